package hub

import (
	"context"
	"fmt"
	"slices"
	"sync"
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

// ledger is what the passes need of the journal, kept in memory: every machine's recent remediations
// (cooldown, failed attempts, flapping, a fence that stands) and the hub's own starts (the rate
// limit). It is loaded once when the hub starts and updated by every Begin and Finish the hub writes
// (through recorder), so that no pass and no scrape reads the journal: in Kubernetes mode each read
// is a List against the API server.
type ledger struct {
	mu     sync.Mutex
	keep   int
	byID   map[string]string // remediation ID → machine, for Finish
	recent map[string][]past // per machine, oldest first, at most keep
	starts []start           // the hub's own remediations, oldest first, but those that ended idle
}

// start is one of the hub's own remediations, as the rate limit counts it.
type start struct {
	id string
	at time.Time
}

func newLedger(keep int) *ledger {
	return &ledger{keep: keep, byID: map[string]string{}, recent: map[string][]past{}}
}

// load reads each machine's history from the journal.
func (l *ledger) load(ctx context.Context, s journal.Store, machines []string) error {
	for _, m := range machines {
		hist, err := s.History(ctx, m)
		if err != nil {
			return fmt.Errorf("reading %s's remediations from the journal (cooldown, attempts, rate limit): %w", m, err)
		}
		for _, r := range hist {
			l.begun(r)
		}
	}
	l.mu.Lock()
	slices.SortFunc(l.starts, func(a, b start) int { return a.at.Compare(b.at) })
	l.mu.Unlock()
	return nil
}

func (l *ledger) begun(r journal.Remediation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byID[r.ID] = r.Machine
	p := pastOf(r)
	l.recent[r.Machine] = append(l.recent[r.Machine], p)
	if n := len(l.recent[r.Machine]); n > l.keep {
		for _, p := range l.recent[r.Machine][:n-l.keep] {
			delete(l.byID, p.id)
		}
		l.recent[r.Machine] = slices.Clone(l.recent[r.Machine][n-l.keep:])
	}
	if p.byHub && !p.idle() {
		l.starts = append(l.starts, start{id: r.ID, at: r.Created})
	}
}

// find is remediation id's record (nil: not kept). Callers hold l.mu.
func (l *ledger) find(id string) *past {
	rs := l.recent[l.byID[id]]
	if i := slices.IndexFunc(rs, func(p past) bool { return p.id == id }); i >= 0 {
		return &rs[i]
	}
	return nil
}

func (l *ledger) finished(id string, state journal.State, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.find(id); p != nil {
		p.state, p.updated = state, at
		if p.idle() {
			l.starts = slices.DeleteFunc(l.starts, func(s start) bool { return s.id == id })
		}
	}
}

// intent notes that a remediation wrote a step's intent: it acts (or may have).
func (l *ledger) intent(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.find(id); p != nil {
		p.acts++
	}
}

func (l *ledger) outcome(id string, step int, r journal.Result, detail string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.find(id); p != nil {
		p.outcome(step, r, detail, at)
	}
}

// of returns a copy of a machine's recent remediations, oldest first.
func (l *ledger) of(machine string) []past {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.recent[machine])
}

// startsWithin counts the hub's own starts within per of now, forgetting older ones.
func (l *ledger) startsWithin(now time.Time, per time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.starts = slices.DeleteFunc(l.starts, func(s start) bool { return now.Sub(s.at) > per })
	return len(l.starts)
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

// recorder is the Store the hub writes through: each Begin, Outcome and Finish that the journal
// accepted is also written to the ledger.
type recorder struct {
	journal.Store
	l *ledger
}

func (r recorder) Begin(ctx context.Context, rem journal.Remediation) (journal.Remediation, error) {
	rem, err := r.Store.Begin(ctx, rem)
	if err == nil {
		r.l.begun(rem)
	}
	return rem, err
}

func (r recorder) Intent(ctx context.Context, id string, step int, detail string) error {
	err := r.Store.Intent(ctx, id, step, detail)
	if err == nil {
		r.l.intent(id)
	}
	return err
}

func (r recorder) Outcome(ctx context.Context, id string, step int, result journal.Result, detail string) error {
	err := r.Store.Outcome(ctx, id, step, result, detail)
	if err == nil {
		r.l.outcome(id, step, result, detail, time.Now())
	}
	return err
}

func (r recorder) Finish(ctx context.Context, id string, state journal.State, detail string) error {
	err := r.Store.Finish(ctx, id, state, detail)
	if err == nil {
		r.l.finished(id, state, time.Now())
	}
	return err
}
