package health

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Defaults for the local etcd member, as kubeadm lays it out.
const (
	DefaultEtcdEndpoint = "https://127.0.0.1:2379"
	DefaultEtcdCA       = "/etc/kubernetes/pki/etcd/ca.crt"
	DefaultEtcdCert     = "/etc/kubernetes/pki/etcd/healthcheck-client.crt"
	DefaultEtcdKey      = "/etc/kubernetes/pki/etcd/healthcheck-client.key"
)

// EtcdConfig is how the agent reaches its node's etcd member; or, for a witness (which runs none),
// the cluster's members from outside.
type EtcdConfig struct {
	Endpoint string `json:"endpoint"`
	// Endpoints (witnesses only) are the members' client URLs, read from outside.
	Endpoints []string `json:"endpoints"`
	TLS       TLSFiles `json:"tls"`
}

// WithDefaults fills in kubeadm's endpoint and certificate paths; plain http:// endpoints take no TLS.
func (c EtcdConfig) WithDefaults() EtcdConfig {
	if c.Endpoint == "" {
		c.Endpoint = DefaultEtcdEndpoint
	}
	if strings.HasPrefix(c.Endpoint, "https://") && c.TLS == (TLSFiles{}) {
		c.TLS = TLSFiles{CA: DefaultEtcdCA, Cert: DefaultEtcdCert, Key: DefaultEtcdKey}
	}
	return c
}

// Etcd talks to the node's own etcd member: the etcd probe and the membership view. A witness's
// (NewEtcdOutside) talks to whichever member answers, and has no local member.
type Etcd struct {
	endpoint string // the local member's; empty from outside
	cli      *clientv3.Client
}

// NewEtcd connects (lazily) to the local member. The client talks to that endpoint only: it never
// fails over to other members, so what it reports is this member's view.
func NewEtcd(cfg EtcdConfig) (*Etcd, error) {
	cfg = cfg.WithDefaults()
	cc := clientv3.Config{Endpoints: []string{cfg.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 2 * time.Second}
	if strings.HasPrefix(cfg.Endpoint, "https://") {
		tc, err := cfg.TLS.Config()
		if err != nil {
			return nil, fmt.Errorf("etcd at %s: %w", cfg.Endpoint, err)
		}
		cc.TLS = tc
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("etcd at %s: %w", cfg.Endpoint, err)
	}
	return &Etcd{endpoint: cfg.Endpoint, cli: cli}, nil
}

// NewEtcdOutside connects (lazily) to the cluster's members from a host that runs none (a witness).
// Its View reads the membership serializably from whichever member answers, and checks each member's
// client URL from here: what etcd looks like from outside the control plane.
func NewEtcdOutside(endpoints []string, tls TLSFiles) (*Etcd, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("etcd.endpoints: none given (the members' client URLs, e.g. https://10.0.0.11:2379)")
	}
	cc := clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 2 * time.Second}
	for _, ep := range endpoints {
		switch {
		case strings.HasPrefix(ep, "https://"):
			tc, err := tls.Config()
			if err != nil {
				return nil, fmt.Errorf("etcd at %s: %w", ep, err)
			}
			cc.TLS = tc
		case !strings.HasPrefix(ep, "http://"):
			return nil, fmt.Errorf("etcd.endpoints: %q: want an http:// or https:// URL", ep)
		}
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("etcd at %v: %w", endpoints, err)
	}
	return &Etcd{cli: cli}, nil
}

// Close closes the client.
func (e *Etcd) Close() error { return e.cli.Close() }

// Probe returns the etcd probe: the local member answers Status, serves a linearizable read (so it
// has a leader and is in the quorum), and no alarm (NOSPACE, CORRUPT) is raised.
func (e *Etcd) Probe() Probe { return etcdProbe{e} }

type etcdProbe struct{ e *Etcd }

func (p etcdProbe) Name() string { return "etcd" }

func (p etcdProbe) Check(ctx context.Context) (bool, string) {
	st, err := p.e.cli.Status(ctx, p.e.endpoint)
	if err != nil {
		return false, fmt.Sprintf("status of %s: %v", p.e.endpoint, err)
	}
	if len(st.Errors) > 0 {
		return false, fmt.Sprintf("member %x reports: %s", st.Header.MemberId, strings.Join(st.Errors, "; "))
	}
	// etcdctl endpoint health does the same read; permission denied still proves a working quorum.
	if _, err := p.e.cli.Get(ctx, "health"); err != nil && !errors.Is(err, rpctypes.ErrPermissionDenied) {
		return false, fmt.Sprintf("linearizable read on member %x: %v", st.Header.MemberId, err)
	}
	alarms, err := p.e.cli.AlarmList(ctx)
	if err != nil {
		return false, fmt.Sprintf("alarm list: %v", err)
	}
	if len(alarms.Alarms) > 0 {
		var as []string
		for _, a := range alarms.Alarms {
			as = append(as, fmt.Sprintf("%s on member %x", a.Alarm, a.MemberID))
		}
		return false, "alarm: " + strings.Join(as, ", ")
	}
	return true, fmt.Sprintf("member %x: leader %x, raft term %d index %d, db %s", st.Header.MemberId, st.Leader,
		st.RaftTerm, st.RaftIndex, bytesHuman(uint64(max(st.DbSize, 0))))
}

// View reads the membership, leader, raft term and index and alarms from the local member, and
// checks whether each member's client URL answers from here. Whatever fails is said in Error; the
// rest of the view is still filled in.
func (e *Etcd) View(ctx context.Context) EtcdView {
	v := EtcdView{ObservedAt: time.Now().UTC()}
	var problems []string
	if e.endpoint != "" {
		st, err := e.cli.Status(ctx, e.endpoint)
		if err != nil {
			problems = append(problems, fmt.Sprintf("status of %s: %v", e.endpoint, err))
		} else {
			v.LocalID, v.LeaderID = hexID(st.Header.MemberId), hexID(st.Leader)
			v.RaftTerm, v.RaftIndex = st.RaftTerm, st.RaftIndex
		}
	}
	// Serializable: the member's own view, which it can give even when quorum is lost (exactly when
	// the hub needs the membership to know which dead members to power-cycle).
	ml, err := e.cli.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		problems = append(problems, fmt.Sprintf("member list: %v", err))
	} else {
		var wg sync.WaitGroup
		v.Members = make([]EtcdMember, len(ml.Members))
		for i, m := range ml.Members {
			v.Members[i] = EtcdMember{ID: hexID(m.ID), Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner}
			if v.LocalID != "" && hexID(m.ID) == v.LocalID {
				v.LocalName = m.Name
			}
			if len(m.ClientURLs) == 0 {
				continue // a member added but not started yet
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				reachable := e.reachable(ctx, m.ClientURLs[0])
				v.Members[i].Reachable = &reachable
			}()
		}
		wg.Wait()
		slices.SortFunc(v.Members, func(a, b EtcdMember) int { return strings.Compare(a.Name+a.ID, b.Name+b.ID) })
	}
	if alarms, err := e.cli.AlarmList(ctx); err != nil {
		problems = append(problems, fmt.Sprintf("alarm list: %v", err))
	} else {
		for _, a := range alarms.Alarms {
			v.Alarms = append(v.Alarms, fmt.Sprintf("%s on member %x", a.Alarm, a.MemberID))
		}
	}
	v.Error = strings.Join(problems, "; ")
	return v
}

// reachable asks a member's client URL for its status, through this client (same TLS), for at most
// half a second: on a LAN a member that takes longer is as good as unreachable.
func (e *Etcd) reachable(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err := e.cli.Status(ctx, url)
	return err == nil
}

func hexID(id uint64) string { return strconv.FormatUint(id, 16) }
