// Package claim is the one right to act on a workload cluster's machines, shared by the two hubs that
// may heal it: the management cluster's cell of that cluster (kube/cellhub) and the workload
// cluster's own hub run with --fallback, which acts only while the cell cannot. The claim is the
// workload cluster's hub Lease (hale-system/hale-hub): the cell campaigns for it as one more replica
// of that cluster's hub would, so the workload API server decides who holds it, as it does between
// replicas (Kubernetes is the engine, no consensus of Hale's), and whoever does not hold it acts on
// nothing. The fallback takes it only once nobody has renewed it for its duration (kube.Elect);
// the cell, back, marks it wanted (Want) and the fallback hands it back at its next safe checkpoint
// (HandBack: a pause, acknowledged once every step in flight has reached its checkpoint).
//
// A remediation in flight crosses over with the claim: the cell copies every record it writes into
// the workload cluster's journal (Mirror), where a fallback taking over resumes it as a new leader
// resumes its predecessor's, and the cell, taking the claim back, reads there what the fallback began
// or ended meanwhile (Pull).
package claim

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/kube"
)

// WantedAnnotation on the claim's Lease names the cell that wants it and when it last said so
// ("IDENTITY TIME"); the cell writes it again every few seconds while it waits, and the fallback heeds
// it while it changes.
const WantedAnnotation = "hale.dev/claim-wanted-by"

// Want marks the Lease key wanted by identity, unless identity holds it or it does not exist yet
// (kube.Elect makes it), and returns its holder ("" for none). It patches the annotation alone,
// never the holder's record.
func Want(ctx context.Context, c client.Client, key client.ObjectKey, identity string) (string, error) {
	var lease coordinationv1.Lease
	if err := c.Get(ctx, key, &lease); apierrors.IsNotFound(err) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("reading the claim (Lease %s): %w", key, err)
	}
	holder := kube.LeaseHolder(&lease)
	if holder == identity {
		return holder, nil
	}
	before := lease.DeepCopy()
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[WantedAnnotation] = identity + " " + time.Now().UTC().Format(time.RFC3339Nano)
	if err := c.Patch(ctx, &lease, client.MergeFrom(before)); err != nil {
		return holder, fmt.Errorf("marking the claim (Lease %s) wanted: %w", key, err)
	}
	return holder, nil
}

// Pauser is the hub as HandBack needs it: a pause of its own, and whether every step in flight has
// reached its checkpoint.
type Pauser interface {
	SetPause(source string, on bool, reason string)
	PauseState() operator.PauseState
}

// HandBack is the fallback's side: while it holds the claim, it reads the Lease every Every and,
// while a cell marks it wanted, pauses the hub.
type HandBack struct {
	Client client.Client
	Lease  client.ObjectKey
	Hub    Pauser
	Every  time.Duration
	// Fresh: a mark that has not changed for this long is not heeded (its cell stopped asking). The
	// first mark read is not heeded until it changes: it may be long gone.
	Fresh time.Duration
	Log   *slog.Logger
}

// pauseSource is the pause HandBack holds, as `hub status` names it.
const pauseSource = "claim"

// Run returns true once the hub is paused for a cell that wants the claim (every step in flight at its
// checkpoint): the caller ends its term, which gives the Lease up, and the cell takes it. It returns
// false when ctx ends. A mark that stops changing lifts the pause.
func (b *HandBack) Run(ctx context.Context) bool {
	tick := time.NewTicker(b.Every)
	defer tick.Stop()
	var last string
	var changed time.Time
	read, paused := false, false
	for {
		var lease coordinationv1.Lease
		if err := b.Client.Get(ctx, b.Lease, &lease); err == nil {
			switch v := lease.Annotations[WantedAnnotation]; {
			case !read:
				last, read = v, true
			case v != last:
				last, changed = v, time.Now()
			}
		}
		wanted := last != "" && !changed.IsZero() && time.Since(changed) < b.Fresh
		switch {
		case wanted && !paused:
			b.Hub.SetPause(pauseSource, true, fmt.Sprintf("the management cluster's cell of this cluster wants the claim back (%s): it is handed back at the next safe checkpoint", last))
			b.Log.Info("claim: wanted by the management cluster's cell; pausing to hand it back", "lease", b.Lease.String(), "wantedBy", last)
			paused = true
		case !wanted && paused:
			b.Hub.SetPause(pauseSource, false, "")
			b.Log.Info("claim: the cell that wanted it stopped asking; going on", "lease", b.Lease.String())
			paused = false
		}
		if paused && b.Hub.PauseState() == operator.Paused {
			b.Log.Info("claim: every step in flight at its checkpoint; handing it back", "lease", b.Lease.String())
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// Mirror is a cell's journal while it holds the claim: reads and writes go to the journal.Store it
// embeds (the management cluster's), and after each write the whole record is copied to Workload,
// the workload cluster's journal, with its machine named as the fallback names it (Node: the
// machine's Node). A write that cannot be copied fails, as one the journal refused: a step is taken
// only once both say it is about to be.
type Mirror struct {
	journal.Store
	Workload *kube.Journal
	Node     func(machine string) string
}

// Begin begins r in both journals; one that cannot be copied is ended at once (aborted, with why).
func (m *Mirror) Begin(ctx context.Context, r journal.Remediation) (journal.Remediation, error) {
	r, err := m.Store.Begin(ctx, r)
	if err != nil {
		return r, err
	}
	if err := m.copy(ctx, r.ID); err != nil {
		if ferr := m.Store.Finish(ctx, r.ID, journal.Aborted, err.Error()); ferr != nil {
			err = fmt.Errorf("%w (and ending it: %v)", err, ferr)
		}
		return r, err
	}
	return r, nil
}

func (m *Mirror) Intent(ctx context.Context, id string, step int, detail string) error {
	return m.then(ctx, id, m.Store.Intent(ctx, id, step, detail))
}

func (m *Mirror) Outcome(ctx context.Context, id string, step int, result journal.Result, detail string) error {
	return m.then(ctx, id, m.Store.Outcome(ctx, id, step, result, detail))
}

func (m *Mirror) Note(ctx context.Context, id string, detail string) error {
	return m.then(ctx, id, m.Store.Note(ctx, id, detail))
}

func (m *Mirror) Finish(ctx context.Context, id string, state journal.State, detail string) error {
	return m.then(ctx, id, m.Store.Finish(ctx, id, state, detail))
}

// then copies id once its write (err) went through.
func (m *Mirror) then(ctx context.Context, id string, err error) error {
	if err != nil {
		return err
	}
	return m.copy(ctx, id)
}

func (m *Mirror) copy(ctx context.Context, id string) error {
	r, err := m.Store.Get(ctx, id)
	if err == nil {
		r.Machine = m.Node(r.Machine)
		err = m.Workload.Put(ctx, r)
	}
	if err != nil {
		return fmt.Errorf("copying remediation %s to the workload cluster's journal (where a fallback hub taking the claim resumes it): %w", id, err)
	}
	return nil
}

// Pull brings into primary (the cell's journal) what it must resume or end from workload (the
// workload cluster's), as the cell takes the claim: each remediation in progress there (the
// fallback's, handed back at a checkpoint), and each that went on there further than primary knows
// (one of the cell's that the fallback carried on, or ended, while it held the claim). Machine names
// a Node's machine. It returns how many it brought.
func Pull(ctx context.Context, primary, workload *kube.Journal, machine func(node string) string) (int, error) {
	active, err := primary.Active(ctx)
	if err != nil {
		return 0, err
	}
	mine := map[string]journal.Remediation{}
	for _, r := range active {
		mine[r.ID] = r
	}
	there, err := workload.Active(ctx)
	if err != nil {
		return 0, err
	}
	for id := range mine {
		if r, err := workload.Get(ctx, id); err == nil && r.State != journal.InProgress {
			there = append(there, r)
		}
	}
	n := 0
	for _, r := range there {
		if p, ok := mine[r.ID]; ok && len(p.History) >= len(r.History) {
			continue // the cell's own, as it left it
		}
		r.Machine = machine(r.Machine)
		if err := primary.Put(ctx, r); err != nil {
			return n, fmt.Errorf("bringing remediation %s from the workload cluster's journal: %w", r.ID, err)
		}
		n++
	}
	return n, nil
}
