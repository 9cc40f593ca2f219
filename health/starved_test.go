package health

import (
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

// stall is a wait of the watch's timer that ran late by late, ending at end.
type stall struct {
	end  time.Time
	late time.Duration
}

const (
	starvedBy     = 150 * time.Millisecond // late enough that a probe and its suspicion both time out
	starvedWithin = 2 * time.Second        // how long after a stall a death is put down to it
)

// watchStarvation watches until the test ends.
func watchStarvation(t testing.TB) *starvation {
	s := &starvation{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		const tick = 10 * time.Millisecond
		for last := time.Now(); ; {
			select {
			case <-stop:
				return
			case <-time.After(tick):
			}
			now := time.Now()
			if late := now.Sub(last) - tick; late >= starvedBy {
				s.mu.Lock()
				s.stalls = append(s.stalls, stall{end: now, late: late})
				s.mu.Unlock()
			}
			last = now
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return s
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
