package pass

import (
	"slices"
	"time"

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
