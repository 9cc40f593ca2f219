package hub

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/quorum"
)

// The executor's world: what a remediation under way reads of the hub (Executor's Live, Barrier,
// Wanted, ResetEvidence, and the Recovered it awaits).

// live gives the executor the membership as it is now, remediations in flight marked (the Executor
// clears its own member's mark: the step it is about to take is what disrupts it).
func (h *Hub) live(context.Context) (quorum.Cluster, error) {
	// Fresh reports for the membership; the latest pass's assessments for each member's health (the
	// assessor belongs to the pass loop).
	h.mu.Lock()
	v, inv, flights := h.view, h.inventoryLocked(), h.flightsLocked()
	h.mu.Unlock()
	obs := h.gossipNow()
	c, why := membershipOf(inv, obs, v.assessments, Hear(ExpectedOf(refs(inv), inv.Witnesses), obs, inv.Policy.Assess.StaleAfter), flights)
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
	e, wait := h.view.hearing.set, h.inventoryLocked().Policy.Assess.StaleAfter
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
