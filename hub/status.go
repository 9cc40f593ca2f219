package hub

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
)

// operator.Status returns the hub's status now.
func (h *Hub) Status(ctx context.Context) operator.Status {
	h.mu.Lock()
	v := h.view
	st := operator.Status{Cluster: h.inv.Cluster, Time: time.Now(), Epoch: h.cfg.Journal.Epoch(), Pause: h.pauseState(),
		PausedBy: h.pausedBy(), Suspended: h.brakes.Suspended != nil, SuspendedBy: h.brakes.Suspended, NotPlanning: v.NotPlanning, Degraded: h.cfg.Degraded,
		Observers: operator.ObserversStatus{Expected: v.Hearing.Expected, Heard: v.Hearing.Heard, Missing: v.Hearing.Missing, Majority: v.Hearing.Majority()}, Policy: h.effective()}
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
		ms := operator.MachineStatus{Name: m.Name, Node: m.Node, Member: m.Member, Verdict: a.Verdict, Since: a.Since, Reasons: a.Reasons,
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
			ms.Remediation = &operator.InFlight{ID: r.rem.ID, Strategy: r.rem.Strategy, RequestedBy: r.rem.RequestedBy, Steps: r.rem.Steps,
				Step: r.next, Busy: r.busy, Hard: r.rem.Hard, Forced: r.rem.Forced, Attempt: r.rem.Attempt, Stalled: r.stalled}
		}
		st.Machines = append(st.Machines, ms)
	}
	h.mu.Unlock()
	return st
}

// Explain says why the hub does or does not act on a machine: its verdict and evidence, its etcd
// role, the planner's decision, the brakes that hold, and its recent remediations.
func (h *Hub) Explain(ctx context.Context, machine string) (operator.Explanation, error) {
	return h.explain(ctx, h.Status(ctx), machine)
}

// explain is Explain from a status already taken, so that a test can hold the explanation and the
// status (and the metrics, metrics.Collector.CollectStatus) to one snapshot.
func (h *Hub) explain(ctx context.Context, st operator.Status, machine string) (operator.Explanation, error) {
	m, ok := h.inventory().Machine(machine)
	if !ok {
		return operator.Explanation{}, fmt.Errorf("machine %q: %w", machine, ErrNotFound)
	}
	e := operator.Explanation{Time: st.Time, Strategy: fmt.Sprint(m.Strategy), Budget: st.Budget}
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
	if st.Pause != operator.Running {
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
		return operator.Explanation{}, err
	}
	if len(hist) > 5 {
		hist = hist[len(hist)-5:]
	}
	e.History, e.Episodes = hist, h.Episodes(machine)
	return e, nil
}
