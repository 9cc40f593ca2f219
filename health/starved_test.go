package health

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// starvation records how late this test process's timers fire. A process starved of CPU (the race
// detector beside two other packages on a loaded 2-core machine) stops answering its gossip probes
// as surely as a dead member does, and memberlist, probing every 100 ms, declares it dead: that says
// nothing of a link's loss or of a key's rotation. A test that holds that nobody dies asks explains
// whether a death it saw followed such a stall, and says so instead of failing.
type starvation struct {
	mu     sync.Mutex
	stalls []stall
}

// stall is a span of this process's timers running late by late in all, from start to end.
type stall struct {
	start, end time.Time
	late       time.Duration
}

const (
	// starvedBy: late enough in all, within starvedSpan, that a probe and its suspicion both time out
	// (probes time out in 50 ms, suspicions in 200 ms): one timer 150 ms late, or several that add up
	// (a CI run at its busiest saw a peer on a clean link dead 2.5 s in, with no single timer that late).
	starvedBy   = 150 * time.Millisecond
	starvedSpan = 400 * time.Millisecond // a probe, its timeout and a suspicion
	// starvedTick: a timer late by half a probe's timeout counts towards starvedBy; a busy machine's
	// few milliseconds each time, however many, do not.
	starvedTick   = 25 * time.Millisecond
	starvedWithin = 2 * time.Second // how long after a stall a death is put down to it
)

// watchStarvation watches until the test ends.
func watchStarvation(t testing.TB) *starvation {
	s := &starvation{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		const tick = 10 * time.Millisecond
		type sample struct {
			at   time.Time
			late time.Duration
		}
		var recent []sample // the late ticks within starvedSpan
		for last := time.Now(); ; {
			select {
			case <-stop:
				return
			case <-time.After(tick):
			}
			now := time.Now()
			if late := now.Sub(last) - tick; late >= starvedTick {
				recent = append(recent, sample{now, late})
			}
			last = now
			recent = slices.DeleteFunc(recent, func(x sample) bool { return now.Sub(x.at) > starvedSpan })
			var sum time.Duration
			for _, x := range recent {
				sum += x.late
			}
			if sum >= starvedBy {
				s.record(recent[0].at.Add(-recent[0].late), now, sum)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return s
}

// record notes a stall from start to end, late by late in all: the last one goes on if it overlaps.
func (s *starvation) record(start, end time.Time, late time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.stalls); n > 0 && !start.After(s.stalls[n-1].end) {
		last := &s.stalls[n-1]
		last.end, last.late = end, max(last.late, late)
		return
	}
	s.stalls = append(s.stalls, stall{start: start, end: end, late: late})
}

// String lists the stalls, for a failure's message.
func (s *starvation) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.stalls))
	for _, st := range s.stalls {
		out = append(out, fmt.Sprintf("%v late in all, ending %s", st.late, st.end.Format("15:04:05.000")))
	}
	return fmt.Sprintf("%d (%s)", len(out), strings.Join(out, "; "))
}

// explains returns the stall that ended within starvedWithin before at, if any (none when not
// watched: s nil).
func (s *starvation) explains(at time.Time) (stall, bool) {
	if s == nil {
		return stall{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.stalls) - 1; i >= 0; i-- {
		if st := s.stalls[i]; !st.end.After(at) && at.Sub(st.end) <= starvedWithin {
			return st, true
		}
	}
	return stall{}, false
}

// TestStarvationExplainsOnlyWhatFollowsAStall: a stall explains a death up to starvedWithin after
// it, not one before it nor one long after.
func TestStarvationExplainsOnlyWhatFollowsAStall(t *testing.T) {
	at := time.Now()
	s := &starvation{stalls: []stall{{end: at, late: 200 * time.Millisecond}}}
	for _, c := range []struct {
		name  string
		death time.Time
		want  bool
	}{
		{"at the stall's end", at, true},
		{"a second after", at.Add(time.Second), true},
		{"just before", at.Add(-time.Millisecond), false},
		{"long after", at.Add(starvedWithin + time.Millisecond), false},
	} {
		st, ok := s.explains(c.death)
		assert.Equal(t, c.want, ok, c.name)
		if ok {
			assert.Equal(t, 200*time.Millisecond, st.late, c.name)
		}
	}
	_, ok := (*starvation)(nil).explains(at)
	assert.False(t, ok, "not watched")
}

// TestStarvationRecordsOneStallPerSpan: windows that overlap are one stall, the largest sum kept;
// one that begins after the last ended is another.
func TestStarvationRecordsOneStallPerSpan(t *testing.T) {
	at := time.Now()
	s := &starvation{}
	s.record(at, at.Add(300*time.Millisecond), 160*time.Millisecond)
	s.record(at.Add(100*time.Millisecond), at.Add(350*time.Millisecond), 200*time.Millisecond)
	s.record(at.Add(200*time.Millisecond), at.Add(400*time.Millisecond), 150*time.Millisecond)
	s.record(at.Add(time.Second), at.Add(1200*time.Millisecond), 170*time.Millisecond)
	assert.Equal(t, []stall{
		{start: at, end: at.Add(400 * time.Millisecond), late: 200 * time.Millisecond},
		{start: at.Add(time.Second), end: at.Add(1200 * time.Millisecond), late: 170 * time.Millisecond},
	}, s.stalls)
}
