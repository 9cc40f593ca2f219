package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"
)

// event is one thing that happened in a run: a fault applied or reverted, a power change, an operator
// command and its answer.
type event struct {
	At                   time.Time
	Kind, Target, Detail string
}

// timeline is a run's events, in order, also written to the run's log as they happen.
type timeline struct {
	start time.Time
	log   io.Writer

	mu     sync.Mutex
	events []event
}

func (tl *timeline) add(kind, target, detail string) {
	e := event{At: time.Now(), Kind: kind, Target: target, Detail: detail}
	tl.mu.Lock()
	tl.events = append(tl.events, e)
	tl.mu.Unlock()
	fmt.Fprintf(tl.log, "%8.3fs %-16s %-6s %s\n", e.At.Sub(tl.start).Seconds(), kind, target, detail)
}

func (tl *timeline) all() []event {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return slices.Clone(tl.events)
}

// since formats t as seconds into the run.
func (tl *timeline) since(t time.Time) string { return fmt.Sprintf("%.1fs", t.Sub(tl.start).Seconds()) }

// run is one chaos run's context: its directory (logs, data), its log, and what to undo at its end. It
// is what the netns lab needs of a test (netns.TB): Fatalf ends the run as a harness error.
type run struct {
	dir string
	log io.Writer

	mu       sync.Mutex
	cleanups []func()
}

// fatal is the panic Fatalf raises; the run's owner recovers it.
type fatal struct{ msg string }

func (r *run) Helper() {}

// Failed is false: a run's verdict is the checker's, and its processes' logs are files in its directory
// whatever the outcome.
func (r *run) Failed() bool { return false }

func (r *run) Logf(format string, args ...any) { fmt.Fprintf(r.log, format+"\n", args...) }

// Errorf logs: the lab reports cleanup failures with it, and the next lab removes what is left.
func (r *run) Errorf(format string, args ...any) { r.Logf("error: "+format, args...) }

func (r *run) Fatalf(format string, args ...any) {
	r.Logf(format, args...)
	panic(fatal{fmt.Sprintf(format, args...)})
}

func (r *run) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}

func (r *run) TempDir() string {
	d, err := os.MkdirTemp(r.dir, "tmp")
	if err != nil {
		r.Fatalf("chaos: %v", err)
	}
	return d
}

// close runs the cleanups, last first.
func (r *run) close() {
	r.mu.Lock()
	cs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}
