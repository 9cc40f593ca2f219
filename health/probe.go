package health

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// Probe checks one thing on the node. Check must return by ctx's deadline.
type Probe interface {
	Name() string
	Check(ctx context.Context) (ok bool, detail string)
}

// ProbeSpec is a probe with its schedule.
type ProbeSpec struct {
	Probe    Probe
	Interval time.Duration
	Timeout  time.Duration
	// FailureThreshold is how many checks in a row must fail before the probe is reported failing,
	// its failure then counted from the first of them (0: DefaultFailureThreshold). One slow answer
	// on a busy machine is not a failure; a real one is reported an interval later and judged on
	// the same clock.
	FailureThreshold int
}

// DefaultFailureThreshold: a probe is failing once two checks in a row have failed.
const DefaultFailureThreshold = 2

// Runner runs probes on their intervals and keeps each one's latest result and since when it has
// been in its current state.
type Runner struct {
	specs    []ProbeSpec
	log      *slog.Logger
	onChange func()

	mu      sync.Mutex
	results map[string]ProbeResult
	streaks map[string]streak // failures in a row of probes still reported passing
}

// streak is a passing probe's failed checks in a row, below its threshold.
type streak struct {
	n     int
	first time.Time
}

// NewRunner returns a runner for specs; onChange (optional) is called after a probe changes state.
func NewRunner(specs []ProbeSpec, log *slog.Logger, onChange func()) (*Runner, error) {
	seen := map[string]bool{}
	for i, s := range specs {
		switch {
		case s.Probe == nil:
			return nil, fmt.Errorf("probes[%d]: no probe", i)
		case seen[s.Probe.Name()]:
			return nil, fmt.Errorf("probes[%d]: %q is configured twice", i, s.Probe.Name())
		case s.Interval <= 0 || s.Timeout <= 0:
			return nil, fmt.Errorf("probe %s: interval and timeout must be positive (have %v, %v)", s.Probe.Name(), s.Interval, s.Timeout)
		case s.Timeout > s.Interval:
			return nil, fmt.Errorf("probe %s: timeout %v is longer than its interval %v", s.Probe.Name(), s.Timeout, s.Interval)
		case s.FailureThreshold < 0:
			return nil, fmt.Errorf("probe %s: failure threshold %d must not be negative", s.Probe.Name(), s.FailureThreshold)
		}
		seen[s.Probe.Name()] = true
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if onChange == nil {
		onChange = func() {}
	}
	return &Runner{specs: specs, log: log, onChange: onChange, results: map[string]ProbeResult{}, streaks: map[string]streak{}}, nil
}

// Run runs every probe until ctx ends, each first at once and then on its interval.
func (r *Runner) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range r.specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(s.Interval)
			defer t.Stop()
			for {
				r.checkOne(ctx, s)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	wg.Wait()
}

// CheckAll runs every probe once, now.
func (r *Runner) CheckAll(ctx context.Context) {
	for _, s := range r.specs {
		r.checkOne(ctx, s)
	}
}

func (r *Runner) checkOne(ctx context.Context, s ProbeSpec) {
	cctx, cancel := context.WithTimeout(ctx, s.Timeout)
	ok, detail := s.Probe.Check(cctx)
	if cctx.Err() == context.DeadlineExceeded {
		ok, detail = false, fmt.Sprintf("no answer within %v", s.Timeout)
	}
	cancel()
	if ctx.Err() != nil {
		return // shutting down: not a result
	}
	now := time.Now().UTC()
	name := s.Probe.Name()
	r.mu.Lock()
	prev, seen := r.results[name]
	res := ProbeResult{Name: name, OK: ok, Detail: detail, Since: now, CheckedAt: now}
	if ok {
		delete(r.streaks, name)
	} else if seen && prev.OK {
		// A failure while reported passing counts until the threshold; it is then failing since
		// the first failure of the streak.
		st := r.streaks[name]
		if st.n == 0 {
			st.first = now
		}
		st.n++
		if st.n < cmp.Or(s.FailureThreshold, DefaultFailureThreshold) {
			r.streaks[name] = st
			prev.CheckedAt = now
			r.results[name] = prev
			r.mu.Unlock()
			r.log.Debug("probe failed; not failing until it fails again", "probe", name, "detail", detail, "inARow", st.n)
			return
		}
		delete(r.streaks, name)
		res.Since = st.first
	}
	changed := !seen || prev.OK != ok
	if !changed {
		res.Since = prev.Since
	}
	r.results[name] = res
	r.mu.Unlock()
	if changed {
		level := slog.LevelInfo
		if !ok {
			level = slog.LevelWarn
		}
		r.log.Log(ctx, level, "probe "+verdictWord(ok), "probe", name, "detail", detail)
		r.onChange()
	}
}

func verdictWord(ok bool) string {
	if ok {
		return "passing"
	}
	return "failing"
}

// Results returns the latest result of every probe that has run, by name.
func (r *Runner) Results() []ProbeResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ProbeResult, 0, len(r.results))
	for _, res := range r.results {
		out = append(out, res)
	}
	slices.SortFunc(out, func(a, b ProbeResult) int { return strings.Compare(a.Name, b.Name) })
	return out
}
