// Package ledger is what the hub's passes need of the journal, kept in memory: every machine's recent
// remediations and the hub's own starts. The hub writes its journal through a Recorder, which keeps
// the ledger in step with every write the journal accepted.
package ledger

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
)

// Ledger is what the passes need of the journal, kept in memory: every machine's recent remediations
// (cooldown, failed attempts, flapping, a fence that stands) and the hub's own starts (the rate
// limit). It is loaded once when the hub starts and updated by every Begin and Finish the hub writes
// (through Recorder), so that no pass and no scrape reads the journal: in Kubernetes mode each read
// is a List against the API server.
type Ledger struct {
	mu     sync.Mutex
	keep   int
	byID   map[string]string      // remediation ID → machine, for Finish
	recent map[string][]pass.Past // per machine, oldest first, at most keep
	starts []start                // the hub's own remediations, oldest first, but those that ended idle
}

// start is one of the hub's own remediations, as the rate limit counts it.
type start struct {
	id string
	at time.Time
}

// New returns a ledger that keeps the last keep remediations of each machine.
func New(keep int) *Ledger {
	return &Ledger{keep: keep, byID: map[string]string{}, recent: map[string][]pass.Past{}}
}

// Load reads each machine's history from the journal.
func (l *Ledger) Load(ctx context.Context, s journal.Store, machines []string) error {
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

func (l *Ledger) begun(r journal.Remediation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byID[r.ID] = r.Machine
	p := pass.PastOf(r)
	l.recent[r.Machine] = append(l.recent[r.Machine], p)
	if n := len(l.recent[r.Machine]); n > l.keep {
		for _, p := range l.recent[r.Machine][:n-l.keep] {
			delete(l.byID, p.ID)
		}
		l.recent[r.Machine] = slices.Clone(l.recent[r.Machine][n-l.keep:])
	}
	if p.ByHub && !p.Idle() {
		l.starts = append(l.starts, start{id: r.ID, at: r.Created})
	}
}

// find is remediation id's record (nil: not kept). Callers hold l.mu.
func (l *Ledger) find(id string) *pass.Past {
	rs := l.recent[l.byID[id]]
	if i := slices.IndexFunc(rs, func(p pass.Past) bool { return p.ID == id }); i >= 0 {
		return &rs[i]
	}
	return nil
}

func (l *Ledger) finished(id string, state journal.State, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.find(id); p != nil {
		p.State, p.Updated = state, at
		if p.Idle() {
			l.starts = slices.DeleteFunc(l.starts, func(s start) bool { return s.id == id })
		}
	}
}

// intent notes that a remediation wrote a step's intent: it acts (or may have).
func (l *Ledger) intent(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.find(id); p != nil {
		p.Acts++
	}
}

func (l *Ledger) outcome(id string, step int, r journal.Result, detail string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.find(id); p != nil {
		p.StepResult(step, r, detail, at)
	}
}

// Of returns a copy of a machine's recent remediations, oldest first.
func (l *Ledger) Of(machine string) []pass.Past {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.recent[machine])
}

// Read is what a pass reads of the ledger: the hub's own starts within per of now (StartsWithin), and
// a copy of each named machine's recent remediations (Of).
func (l *Ledger) Read(now time.Time, per time.Duration, machines []string) (starts int, history map[string][]pass.Past) {
	history = make(map[string][]pass.Past, len(machines))
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range machines {
		history[m] = slices.Clone(l.recent[m])
	}
	return l.startsWithinLocked(now, per), history
}

// StartsWithin counts the hub's own starts within per of now, forgetting older ones.
func (l *Ledger) StartsWithin(now time.Time, per time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.startsWithinLocked(now, per)
}

func (l *Ledger) startsWithinLocked(now time.Time, per time.Duration) int {
	l.starts = slices.DeleteFunc(l.starts, func(s start) bool { return now.Sub(s.at) > per })
	return len(l.starts)
}

// Recorder is the Store the hub writes through: each Begin, Outcome and Finish that the journal
// accepted is also written to the ledger.
type Recorder struct {
	journal.Store
	Ledger *Ledger
}

func (r Recorder) Begin(ctx context.Context, rem journal.Remediation) (journal.Remediation, error) {
	rem, err := r.Store.Begin(ctx, rem)
	if err == nil {
		r.Ledger.begun(rem)
	}
	return rem, err
}

func (r Recorder) Intent(ctx context.Context, id string, step int, detail string) error {
	err := r.Store.Intent(ctx, id, step, detail)
	if err == nil {
		r.Ledger.intent(id)
	}
	return err
}

func (r Recorder) Outcome(ctx context.Context, id string, step int, result journal.Result, detail string) error {
	err := r.Store.Outcome(ctx, id, step, result, detail)
	if err == nil {
		r.Ledger.outcome(id, step, result, detail, time.Now())
	}
	return err
}

func (r Recorder) Finish(ctx context.Context, id string, state journal.State, detail string) error {
	err := r.Store.Finish(ctx, id, state, detail)
	if err == nil {
		r.Ledger.finished(id, state, time.Now())
	}
	return err
}
