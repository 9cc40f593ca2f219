package hub

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/quorum"
)

// Config configures a hub.
type Config struct {
	Inventory Inventory
	// Gossip is the hub's own membership of the agents' pool.
	Gossip  *health.Gossip
	Journal *Journal
	Log     *slog.Logger
	// Tick is the time between passes (default 200 ms).
	Tick time.Duration
	// PowerFor returns a machine's BMC controller (default: bmc.New from the inventory).
	PowerFor func(Machine) (Power, error)
	// RecoveryTimeout bounds how long a remediated machine may take to come back (default 10 min).
	RecoveryTimeout time.Duration
}

// Hub runs the pipeline: observe, assess, plan, act, record. Only one goroutine runs passes; each
// remediation runs in its own goroutine through an Executor.
type Hub struct {
	cfg      Config
	log      *slog.Logger
	assessor *Assessor

	mu          sync.Mutex
	assessments map[string]Assessment
	outcome     quorum.Outcome
	planErr     string
	running     map[string]*running
	starts      []time.Time
	recoveredAt map[string]time.Time
	events      []string
	paused      bool
	suspended   bool
	detached    map[string]bool
	resumed     chan struct{} // closed and replaced when the hub is resumed
}

type running struct {
	rem    Remediation
	cancel context.CancelFunc
	// busy: between a checkpoint and the end of an irreversible step (a BMC call in progress).
	busy bool
}

// PauseState is what `hub status` says about pausing.
type PauseState string

// Pause states: Pausing lasts until every remediation in flight has reached a safe checkpoint.
const (
	Running PauseState = "Running"
	Pausing PauseState = "Pausing"
	Paused  PauseState = "Paused"
)

// SetPaused pauses (no new step starts; steps in progress finish) or resumes the hub.
func (h *Hub) SetPaused(p bool) {
	h.mu.Lock()
	changed := h.paused != p
	h.paused = p
	if changed && !p {
		close(h.resumed)
		h.resumed = make(chan struct{})
	}
	h.mu.Unlock()
	if changed {
		h.event("paused: %v", p)
	}
}

// PauseState says whether the pause is acknowledged: Paused only once no remediation is inside an
// irreversible step.
func (h *Hub) PauseState() PauseState {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.paused {
		return Running
	}
	for _, r := range h.running {
		if r.busy {
			return Pausing
		}
	}
	return Paused
}

// SetSuspended makes the hub observe-only: everything is assessed and planned and what it would start
// is logged, but nothing is executed.
func (h *Hub) SetSuspended(s bool) {
	h.mu.Lock()
	changed := h.suspended != s
	h.suspended = s
	h.mu.Unlock()
	if changed {
		h.event("suspended: %v", s)
	}
}

// SetDetached detaches a machine (no probe-driven action and no BMC call for it) or attaches it again.
func (h *Hub) SetDetached(machine string, d bool) error {
	if _, ok := h.machine(machine); !ok {
		return fmt.Errorf("no machine %q in the inventory", machine)
	}
	h.mu.Lock()
	h.detached[machine] = d
	h.mu.Unlock()
	h.event("%s detached: %v", machine, d)
	return nil
}

// gate is the executors' checkpoint: it marks the remediation busy for the step that follows, or
// holds it while the hub is paused.
func (h *Hub) gate(machine string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		for {
			h.mu.Lock()
			r := h.running[machine]
			if r != nil {
				r.busy = false
			}
			if !h.paused {
				if r != nil {
					r.busy = true
				}
				h.mu.Unlock()
				return nil
			}
			wait := h.resumed
			h.mu.Unlock()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-wait:
			}
		}
	}
}

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
		cfg.PowerFor = func(m Machine) (Power, error) {
			return bmc.New(m.Endpoint, m.Credentials, bmc.Options{CAFile: m.CAFile, Insecure: m.Insecure, Logger: cfg.Log})
		}
	}
	return &Hub{cfg: cfg, log: cfg.Log, assessor: NewAssessor(cfg.Inventory.Policy.Assess),
		assessments: map[string]Assessment{}, running: map[string]*running{}, recoveredAt: map[string]time.Time{},
		detached: map[string]bool{}, resumed: make(chan struct{})}, nil
}

// Run resumes what the journal says was in progress, then runs passes until ctx ends.
func (h *Hub) Run(ctx context.Context) error {
	if err := h.resume(ctx); err != nil {
		return err
	}
	t := time.NewTicker(h.cfg.Tick)
	defer t.Stop()
	for {
		h.pass(ctx)
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

// Events returns what the hub did and decided, oldest first (bounded).
func (h *Hub) Events() []string {
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

func (h *Hub) event(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.log.Info(msg)
	h.mu.Lock()
	h.events = append(h.events, time.Now().UTC().Format("15:04:05.000")+" "+msg)
	if len(h.events) > 1000 {
		h.events = h.events[len(h.events)-1000:]
	}
	h.mu.Unlock()
}

func (h *Hub) observe() Observations {
	obs := Observations{Now: time.Now(), Reports: h.cfg.Gossip.Reports(), HubPeers: map[string]health.PeerView{}}
	for _, p := range h.cfg.Gossip.Peers() {
		obs.HubPeers[p.Name] = p
	}
	return obs
}

func (h *Hub) refs() []MachineRef {
	out := make([]MachineRef, len(h.cfg.Inventory.Machines))
	for i, m := range h.cfg.Inventory.Machines {
		out[i] = m.MachineRef
	}
	return out
}

// pass is one observe → assess → plan → act round.
func (h *Hub) pass(ctx context.Context) {
	obs := h.observe()
	assessments := h.assessor.Assess(h.refs(), obs)
	var changed []Assessment
	h.mu.Lock()
	for _, a := range assessments {
		if prev, seen := h.assessments[a.Machine]; !seen || prev.Verdict != a.Verdict {
			changed = append(changed, a)
		}
		h.assessments[a.Machine] = a
	}
	h.mu.Unlock()
	for _, a := range changed {
		if len(a.Reasons) == 0 {
			h.event("%s is %s", a.Machine, a.Verdict)
		} else {
			h.event("%s is %s: %s", a.Machine, a.Verdict, strings.Join(a.Reasons, "; "))
		}
	}

	cluster, why := h.membership(obs, assessments)
	if why != "" {
		h.setPlanErr(why)
		return
	}
	in := quorum.Input{Cluster: cluster, Policy: h.cfg.Inventory.Policy.Quorum}
	h.mu.Lock()
	for _, m := range h.cfg.Inventory.Machines {
		a := h.assessments[m.Name]
		_, inFlight := h.running[m.Name]
		in.Machines = append(in.Machines, quorum.Machine{Name: m.Name, Member: m.Member, Pool: m.Pool, Strategy: m.Strategy,
			Unhealthy: a.Verdict == Unhealthy, Since: a.Since, InFlight: inFlight})
	}
	h.mu.Unlock()
	out, err := quorum.PlanPass(in)
	if err != nil {
		h.setPlanErr(err.Error())
		return
	}
	h.mu.Lock()
	h.outcome, h.planErr = out, ""
	h.mu.Unlock()
	for _, d := range out.Started() {
		h.start(ctx, d)
	}
}

func (h *Hub) setPlanErr(why string) {
	h.mu.Lock()
	changed := h.planErr != why
	h.planErr = why
	h.mu.Unlock()
	if changed {
		h.event("not planning: %s", why)
	}
}

// membership builds the cluster the planner sees: the membership a majority of fresh agent views
// agree on, each member's health from the assessments, in-flight remediations marked. When the views
// disagree it returns why instead.
func (h *Hub) membership(obs Observations, assessments []Assessment) (quorum.Cluster, string) {
	votes := map[string]int{}
	lists := map[string][]health.EtcdMember{}
	total := 0
	for node, r := range obs.Reports {
		if pv, ok := obs.HubPeers[node]; !ok || pv.State != health.PeerAlive || r.Etcd == nil || len(r.Etcd.Members) == 0 ||
			obs.Now.Sub(r.SentAt) > h.cfg.Inventory.Policy.Assess.StaleAfter {
			continue
		}
		var keys []string
		for _, m := range r.Etcd.Members {
			keys = append(keys, fmt.Sprintf("%s:%v", m.Name, m.Learner))
		}
		slices.Sort(keys)
		k := strings.Join(keys, ",")
		votes[k]++
		lists[k] = r.Etcd.Members
		total++
	}
	best, n := "", 0
	for k, v := range votes {
		if v > n {
			best, n = k, v
		}
	}
	if total == 0 {
		return quorum.Cluster{}, "no fresh etcd view from any agent: waiting"
	}
	if 2*n <= total {
		return quorum.Cluster{}, fmt.Sprintf("agents disagree on the etcd membership (%d views, the most common held by %d): waiting", total, n)
	}
	healthOf := map[string]quorum.Health{}
	member := map[string]string{}
	for _, m := range h.cfg.Inventory.Machines {
		member[m.Member] = m.Name
	}
	for _, a := range assessments {
		healthOf[a.Machine] = a.EtcdHealth
	}
	var c quorum.Cluster
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, em := range lists[best] {
		m := quorum.Member{Name: em.Name, Learner: em.Learner, Health: quorum.HealthUnknown}
		if machine, ok := member[em.Name]; ok {
			m.Health = healthOf[machine]
			if _, inFlight := h.running[machine]; inFlight {
				m.Disruption = quorum.InFlight
			}
		}
		c.Members = append(c.Members, m)
	}
	return c, ""
}

// start begins a remediation the planner admitted, after the hub's own brakes: cooldown and rate limit.
func (h *Hub) start(ctx context.Context, d quorum.Decision) {
	m, ok := h.machine(d.Machine)
	if !ok {
		return
	}
	now := time.Now()
	p := h.cfg.Inventory.Policy
	h.mu.Lock()
	paused, suspended, detached := h.paused, h.suspended, h.detached[m.Name]
	if t, ok := h.recoveredAt[m.Name]; ok && now.Sub(t) < p.Cooldown || paused || detached {
		h.mu.Unlock()
		return
	}
	if suspended {
		h.mu.Unlock()
		h.setPlanErr(fmt.Sprintf("suspended: would start %s of %s (%s): %s", d.Strategy, m.Name, d.Reason, d.Plan.StepList()))
		return
	}
	h.starts = slices.DeleteFunc(h.starts, func(t time.Time) bool { return now.Sub(t) > p.RatePer })
	if len(h.starts) >= p.RateMax {
		h.mu.Unlock()
		h.setPlanErr(fmt.Sprintf("rate limit: %d remediations started in the last %v (max %d): holding %s to stop a remediation storm",
			len(h.starts), p.RatePer, p.RateMax, m.Name))
		return
	}
	h.starts = append(h.starts, now)
	h.mu.Unlock()

	power, err := h.cfg.PowerFor(m)
	if err != nil {
		h.event("cannot remediate %s: %v", m.Name, err)
		return
	}
	plan := d.Plan
	if len(plan.Steps) == 0 { // not an etcd member: the machine-level steps
		plan = machinePlan(d.Strategy, m.Name)
	}
	rem, err := h.cfg.Journal.Begin(Remediation{Machine: m.Name, Strategy: d.Strategy.String(), RequestedBy: "hub",
		Reason: d.Reason, Steps: plan.StepStrings()})
	if err != nil {
		h.event("cannot remediate %s: %v", m.Name, err)
		return
	}
	h.launch(ctx, m, rem, plan, 0, power)
}

func machinePlan(s quorum.Strategy, name string) quorum.Plan {
	if s == quorum.Fence {
		return quorum.Plan{Strategy: s, Member: name, Steps: []quorum.Step{{Op: quorum.OpPowerOff, Member: name}}}
	}
	return quorum.Plan{Strategy: s, Member: name, Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: name}, {Op: quorum.OpAwaitHealthy, Member: name}}}
}

func (h *Hub) launch(ctx context.Context, m Machine, rem Remediation, plan quorum.Plan, from int, power Power) {
	rctx, cancel := context.WithCancel(ctx)
	h.mu.Lock()
	h.running[m.Name] = &running{rem: rem, cancel: cancel}
	h.mu.Unlock()
	h.event("%s: remediation %s started (%s): %s", m.Name, rem.ID, rem.Strategy, strings.Join(rem.Steps, " → "))
	exec := &Executor{Journal: h.cfg.Journal, Policy: h.cfg.Inventory.Policy.Quorum, Log: h.log, RecoveryTimeout: h.cfg.RecoveryTimeout,
		Live: h.live(m.Name), Gate: h.gate(m.Name), Checkpoint: func() {
			h.mu.Lock()
			if r := h.running[m.Name]; r != nil {
				r.busy = false
			}
			h.mu.Unlock()
		}}
	go func() {
		defer cancel()
		err := exec.Run(rctx, rem, plan, from, power, h.recovered(m))
		h.mu.Lock()
		delete(h.running, m.Name)
		if err == nil {
			h.recoveredAt[m.Name] = time.Now()
		}
		h.mu.Unlock()
		if err != nil {
			h.event("%s: remediation %s ended: %v", m.Name, rem.ID, err)
		} else {
			h.event("%s: remediation %s succeeded: the machine is back", m.Name, rem.ID)
		}
	}()
}

// live gives the executor the membership as it is now, this remediation's own member not yet counted
// as disrupted by itself (the Executor clears its own InFlight mark).
func (h *Hub) live(machine string) Live {
	return func(context.Context) (quorum.Cluster, error) {
		// Fresh reports for the membership; the latest pass's assessments for each member's health (the
		// assessor belongs to the pass loop).
		h.mu.Lock()
		assessments := make([]Assessment, 0, len(h.assessments))
		for _, a := range h.assessments {
			assessments = append(assessments, a)
		}
		h.mu.Unlock()
		c, why := h.membership(h.observe(), assessments)
		if why != "" {
			return c, fmt.Errorf("%s", why)
		}
		return c, nil
	}
}

// recovered: the machine's agent is alive in the hub's view with a fresh report, and for an etcd
// member, the member is healthy.
func (h *Hub) recovered(m Machine) Recovered {
	return func(context.Context) bool {
		a, ok := h.Assessment(m.Name)
		if !ok || a.Verdict == Unhealthy {
			return false
		}
		pv, alive := h.observePeer(m.Node)
		if !alive || pv.State != health.PeerAlive {
			return false
		}
		return m.Member == "" || a.EtcdHealth == quorum.Healthy
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

func (h *Hub) machine(name string) (Machine, bool) {
	for _, m := range h.cfg.Inventory.Machines {
		if m.Name == name {
			return m, true
		}
	}
	return Machine{}, false
}

// resume picks up every remediation the journal says is in progress.
func (h *Hub) resume(ctx context.Context) error {
	active, err := h.cfg.Journal.Active()
	if err != nil {
		return err
	}
	for _, rem := range active {
		m, ok := h.machine(rem.Machine)
		if !ok {
			_ = h.cfg.Journal.Finish(rem.ID, Aborted, "the machine is no longer in the inventory")
			continue
		}
		plan, err := planFromSteps(rem.Strategy, rem.Steps)
		if err != nil {
			_ = h.cfg.Journal.Finish(rem.ID, Aborted, err.Error())
			continue
		}
		power, err := h.cfg.PowerFor(m)
		if err != nil {
			return fmt.Errorf("resuming %s: %w", rem.ID, err)
		}
		exec := &Executor{Journal: h.cfg.Journal, Policy: h.cfg.Inventory.Policy.Quorum, Log: h.log}
		from, err := exec.Resume(ctx, rem, plan, power, h.recovered(m))
		if err != nil {
			return err
		}
		h.event("%s: resuming remediation %s at step %d after a restart", m.Name, rem.ID, from)
		h.launch(ctx, m, rem, plan, from, power)
	}
	return nil
}
