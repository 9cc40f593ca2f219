package kube

// Whole records written from another journal: a degraded term's local one (Import), and the copies
// the management cluster's cell and a workload cluster's fallback hub keep of each other's work
// (Put, kube/claim).

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// Import records a remediation that a hub kept in its local journal while the API server did not
// answer (degraded mode) as a Remediation object with its whole history, then note: a finished one as
// it ended, one still in progress for this hub to resume as any other. The object's name comes from
// the record (machine and start time), so a second import of the same record writes nothing: an
// import cut short by a crash is simply done again.
func (j *Journal) Import(ctx context.Context, r journal.Remediation, note string) error {
	return j.write(ctx, nameFor(r.Machine, r.Created), r, note, false)
}

// Put writes r as the Remediation named r.ID with its whole history, creating it or replacing what
// it held: another journal's copy of a remediation (kube/claim: a workload cluster's copy of a
// management cell's work, and back). One written at a higher epoch than this journal's is refused
// (journal.ErrStaleEpoch): a newer writer has it.
func (j *Journal) Put(ctx context.Context, r journal.Remediation) error {
	return j.write(ctx, r.ID, r, "", true)
}

// write is Import (replace false: an object whose status is written is left as it is) and Put.
func (j *Journal) write(ctx context.Context, name string, r journal.Remediation, note string, replace bool) error {
	if err := j.checkFence(ctx); err != nil {
		return err
	}
	obj := &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: j.ns}}
	j.label(obj, v1alpha1.RemediationPhase(r.State), r.Machine)
	obj.Spec = v1alpha1.RemediationSpec{Machine: r.Machine, Strategy: r.Strategy, RequestedBy: r.RequestedBy, Reason: r.Reason,
		Hard: r.Hard, Force: r.Forced, Steps: quorum.Plan{Steps: r.Steps}.StepStrings(), Attempt: int32(r.Attempt), Members: r.Members,
		WhileDead: r.WhileDead}
	if !r.AgentStarted.IsZero() {
		obj.Spec.AgentStarted = &metav1.Time{Time: r.AgentStarted}
	}
	if err := j.c.Create(ctx, obj); apierrors.IsAlreadyExists(err) {
		var got v1alpha1.Remediation
		if err := j.c.Get(ctx, client.ObjectKey{Namespace: j.ns, Name: name}, &got); err != nil {
			return fmt.Errorf("reading remediation %s/%s: %w", j.ns, name, err)
		}
		switch {
		case !replace && got.Status.Phase != "":
			return nil // imported before
		case replace && uint64(got.Status.Epoch) > j.epoch:
			return fmt.Errorf("remediation %s/%s: %w (this hub's epoch %d, the remediation's %d)", j.ns, name, journal.ErrStaleEpoch, j.epoch, got.Status.Epoch)
		case replace:
			got.Labels, got.Spec = obj.Labels, obj.Spec
			if err := j.c.Update(ctx, &got); err != nil {
				return fmt.Errorf("writing remediation %s/%s: %w", j.ns, name, err)
			}
		}
		obj = &got // (Import: created, its status not written yet: the import was cut short)
	} else if err != nil {
		return fmt.Errorf("creating remediation %s/%s: %w", j.ns, name, err)
	}
	obj.Status = v1alpha1.RemediationStatus{Phase: v1alpha1.RemediationPhase(r.State), Epoch: int64(j.epoch)}
	for _, e := range r.History {
		obj.Status.History = append(obj.Status.History, eventOf(e))
	}
	if note != "" {
		obj.Status.History = append(obj.Status.History, v1alpha1.RemediationEvent{Time: metav1.NewMicroTime(j.now()), Step: -1,
			Kind: string(journal.EntryNote), Detail: note, Epoch: int64(j.epoch)})
	}
	if r.State != journal.InProgress {
		status := metav1.ConditionFalse
		if r.State == journal.Succeeded {
			status = metav1.ConditionTrue
		}
		last := ""
		if n := len(r.History); n > 0 {
			last = r.History[n-1].Detail
		}
		meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{Type: "Ready", Status: status, Reason: string(r.State),
			Message: last, ObservedGeneration: obj.Generation})
	}
	if err := j.c.Status().Update(ctx, obj); err != nil {
		return fmt.Errorf("writing the status of remediation %s/%s: %w", j.ns, name, err)
	}
	if replace && r.State != journal.InProgress {
		return j.prune(ctx, r.Machine)
	}
	return nil
}
