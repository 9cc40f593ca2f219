package hub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// remediationWorld is the World of one remediation the hub runs: what its executor reads of the hub,
// and the one path by which what it records becomes the hub's notices, metrics and status.
type remediationWorld struct {
	h   *Hub
	m   pass.Machine
	rem journal.Remediation
	r   *running
	// detected: when the hub found the machine Unhealthy (zero for an operator's remediation, or one
	// resumed); the first intent of a hub remediation observes the detection-to-action time.
	detected time.Time
	acted    bool
	// failing: a journal write was refused and not yet accepted (the remediation holds its machine).
	failing bool
	// end: the entry that ended the remediation, said once it no longer holds its machine.
	end *journal.Entry
}

func (w *remediationWorld) Live(ctx context.Context) (quorum.Cluster, error) { return w.h.live(ctx) }
func (w *remediationWorld) Barrier(ctx context.Context) error                { return w.h.freshBarrier(ctx) }
func (w *remediationWorld) Gate(ctx context.Context) error {
	return w.h.gate(w.m.Name, w.Overtaken)(ctx)
}

// Recorded turns each entry into what the hub says and counts, and what `hub status` shows: the step
// under way, a step's outcome (StepDone), a journal write refused and then accepted, the end.
func (w *remediationWorld) Recorded(en journal.Entry, err error) {
	h, m, id := w.h, w.m.Name, w.rem.ID
	if err != nil {
		w.failing = true
		h.setStalled(w.r, fmt.Sprintf("the journal refuses a write: %v (retrying until it is recorded)", err))
		h.say(pass.Notice{Machine: m, Reason: pass.ReasonJournalWriteFailing, Remediation: id, Warning: true,
			Message: fmt.Sprintf("%s: remediation %s: the journal refuses a write (%v): retrying until it is recorded; %s stays in flight meanwhile", m, id, err, m)})
		return
	}
	if w.failing {
		w.failing = false
		h.setStalled(w.r, "")
		h.say(pass.Notice{Machine: m, Reason: pass.ReasonJournalWriteRecorded, Remediation: id,
			Message: fmt.Sprintf("%s: remediation %s: the journal accepted the write it refused before; going on", m, id)})
	}
	switch {
	case en.Ends != "":
		w.end = &en
	case en.Kind == journal.EntryIntent:
		if !w.acted && w.rem.RequestedBy == "hub" && !w.detected.IsZero() {
			h.metrics.DetectionToAction(time.Since(w.detected))
		}
		w.acted = true
		h.mu.Lock()
		w.r.next = en.Step
		h.mu.Unlock()
	case en.Kind == journal.EntryOutcome:
		h.mu.Lock()
		w.r.busy = false
		if en.Result.Completes() {
			w.r.next = en.Step + 1
		}
		h.mu.Unlock()
		if en.Result.Announced() {
			h.say(pass.Notice{Machine: m, Reason: pass.ReasonStepDone, Remediation: id, Message: fmt.Sprintf("%s: remediation %s: %s: %s", m, id, stepName(w.rem, en.Step), en.Detail)})
		}
	}
}

// stepName names step i of rem's plan as the journal wrote it ("power-cycle etcd-2").
func stepName(rem journal.Remediation, i int) string {
	if i < 0 || i >= len(rem.Steps) {
		return fmt.Sprintf("step %d", i)
	}
	return rem.Steps[i].String()
}

// ended says how the remediation ended, once it no longer holds its machine: from the journal's end
// of it (Remediated only when that says Succeeded), or, with no end recorded, why it stopped.
func (w *remediationWorld) ended(stopping bool, err error) {
	h, m, id := w.h, w.m.Name, w.rem.ID
	switch {
	case stopping:
		h.say(pass.Notice{Machine: m, Reason: pass.ReasonRemediationInterrupted, Remediation: id,
			Message: fmt.Sprintf("%s: remediation %s interrupted by the hub stopping; the next hub resumes it", m, id)})
	case w.end != nil && w.end.Ends == journal.Succeeded:
		h.metrics.Remediation(w.rem, "succeeded")
		outcome := "the machine is back"
		if w.rem.Strategy == quorum.Fence.String() {
			outcome = "the machine is off, and stays off until an operator acts"
		}
		h.say(pass.Notice{Machine: m, Reason: pass.ReasonRemediated, Remediation: id,
			Message: fmt.Sprintf("%s: remediation %s succeeded: %s (%s)", m, id, outcome, quorum.StepList(w.rem.Steps))})
	case w.end != nil || err != nil:
		why := err
		if w.end != nil {
			why = errors.New(w.end.Detail)
		}
		h.metrics.Remediation(w.rem, "failed")
		h.say(pass.Notice{Machine: m, Reason: pass.ReasonRemediationFailed, Remediation: id, Warning: true,
			Message: fmt.Sprintf("%s: remediation %s ended: %v", m, id, why)})
	}
}

// live gives the executor the membership as it is now, remediations in flight marked (the Executor
// clears its own member's mark: the step it is about to take is what disrupts it).
func (h *Hub) live(context.Context) (quorum.Cluster, error) {
	// Fresh reports for the membership; the latest pass's assessments for each member's health (the
	// assessor belongs to the pass loop).
	h.mu.Lock()
	v, inv, flights := h.view, h.inventoryLocked(), h.flightsLocked()
	h.mu.Unlock()
	obs := h.gossipNow()
	c, why := pass.MembershipOf(inv, obs, v.Assessments, assess.Hear(assess.ExpectedOf(inv.Refs(), inv.Witnesses), obs, inv.Policy.Assess.StaleAfter), flights)
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
	e, wait := h.view.Hearing.Set, h.inventoryLocked().Policy.Assess.StaleAfter
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
		for _, node := range e.JudgeNodes {
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

// Overtaken: an etcd recovery begun after the remediation's flight (not its journal entry: a pass's begin
// decided before the recovery's pause may be journaled after it began) retired its machine (until it rejoins).
func (w *remediationWorld) Overtaken() error {
	w.h.mu.Lock()
	r := w.h.retired
	w.h.mu.Unlock()
	if !w.r.since.Before(r.Began) && !w.rem.Created.Before(r.Began) {
		return nil
	}
	if _, retired := r.Hold(w.m.Name, w.h.gossipNow(), w.h.inventory().Policy.Assess.StaleAfter); !retired {
		return nil
	}
	return fmt.Errorf("overtaken by etcd recovery %s (begun %s): %s is retired, a member of the old cluster, until `agent rejoin` on it",
		r.Token, r.Began.UTC().Format(time.RFC3339), w.m.Name)
}

// Wanted: the remediation is still wanted, as the machine's latest assessment says (wanted).
func (w *remediationWorld) Wanted() error {
	a, ok := w.h.Assessment(w.m.Name)
	if !ok {
		return nil
	}
	return wanted(w.rem, w.r.since, a)
}

// wanted: one of the hub's own remediations is wanted while its machine has not been judged Healthy
// again, and one begun while the machine was dead while it has shown no sign of life since it began
// (it resumed by itself: pass/stall.go), counted from the earlier of its flight's beginning (since) and its
// journal entry (as Overtaken). An operator's reboot is wanted whatever the verdict.
func wanted(rem journal.Remediation, since time.Time, a assess.Assessment) error {
	switch {
	case rem.RequestedBy == "hub" && a.Verdict == assess.VerdictHealthy:
		return fmt.Errorf("%s is Healthy again since it was found Unhealthy: its remediation is no longer wanted", a.Machine)
	case rem.WhileDead && (a.LifeAt.After(rem.Created) || a.LifeAt.After(since)) && (a.Alive || !a.Dead):
		return fmt.Errorf("%s has shown a sign of life (at %s) since its remediation began, where it was dead: it resumed by itself, and its remediation is no longer wanted",
			a.Machine, a.LifeAt.UTC().Format("15:04:05.000Z07:00"))
	}
	return nil
}

// CameBack: the machine's agent restarted since the remediation began (a report from an agent
// started later than the one before), is alive in the hub's view and not Unhealthy, and for an etcd
// member, the member is healthy. Without the restart, a machine the hub has not yet seen go down
// would count as back the moment it was rebooted.
func (w *remediationWorld) CameBack(context.Context) bool {
	h, m := w.h, w.m
	a, ok := h.Assessment(m.Name)
	if !ok || a.Verdict == assess.VerdictUnhealthy {
		return false
	}
	if r, ok := h.cfg.Gossip.Reports()[m.Node]; !ok || !w.rem.AgentRestarted(r.Started) {
		return false
	}
	pv, alive := h.observePeer(m.Node)
	if !alive || pv.State != health.PeerAlive {
		return false
	}
	return m.Member == "" || a.EtcdHealth == quorum.Healthy
}

// ResetEvidence: the machine's agent restarted after since, or the hub or another observer saw it go
// down after it.
func (w *remediationWorld) ResetEvidence(_ context.Context, since time.Time) (bool, string) {
	h, m := w.h, w.m
	{
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
