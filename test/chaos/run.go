package main

import (
	"fmt"
	"io"
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
