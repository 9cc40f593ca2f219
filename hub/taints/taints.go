// Package taints writes the out-of-service taint (node.kubernetes.io/out-of-service) on the Nodes
// of the machines the hub's passes say are known off, beside the passes, and takes off the ones it put
// on once they must go.
package taints

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hale-dev/hale/hub/pass"
)

// Nodes puts the out-of-service taint (node.kubernetes.io/out-of-service=nodeshutdown:NoExecute)
// on Nodes and takes off the ones it put on (Kubernetes mode: outofservice.Taints).
type Nodes interface {
	// Tainted lists the Nodes that carry the taint Hale put on.
	Tainted(ctx context.Context) ([]string, error)
	// Taint puts the taint on node, recording why (a Node that has it already, put on by someone
	// else, is left as it is).
	Taint(ctx context.Context, node, why string) error
	// Untaint takes off the taint Hale put on node (none, or the Node gone: nothing to do).
	Untaint(ctx context.Context, node string) error
}

// retry is how long a Node whose taint could not be written waits before it is tried again.
const retry = 10 * time.Second

// Writer makes the Nodes carry the out-of-service taint the passes want (pass.OutOfService),
// beside the passes: each planning pass posts what it says of each machine; the writer puts the taint
// on each Node it is wanted on and takes off each it put on that must go, or whose Node is no
// inventory machine's, and says each change. A new leader first lists what the Nodes carry, so that
// a taint an earlier leader put on goes once it must.
type Writer struct {
	wake chan struct{}

	mu      sync.Mutex
	posted  bool
	want    map[string]taint // by Node: the latest posts' (a Node the passes said nothing of keeps its last)
	nodes   map[string]bool  // the inventory's Nodes, at the latest post
	applied map[string]taint // by Node: what the Nodes carry, as last written or listed
	failed  map[string]time.Time
}

// taint is one Node's out-of-service taint: its machine and why ("" when it must go).
type taint struct{ machine, why string }

// NewWriter returns a writer with nothing to write yet.
func NewWriter() *Writer {
	return &Writer{wake: make(chan struct{}, 1), want: map[string]taint{}, applied: map[string]taint{}, failed: map[string]time.Time{}}
}

// Post hands the writer what a pass said of the taints: the Nodes of the machines it keeps keep what
// the writer last wanted of them; the others want the taint on (said.On) or off.
func (w *Writer) Post(inv pass.Inventory, said pass.Taints) {
	w.mu.Lock()
	changed, nodesChanged, count := !w.posted, false, 0
	for _, m := range inv.Machines {
		if m.Node == "" {
			continue
		}
		count++
		if !w.nodes[m.Node] {
			nodesChanged = true
		}
		if said.Keep[m.Name] {
			continue
		}
		t := taint{m.Name, said.On[m.Name]}
		if old, ok := w.want[m.Node]; !ok || old != t {
			w.want[m.Node], changed = t, true
		}
	}
	if nodesChanged || count != len(w.nodes) {
		// the inventory's Nodes, built again only when they changed (a pass at thousands of machines
		// posts every 200 ms)
		w.nodes = make(map[string]bool, count)
		for _, m := range inv.Machines {
			if m.Node != "" {
				w.nodes[m.Node] = true
			}
		}
		changed = true
	}
	w.posted = true
	w.mu.Unlock()
	if changed {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Of is why node carries the taint Hale put on now ("" when it does not).
func (w *Writer) Of(node string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.applied[node].why
}

// Run lists what the Nodes carry, then writes what is posted until ctx ends, a Node that failed tried
// again after retry; machineOf names the machine of a Node the writer found tainted.
func (w *Writer) Run(ctx context.Context, nodes Nodes, machineOf func(node string) string, say func(pass.Notice)) {
	for failed := false; ; failed = true {
		listed, err := nodes.Tainted(ctx)
		if err == nil {
			w.mu.Lock()
			for _, n := range listed {
				w.applied[n] = taint{machineOf(n), "put on by an earlier leader of the hub"}
			}
			w.mu.Unlock()
			break
		}
		if !failed { // said once; tried again every retry
			say(pass.Notice{Reason: pass.ReasonOutOfService, Warning: true,
				Message: fmt.Sprintf("out-of-service taints: cannot list the Nodes that carry Hale's (%v): none is put on or taken off until they can be listed", err)})
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
	t := time.NewTicker(retry)
	defer t.Stop()
	for {
		w.write(ctx, nodes, say)
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-t.C:
		}
	}
}

// write makes each Node's taint what the posts said (nothing before a first post).
func (w *Writer) write(ctx context.Context, nodes Nodes, say func(pass.Notice)) {
	w.mu.Lock()
	if !w.posted {
		w.mu.Unlock()
		return
	}
	want, applied, known := maps.Clone(w.want), maps.Clone(w.applied), maps.Clone(w.nodes)
	w.mu.Unlock()
	for _, node := range slices.Sorted(maps.Keys(want)) {
		t := want[node]
		switch _, on := applied[node]; {
		case t.why == "":
		case on: // carried already (put on by an earlier leader: this one's why from now on)
			w.mu.Lock()
			w.applied[node] = t
			w.mu.Unlock()
		case w.due(node):
			w.done(node, &t, nodes.Taint(ctx, node, t.why), say)
		}
	}
	for _, node := range slices.Sorted(maps.Keys(applied)) {
		if t, said := want[node]; ((said && t.why == "") || !known[node]) && w.due(node) {
			w.done(node, nil, nodes.Untaint(ctx, node), say)
		}
	}
}

func (w *Writer) due(node string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Since(w.failed[node]) >= retry
}

// done records how putting the taint on node (put: its machine and why) or taking it off (nil) went,
// and says it.
func (w *Writer) done(node string, put *taint, err error, say func(pass.Notice)) {
	w.mu.Lock()
	t, wasFailing := w.applied[node], !w.failed[node].IsZero()
	if put != nil {
		t = *put
	}
	switch {
	case err != nil:
		w.failed[node] = time.Now()
	case put != nil:
		w.applied[node] = t
		delete(w.failed, node)
	default:
		delete(w.applied, node)
		delete(w.failed, node)
	}
	w.mu.Unlock()
	switch {
	case err != nil && !wasFailing && put != nil:
		say(pass.Notice{Machine: t.machine, Reason: pass.ReasonOutOfService, Warning: true,
			Message: fmt.Sprintf("%s: cannot put the out-of-service taint on Node %s (%v); tried again every %v: %s", t.machine, node, err, retry, t.why)})
	case err != nil && !wasFailing:
		say(pass.Notice{Machine: t.machine, Reason: pass.ReasonInService, Warning: true,
			Message: fmt.Sprintf("%s: cannot take Hale's out-of-service taint off Node %s (%v); tried again every %v", t.machine, node, err, retry)})
	case err != nil:
	case put != nil:
		say(pass.Notice{Machine: t.machine, Reason: pass.ReasonOutOfService, Warning: true,
			Message: fmt.Sprintf("%s: Node %s tainted node.kubernetes.io/out-of-service (its pods are deleted and their volumes detached, to start elsewhere): %s", t.machine, node, t.why)})
	default:
		say(pass.Notice{Machine: t.machine, Reason: pass.ReasonInService,
			Message: fmt.Sprintf("%s: out-of-service taint taken off Node %s: no longer known off (back, heard again, its BMC reads On or cannot be read, detached, or the policy changed)", t.machine, node)})
	}
}
