package pass

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// Past is one remediation as the brakes count it.
type Past struct {
	ID, strategy     string
	ByHub            bool
	State            journal.State
	created, Updated time.Time
	// cycles are the indexes of its power-cycle steps; cycled is when the latest of them was done
	// (its BMC showed the power go off and on, or the reset: zero when none was). A cycle that did
	// not bring an unseen machine back into view is not repeated (holdOf).
	cycles []int
	Cycled time.Time
	// Shown is what the BMC showed of that cycle (the outcome's evidence, as journaled).
	Shown string
	// Acts counts the steps whose intent was written (every side effect has one first) but those
	// withdrawn (their request not sent).
	Acts int
	// outcomeAt is its latest step outcome's time: when it last did something, which a note written
	// after (an import from a degraded term's journal, at the import) does not move as it moves Updated.
	outcomeAt time.Time
}

// doneAt is when it last did something: its latest step outcome, else its last update.
func (p Past) doneAt() time.Time {
	if p.outcomeAt.IsZero() {
		return p.Updated
	}
	return p.outcomeAt
}

// Idle: it ended having taken no step, having done nothing (refused at the check before its first
// step, or withdrawn, as when the machine was judged Healthy again while the journal took its begin).
// An idle remediation starts no cooldown, is no failed attempt and takes no slot of the rate limit:
// those bound actions, and it took none. It holds its machine for idleRetry (historyHold).
func (p Past) Idle() bool { return p.State != journal.InProgress && p.Acts <= 0 }

func PastOf(r journal.Remediation) Past {
	p := Past{ID: r.ID, strategy: r.Strategy, ByHub: r.RequestedBy == "hub", State: r.State, created: r.Created, Updated: r.Updated}
	for i, s := range r.Steps {
		if s.Op == quorum.OpPowerCycle {
			p.cycles = append(p.cycles, i)
		}
	}
	for _, e := range r.History {
		switch e.Kind {
		case journal.EntryIntent:
			p.Acts++
		case journal.EntryOutcome:
			p.StepResult(e.Step, e.Result, e.Detail, e.At)
		}
	}
	return p
}

// StepResult records a step's outcome: a power cycle done (or found done after a restart) sets cycled
// and what the BMC showed of it; a withdrawn step did nothing.
func (p *Past) StepResult(step int, r journal.Result, detail string, at time.Time) {
	if r == journal.ResultWithdrawn {
		p.Acts--
	}
	if at.After(p.outcomeAt) {
		p.outcomeAt = at
	}
	if (r == journal.ResultDone || r == journal.ResultNotRepeated) && slices.Contains(p.cycles, step) && at.After(p.Cycled) {
		p.Cycled, p.Shown = at, detail
	}
}

// Ended is when the machine's latest finished remediation that acted ended (zero: none).
func Ended(hist []Past) time.Time {
	var t time.Time
	for _, p := range hist {
		if p.State != journal.InProgress && !p.Idle() && p.Updated.After(t) {
			t = p.Updated
		}
	}
	return t
}

// failures counts the remediations that ended without success after the machine was last seen
// healthy (all of the latest unsuccessful run when the hub never saw it healthy).
func failures(hist []Past, healthy time.Time) int {
	n := 0
	for i := len(hist) - 1; i >= 0; i-- {
		r := hist[i]
		if r.State == journal.InProgress || r.Idle() {
			continue
		}
		if r.State == journal.Succeeded || !r.Updated.After(healthy) {
			break
		}
		n++
	}
	return n
}

// historyHold is the hold the hub's own history with m gives (its last remediation's cooldown, a cycle
// nobody has seen the machine since, a fence, too many failures or remediations), with the count of
// its failed remediations (held or not: an escalation counts them).
func historyHold(f Facts, m Machine, a assess.Assessment) Hold {
	p := f.Inventory.Policy
	hist := f.History[m.Name]
	if last := len(hist) - 1; last >= 0 && hist[last].Idle() && f.Now.Sub(hist[last].Updated) < idleRetry {
		return Hold{Reason: ReasonCoolingDown, Why: fmt.Sprintf("its last remediation %s ended having taken no step: tried again at %s",
			hist[last].ID, hist[last].Updated.Add(idleRetry).Format(time.TimeOnly))}
	}
	if end := Ended(hist); !end.IsZero() && f.Now.Sub(end) < p.Cooldown {
		return Hold{Reason: ReasonCoolingDown, Why: fmt.Sprintf("cooling down until %s after its last remediation", end.Add(p.Cooldown).Format(time.TimeOnly))}
	}
	if c, ok := UnseenSinceCycle(hist, newest(f.seenAt, m.Name, a.SeenAt)); ok {
		return Hold{Reason: ReasonUnseen, Why: fmt.Sprintf("power-cycled by remediation %s at %s (its BMC showed: %s) and seen by nobody since: no report from its agent, "+
			"and no majority of the observers reaches its etcd member. A partition, or a host that does not boot: another cycle would take down a member "+
			"that may be serving etcd's quorum on the other side of a partition, so it is not repeated while %s stays unseen; "+
			"needs an operator (check its console and network, then `hub reboot %s` or `hub detach %s`)",
			c.ID, c.Cycled.UTC().Format(time.RFC3339), cmp.Or(c.Shown, "the cycle"), m.Name, m.Name, m.Name), Need: NeedUnseen}
	}
	if last := len(hist) - 1; last >= 0 && hist[last].Fenced() {
		return Hold{Reason: ReasonFenced, Why: fmt.Sprintf("fenced by remediation %s: it stays off until an operator acts (`hub reboot %s` powers it on)", hist[last].ID, m.Name),
			Need: NeedFenced}
	}
	n := failures(hist, f.healthyAt[m.Name])
	if n >= p.MaxAttempts {
		return Hold{Reason: ReasonGaveUp, Why: fmt.Sprintf("gave up after %d failed remediations since it was last healthy (maxAttempts %d): "+
			"needs an operator (`hub explain %s`, then `hub reboot %s` or `hub detach %s`)", n, p.MaxAttempts, m.Name, m.Name, m.Name), failed: n, Need: NeedGaveUp}
	}
	// A machine that comes back and fails again soon after is one flapping machine, not a string of
	// new failures: its remediations within flapWindow count together, escalate, and give up.
	recent := 0
	for _, r := range hist {
		if r.ByHub && r.State != journal.InProgress && !r.Idle() && f.Now.Sub(r.created) < p.FlapWindow {
			recent++
		}
	}
	if recent >= p.MaxAttempts {
		return Hold{Reason: ReasonFlapping, Why: fmt.Sprintf("flapping: %d remediations in the last %v (it comes back, then fails again; maxAttempts %d): "+
			"needs an operator (`hub explain %s`, then `hub reboot %s` or `hub detach %s`)", recent, p.FlapWindow, p.MaxAttempts, m.Name, m.Name, m.Name),
			failed: recent, Need: NeedFlapping}
	}
	return Hold{failed: max(n, recent)}
}

// UnseenSinceCycle finds the machine's latest power cycle when nobody has seen the machine since it
// (DESIGN.md rule 9): from the hub's side of a partition, the healthy members of a quorate far side
// look exactly like dead ones, and the first cycle is the price of healing real crashes; a second one
// of a member the first did not bring back into view is not. seen is when it was last in view; a
// remediation that succeeded saw it come back (a hub restarted since has no other record of it).
func UnseenSinceCycle(hist []Past, seen time.Time) (Past, bool) {
	var last Past
	for _, p := range hist {
		if p.State == journal.Succeeded && p.Updated.After(seen) {
			seen = p.Updated
		}
		if p.Cycled.After(last.Cycled) {
			last = p
		}
	}
	return last, !last.Cycled.IsZero() && !seen.After(last.Cycled)
}
