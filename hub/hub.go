package hub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/health"
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
	Inventory Inventory
	// Gossip is the hub's own membership of the agents' pool.
	Gossip  Pool
	Journal Store
	Log     *slog.Logger
	// Tick is the time between passes (default 200 ms).
	Tick time.Duration
	// PowerFor returns a machine's BMC controller (default: bmc.New from the inventory, with BMC as
	// the options: timeouts, metrics).
	PowerFor func(Machine) (Power, error)
	// OwnerFor returns the controller that replaces a machine whose strategy is replace (Kubernetes
	// mode); without it such remediations cannot start.
	OwnerFor func(Machine) (Owner, error)
	BMC      bmc.Options
	// LoginBackoff is how long the hub makes no login to a BMC account after its credentials failed
	// (default 5 min; it doubles with each failure in a row, up to 12 times; see logins).
	LoginBackoff time.Duration
	// Metrics, when set, receives the hub's metrics.
	Metrics prometheus.Registerer
	// OnEvent, when set, is called with every event as it happens (the demo's timeline). It must not
	// block or call back into the hub.
	OnEvent func(at time.Time, msg string)
	// Notify, when set, is told every decision about a machine (Kubernetes mode turns them into
	// Events on its Machine or Node). It must not block or call back into the hub.
	Notify func(Notice)
	// Standby, when set, says why this hub must not act now ("" when it may): a second standalone hub
	// on the same gossip pool stands by (FirstHubLeads). Kubernetes mode has its Lease instead.
	Standby func() string
	// Brakes, when set, keeps the operator's brakes across restarts (default: the journal, when it is
	// a BrakeStore, as the bbolt journal is).
	Brakes BrakeStore
	// Degraded, when set, says why this hub acts without the API server and with what (Kubernetes
	// mode's degraded mode, cmd/hub): shown in status and the metric hale_hub_degraded.
	Degraded string
	// AfterPass, when set, is called with the count of passes so far at the end of each (tests assert
	// "nothing happened" over a number of passes, not a sleep).
	AfterPass func(n uint64)
}

// BMCPower is the default PowerFor: the machine's BMC from the inventory, with BMC as the options.
func (cfg Config) BMCPower(m Machine) (Power, error) {
	o := cfg.BMC
	o.CAFile, o.Insecure = m.CAFile, m.Insecure
	if o.Logger == nil {
		o.Logger = cfg.Log
	}
	return bmc.New(m.Endpoint, m.Credentials, o)
}

// Hub runs the pipeline: observe, assess, plan, act, record. Only one goroutine runs passes; each
// remediation runs in its own goroutine through an Executor.
type Hub struct {
	cfg      Config
	log      *slog.Logger
	assessor *Assessor // the pass goroutine's only
	kept     Expected  // the observers the gossip keeps joined (the pass goroutine's only)
	metrics  *metrics

	mu          sync.Mutex
	ctx         context.Context // Run's, once it runs
	inv         Inventory
	assessments map[string]Assessment
	unhealthyAt map[string]time.Time // when each machine's verdict last became Unhealthy
	healthyAt   map[string]time.Time // when each machine was last seen Healthy: resets its attempts
	seenAt      map[string]time.Time // when each machine was last in view (Assessment.SeenAt)
	hearing     Hearing              // the expected observers the latest pass heard
	// majorityNoticed: whether the last notice said the hub hears a majority (nil: none sent yet).
	majorityNoticed *bool
	cluster         quorum.Cluster // the membership of the latest pass
	quorumLost      bool           // the latest pass that planned saw etcd's quorum lost
	outcome         quorum.Outcome
	needs           map[string]OperatorNeed // of the latest pass that planned
	planErr         string                  // why the latest pass did not plan; empty when it did
	holding         string                  // what the latest pass would have started but held (suspended, rate limit)
	running         map[string]*running
	ledger          *ledger                 // the journal's summary the passes read (never the journal)
	beginFailed     map[string]beginFailure // machines whose remediation could not be begun
	logins          *logins                 // BMC accounts that refused the credentials (its own lock)
	events          []string
	override        PolicyOverride   // over the inventory's policy (Kubernetes mode's HealthPolicy)
	brakes          Brakes           // the operator's: pause, suspend, detached machines (a BrakeStore keeps them)
	pauses          map[string]Brake // pauses of other sources (a paused Cluster API Cluster)
	// started is when Run began; lastPass when the latest pass ended (Stalled).
	started, lastPass time.Time
	// brakeSeq counts the hub's own brake changes: odd while one is being recorded (ApplyBrakes).
	brakeSeq   uint64
	waitingWhy map[string]string // the last Waiting notice's reason per machine
	resumed    chan struct{}     // closed and replaced when the hub is resumed
}

type running struct {
	rem    Remediation
	plan   quorum.Plan
	next   int // the step under way: the planner counts it and those after it as still to come
	cancel context.CancelFunc
	// busy: between a checkpoint and the end of an irreversible step (a BMC call in progress).
	busy bool
	// waiting: why the remediation cannot go on right now (the journal refuses a write, retried until
	// it is in; a resumed one reads the world before anything else).
	waiting string
}

// beginFailure is a remediation the planner admitted and the hub could not begin (its BMC or owner
// could not be reached for, the journal refused it): retried after beginRetry, without a slot of the
// rate limit, which only a remediation in the journal takes.
type beginFailure struct {
	why string
	at  time.Time
}

const beginRetry = 30 * time.Second

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
	if cfg.PowerFor == nil {
		cfg.PowerFor = cfg.BMCPower
	}
	if bs, ok := cfg.Journal.(BrakeStore); ok && cfg.Brakes == nil {
		cfg.Brakes = bs
	}
	if cfg.OwnerFor == nil {
		cfg.OwnerFor = func(m Machine) (Owner, error) {
			return nil, fmt.Errorf("%s: strategy replace needs an owner controller (Kubernetes mode with Cluster API)", m.Name)
		}
	}
	l := newLedger(keepFinished)
	cfg.Journal = recorder{Store: cfg.Journal, l: l}
	met, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	h := &Hub{cfg: cfg, log: cfg.Log, assessor: NewAssessor(cfg.Inventory.Policy.Assess), metrics: met, inv: cfg.Inventory,
		assessments: map[string]Assessment{}, unhealthyAt: map[string]time.Time{}, healthyAt: map[string]time.Time{}, seenAt: map[string]time.Time{},
		running: map[string]*running{}, ledger: l, beginFailed: map[string]beginFailure{}, logins: newLogins(cfg.LoginBackoff), pauses: map[string]Brake{},
		waitingWhy: map[string]string{}, resumed: make(chan struct{})}
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(newHubCollector(h)); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// Run resumes what the journal says was in progress, then runs passes until ctx ends.
func (h *Hub) Run(ctx context.Context) error {
	h.mu.Lock()
	h.ctx, h.started = ctx, time.Now()
	h.mu.Unlock()
	if err := h.loadBrakes(ctx); err != nil {
		return err
	}
	if err := h.ledger.load(ctx, h.cfg.Journal, machineNames(h.inventory())); err != nil {
		return err
	}
	h.warmUp(ctx)
	h.waitLeading(ctx)
	if err := h.resume(ctx); err != nil {
		return err
	}
	t := time.NewTicker(h.cfg.Tick)
	defer t.Stop()
	for n := uint64(1); ; n++ {
		h.pass(ctx)
		h.mu.Lock()
		h.lastPass = time.Now()
		h.mu.Unlock()
		if h.cfg.AfterPass != nil {
			h.cfg.AfterPass(n)
		}
		select {
		case <-ctx.Done():
			h.mu.Lock()
			for _, r := range h.running {
				r.cancel()
			}
			h.mu.Unlock()
			return nil
		case <-t.C:
		}
	}
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

// EtcdQuorum is etcd's quorum as the hub's latest pass saw it.
type EtcdQuorum int

const (
	// QuorumUnknown: no recent pass, no majority of the expected observers, or no plan.
	QuorumUnknown EtcdQuorum = iota
	// QuorumLost: a majority heard, a plan made, fewer healthy voters than the quorum.
	QuorumLost
	// QuorumHeld: a majority heard, a plan made, the quorum held.
	QuorumHeld
)

// EtcdQuorum says how the latest pass, within maxPassGap of now, saw etcd's quorum, and what it saw:
// only a pass that heard a strict majority of the expected observers and planned knows. It is
// Kubernetes mode's test for degraded mode: a leader that loses the API server acts alone only when
// the majority shows that etcd cannot serve it, and stops starting anything once it shows quorum again.
func (h *Hub) EtcdQuorum(now time.Time) (EtcdQuorum, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch b := h.outcome.Budget; {
	case h.lastPass.IsZero() || now.Sub(h.lastPass) > maxPassGap:
		return QuorumUnknown, "no recent pass of the hub"
	case !h.hearing.Majority():
		return QuorumUnknown, h.hearing.String()
	case h.planErr != "" || b.Voters == 0:
		return QuorumUnknown, "not planning: " + h.planErr
	case b.QuorumLost():
		return QuorumLost, fmt.Sprintf("etcd: %s (%s)", b, h.hearing)
	default:
		return QuorumHeld, "etcd: " + b.String()
	}
}

// Inventory is the inventory in force.
func (h *Hub) Inventory() Inventory { return h.inventory() }

// Timeline returns what the hub did and decided, oldest first (bounded).
func (h *Hub) Timeline() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// Assessment returns the latest assessment of a machine.
func (h *Hub) Assessment(machine string) (Assessment, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a, ok := h.assessments[machine]
	return a, ok
}

// History returns a machine's remediations from the journal, oldest first.
func (h *Hub) History(ctx context.Context, machine string) ([]Remediation, error) {
	return h.cfg.Journal.History(ctx, machine)
}

// noticeHearing notices the hub losing the majority of its expected observers, and hearing one again
// after it had lost it (each once, when it changes).
func (h *Hub) noticeHearing() {
	h.mu.Lock()
	hearing, before := h.hearing, h.majorityNoticed
	now := hearing.Majority()
	h.majorityNoticed = &now
	h.mu.Unlock()
	switch {
	case !hearing.Majority() && (before == nil || *before):
		h.say(Notice{Reason: ReasonObserverMajorityLost, Message: hearing.NoMajority(), Warning: true})
	case hearing.Majority() && before != nil && !*before:
		h.say(Notice{Reason: ReasonObserverMajorityHeard, Message: hearing.String() + ": acting again"})
	}
}

// noticeWaits notices each machine the pass did not start, when why changes.
func (h *Hub) noticeWaits(out quorum.Outcome) {
	h.mu.Lock()
	var send []Notice
	decided := map[string]bool{}
	for _, d := range out.Decisions {
		decided[d.Machine] = true
	}
	for m := range h.waitingWhy {
		if !decided[m] { // healthy again: a later wait is news
			delete(h.waitingWhy, m)
		}
	}
	for _, d := range out.Decisions {
		if d.Start || d.InFlight || h.waitingWhy[d.Machine] == d.Reason {
			continue
		}
		h.waitingWhy[d.Machine] = d.Reason
		send = append(send, Notice{Machine: d.Machine, Reason: ReasonWaiting, Message: fmt.Sprintf("%s of %s not started: %s", d.Strategy, d.Machine, d.Reason), Warning: true})
	}
	h.mu.Unlock()
	for _, n := range send {
		h.say(n)
	}
}

// inventory is the inventory in force, its policy overridden where an override says (SetPolicyOverride).
func (h *Hub) inventory() Inventory {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.inventoryLocked()
}

func (h *Hub) inventoryLocked() Inventory {
	inv := h.inv
	inv.Policy = h.override.Apply(inv.Policy)
	return inv
}

func (h *Hub) observe() Observations {
	obs := Observations{Now: time.Now(), Reports: h.cfg.Gossip.Reports(), HubPeers: map[string]health.PeerView{}}
	for _, p := range h.cfg.Gossip.Peers() {
		obs.HubPeers[p.Name] = p
	}
	return obs
}

func refs(inv Inventory) []MachineRef {
	out := make([]MachineRef, len(inv.Machines))
	for i, m := range inv.Machines {
		out[i] = m.MachineRef
	}
	return out
}

// assess observes and judges every machine, and records verdict changes and which expected observers
// the hub hears.
func (h *Hub) assess(inv Inventory) (Observations, []Assessment, Hearing) {
	h.assessor.SetPolicy(inv.Policy.Assess)
	h.mu.Lock()
	last := h.lastPass
	h.mu.Unlock()
	if !last.IsZero() && time.Since(last) > maxPassGap {
		// Passes this far apart: the hub was not running (test/chaos seeds 96 and 100: a hub stopped
		// for 7 s power-cycled a member on its pre-stop view 0.1 s after it resumed; the member had
		// recovered meanwhile).
		h.assessor.HeardNothing()
	}
	obs := h.observe()
	machines := refs(inv)
	assessments, hearing := h.assessor.AssessHearing(machines, inv.Witnesses, obs)
	e := hearing.set
	if !slices.Equal(e.Agents, h.kept.Agents) || !slices.Equal(e.Witnesses, h.kept.Witnesses) {
		// Every expected observer the pool has lost is joined again for as long as it is expected, so
		// that after a partition all observers hear each other within seconds.
		h.cfg.Gossip.KeepJoined(append(slices.Clone(e.Agents), e.Witnesses...))
		h.kept = e
	}
	var changed []Assessment
	h.mu.Lock()
	h.hearing = hearing
	for _, a := range assessments {
		prev, seen := h.assessments[a.Machine]
		if !seen || prev.Verdict != a.Verdict {
			changed = append(changed, a)
			if a.Verdict == VerdictUnhealthy {
				h.unhealthyAt[a.Machine] = obs.Now
			}
		}
		if a.Verdict == VerdictHealthy {
			h.healthyAt[a.Machine] = obs.Now
		}
		if a.SeenAt.After(h.seenAt[a.Machine]) {
			h.seenAt[a.Machine] = a.SeenAt
		}
		h.assessments[a.Machine] = a
	}
	h.mu.Unlock()
	for _, a := range changed {
		msg := fmt.Sprintf("%s is %s", a.Machine, a.Verdict)
		if len(a.Reasons) > 0 {
			msg += ": " + strings.Join(a.Reasons, "; ")
		}
		h.say(Notice{Machine: a.Machine, Reason: Reason(a.Verdict), Message: msg, Warning: a.Verdict == VerdictUnhealthy})
	}
	return obs, assessments, hearing
}

// warmUp assesses, without planning or acting, until the agents' reports give a membership to plan
// with (at most StaleAfter): a restarted hub listens before it resumes or starts anything.
func (h *Hub) warmUp(ctx context.Context) {
	inv := h.inventory()
	deadline := time.Now().Add(inv.Policy.Assess.StaleAfter)
	for {
		obs, assessments, hearing := h.assess(inv)
		_, why := membershipOf(inv, obs, assessments, hearing, nil)
		if why == "" || time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.cfg.Tick):
		}
	}
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

// standby says why this hub must not act now, or "".
func (h *Hub) standby() string {
	if h.cfg.Standby == nil {
		return ""
	}
	return h.cfg.Standby()
}

// waitLeading assesses without acting (nothing resumed, nothing started) while this hub stands by.
func (h *Hub) waitLeading(ctx context.Context) {
	for {
		why := h.standby()
		if why == "" {
			return
		}
		h.assess(h.inventory())
		h.setPlanErr(why)
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.cfg.Tick):
		}
	}
}

// pass is one observe → decide → act round.
func (h *Hub) pass(ctx context.Context) {
	inv := h.inventory()
	obs, assessments, hearing := h.assess(inv)
	if why := h.standby(); why != "" {
		h.setPlanErr(why) // remediations it started before go on; nothing new starts
		return
	}
	h.noticeHearing()
	d := decide(h.facts(inv, obs, assessments, hearing))
	if d.quorumBack {
		// What was gathered while quorum was lost is judged again, from now, before anything is
		// decided on it (a survivor's "no leader" is stale the moment quorum is back).
		h.assessor.QuorumBack(obs.Now)
		h.mu.Lock()
		h.quorumLost = false
		h.mu.Unlock()
		h.say(Notice{Reason: ReasonQuorumBack, Message: "etcd's quorum is back: the evidence gathered while it was lost counts again from now"})
		obs, assessments, hearing = h.assess(inv)
		d = decide(h.facts(inv, obs, assessments, hearing))
	}
	if d.notPlanning != "" {
		h.setPlanErr(d.notPlanning)
		return
	}
	h.mu.Lock()
	h.outcome, h.cluster, h.planErr, h.needs = d.outcome, d.cluster, "", d.needs
	h.quorumLost = d.outcome.Budget.QuorumLost()
	h.mu.Unlock()
	h.noticeWaits(d.outcome)
	for _, s := range d.begin {
		h.beginDecided(ctx, s)
	}
	h.setHolding(strings.Join(d.held, "; "))
}

// facts snapshots what decide needs of the hub's own state.
func (h *Hub) facts(inv Inventory, obs Observations, assessments []Assessment, hearing Hearing) facts {
	f := facts{now: obs.Now, inv: inv, obs: obs, assessments: assessments, hearing: hearing, history: map[string][]past{},
		recentStarts: h.ledger.startsWithin(obs.Now, inv.Policy.RatePer)}
	h.mu.Lock()
	f.flights = h.flightsLocked()
	if h.isPaused() {
		f.paused = DescribeBrakes(h.pausedBy())
	}
	f.suspended, f.detached = h.brakes.Suspended != nil, h.brakes.Detached
	f.healthyAt, f.beginFailed, f.seenAt, f.quorumLost = h.healthyAt, h.beginFailed, h.seenAt, h.quorumLost
	h.mu.Unlock()
	for _, m := range inv.Machines {
		if why := h.logins.blocked(m, f.now); why != "" && m.Strategy != quorum.Replace {
			if f.loginWait == nil {
				f.loginWait = map[string]string{}
			}
			f.loginWait[m.Name] = why
		}
	}
	for _, a := range assessments {
		if _, inFlight := f.flights[a.Machine]; a.Verdict == VerdictUnhealthy && !inFlight {
			f.history[a.Machine] = h.ledger.of(a.Machine)
		}
	}
	return f
}

// flightsLocked snapshots the remediations under way (h.mu held).
func (h *Hub) flightsLocked() map[string]flight {
	out := make(map[string]flight, len(h.running))
	for name, r := range h.running {
		out[name] = flight{plan: r.plan, next: r.next, members: r.rem.Members}
	}
	return out
}

func machineNames(inv Inventory) []string {
	out := make([]string, len(inv.Machines))
	for i, m := range inv.Machines {
		out[i] = m.Name
	}
	return out
}

// inFlight lists the machines with a remediation running, each with its steps still to come, as the
// latest pass's membership tells them.
func (h *Hub) inFlight(inv Inventory) []quorum.Machine {
	h.mu.Lock()
	flights, cluster := h.flightsLocked(), h.cluster
	h.mu.Unlock()
	var out []quorum.Machine
	for _, m := range inv.Machines {
		if fl, ok := flights[m.Name]; ok {
			out = append(out, quorum.Machine{Name: m.Name, Member: m.Member, InFlight: true, Strategy: fl.plan.Strategy, Remaining: fl.stillToCome(cluster)})
		}
	}
	return out
}

// setHolding records what the pass held back; setPlanErr why it did not plan. Each is said only
// when it changes to something, not every pass.
func (h *Hub) setHolding(why string) { h.setNote(&h.holding, why, ReasonHolding, "holding: ") }
func (h *Hub) setPlanErr(why string) { h.setNote(&h.planErr, why, ReasonNotPlanning, "not planning: ") }

func (h *Hub) setNote(field *string, why string, reason Reason, prefix string) {
	h.mu.Lock()
	changed := *field != why
	*field = why
	h.mu.Unlock()
	if changed && why != "" {
		h.say(Notice{Reason: reason, Message: prefix + why})
	}
}

// beginDecided begins a remediation decide admitted. Only a remediation the journal accepted takes a
// slot of the rate limit (the ledger counts it): one that cannot begin is held and tried again after
// beginRetry, said once, and the others begin.
func (h *Hub) beginDecided(ctx context.Context, s toBegin) {
	_, err := h.begin(ctx, s.machine, s.rem, s.plan)
	h.mu.Lock()
	prev := h.beginFailed[s.machine.Name]
	if err == nil {
		delete(h.beginFailed, s.machine.Name)
	} else {
		h.beginFailed[s.machine.Name] = beginFailure{why: err.Error(), at: time.Now()}
	}
	h.mu.Unlock()
	if err != nil && prev.why != err.Error() {
		h.say(Notice{Machine: s.machine.Name, Reason: ReasonRemediationNotBegun, Warning: true,
			Message: fmt.Sprintf("cannot remediate %s: %v (trying again in %v)", s.machine.Name, err, beginRetry)})
	}
}

// begin journals a new remediation and executes it (one word for the act: begin = journal + execute).
func (h *Hub) begin(ctx context.Context, m Machine, rem Remediation, plan quorum.Plan) (Remediation, error) {
	act, err := h.actuator(m, plan.Strategy)
	if err != nil {
		return rem, err
	}
	rem, err = h.cfg.Journal.Begin(ctx, rem)
	if err != nil {
		return rem, fmt.Errorf("the journal refused it: %w", err)
	}
	h.execute(ctx, m, rem, plan, act, false)
	return rem, nil
}

// newMemberSuffix names the replacement's etcd member in a plan: the owner picks the real name.
const newMemberSuffix = "-replacement"

// actuator is what carries out a machine's plan: its BMC, or for a replace its owner controller.
type actuator struct {
	power Power
	owner Owner
}

func (h *Hub) actuator(m Machine, s quorum.Strategy) (actuator, error) {
	if s == quorum.Replace {
		owner, err := h.cfg.OwnerFor(m)
		return actuator{owner: owner}, err
	}
	power, err := h.cfg.PowerFor(m)
	if err != nil {
		return actuator{}, err
	}
	return actuator{power: h.logins.guard(m, power)}, nil
}

// machinePlan is the plan for a machine that is not an etcd member: no quorum to keep, only its pool's
// limits (applied by the planner).
func machinePlan(s quorum.Strategy, m Machine) quorum.Plan {
	name := m.Name
	switch s {
	case quorum.Fence:
		return quorum.Plan{Strategy: s, Member: name, Steps: []quorum.Step{{Op: quorum.OpPowerOff, Member: name}}}
	case quorum.Replace: // the owner makes a new machine and removes this one, in the order it prefers
		if len(m.Replace.Orders) > 0 && m.Replace.Orders[0] == quorum.ScaleUpFirst {
			return quorum.Plan{Strategy: s, Member: name, Shape: quorum.Shape{Order: quorum.ScaleUpFirst, Join: quorum.JoinAsVoter},
				Steps: quorum.Shape{Order: quorum.ScaleUpFirst, Join: quorum.JoinAsVoter}.Steps(name, name+newMemberSuffix)}
		}
		return quorum.Plan{Strategy: s, Member: name, Steps: []quorum.Step{{Op: quorum.OpRemove, Member: name}}}
	}
	return quorum.Plan{Strategy: s, Member: name, Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: name}, {Op: quorum.OpAwaitHealthy, Member: name}}}
}

// execute runs a remediation in its own goroutine: a new one from its first step, or one found in
// progress in the journal (resuming), which first finds out where it stands (Executor.Resume: the BMC
// and the machine are read before anything is repeated). Resuming runs there too, not before the
// passes: one machine's wait for evidence of a reset must not hold up every other machine.
func (h *Hub) execute(ctx context.Context, m Machine, rem Remediation, plan quorum.Plan, act actuator, resuming bool) {
	rctx, cancel := context.WithCancel(ctx)
	from := 0
	if resuming {
		from = nextStep(rem)
		if p, ok := rem.Pending(); ok {
			from = p.Step
		}
	}
	h.mu.Lock()
	r := &running{rem: rem, plan: plan, next: from, cancel: cancel}
	h.running[m.Name] = r
	detected := h.unhealthyAt[m.Name]
	h.mu.Unlock()
	how := rem.Strategy
	if rem.Hard {
		how += ", hard"
	}
	if rem.Forced {
		how += ", forced"
	}
	if !resuming {
		h.say(Notice{Machine: m.Name, Reason: ReasonRemediationStarted, Remediation: rem.ID,
			Message: fmt.Sprintf("%s: remediation %s started (%s, requested by %s): %s", m.Name, rem.ID, how, rem.RequestedBy, quorum.StepList(rem.Steps))})
	}
	h.mu.Lock()
	delete(h.waitingWhy, m.Name)
	h.mu.Unlock()
	acted := false
	policy := h.inventory().Policy
	exec := &Executor{Journal: h.cfg.Journal, Policy: policy.Quorum, Log: h.log, RecoveryTimeout: policy.RecoveryTimeout,
		Hard: rem.Hard, Force: rem.Forced, Live: h.live, Barrier: h.freshBarrier, Gate: h.gate(m.Name), Owner: act.owner, NotAMember: m.Member == "",
		Wanted: h.wanted(m, rem),
		BeforeAct: func(step quorum.Step) {
			if !acted && rem.RequestedBy == "hub" && from == 0 && !detected.IsZero() {
				h.metrics.detectionToAction(time.Since(detected))
			}
			acted = true
		},
		Progress: func(i int) {
			h.mu.Lock()
			r.next = i
			h.mu.Unlock()
		},
		Trouble: h.journalTrouble(m.Name, rem.ID, r),
		Checkpoint: func(step quorum.Step, outcome string) {
			h.mu.Lock()
			r.busy = false
			h.mu.Unlock()
			h.say(Notice{Machine: m.Name, Reason: ReasonStepDone, Remediation: rem.ID, Message: fmt.Sprintf("%s: remediation %s: %s: %s", m.Name, rem.ID, step, outcome)})
		},
		ResetEvidence: h.resetEvidence(m), ResetWindow: cmp.Or(h.cfg.BMC.GracefulTimeout, 2*time.Minute) + 30*time.Second}
	go func() {
		defer cancel()
		var err error
		if resuming {
			from, err = h.resumeAt(rctx, m, rem, plan, act, exec, r)
		}
		if err == nil {
			err = exec.Run(rctx, rem, plan, from, act.power, h.recovered(m, rem))
		}
		h.mu.Lock()
		delete(h.running, m.Name)
		stopping := ctx.Err() != nil
		h.mu.Unlock()
		switch {
		case stopping:
			h.say(Notice{Machine: m.Name, Reason: ReasonRemediationStopped, Remediation: rem.ID,
				Message: fmt.Sprintf("%s: remediation %s interrupted by the hub stopping; the next hub resumes it", m.Name, rem.ID)})
		case err != nil:
			h.metrics.remediation(rem, "failed")
			h.say(Notice{Machine: m.Name, Reason: ReasonRemediationFailed, Remediation: rem.ID, Warning: true,
				Message: fmt.Sprintf("%s: remediation %s ended: %v", m.Name, rem.ID, err)})
		default:
			h.metrics.remediation(rem, "succeeded")
			h.say(Notice{Machine: m.Name, Reason: ReasonRemediated, Remediation: rem.ID,
				Message: fmt.Sprintf("%s: remediation %s succeeded: the machine is back (%s)", m.Name, rem.ID, quorum.StepList(rem.Steps))})
		}
	}()
}

// resumeAt finds where a remediation found in progress goes on (Executor.Resume). Until it knows, the
// remediation holds its machine: a BMC that cannot be read now (unreachable, refusing the
// credentials) is read again every resumeRetry, said once, and nothing is repeated on a guess.
func (h *Hub) resumeAt(ctx context.Context, m Machine, rem Remediation, plan quorum.Plan, act actuator, exec *Executor, r *running) (int, error) {
	h.setWaiting(r, fmt.Sprintf("resuming after a hub restart: reading the BMC and the machine before anything else (a reset sent without a recorded outcome may take up to %v to show)", exec.ResetWindow))
	defer h.setWaiting(r, "")
	said := ""
	for {
		from, err := exec.Resume(ctx, rem, plan, act.power, h.recovered(m, rem))
		if err == nil {
			h.say(Notice{Machine: m.Name, Reason: ReasonResumed, Remediation: rem.ID,
				Message: fmt.Sprintf("%s: resuming remediation %s at step %d after a restart", m.Name, rem.ID, from)})
			h.mu.Lock()
			r.next = from
			h.mu.Unlock()
			return from, nil
		}
		if ctx.Err() != nil || errors.Is(err, ErrStaleEpoch) {
			return 0, err
		}
		if err.Error() != said {
			said = err.Error()
			h.setWaiting(r, fmt.Sprintf("cannot resume yet: %v (trying again every %v; nothing is repeated without knowing)", err, resumeRetry))
			h.say(Notice{Machine: m.Name, Reason: ReasonResumeWaiting, Remediation: rem.ID, Warning: true,
				Message: fmt.Sprintf("%s: remediation %s cannot resume yet: %v (trying again every %v)", m.Name, rem.ID, err, resumeRetry)})
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(resumeRetry):
		}
	}
}

const resumeRetry = 5 * time.Second

func (h *Hub) setWaiting(r *running, why string) {
	h.mu.Lock()
	r.waiting = why
	h.mu.Unlock()
}

// journalTrouble is an executor's Trouble: a journal write that fails is said (event, Warning,
// `hub status`) once, and again when it went in; the remediation holds its machine meanwhile.
func (h *Hub) journalTrouble(machine, id string, r *running) func(error) {
	return func(err error) {
		if err == nil {
			h.setWaiting(r, "")
			h.say(Notice{Machine: machine, Reason: ReasonJournalWriteRecorded, Remediation: id,
				Message: fmt.Sprintf("%s: remediation %s: the journal accepted the write it refused before; going on", machine, id)})
			return
		}
		h.setWaiting(r, fmt.Sprintf("the journal refuses a write: %v (retrying until it is recorded)", err))
		h.say(Notice{Machine: machine, Reason: ReasonJournalWriteFailing, Remediation: id, Warning: true,
			Message: fmt.Sprintf("%s: remediation %s: the journal refuses a write (%v): retrying until it is recorded; %s stays in flight meanwhile", machine, id, err, machine)})
	}
}

// live gives the executor the membership as it is now, remediations in flight marked (the Executor
// clears its own member's mark: the step it is about to take is what disrupts it).
func (h *Hub) live(context.Context) (quorum.Cluster, error) {
	// Fresh reports for the membership; the latest pass's assessments for each member's health (the
	// assessor belongs to the pass loop).
	h.mu.Lock()
	assessments := make([]Assessment, 0, len(h.assessments))
	for _, a := range h.assessments {
		assessments = append(assessments, a)
	}
	inv, flights := h.inventoryLocked(), h.flightsLocked()
	h.mu.Unlock()
	obs := h.observe()
	c, why := membershipOf(inv, obs, assessments, Hear(ExpectedOf(refs(inv), inv.Witnesses), obs, inv.Policy.Assess.StaleAfter), flights)
	if why != "" {
		return c, fmt.Errorf("%s", why)
	}
	return c, nil
}

// freshBarrier waits until a strict majority of the etcd judges (the agents of etcd members and the
// witnesses), alive in the hub's view, have reported again since it was called: what a step that
// disrupts a healthy voter is checked against after it. Reports stay fresh for StaleAfter, so a
// partition a few seconds old still looks like a working quorum; new reports from a majority prove
// the hub still hears one. Versions, not send times, tell new from old (the agents' clocks may
// differ from the hub's). It gives up after StaleAfter.
func (h *Hub) freshBarrier(ctx context.Context) error {
	h.mu.Lock()
	e, wait := h.hearing.set, h.inventoryLocked().Policy.Assess.StaleAfter
	h.mu.Unlock()
	before := h.cfg.Gossip.Reports()
	need := e.Judges()/2 + 1
	deadline := time.Now().Add(wait)
	for {
		now, alive := h.cfg.Gossip.Reports(), map[string]bool{}
		for _, p := range h.cfg.Gossip.Peers() {
			alive[p.Name] = p.State == health.PeerAlive
		}
		n := 0
		for _, node := range e.judgeNodes {
			if r, ok := now[node]; ok && alive[node] && r.Etcd != nil && r.Version > before[node].Version {
				n++
			}
		}
		if n >= need {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of the %d agents of etcd members and witnesses reported within %v (%d needed): "+
				"what the quorum check relied on cannot be confirmed now (a partition may have begun)", n, e.Judges(), wait, need)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// wanted is an Executor's Wanted: one of the hub's own remediations is wanted while the machine has
// not been judged Healthy again (an operator's reboot is wanted whatever the verdict).
func (h *Hub) wanted(m Machine, rem Remediation) func() error {
	return func() error {
		if a, ok := h.Assessment(m.Name); ok && rem.RequestedBy == "hub" && a.Verdict == VerdictHealthy {
			return fmt.Errorf("%s is Healthy again since it was found Unhealthy: its remediation is no longer wanted", m.Name)
		}
		return nil
	}
}

// recovered: the machine's agent restarted since the remediation began (a report from an agent
// started later than the one before), is alive in the hub's view and not Unhealthy, and for an etcd
// member, the member is healthy. Without the restart, a machine the hub has not yet seen go down
// would count as back the moment it was rebooted.
func (h *Hub) recovered(m Machine, rem Remediation) Recovered {
	return func(context.Context) bool {
		a, ok := h.Assessment(m.Name)
		if !ok || a.Verdict == VerdictUnhealthy {
			return false
		}
		if r, ok := h.cfg.Gossip.Reports()[m.Node]; !ok || !r.Started.After(rem.AgentStarted) {
			return false
		}
		pv, alive := h.observePeer(m.Node)
		if !alive || pv.State != health.PeerAlive {
			return false
		}
		return m.Member == "" || a.EtcdHealth == quorum.Healthy
	}
}

// resetEvidence says whether machine m shows it was reset after since, other than through its BMC:
// its agent restarted after it, or the hub or another observer saw it go down after it.
func (h *Hub) resetEvidence(m Machine) func(context.Context, time.Time) (bool, string) {
	return func(_ context.Context, since time.Time) (bool, string) {
		reports := h.cfg.Gossip.Reports()
		if r, ok := reports[m.Node]; ok && r.Started.After(since) {
			return true, fmt.Sprintf("its agent restarted at %s, after the intent", r.Started.UTC().Format(time.RFC3339Nano))
		}
		if pv, ok := h.observePeer(m.Node); ok && pv.State != health.PeerAlive && pv.Since.After(since) {
			return true, fmt.Sprintf("the hub saw it go down at %s, after the intent", pv.Since.UTC().Format(time.RFC3339Nano))
		}
		for _, node := range slices.Sorted(maps.Keys(reports)) {
			for _, p := range reports[node].Peers {
				if node != m.Node && p.Name == m.Node && p.State != health.PeerAlive && p.Since.After(since) {
					return true, fmt.Sprintf("%s saw it go down at %s, after the intent", node, p.Since.UTC().Format(time.RFC3339Nano))
				}
			}
		}
		return false, ""
	}
}

func (h *Hub) observePeer(node string) (health.PeerView, bool) {
	for _, p := range h.cfg.Gossip.Peers() {
		if p.Name == node {
			return p, true
		}
	}
	return health.PeerView{}, false
}

func (inv Inventory) machine(name string) (Machine, bool) {
	for _, m := range inv.Machines {
		if m.Name == name {
			return m, true
		}
	}
	return Machine{}, false
}

// resume picks up every remediation the journal says is in progress.
func (h *Hub) resume(ctx context.Context) error {
	active, err := h.cfg.Journal.Active(ctx)
	if err != nil {
		return err
	}
	inv := h.inventory()
	for _, rem := range active {
		m, ok := inv.machine(rem.Machine)
		why := "the machine is no longer in the inventory"
		plan, err := planOf(rem)
		if err != nil {
			why = err.Error()
		}
		if !ok || err != nil {
			if err := persist(ctx, nil, func(ctx context.Context) error { return h.cfg.Journal.Finish(ctx, rem.ID, Aborted, why) }); err != nil && !errors.Is(err, ErrFinished) {
				return fmt.Errorf("ending remediation %s (%s): %w", rem.ID, why, err)
			}
			continue
		}
		act, err := h.actuator(m, plan.Strategy)
		if err != nil {
			return fmt.Errorf("resuming %s: %w", rem.ID, err)
		}
		h.execute(ctx, m, rem, plan, act, true)
	}
	return nil
}
