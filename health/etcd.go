package health

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
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
	// Endpoint is the local member's client URL (default https://127.0.0.1:2379, kubeadm's); an
	// http:// endpoint takes no TLS.
	Endpoint string `json:"endpoint"`
	// Endpoints (witnesses only) are the members' client URLs, read from outside.
	Endpoints []string `json:"endpoints"`
	// TLS is the client certificate etcd accepts (default: kubeadm's healthcheck-client under
	// /etc/kubernetes/pki/etcd, for an https:// endpoint).
	TLS TLSFiles `json:"tls"`
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
	endpoint string           // the local member's; empty from outside
	cli      *clientv3.Client // the local member's (nil from outside)
	cfg      clientv3.Config  // how cli was made; each member's own client is made the same way

	mu sync.Mutex
	// members holds a client of each other member alone (by client URL), kept from one view to the
	// next: clientv3's Status(endpoint) dials the member afresh on every call, which with TLS is a
	// handshake per probe and per member per view, on the agent and on etcd.
	members map[string]*clientv3.Client
}

// clientConfig is how every etcd client of the agent is made. A connection that broke is dialled again
// at most a second later (gRPC's default backs off to two minutes, so a member back from a long outage
// could stay "unreachable" for that long).
func clientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: time.Second,
			Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}})}}
}

// NewEtcd connects (lazily) to the local member. The client talks to that endpoint only: it never
// fails over to other members, so what it reports is this member's view.
func NewEtcd(cfg EtcdConfig) (*Etcd, error) {
	if strings.HasPrefix(cfg.WithDefaults().Endpoint, "https://") && cfg.TLS == (TLSFiles{}) {
		for _, f := range []struct{ path, setting string }{{DefaultEtcdCA, "etcd.tls.ca"}, {DefaultEtcdCert, "etcd.tls.cert"}, {DefaultEtcdKey, "etcd.tls.key"}} {
			if err := kubeadmDefault(f.path, f.setting, "probes.etcd.enabled: false"); err != nil {
				return nil, fmt.Errorf("etcd: %w", err)
			}
		}
	}
	cfg = cfg.WithDefaults()
	cc := clientConfig([]string{cfg.Endpoint})
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
	return &Etcd{endpoint: cfg.Endpoint, cli: cli, cfg: cc, members: map[string]*clientv3.Client{}}, nil
}

// NewEtcdOutside connects (lazily) to the cluster's members from a host that runs none (a witness).
// Its View reads the membership serializably from whichever member answers, and checks each member's
// client URL from here: what etcd looks like from outside the control plane.
func NewEtcdOutside(endpoints []string, tls TLSFiles) (*Etcd, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("etcd.endpoints: none given (the members' client URLs, e.g. https://10.0.0.11:2379)")
	}
	cc := clientConfig(endpoints)
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
	// No client of all the endpoints: each member is asked through its own (memberList, status).
	return &Etcd{cfg: cc, members: map[string]*clientv3.Client{}}, nil
}

// Close closes the clients.
func (e *Etcd) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	if e.cli != nil {
		errs = append(errs, e.cli.Close())
	}
	for url, c := range e.members {
		errs = append(errs, c.Close())
		delete(e.members, url)
	}
	return errors.Join(errs...)
}

// status asks the member at url for its status over the connection kept to it. A connection that
// failed is dialled again at once rather than after its backoff (a member back from an outage answers
// the first view after it is up, not the one after the backoff: the hub counts an observer's "does not
// answer" against a member that has just restarted, once the report is newer than the restart). With
// wait, the call waits for the connection within ctx instead of failing at once while it is down.
func (e *Etcd) status(ctx context.Context, url string, wait bool) (*clientv3.StatusResponse, error) {
	cli := e.cli // the local member's client talks to it alone
	if url != e.endpoint {
		var err error
		if cli, err = e.memberClient(url); err != nil {
			return nil, err
		}
	}
	conn := cli.ActiveConnection()
	if conn.GetState() == connectivity.TransientFailure {
		conn.ResetConnectBackoff()
	}
	st, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(wait))
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.StatusResponse)(st), nil
}

func (e *Etcd) memberClient(url string) (*clientv3.Client, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.members[url]; ok {
		return c, nil
	}
	cc := e.cfg
	cc.Endpoints = []string{url}
	c, err := clientv3.New(cc) // does not wait for the connection
	if err != nil {
		return nil, fmt.Errorf("etcd member at %s: %w", url, err)
	}
	e.members[url] = c
	return c, nil
}

// forgetMembersBut closes the clients of members whose client URL is not in urls (removed members).
func (e *Etcd) forgetMembersBut(urls map[string]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for url, c := range e.members {
		if !urls[url] {
			_ = c.Close()
			delete(e.members, url)
		}
	}
}

// Probe returns the etcd probe: the local member answers Status with no error (a leader, no alarm
// such as NOSPACE or CORRUPT: the member's Status carries both), and serves a linearizable read (so it
// is in the quorum).
func (e *Etcd) Probe() Probe { return etcdProbe{e} }

type etcdProbe struct{ e *Etcd }

func (p etcdProbe) Name() string { return "etcd" }

func (p etcdProbe) Check(ctx context.Context) (bool, string) {
	st, err := p.e.status(ctx, p.e.endpoint, false)
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
	return true, fmt.Sprintf("member %x: leader %x, raft term %d index %d, db %s", st.Header.MemberId, st.Leader,
		st.RaftTerm, st.RaftIndex, bytesHuman(uint64(max(st.DbSize, 0))))
}

// View reads the membership, leader, raft term and index and alarms from the local member, and
// checks whether each member's client URL answers from here. Whatever fails is said in Error; the
// rest of the view is still filled in. Nothing in it goes through raft (the membership is read
// serializably, the alarms come with the members' Status): it answers as fast with quorum lost as
// with it, and costs the cluster no write.
func (e *Etcd) View(ctx context.Context) EtcdView {
	v := EtcdView{ObservedAt: time.Now().UTC()}
	var problems []string
	alarms := map[string]bool{}
	if e.endpoint != "" {
		st, err := e.status(ctx, e.endpoint, false)
		if err != nil {
			problems = append(problems, fmt.Sprintf("status of %s: %v", e.endpoint, err))
		} else {
			v.ClusterID, v.LocalID, v.LeaderID = hexID(st.Header.ClusterId), hexID(st.Header.MemberId), hexID(st.Leader)
			v.RaftTerm, v.RaftIndex = st.RaftTerm, st.RaftIndex
			addAlarms(alarms, st)
		}
	}
	// Serializable: the member's own view, which it can give even when quorum is lost (exactly when
	// the hub needs the membership to know which dead members to power-cycle).
	ml, err := e.memberList(ctx)
	if err != nil {
		problems = append(problems, fmt.Sprintf("member list: %v", err))
	} else {
		var mu sync.Mutex
		var wg sync.WaitGroup
		v.Members = make([]EtcdMember, len(ml.Members))
		urls := map[string]bool{}
		for _, ep := range e.cfg.Endpoints {
			urls[ep] = true // a witness's configured endpoints keep their clients too
		}
		for i, m := range ml.Members {
			v.Members[i] = EtcdMember{ID: hexID(m.ID), Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner}
			if v.LocalID != "" && hexID(m.ID) == v.LocalID {
				v.LocalName = m.Name
			}
			if len(m.ClientURLs) == 0 {
				continue // a member added but not started yet
			}
			urls[m.ClientURLs[0]] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := e.reachable(ctx, m.ClientURLs[0])
				// Reachable only when the member that answered is this one, of this cluster: after an
				// etcd recovery a machine at that URL may still run its old member of the old cluster.
				reachable := st != nil && st.Header != nil && st.Header.MemberId == m.ID && st.Header.ClusterId == ml.Header.ClusterId
				v.Members[i].Reachable = &reachable
				if st != nil && e.endpoint == "" { // from outside, the alarms come with the members' Status
					mu.Lock()
					addAlarms(alarms, st)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		e.forgetMembersBut(urls)
		slices.SortFunc(v.Members, func(a, b EtcdMember) int { return strings.Compare(a.Name+a.ID, b.Name+b.ID) })
	}
	v.Alarms = slices.Sorted(maps.Keys(alarms))
	v.Error = strings.Join(problems, "; ")
	return v
}

// memberList reads the membership serializably: from the local member, or from outside from whichever
// member answers first. Outside, every configured endpoint is asked at once, each through its own
// client: clientv3 balances one call round robin over its endpoints, and a frozen member (its TCP
// accepts, it never answers) holds the call until ctx ends, so with two of three members hung a
// witness would see the membership one view in three.
func (e *Etcd) memberList(ctx context.Context) (*clientv3.MemberListResponse, error) {
	if e.endpoint != "" {
		return e.cli.MemberList(ctx, clientv3.WithSerializable())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		ml  *clientv3.MemberListResponse
		err error
	}
	answers := make(chan answer, len(e.cfg.Endpoints))
	for _, url := range e.cfg.Endpoints {
		go func() {
			cli, err := e.memberClient(url)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			ml, err := cli.MemberList(ctx, clientv3.WithSerializable())
			if err != nil {
				err = fmt.Errorf("%s: %w", url, clientv3.ContextError(ctx, err))
			}
			answers <- answer{ml, err}
		}()
	}
	var errs []error
	for range e.cfg.Endpoints {
		a := <-answers
		if a.err == nil {
			return a.ml, nil
		}
		errs = append(errs, a.err)
	}
	return nil, errors.Join(errs...)
}

// addAlarms adds the alarms a member's Status lists among its errors (each "memberID:… alarm:…";
// "no leader" is no alarm).
func addAlarms(alarms map[string]bool, st *clientv3.StatusResponse) {
	for _, e := range st.Errors {
		if strings.Contains(e, "alarm:") {
			alarms[strings.TrimSpace(e)] = true
		}
	}
}

// reachable asks a member's client URL for its status, through this client (same TLS), for at most
// half a second (dialling it again at once if its connection had failed): on a LAN a member that takes
// longer is as good as unreachable. Nil: it did not answer.
func (e *Etcd) reachable(ctx context.Context, url string) *clientv3.StatusResponse {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	st, err := e.status(ctx, url, true)
	if err != nil {
		return nil
	}
	return st
}

func hexID(id uint64) string { return strconv.FormatUint(id, 16) }
