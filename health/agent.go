package health

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Agent ties a node's probes, its etcd view and the gossip together: it publishes a report at once
// when a probe or a peer changes state, and at least every ReportInterval. It never acts on anything.
type Agent struct {
	gossip   *Gossip
	runner   *Runner
	etcd     *Etcd // nil on a node without an etcd member
	interval time.Duration
	log      *slog.Logger
	poke     chan struct{}
	kubeadm  string // kubeadm's temporary directory, watched for an upgrade under way ("": none)

	mu          sync.Mutex
	published   int
	lastPublish time.Time
	lastView    *EtcdView
}

// NewAgent returns an agent. Give its Poke method to the Runner's onChange and the gossip's
// OnPeerChange so that changes are published at once.
func NewAgent(g *Gossip, r *Runner, etcd *Etcd, reportInterval time.Duration, log *slog.Logger) *Agent {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Agent{gossip: g, runner: r, etcd: etcd, interval: reportInterval, log: log, poke: make(chan struct{}, 1)}
}

// WatchKubeadm makes every report say whether a kubeadm upgrade is replacing this node's static pod
// manifests (Report.KubeadmUpgrade): `kubeadm upgrade apply` and `kubeadm upgrade node` hold a
// directory kubeadm-upgraded-manifests* in kubeadm's temporary directory dir (/etc/kubernetes/tmp)
// while they do, and remove it when done. It returns a.
func (a *Agent) WatchKubeadm(dir string) *Agent {
	a.kubeadm = dir
	return a
}

// KubeadmUpgradeSince is when the kubeadm upgrade under way on this node began, as kubeadm's
// temporary directory dir shows it (the newest kubeadm-upgraded-manifests* directory's time), or zero
// when none is (no such directory, or no dir at all).
func KubeadmUpgradeSince(dir string) time.Time {
	var since time.Time
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "kubeadm-upgraded-manifests") {
			continue
		}
		if info, err := e.Info(); err == nil && info.ModTime().After(since) {
			since = info.ModTime()
		}
	}
	return since
}

// Poke asks for a report now. It never blocks.
func (a *Agent) Poke() {
	select {
	case a.poke <- struct{}{}:
	default:
	}
}

// viewEvery is how often the agent looks at etcd between two reports: a view that changed (a member
// reachable again or no longer, another leader or cluster, the local member answering or not) is
// published at once, so that the hub's evidence about a member that came back is at most this old (a
// view costs a Status per member over kept connections and a serializable member list: no raft write).
// While the agent sees a peer dead or a member unreachable it reports this often too: the hub knows a
// machine's silence only as far as a majority of its observers have reported it (a stall tolerance
// ends once their reports pass it), so a dead machine waits at most this long for their word, not a
// report interval.
const viewEvery = time.Second

// Run probes and publishes until ctx ends, then leaves the gossip pool within leaveTimeout, so that
// peers see this node as left rather than dead.
func (a *Agent) Run(ctx context.Context, leaveTimeout time.Duration) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.runner.Run(ctx)
	}()
	t := time.NewTicker(a.interval)
	defer t.Stop()
	var look <-chan time.Time
	if viewEvery < a.interval {
		lt := time.NewTicker(viewEvery)
		defer lt.Stop()
		look = lt.C
	}
	var last *EtcdView
	var trouble bool
	for {
		last, trouble = a.publish(ctx, a.view(ctx))
		for again := false; !again; {
			select {
			case <-ctx.Done():
				wg.Wait()
				a.log.Info("leaving the gossip pool")
				return a.gossip.Leave(leaveTimeout)
			case <-t.C:
				again = true
			case <-a.poke:
				again = true
			case <-look:
				if v := a.view(ctx); trouble || v != nil && !sameView(v, last) {
					last, trouble = a.publish(ctx, v)
				}
			}
		}
	}
}

// troubled says whether r tells of a peer dead or an etcd member unreachable.
func troubled(r Report) bool {
	if slices.ContainsFunc(r.Peers, func(p PeerView) bool { return p.State == PeerDead }) {
		return true
	}
	return r.Etcd != nil && slices.ContainsFunc(r.Etcd.Members, func(m EtcdMember) bool { return m.Reachable != nil && !*m.Reachable })
}

// view is the etcd view of this node (nil on a node without etcd), taken within a report interval.
func (a *Agent) view(ctx context.Context) *EtcdView {
	if a.etcd == nil {
		return nil
	}
	vctx, cancel := context.WithTimeout(ctx, a.interval)
	defer cancel()
	v := a.etcd.View(vctx)
	return &v
}

// publish sends a report with the probes' results, the peers and the etcd view v, and returns v and
// whether the report tells of trouble (troubled).
func (a *Agent) publish(ctx context.Context, v *EtcdView) (*EtcdView, bool) {
	r := Report{Probes: a.runner.Results(), Peers: a.gossip.Peers(), Etcd: v}
	if a.kubeadm != "" {
		r.KubeadmUpgrade = KubeadmUpgradeSince(a.kubeadm).UTC()
	}
	trouble := troubled(r)
	if ctx.Err() != nil {
		return v, trouble
	}
	if err := a.gossip.Publish(r); err != nil {
		a.log.Warn("publishing the report", "err", err)
		return v, trouble
	}
	a.mu.Lock()
	a.published++
	a.lastPublish = time.Now()
	if v != nil && len(v.Members) > 0 {
		a.lastView = v
	}
	a.mu.Unlock()
	return v, trouble
}

// MemberPeers are the gossip addresses of the agents beside etcd's members, as this node last saw
// the membership: each member's peer URL's host, at port (every agent's gossip port). It lists
// nothing until the local member has answered, and never this node's own address (self).
func (a *Agent) MemberPeers(port int, self string) []string {
	a.mu.Lock()
	v := a.lastView
	a.mu.Unlock()
	if v == nil {
		return nil
	}
	var peers []string
	for _, m := range v.Members {
		for _, raw := range m.PeerURLs {
			u, err := url.Parse(raw)
			if err != nil || u.Hostname() == "" {
				continue
			}
			addr := net.JoinHostPort(u.Hostname(), strconv.Itoa(port))
			if addr != self && !slices.Contains(peers, addr) {
				peers = append(peers, addr)
			}
		}
	}
	return peers
}

// Status says how many reports were published and when the last one was.
func (a *Agent) Status() (published int, last time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.published, a.lastPublish
}

// Gossip returns the agent's gossip member.
func (a *Agent) Gossip() *Gossip { return a.gossip }

// Runner returns the agent's probe runner.
func (a *Agent) Runner() *Runner { return a.runner }
