package hub

import (
	"slices"
	"time"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// past is one remediation as the brakes count it.
type past struct {
	id, strategy     string
	byHub            bool
	state            journal.State
	created, updated time.Time
	// cycles are the indexes of its power-cycle steps; cycled is when the latest of them was done
	// (its BMC showed the power go off and on, or the reset: zero when none was). A cycle that did
	// not bring an unseen machine back into view is not repeated (holdOf).
	cycles []int
	cycled time.Time
	// shown is what the BMC showed of that cycle (the outcome's evidence, as journaled).
	shown string
	// acts counts the steps whose intent was written (every side effect has one first) but those
	// withdrawn (their request not sent).
	acts int
}

// idle: it ended having taken no step, having done nothing (refused at the check before its first
// step, or withdrawn, as when the machine was judged Healthy again while the journal took its begin).
// An idle remediation starts no cooldown, is no failed attempt and takes no slot of the rate limit:
// those bound actions, and it took none. It holds its machine for idleRetry (historyHold).
func (p past) idle() bool { return p.state != journal.InProgress && p.acts <= 0 }

func pastOf(r journal.Remediation) past {
	p := past{id: r.ID, strategy: r.Strategy, byHub: r.RequestedBy == "hub", state: r.State, created: r.Created, updated: r.Updated}
	for i, s := range r.Steps {
		if s.Op == quorum.OpPowerCycle {
			p.cycles = append(p.cycles, i)
		}
	}
	for _, e := range r.History {
		switch e.Kind {
		case journal.EntryIntent:
			p.acts++
		case journal.EntryOutcome:
			p.outcome(e.Step, e.Result, e.Detail, e.At)
		}
	}
	return p
}

// outcome records a step's outcome: a power cycle done (or found done after a restart) sets cycled
// and what the BMC showed of it; a withdrawn step did nothing.
func (p *past) outcome(step int, r journal.Result, detail string, at time.Time) {
	if r == journal.ResultWithdrawn {
		p.acts--
	}
	if (r == journal.ResultDone || r == journal.ResultNotRepeated) && slices.Contains(p.cycles, step) && at.After(p.cycled) {
		p.cycled, p.shown = at, detail
	}
}

// ended is when the machine's latest finished remediation that acted ended (zero: none).
func ended(hist []past) time.Time {
	var t time.Time
	for _, p := range hist {
		if p.state != journal.InProgress && !p.idle() && p.updated.After(t) {
			t = p.updated
		}
	}
	return t
}

// failures counts the remediations that ended without success after the machine was last seen
// healthy (all of the latest unsuccessful run when the hub never saw it healthy).
func failures(hist []past, healthy time.Time) int {
	n := 0
	for i := len(hist) - 1; i >= 0; i-- {
		r := hist[i]
		if r.state == journal.InProgress || r.idle() {
			continue
		}
		if r.state == journal.Succeeded || !r.updated.After(healthy) {
			break
		}
		n++
	}
	return n
}
