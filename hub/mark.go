package hub

import (
	"context"
	"sync"

	"github.com/hale-dev/hale/hub/pass"
)

// MarkStore keeps the raft mark across hub restarts: the journal does (Journal.RecordRaftMark).
type MarkStore interface {
	RaftMark(ctx context.Context) (pass.RaftMark, error)
	RecordRaftMark(ctx context.Context, m pass.RaftMark) error
}

// latest writes, beside the passes, the latest value handed over at a time (a value posted before
// the writer took the one before replaces it). The raft mark goes so: in Kubernetes mode the mark goes
// to the API server, which, once etcd has lost quorum (when a pass writes the mark at once), accepts
// the write and answers only at the client's timeout. A pass held that long kept the hub from passing
// for seconds at the moment degraded mode is decided, and the leader, its Lease lost then, found no
// recent pass and did not go on alone (test/quorumlost, five members). How a mark's write went comes
// back to the next pass as a fact (advance, pass.State.MarkWritten). The episodes' log goes so too.
type latest[T any] struct {
	wake chan struct{} // one pending signal

	mu      sync.Mutex
	pending *T // handed over, not yet taken by the writer
}

func newLatest[T any]() *latest[T] { return &latest[T]{wake: make(chan struct{}, 1)} }

// post hands v to the writer, in place of a value it has not taken yet.
func (w *latest[T]) post(v T) {
	w.mu.Lock()
	w.pending = &v
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run writes what is posted with write until ctx ends, and tells done (when set) how each write went.
func (w *latest[T]) run(ctx context.Context, write func(context.Context, T) error, done func(T, error)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		w.mu.Lock()
		v := w.pending
		w.pending = nil
		w.mu.Unlock()
		if v == nil {
			continue
		}
		err := write(ctx, *v)
		if done != nil {
			done(*v, err)
		}
	}
}
