// Package hub is Hale's decision maker around its pure parts: the pass's loop (observe, then
// hub/pass's Compute, then apply), the executor's world (hub/execute carries out each remediation),
// the operator's controls and status, and the BMCs' readiness. docs/hub-internals.md walks it.
package hub

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/bmcaccess"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/ledger"
	"github.com/hale-dev/hale/hub/metrics"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/hub/taints"
	"github.com/hale-dev/hale/quorum"
)

// Pool is what the hub reads from the gossip pool it is a member of (*health.Gossip).
type Pool interface {
	// Reports are the latest report of each node.
	Reports() map[string]health.Report
	// Peers are the members as the hub's own membership sees them.
	Peers() []health.PeerView
	// KeepJoined keeps these nodes joined: the pool joins them again when it has lost them.
	KeepJoined(nodes []string)
}

// Config configures a hub.
type Config struct {
	Inventory pass.Inventory
	// Gossip is the hub's own membership of the agents' pool.
	Gossip  Pool
	Journal journal.Store
	Log     *slog.Logger
	// Tick is the time between passes (default 200 ms).
	Tick time.Duration
	// PowerFor returns a machine's BMC controller (default: bmc.New from the inventory, with BMC as
	// the options: timeouts, metrics).
	PowerFor func(pass.Machine) (execute.Power, error)
	// OwnerFor returns the controller that replaces a machine whose strategy is replace (Kubernetes
	// mode); without it such remediations cannot start.
	OwnerFor func(pass.Machine) (execute.Owner, error)
	BMC      bmc.Options
	// BMCCheckInterval is how often the leading hub checks every machine's BMC (readiness.go; default
	// 10 min, negative: never).
	BMCCheckInterval time.Duration
	// LoginBackoff is how long the hub makes no login to a BMC account after its credentials failed
	// (default 5 min; it doubles with each failure in a row, up to 12 times; see package bmcaccess).
	LoginBackoff time.Duration
	// Metrics, when set, receives the hub's metrics.
	Metrics prometheus.Registerer
	// OnNotice, when set, is called with every notice as it is said (the demo's timeline). It must not
	// block or call back into the hub.
	OnNotice func(at time.Time, msg string)
	// Notify, when set, is told every decision about a machine (Kubernetes mode turns them into
	// Events on its Machine or Node). It must not block or call back into the hub.
	Notify func(pass.Notice)
	// Standby, when set, says why this hub must not act now ("" when it may): a second standalone hub
	// on the same gossip pool stands by (FirstHubLeads). Kubernetes mode has its Lease instead.
	Standby func() string
	// Brakes, when set, keeps the operator's brakes across restarts (default: the journal, when it is
	// a BrakeStore, as the bbolt journal is).
	Brakes BrakeStore
	// Marks, when set, keeps the raft mark (RaftMark) across restarts (default: the journal, when it is
	// a MarkStore, as the bbolt journal is). MarkEvery is how often a rising mark is written there at
	// most (default pass.MarkEvery; a management cluster's cells: pass.CellMarkEvery).
	Marks     MarkStore
	MarkEvery time.Duration
	// Recoveries, when set, journals a recovery after a permanent loss of quorum (`hub recover --yes`;
	// default: the journal, when it is a RecoveryStore, as the bbolt journal is). Without it the hub
	// refuses to begin one.
	Recoveries RecoveryStore
	// Episodes, when set, keeps the last episodes of each machine across restarts (default: the
	// journal, when it is an EpisodeStore, as the bbolt journal is).
	Episodes EpisodeStore
	// ProofWatch is how often the BMC of each machine dead within its stall tolerance is read for
	// proof of a hang (default 1 s).
	ProofWatch time.Duration
	// Degraded, when set, says why this hub acts without the API server and with what (Kubernetes
	// mode's degraded mode, cmd/hub): shown in status and the metric hale_hub_degraded.
	Degraded string
	// OutOfService, when set, puts the out-of-service taint on the Nodes of machines Hale fenced and
	// its BMC reads Off (policy.outOfServiceAfter; Kubernetes mode: outofservice.Taints), and takes it off.
	OutOfService taints.Nodes
	// FenceWatch is how often the BMC of each fenced machine is read while OutOfService is set
	// (default pass.FenceWatchEvery).
	FenceWatch time.Duration
	// AfterPass, when set, is called with the count of passes so far at the end of each (tests assert
	// "nothing happened" over a number of passes, not a sleep).
	AfterPass func(n uint64)
}

// BMCPower is the default PowerFor: the machine's BMC from the inventory, with BMC as the options.
func (cfg Config) BMCPower(m pass.Machine) (execute.Power, error) {
	o := cfg.BMC
	o.CAFile, o.Insecure = m.CAFile, m.Insecure
	if o.Logger == nil {
		o.Logger = cfg.Log
	}
	return bmc.New(m.Endpoint, m.Credentials, o)
}

// Hub runs the pipeline: a pass (pass.go: observe, compute, apply) every Tick in one goroutine; each
// remediation in its own goroutine through an Executor (remediate.go). This file is its configuration,
// construction and accessors.
type Hub struct {
	cfg      Config
	log      *slog.Logger
	metrics  *metrics.Counters
	assessor *assess.Assessor // the pass goroutine's only
	state    pass.State       // the pass goroutine's only: what one pass leaves the next (compute)

	// recovering is held while `hub recover --yes` is carried out: a second caller is refused.
	recovering sync.Mutex
	// recordMu is held while the recovery record is read, changed and written back by underway (done)
	// and survivorSeen (the survivor seen healthy), one in the caller's goroutine and one in the pass's:
	// each wrote back what it had read, and one took the other's change away (a run lost Done).
	recordMu sync.Mutex
	// rebooting is held while an operator's reboot is admitted and begun: two retired machines
	// asked for at once each found the other still off, and both came on (the old cluster's quorum).
	rebooting sync.Mutex

	mu   sync.Mutex
	ctx  context.Context // Run's, once it runs
	inv  pass.Inventory
	view pass.View // the latest pass's (published by apply)
	// running: the remediations under way (their goroutines update them), from the moment a pass
	// queues one (beginQueued).
	running map[string]*running
	// beginning counts the begins queued and not yet journaled (or refused): Run waits for them.
	beginning sync.WaitGroup
	ledger    *ledger.Ledger               // the journal's summary the passes read (never the journal)
	logins    *bmcaccess.Logins            // BMC accounts that refused the credentials (its own lock)
	bmcs      map[string]pass.BMCReadiness // what the last readiness checks found
	hangs     map[string][]bmcval.LogEntry // the hangs their event logs record (assess.Observations.Hangs)
	// checkBMCs asks watchBMCs for a check now (a pass found quorum lost).
	checkBMCs chan struct{}
	// marks writes the raft mark the passes hand it (its own lock); episodeLog the episodes' log.
	marks      *latest[pass.RaftMark]
	episodeLog *latest[pass.EpisodeLog]
	// episodes: the last episodes of each machine (episodes.go; replaced whole, never changed).
	episodes pass.EpisodeLog
	// watching: the machines whose BMCs watchProofs reads (the latest pass's); watchWake wakes it.
	watching  []string
	watchWake chan struct{}
	// taints writes the out-of-service taints the passes want (its own lock).
	taints *taints.Writer
	// advance: how what the passes set going went (its own lock), for the next pass.
	advance  advance
	timeline []string                 // what the hub said, oldest first (bounded)
	override inventory.PolicyOverride // over the inventory's policy (Kubernetes mode's HealthPolicy)
	brakes   pass.Brakes              // the operator's: pause, suspend, detached machines (a BrakeStore keeps them)
	retired  pass.Retirement          // the old cluster the last etcd recovery journaled replaced, done or not
	pauses   map[string]pass.Brake    // pauses of other sources (a paused Cluster API Cluster)
	// quorumBack: when etcd's quorum came back, as the last pass found, for the next round to tell the
	// assessor (the pass goroutine's only).
	quorumBack time.Time
	// started is when Run began; lastPass when the latest pass ended (Stalled).
	started, lastPass time.Time
	// brakeSeq counts the hub's own brake changes: odd while one is being recorded (ApplyBrakes).
	brakeSeq uint64
	resumed  chan struct{} // closed and replaced when the hub is resumed
	// resumedAt: when the last brake that held steps was lifted (the assessor counts from there).
	resumedAt time.Time
}

type running struct {
	rem    journal.Remediation
	plan   quorum.Plan
	next   int // the step under way: the planner counts it and those after it as still to come
	cancel context.CancelFunc
	since  time.Time // when the flight began, before its journal entry (set once; Overtaken and Wanted count from it)
	// busy: between a checkpoint and the end of an irreversible step (a BMC call in progress).
	busy bool
	// stalled: why the remediation cannot go on right now (the journal refuses a write, retried until
	// it is in; a resumed one reads the world before anything else).
	stalled string
}

// maxPassGap: passes this far apart (they are a Tick, 200 ms, apart) mean the hub was not running.
const maxPassGap = 2 * time.Second

// keepFinished is how many finished remediations per machine the ledger keeps (as the journal does).
const keepFinished = 20

// New returns a hub.
func New(cfg Config) (*Hub, error) {
	if cfg.Gossip == nil || cfg.Journal == nil {
		return nil, fmt.Errorf("hub: gossip and journal are required")
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 200 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.FenceWatch == 0 {
		cfg.FenceWatch = pass.FenceWatchEvery
	}
	if cfg.BMCCheckInterval == 0 {
		cfg.BMCCheckInterval = 10 * time.Minute
	}
	if cfg.PowerFor == nil {
		cfg.PowerFor = cfg.BMCPower
	}
	if bs, ok := cfg.Journal.(BrakeStore); ok && cfg.Brakes == nil {
		cfg.Brakes = bs
	}
	if ms, ok := cfg.Journal.(MarkStore); ok && cfg.Marks == nil {
		cfg.Marks = ms
	}
	if rs, ok := cfg.Journal.(RecoveryStore); ok && cfg.Recoveries == nil {
		cfg.Recoveries = rs
	}
	if es, ok := cfg.Journal.(EpisodeStore); ok && cfg.Episodes == nil {
		cfg.Episodes = es
	}
	if cfg.ProofWatch <= 0 {
		cfg.ProofWatch = time.Second
	}
	if cfg.OwnerFor == nil {
		cfg.OwnerFor = func(m pass.Machine) (execute.Owner, error) {
			return nil, fmt.Errorf("%s: strategy replace needs an owner controller (Kubernetes mode with Cluster API)", m.Name)
		}
	}
	l := ledger.New(keepFinished)
	cfg.Journal = ledger.Recorder{Store: cfg.Journal, Ledger: l}
	met, err := metrics.New(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	h := &Hub{cfg: cfg, log: cfg.Log, assessor: assess.NewAssessor(cfg.Inventory.Policy.Assess), metrics: met, state: pass.NewState(), inv: cfg.Inventory,
		view: pass.NewState().View, running: map[string]*running{}, ledger: l, logins: bmcaccess.NewLogins(cfg.LoginBackoff), pauses: map[string]pass.Brake{},
		resumed: make(chan struct{}), checkBMCs: make(chan struct{}, 1), marks: newLatest[pass.RaftMark](),
		episodeLog: newLatest[pass.EpisodeLog](), watchWake: make(chan struct{}, 1),
		taints: taints.NewWriter()}
	h.state.MarkEvery = cfg.MarkEvery
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(metrics.NewCollector(h.Status)); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// Stalled says why the pipeline is not running, or "": the hub has not begun (Run not called, or
// ended), its first pass has not come within startGrace of Run (warm-up and resume take that long at
// most), or no pass has ended for longer than stall. /healthz reports it, so that a leader whose
// pipeline hangs is restarted rather than holding its Lease while nothing runs.
func (h *Hub) Stalled(now time.Time, startGrace, stall time.Duration) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.started.IsZero():
		return "the pipeline has not started"
	case h.lastPass.IsZero() && now.Sub(h.started) > startGrace:
		return fmt.Sprintf("no pass since the pipeline started %v ago (warm-up and resume take at most %v)", now.Sub(h.started).Round(time.Second), startGrace)
	case !h.lastPass.IsZero() && now.Sub(h.lastPass) > stall:
		return fmt.Sprintf("the pipeline stalled: no pass for %v (one is due every %v)", now.Sub(h.lastPass).Round(time.Second), h.cfg.Tick)
	}
	return ""
}

// EtcdQuorum is the latest pass's View.EtcdQuorum: Kubernetes mode's test for degraded mode.
func (h *Hub) EtcdQuorum(after time.Time) (pass.EtcdQuorum, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.view.EtcdQuorum(after)
}

// EtcdQuorumSince is EtcdQuorum held only on evidence from after since: besides the latest pass's
// count, the agents of a quorum of the voters must have seen their own member's etcd probe pass at a
// check made after since (a member without quorum fails it: "no leader"). It is degraded mode's test
// that etcd has quorum again. A hub that starts at the loss (the degraded term's) holds the last
// reports of the members that hung just before, fresh by age, and the observers' views from before
// the loss: its first pass that planned counted two of three hung voters healthy, and the term
// started nothing for the rest of the outage (found on a real kubeadm cluster, two of three nodes
// frozen).
func (h *Hub) EtcdQuorumSince(now, since time.Time) (pass.EtcdQuorum, string) {
	q, why := h.EtcdQuorum(now.Add(-maxPassGap))
	if q != pass.QuorumHeld {
		return q, why
	}
	h.mu.Lock()
	cluster := h.view.Cluster
	h.mu.Unlock()
	back, voters := votersBackSince(cluster, h.inventory(), h.cfg.Gossip.Reports(), since)
	if need := quorum.Quorum(voters); len(back) < need {
		return pass.QuorumUnknown, fmt.Sprintf("%s, but the etcd probe passed since %s on %d of the %d voters' machines (%s), quorum needs %d",
			why, since.UTC().Format("15:04:05.000Z07:00"), len(back), voters, strings.Join(back, ", "), need)
	}
	return pass.QuorumHeld, fmt.Sprintf("%s; the etcd probe passed since %s on %s", why, since.UTC().Format("15:04:05.000Z07:00"), strings.Join(back, ", "))
}

// votersBackSince are the machines of cluster's voters whose own agent's report says their member's
// etcd probe passed at a check made after since, and how many voters the cluster has.
func votersBackSince(cluster quorum.Cluster, inv pass.Inventory, reports map[string]health.Report, since time.Time) (back []string, voters int) {
	for _, mb := range cluster.Members {
		if mb.Learner {
			continue
		}
		voters++
		m, ok := inv.MachineOfMember(mb.Name)
		if !ok {
			continue
		}
		r, ok := reports[m.Node]
		if ok && slices.ContainsFunc(r.Probes, func(p health.ProbeResult) bool { return p.Name == "etcd" && p.OK && p.CheckedAt.After(since) }) {
			back = append(back, m.Name)
		}
	}
	return back, voters
}

// Inventory is the inventory in force.
func (h *Hub) Inventory() pass.Inventory { return h.inventory() }

// Timeline returns what the hub did and decided, oldest first (bounded).
func (h *Hub) Timeline() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.timeline)
}

// Assessment returns the latest assessment of a machine.
func (h *Hub) Assessment(machine string) (assess.Assessment, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a := pass.AssessmentOf(h.view.Assessments, -1, machine)
	return a, a.Machine != ""
}

// History returns a machine's remediations from the journal, oldest first.
func (h *Hub) History(ctx context.Context, machine string) ([]journal.Remediation, error) {
	return h.cfg.Journal.History(ctx, machine)
}

// FirstHubLeads is Config.Standby for a standalone hub on g: among the hubs live in the gossip pool,
// the one that started first (then by name) leads, and any other stands by and says which leads. Two
// standalone hubs with journals of their own must never both act; a restarted hub waits until the pool
// has declared its previous incarnation dead.
func FirstHubLeads(g *health.Gossip, self string) func() string {
	return func() string {
		mine := g.Started()
		for _, m := range g.Members() {
			if m.Role != "hub" || m.Name == self {
				continue
			}
			if m.Started.Before(mine) || m.Started.Equal(mine) && m.Name < self {
				return fmt.Sprintf("standing by: hub %s (started %s) leads this gossip pool; one hub acts at a time (`hub status` on that hub)",
					m.Name, m.Started.UTC().Format(time.RFC3339))
			}
		}
		return ""
	}
}

func machineNames(inv pass.Inventory) []string {
	out := make([]string, len(inv.Machines))
	for i, m := range inv.Machines {
		out[i] = m.Name
	}
	return out
}

// inFlight lists the machines with a remediation running, each with its steps still to come, as the
// latest pass's membership tells them.
func (h *Hub) inFlight(inv pass.Inventory) []quorum.Machine {
	h.mu.Lock()
	flights, cluster := h.flightsLocked(), h.view.Cluster
	h.mu.Unlock()
	var out []quorum.Machine
	for _, m := range inv.Machines {
		if fl, ok := flights[m.Name]; ok {
			out = append(out, quorum.Machine{Name: m.Name, Member: m.Member, InFlight: true, Strategy: fl.Plan.Strategy, Remaining: fl.StillToCome(cluster)})
		}
	}
	return out
}
