package hub

import (
	"sync"

	"github.com/hale-dev/hale/hub/pass"
)

// advance is the one door by which what apply set going beside the passes comes back to them (raft's
// Advance): how each queued begin went and how the latest write of the raft mark went, collected by the
// next pass's observe as facts. (What the BMC checks found is the hub's published readiness, read
// whole by each pass.)
type advance struct {
	mu    sync.Mutex
	begun []pass.BeginResult
	mark  *pass.MarkResult // the latest write's: an older one is news to nobody
}

func (a *advance) began(r pass.BeginResult) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.begun = append(a.begun, r)
}

func (a *advance) markWritten(m pass.RaftMark, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.mark = &pass.MarkResult{Mark: m, Err: err}
}

// collect returns what came back since the last call.
func (a *advance) collect() (begun []pass.BeginResult, mark *pass.MarkResult) {
	a.mu.Lock()
	defer a.mu.Unlock()
	begun, mark, a.begun, a.mark = a.begun, a.mark, nil, nil
	return begun, mark
}
