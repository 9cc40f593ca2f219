package hub

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// Status is what `hub status` shows: the hub's brakes, the etcd budget and every machine.
type Status struct {
	Cluster string     `json:"cluster"`
	Time    time.Time  `json:"time"`
	Epoch   uint64     `json:"epoch"`
	Pause   PauseState `json:"pause"`
	// PausedBy lists every pause in force (any one holds): who, why, since when.
	PausedBy  []pass.Brake `json:"pausedBy,omitempty"`
	Suspended bool         `json:"suspended"`
	// Degraded says why the hub acts without the API server (Kubernetes mode's degraded mode), and
	// with what: empty when it does not.
	Degraded string `json:"degraded,omitempty"`
	// SuspendedBy says who made the hub observe-only, why and since when.
	SuspendedBy *pass.Brake `json:"suspendedBy,omitempty"`
	// NotPlanning says why the latest pass did not plan (agents disagree, suspended would-do, rate
	// limit); empty when it planned.
	NotPlanning string `json:"notPlanning,omitempty"`
	// Holding says what the latest pass would have started but held back (paused, suspended, rate
	// limit).
	Holding string         `json:"holding,omitempty"`
	Budget  *quorum.Budget `json:"budget,omitempty"`
	// QuorumLoss says which voters etcd's lost quorum lacks and whether they are lost for good (absent
	// while quorum holds).
	QuorumLoss *pass.QuorumLoss `json:"quorumLoss,omitempty"`
	// RaftMark is the highest raft index a member has reported to the hub (or the journal held when
	// the hub started): what a recovery after a permanent loss of quorum is checked against.
	RaftMark *pass.RaftMark `json:"raftMark,omitempty"`
	// Observers says how many of the expected observers the hub hears: it acts only on a strict
	// majority.
	Observers ObserversStatus `json:"observers"`
	// Policy is the policy in force.
	Policy   inventory.EffectivePolicy `json:"policy"`
	Machines []MachineStatus           `json:"machines"`
}

// ObserversStatus is the expected observer set as the hub hears it.
type ObserversStatus struct {
	Expected int      `json:"expected"`
	Heard    []string `json:"heard"`
	Missing  []string `json:"missing,omitempty"`
	Majority bool     `json:"majority"`
}

// MachineStatus is one machine's line of `hub status`.
type MachineStatus struct {
	Name   string `json:"name"`
	Node   string `json:"node"`
	Member string `json:"member,omitempty"`
	// Role: voter or learner in the membership the hub plans with, "absent" when the member is not in
	// it, empty for a machine that is not an etcd member.
	Role       string         `json:"role,omitempty"`
	EtcdHealth string         `json:"etcdHealth,omitempty"`
	Verdict    assess.Verdict `json:"verdict"`
	Since      time.Time      `json:"since,omitzero"`
	Reasons    []string       `json:"reasons,omitempty"`
	Detached   bool           `json:"detached,omitempty"`
	DetachedBy *pass.Brake    `json:"detachedBy,omitempty"`
	Decision   string         `json:"decision,omitempty"`
	// NeedsOperator: the hub will not heal this Unhealthy machine again by itself (given up, flapping,
	// fenced); Decision says what to do.
	NeedsOperator pass.OperatorNeed `json:"needsOperator,omitempty"`
	Remediation   *InFlight         `json:"remediation,omitempty"`
	// BMCLogin says why the hub makes no login to the machine's BMC now: its account refused the
	// credentials, and the hub waits before it tries again so that the account does not lock.
	BMCLogin string `json:"bmcLogin,omitempty"`
	// BMC is what the last readiness check of its BMC found (none yet, or no BMC: absent).
	BMC *pass.BMCReadiness `json:"bmc,omitempty"`
	// OutOfService, when set, says why its Node carries the out-of-service taint Hale put on
	// (Kubernetes mode, policy.outOfServiceAfter).
	OutOfService string `json:"outOfService,omitempty"`
	// PlannedWork, when set, is the planned work under way on it (policy.plannedWork: a cordon, a
	// rollout, a NodeMaintenance, a kubeadm upgrade): the hub starts nothing on it meanwhile, whatever
	// its verdict.
	PlannedWork string `json:"plannedWork,omitempty"`
}

// InFlight is a remediation in flight, as `hub status` shows it.
type InFlight struct {
	ID          string        `json:"id"`
	Strategy    string        `json:"strategy"`
	RequestedBy string        `json:"requestedBy"`
	Steps       []quorum.Step `json:"steps"`
	// Step is the index of the step under way (len(Steps) when all are done).
	Step int `json:"step"`
	// Busy: inside an irreversible step (a BMC call): a pause waits for it.
	Busy    bool `json:"busy"`
	Hard    bool `json:"hard,omitempty"`
	Forced  bool `json:"forced,omitempty"`
	Attempt int  `json:"attempt,omitempty"`
	// Stalled says why the remediation cannot go on right now: the journal refuses a write (retried
	// until it is in), or, resumed after a hub restart, it reads the BMC and the machine before
	// anything else. The machine stays in flight meanwhile.
	Stalled string `json:"stalled,omitempty"`
}

// Status returns the hub's status now.
func (h *Hub) Status(ctx context.Context) Status {
	h.mu.Lock()
	v := h.view
	st := Status{Cluster: h.inv.Cluster, Time: time.Now(), Epoch: h.cfg.Journal.Epoch(), Pause: h.pauseState(),
		PausedBy: h.pausedBy(), Suspended: h.brakes.Suspended != nil, SuspendedBy: h.brakes.Suspended, NotPlanning: v.NotPlanning, Degraded: h.cfg.Degraded,
		Observers: ObserversStatus{Expected: v.Hearing.Expected, Heard: v.Hearing.Heard, Missing: v.Hearing.Missing, Majority: v.Hearing.Majority()}, Policy: h.effective()}
	if v.NotPlanning == "" && v.Outcome.Budget.Voters > 0 {
		b := v.Outcome.Budget
		st.Budget, st.QuorumLoss = &b, v.Loss
	}
	if v.Mark.Index > 0 {
		m := v.Mark
		st.RaftMark = &m
	}
	decisions := map[string]string{}
	var holding []string
	for _, d := range v.Outcome.Decisions {
		decisions[d.Machine] = d.Reason
		if h, ok := v.Holds[d.Machine]; ok {
			decisions[d.Machine] = h.Why
			if h.Brake() {
				holding = append(holding, h.Why)
			}
		}
	}
	for name, h := range v.Holds { // held whatever the verdict (retired), so the planner said nothing
		if _, ok := decisions[name]; !ok {
			decisions[name] = h.Why
		}
	}
	st.Holding = strings.Join(holding, "; ")
	for i, m := range h.inv.Machines {
		a := pass.AssessmentOf(v.Assessments, i, m.Name)
		ms := MachineStatus{Name: m.Name, Node: m.Node, Member: m.Member, Verdict: a.Verdict, Since: a.Since, Reasons: a.Reasons,
			Decision: decisions[m.Name], NeedsOperator: v.Needs[m.Name], BMCLogin: h.logins.Blocked(m, st.Time)}
		if b, ok := h.brakes.Detached[m.Name]; ok {
			ms.Detached, ms.DetachedBy = true, &b
		}
		if r, ok := h.bmcs[m.Name]; ok {
			ms.BMC = &r
		}
		if m.Node != "" {
			ms.OutOfService = h.taints.Of(m.Node)
		}
		ms.PlannedWork = v.PlannedWork[m.Name]
		if ms.Verdict == "" {
			ms.Verdict = "Unknown"
		}
		if m.Member != "" {
			ms.Role, ms.EtcdHealth = "absent", a.EtcdHealth.String()
			if i := v.Cluster.Index(m.Member); i >= 0 {
				ms.Role = "voter"
				if v.Cluster.Members[i].Learner {
					ms.Role = "learner"
				}
			}
		}
		// From memory: a status (and a scrape) reads no journal. A remediation is shown once journaled
		// (a begin the pass queued has no ID before).
		if r, ok := h.running[m.Name]; ok && r.rem.ID != "" {
			ms.Remediation = &InFlight{ID: r.rem.ID, Strategy: r.rem.Strategy, RequestedBy: r.rem.RequestedBy, Steps: r.rem.Steps,
				Step: r.next, Busy: r.busy, Hard: r.rem.Hard, Forced: r.rem.Forced, Attempt: r.rem.Attempt, Stalled: r.stalled}
		}
		st.Machines = append(st.Machines, ms)
	}
	h.mu.Unlock()
	return st
}

// Acting says whether the hub acts, for the observers line of `hub status`: only on a strict majority,
// and not while a brake or something else keeps it from starting anything.
func (st Status) Acting() string {
	switch {
	case !st.Observers.Majority:
		return "NOT a strict majority: acting on nothing"
	case st.Pause != Running:
		return "a strict majority, but " + strings.ToLower(string(st.Pause)) + ": nothing new starts"
	case st.Suspended:
		return "a strict majority, but suspended: observe-only"
	case st.NotPlanning != "":
		return "a strict majority, but not planning (below)"
	}
	return "a strict majority: acting"
}

// Explanation is why the hub does or does not act on one machine, from the same status `hub status`
// shows: `hub explain` prints it as text (String), and -o json|yaml as data.
type Explanation struct {
	// Time is when the status it is built from was taken.
	Time time.Time `json:"time"`
	// Machine is the machine's row of the status (verdict, evidence, etcd role, BMC readiness, the
	// remediation in flight).
	Machine MachineStatus `json:"machine"`
	// Strategy is how it is healed; BMC its BMC's endpoint (none: no BMC).
	Strategy string `json:"strategy"`
	BMC      string `json:"bmcEndpoint,omitempty"`
	// Planner is the planner's word on it.
	Planner string         `json:"planner"`
	Budget  *quorum.Budget `json:"budget,omitempty"`
	// Holding is the hold that keeps it, when one does.
	Holding string `json:"holding,omitempty"`
	// Lost is its part in a loss of etcd's quorum, when it is a lost voter.
	Lost *pass.LostVoter `json:"lostVoter,omitempty"`
	// Brakes are what keeps the hub from acting on it (pause, suspend, detach, a refused BMC login).
	Brakes []string `json:"brakes,omitempty"`
	// History is its last remediations (at most 5), oldest first, with every journaled step.
	History []journal.Remediation `json:"history,omitempty"`
	// Episodes are its last episodes (at most 10), oldest first: each stretch of time it was Unhealthy,
	// and whether it came back by itself.
	Episodes []pass.Episode `json:"episodes,omitempty"`
}

// Explain says why the hub does or does not act on a machine: its verdict and evidence, its etcd
// role, the planner's decision, the brakes that hold, and its recent remediations.
func (h *Hub) Explain(ctx context.Context, machine string) (Explanation, error) {
	return h.explain(ctx, h.Status(ctx), machine)
}

// explain is Explain from a status already taken, so that a test can hold the explanation and the
// status (and the metrics, collectStatus) to one snapshot.
func (h *Hub) explain(ctx context.Context, st Status, machine string) (Explanation, error) {
	m, ok := h.inventory().Machine(machine)
	if !ok {
		return Explanation{}, fmt.Errorf("machine %q: %w", machine, ErrNotFound)
	}
	e := Explanation{Time: st.Time, Strategy: fmt.Sprint(m.Strategy), Budget: st.Budget}
	for _, x := range st.Machines {
		if x.Name == machine {
			e.Machine = x
		}
	}
	if m.Endpoint.Driver != "" {
		e.BMC = fmt.Sprint(m.Endpoint)
	}
	ms := e.Machine
	switch {
	case st.NotPlanning != "":
		e.Planner = "not planning: " + st.NotPlanning
	case ms.Decision != "":
		e.Planner = ms.Decision
	case ms.Verdict == assess.VerdictHealthy:
		e.Planner = "nothing to do: the machine is healthy"
	case ms.Verdict == assess.VerdictUnhealthy:
		e.Planner = "no decision about it in the latest pass"
	default:
		e.Planner = fmt.Sprintf("nothing to do: %s is %s, and only Unhealthy machines are remediated", m.Name, ms.Verdict)
	}
	if l := st.QuorumLoss; l != nil {
		for _, v := range l.Lost {
			if v.Machine == m.Name {
				e.Lost = &v
			}
		}
	}
	if strings.Contains(st.Holding, " "+m.Name+" ") {
		e.Holding = st.Holding
	}
	if st.Pause != Running {
		e.Brakes = append(e.Brakes, fmt.Sprintf("the hub is %s by %s", st.Pause, DescribeBrakes(st.PausedBy)))
	}
	if st.SuspendedBy != nil {
		e.Brakes = append(e.Brakes, fmt.Sprintf("the hub is suspended (observe-only) by %s", st.SuspendedBy))
	}
	if ms.DetachedBy != nil {
		e.Brakes = append(e.Brakes, fmt.Sprintf("%s is detached by %s (`hub attach %s`)", m.Name, ms.DetachedBy, m.Name))
	}
	if ms.BMCLogin != "" {
		e.Brakes = append(e.Brakes, "no BMC login: "+ms.BMCLogin)
	}
	if ms.OutOfService != "" {
		e.Brakes = append(e.Brakes, fmt.Sprintf("Node %s carries the out-of-service taint: %s", m.Node, ms.OutOfService))
	}
	hist, err := h.cfg.Journal.History(ctx, machine)
	if err != nil {
		return Explanation{}, err
	}
	if len(hist) > 5 {
		hist = hist[len(hist)-5:]
	}
	e.History, e.Episodes = hist, h.Episodes(machine)
	return e, nil
}

// String is the explanation as `hub explain` prints it.
func (e Explanation) String() string {
	ms := e.Machine
	var b strings.Builder
	fmt.Fprintf(&b, "%s (node %s", ms.Name, ms.Node)
	if ms.Member != "" {
		fmt.Fprintf(&b, ", etcd member %s: %s, %s", ms.Member, ms.Role, ms.EtcdHealth)
	}
	bmcEndpoint := e.BMC
	if bmcEndpoint == "" {
		bmcEndpoint = "none"
	}
	fmt.Fprintf(&b, "; strategy %s, BMC %s)\n", e.Strategy, bmcEndpoint)
	fmt.Fprintf(&b, "verdict: %s", ms.Verdict)
	if !ms.Since.IsZero() {
		fmt.Fprintf(&b, " since %s (%s ago)", ms.Since.Local().Format(time.TimeOnly), e.Time.Sub(ms.Since).Round(100*time.Millisecond))
	}
	b.WriteString("\n")
	for _, r := range ms.Reasons {
		fmt.Fprintf(&b, "  - %s\n", r)
	}
	if e.BMC != "" {
		b.WriteString(describeBMC(ms.BMC) + "\n")
	}
	fmt.Fprintf(&b, "planner: %s\n", e.Planner)
	if e.Budget != nil {
		fmt.Fprintf(&b, "budget: %s\n", e.Budget)
	}
	if l := e.Lost; l != nil {
		switch {
		case l.ForGood:
			fmt.Fprintf(&b, "quorum loss: %s is lost for good: %s\n", l.Member, l.Evidence)
		case l.PoweredOn:
			fmt.Fprintf(&b, "quorum loss: %s is lost, but its BMC reads the host powered on: it may be serving on the far side of a partition; silence is no proof\n", l.Member)
		default:
			fmt.Fprintf(&b, "quorum loss: %s is lost; nothing says yet that it will not come back\n", l.Member)
		}
	}
	if e.Holding != "" {
		fmt.Fprintf(&b, "holding: %s\n", e.Holding)
	}
	if len(e.Brakes) > 0 {
		fmt.Fprintf(&b, "brakes: %s\n", strings.Join(e.Brakes, "; "))
	}
	if r := ms.Remediation; r != nil {
		fmt.Fprintf(&b, "in flight: %s (%s, attempt %d, requested by %s), step %d of %d\n", r.ID, r.Strategy, r.Attempt, r.RequestedBy, r.Step+1, len(r.Steps))
		if r.Stalled != "" {
			fmt.Fprintf(&b, "  stalled: %s\n", r.Stalled)
		}
	}
	for _, ep := range e.Episodes {
		fmt.Fprintf(&b, "episode: %s\n", ep)
	}
	for _, rem := range e.History {
		fmt.Fprintf(&b, "remediation %s: %s, %s, requested by %s: %s\n", rem.ID, rem.State, rem.Strategy, rem.RequestedBy, rem.Reason)
		for _, ev := range rem.History {
			fmt.Fprintf(&b, "  %s %-7s %s\n", ev.At.Local().Format("15:04:05.000"), ev.Kind, ev.Detail)
		}
	}
	return b.String()
}

// describeBMC is explain's line on the last readiness check of a machine's BMC.
func describeBMC(r *pass.BMCReadiness) string {
	switch {
	case r == nil:
		return "bmc: not checked yet (the hub checks every BMC when it starts leading, then every 10 min)"
	case r.Ready:
		s := fmt.Sprintf("bmc: ready (power %s", r.Power)
		if r.Health != "" {
			s += ", health " + r.Health
		}
		s += fmt.Sprintf("), checked at %s", r.Checked.Local().Format(time.TimeOnly))
		for _, h := range r.Hangs {
			s += fmt.Sprintf("\n  event log: %s at %s (entry %s: %s)", h.Kind, h.At.Local().Format(time.TimeOnly), h.ID, h.Message)
		}
		if r.LogError != "" {
			s += "\n  event log not read: " + r.LogError + " (a hang is proved by the power alone)"
		}
		return s
	}
	return fmt.Sprintf("bmc: NOT READY (%s), checked at %s: %s", r.Problem, r.Checked.Local().Format(time.TimeOnly), r.Error)
}
