package health

import (
	"context"
	"log/slog"
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

	mu          sync.Mutex
	published   int
	lastPublish time.Time
}

// NewAgent returns an agent. Give its Poke method to the Runner's onChange and the gossip's
// OnPeerChange so that changes are published at once.
func NewAgent(g *Gossip, r *Runner, etcd *Etcd, reportInterval time.Duration, log *slog.Logger) *Agent {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Agent{gossip: g, runner: r, etcd: etcd, interval: reportInterval, log: log, poke: make(chan struct{}, 1)}
}

// Poke asks for a report now. It never blocks.
func (a *Agent) Poke() {
	select {
	case a.poke <- struct{}{}:
	default:
	}
}

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
	for {
		a.publish(ctx)
		select {
		case <-ctx.Done():
			wg.Wait()
			a.log.Info("leaving the gossip pool")
			return a.gossip.Leave(leaveTimeout)
		case <-t.C:
		case <-a.poke:
		}
	}
}

func (a *Agent) publish(ctx context.Context) {
	r := Report{Probes: a.runner.Results(), Peers: a.gossip.Peers()}
	if a.etcd != nil {
		vctx, cancel := context.WithTimeout(ctx, a.interval)
		v := a.etcd.View(vctx)
		cancel()
		r.Etcd = &v
	}
	if ctx.Err() != nil {
		return
	}
	if err := a.gossip.Publish(r); err != nil {
		a.log.Warn("publishing the report", "err", err)
		return
	}
	a.mu.Lock()
	a.published++
	a.lastPublish = time.Now()
	a.mu.Unlock()
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
