// Package kube is Hale's Kubernetes mode: the same hub pipeline, with its journal, inventory and
// actuators in the cluster. This file is the journal: hub.Store on Remediation objects (hale.dev).
package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// Journal keeps remediations as Remediation objects in one namespace, so `kubectl get remediations`
// shows them and RBAC decides who may create one. Each write checks the object's epoch (the newest
// hub that wrote to it) against its own and uses the object's resourceVersion (optimistic
// concurrency): a deposed hub's write is refused with hub.ErrStaleEpoch, a racing one retried on the
// fresh object.
type Journal struct {
	c  client.Client
	ns string
	// cluster, when set, is the Cluster API Cluster whose remediations these are (a management
	// cluster's cell): written with its cluster.x-k8s.io/cluster-name label, and only those read.
	cluster string
	epoch   uint64
	keep    int
	now     func() time.Time
	fence   func(context.Context) error
}

// WithFence makes every write first call fence (Leader.Check): a deposed leader's writes are refused
// even on objects its successor has not touched yet.
func (j *Journal) WithFence(fence func(context.Context) error) *Journal {
	j.fence = fence
	return j
}

// ForCluster makes the journal the remediations of Cluster API Cluster name only: a management
// cluster's namespace may hold several clusters' machines, and their names may be the same.
func (j *Journal) ForCluster(name string) *Journal {
	j.cluster = name
	return j
}

func (j *Journal) checkFence(ctx context.Context) error {
	if j.fence == nil {
		return nil
	}
	return j.fence(ctx)
}

var _ journal.Store = (*Journal)(nil)

// NewJournal returns the journal in namespace ns for a hub at epoch (in Kubernetes mode: from its
// leader-election Lease); keep bounds the finished remediations kept per machine (default 20).
func NewJournal(c client.Client, ns string, epoch uint64, keep int) *Journal {
	if keep <= 0 {
		keep = 20
	}
	return &Journal{c: c, ns: ns, epoch: epoch, keep: keep, now: func() time.Time { return time.Now().UTC() }}
}

// Epoch is this writer's epoch.
func (j *Journal) Epoch() uint64 { return j.epoch }

// nameFor is a DNS-1123 name that sorts by time: the machine's name made safe, then the creation
// time in nanoseconds, base 36, fixed width.
func nameFor(machine string, at time.Time) string {
	ts := strconv.FormatInt(at.UnixNano(), 36)
	return fmt.Sprintf("%s-%013s", DNSSafe(machine), ts)
}

// DNSSafe is machine made a DNS-1123 label prefix: lower case, other characters as '-', at most 40.
func DNSSafe(machine string) string {
	safe := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '-'
	}, machine)
	safe = strings.Trim(safe, "-")
	if len(safe) > 40 {
		safe = safe[:40]
	}
	return safe
}

// machineLabel is the machine's name as a label value, or empty when it cannot be one (History then
// lists without the label and filters on spec.machine).
func machineLabel(machine string) string {
	if len(validation.IsValidLabelValue(machine)) > 0 {
		return ""
	}
	return machine
}

// Begin creates the Remediation (spec: what was asked) and its status (InProgress, a "begun" note).
func (j *Journal) Begin(ctx context.Context, r journal.Remediation) (journal.Remediation, error) {
	if r.Machine == "" {
		return r, errors.New("remediation: machine name is empty")
	}
	if err := j.checkFence(ctx); err != nil {
		return r, err
	}
	active, err := j.list(ctx, r.Machine, true)
	if err != nil {
		return r, err
	}
	if len(active) > 0 {
		return r, fmt.Errorf("%s: %w (%s)", r.Machine, journal.ErrActive, active[0].Name)
	}
	now := j.now()
	obj := &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Name: nameFor(r.Machine, now), Namespace: j.ns}}
	if r.ID != "" { // an operator's request object (kubectl, `hub reboot --kubernetes`): recorded in it
		if err := j.c.Get(ctx, client.ObjectKey{Namespace: j.ns, Name: r.ID}, obj); err != nil {
			return r, fmt.Errorf("reading the requested remediation %s/%s: %w", j.ns, r.ID, err)
		}
		if _, begun := obj.Labels[v1alpha1.LabelPhase]; begun || obj.Status.Phase != "" {
			return r, fmt.Errorf("remediation %s/%s was begun already", j.ns, r.ID)
		}
		if c, ok := obj.Labels[clusterv1.ClusterNameLabel]; ok && j.cluster != "" && c != j.cluster {
			return r, fmt.Errorf("remediation %s/%s is labelled %s=%s: not this hub's cluster (%q)", j.ns, r.ID, clusterv1.ClusterNameLabel, c, j.cluster)
		}
	}
	j.label(obj, v1alpha1.PhaseInProgress, r.Machine)
	obj.Spec = v1alpha1.RemediationSpec{Machine: r.Machine, Strategy: r.Strategy, RequestedBy: r.RequestedBy, Reason: r.Reason,
		Hard: r.Hard, Force: r.Forced, Steps: quorum.Plan{Steps: r.Steps}.StepStrings(), Attempt: int32(r.Attempt), WhileDead: r.WhileDead}
	obj.Spec.Members = r.Members
	if !r.AgentStarted.IsZero() {
		obj.Spec.AgentStarted = &metav1.Time{Time: r.AgentStarted}
	}
	if r.ID != "" {
		if err := j.c.Update(ctx, obj); err != nil { // resourceVersion: refused if the request changed meanwhile
			return r, fmt.Errorf("adopting remediation %s/%s: %w", j.ns, obj.Name, err)
		}
	} else if err := j.c.Create(ctx, obj); err != nil {
		return r, fmt.Errorf("creating remediation %s/%s: %w", j.ns, obj.Name, err)
	}
	obj.Status = v1alpha1.RemediationStatus{Phase: v1alpha1.PhaseInProgress, Epoch: int64(j.epoch),
		History: []v1alpha1.RemediationEvent{{Time: metav1.NewMicroTime(now), Step: -1, Kind: string(journal.EntryNote),
			Detail: "begun: " + r.Reason, Epoch: int64(j.epoch)}}}
	if err := j.c.Status().Update(ctx, obj); err != nil {
		return r, fmt.Errorf("writing the status of remediation %s/%s: %w", j.ns, obj.Name, err)
	}
	return toHub(obj), nil
}

// label sets the labels a remediation is listed by: its phase, its machine, and this journal's cluster.
func (j *Journal) label(obj *v1alpha1.Remediation, phase v1alpha1.RemediationPhase, machine string) {
	if obj.Labels == nil {
		obj.Labels = map[string]string{}
	}
	obj.Labels[v1alpha1.LabelPhase] = string(phase)
	if l := machineLabel(machine); l != "" {
		obj.Labels[v1alpha1.LabelMachine] = l
	}
	if j.cluster != "" {
		obj.Labels[clusterv1.ClusterNameLabel] = j.cluster
	}
}

// Intent records that step is about to be taken (before the side effect).
func (j *Journal) Intent(ctx context.Context, id string, step int, detail string) error {
	return j.event(ctx, id, journal.Entry{Step: step, Kind: journal.EntryIntent, Detail: detail}, "")
}

// Outcome records what step did (after the side effect).
func (j *Journal) Outcome(ctx context.Context, id string, step int, result journal.Result, detail string) error {
	return j.event(ctx, id, journal.Entry{Step: step, Kind: journal.EntryOutcome, Result: result, Detail: detail}, "")
}

// Note records something worth knowing (step -1).
func (j *Journal) Note(ctx context.Context, id string, detail string) error {
	return j.event(ctx, id, journal.Entry{Step: -1, Kind: journal.EntryNote, Detail: detail}, "")
}

// Finish ends a remediation and prunes the machine's finished ones to the bound.
func (j *Journal) Finish(ctx context.Context, id string, state journal.State, detail string) error {
	if state == journal.InProgress {
		return fmt.Errorf("finish %s: %s is not a final state", id, state)
	}
	return j.event(ctx, id, journal.Entry{Step: -1, Kind: journal.EntryNote, Ends: state, Detail: string(state) + ": " + detail}, state)
}

func (j *Journal) event(ctx context.Context, id string, e journal.Entry, finish journal.State) error {
	var obj v1alpha1.Remediation
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := j.c.Get(ctx, client.ObjectKey{Namespace: j.ns, Name: id}, &obj); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("%s: %w in namespace %s", id, journal.ErrNoRemediation, j.ns)
			}
			return fmt.Errorf("reading remediation %s/%s: %w", j.ns, id, err)
		}
		if uint64(obj.Status.Epoch) > j.epoch {
			return fmt.Errorf("remediation %s: %w (this hub's epoch %d, the remediation's %d)", id, journal.ErrStaleEpoch, j.epoch, obj.Status.Epoch)
		}
		if obj.Status.Phase == "" && obj.Labels[v1alpha1.LabelPhase] == string(v1alpha1.PhaseInProgress) {
			// Created, its status not written (the begin's second write failed, or its hub died in
			// between): in progress, as Active and toHub take it.
			obj.Status.Phase = v1alpha1.PhaseInProgress
		}
		if obj.Status.Phase != v1alpha1.PhaseInProgress {
			return fmt.Errorf("remediation %s is %s already: %w", id, obj.Status.Phase, journal.ErrFinished)
		}
		if err := j.checkFence(ctx); err != nil {
			return err
		}
		obj.Status.Epoch = int64(j.epoch)
		e.At, e.Epoch = j.now(), j.epoch
		obj.Status.History = append(obj.Status.History, eventOf(e))
		if finish != "" {
			obj.Status.Phase = v1alpha1.RemediationPhase(finish)
			status, reason := metav1.ConditionFalse, string(finish)
			if finish == journal.Succeeded {
				status = metav1.ConditionTrue
			}
			meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{Type: "Ready", Status: status, Reason: reason,
				Message: e.Detail, ObservedGeneration: obj.Generation})
		}
		return j.c.Status().Update(ctx, &obj)
	})
	if err != nil || finish == "" {
		return err
	}
	// The phase label lets Active list what is in progress without reading every object.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := j.c.Get(ctx, client.ObjectKey{Namespace: j.ns, Name: id}, &obj); err != nil {
			return err
		}
		obj.Labels[v1alpha1.LabelPhase] = string(finish)
		return j.c.Update(ctx, &obj)
	}); err != nil {
		return fmt.Errorf("labelling remediation %s/%s %s: %w", j.ns, id, finish, err)
	}
	return j.prune(ctx, obj.Spec.Machine)
}

// prune deletes the machine's oldest finished remediations beyond the bound.
// eventOf is a journal entry as a Remediation's status keeps it.
func eventOf(e journal.Entry) v1alpha1.RemediationEvent {
	return v1alpha1.RemediationEvent{Time: metav1.NewMicroTime(e.At), Step: int32(e.Step), Kind: string(e.Kind),
		Result: string(e.Result), Ends: string(e.Ends), Detail: e.Detail, Epoch: int64(e.Epoch)}
}

func (j *Journal) prune(ctx context.Context, machine string) error {
	all, err := j.list(ctx, machine, false)
	if err != nil {
		return err
	}
	var done []v1alpha1.Remediation
	for _, r := range all {
		if r.Status.Phase != v1alpha1.PhaseInProgress {
			done = append(done, r)
		}
	}
	for i := 0; i < len(done)-j.keep; i++ {
		if err := j.c.Delete(ctx, &done[i]); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("pruning remediation %s/%s: %w", j.ns, done[i].Name, err)
		}
	}
	return nil
}

// list returns a machine's remediations (all machines' when machine is empty), oldest first; only
// those in progress when active.
func (j *Journal) list(ctx context.Context, machine string, active bool) ([]v1alpha1.Remediation, error) {
	labels := client.MatchingLabels{}
	if l := machineLabel(machine); l != "" {
		labels[v1alpha1.LabelMachine] = l
	}
	if active {
		labels[v1alpha1.LabelPhase] = string(v1alpha1.PhaseInProgress)
	}
	if j.cluster != "" {
		labels[clusterv1.ClusterNameLabel] = j.cluster
	}
	var list v1alpha1.RemediationList
	if err := j.c.List(ctx, &list, client.InNamespace(j.ns), labels); err != nil {
		return nil, fmt.Errorf("listing remediations in %s: %w", j.ns, err)
	}
	out := slices.DeleteFunc(list.Items, func(r v1alpha1.Remediation) bool {
		return (machine != "" && r.Spec.Machine != machine) || (active && r.Status.Phase != v1alpha1.PhaseInProgress && r.Status.Phase != "")
	})
	slices.SortFunc(out, func(a, b v1alpha1.Remediation) int {
		if c := begunAt(&a).Compare(begunAt(&b)); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// begunAt is when the remediation began: its first history event (microseconds), else its creation
// (seconds: created, status not written yet).
func begunAt(obj *v1alpha1.Remediation) time.Time {
	if len(obj.Status.History) > 0 {
		return obj.Status.History[0].Time.UTC()
	}
	return obj.CreationTimestamp.UTC()
}

// Get returns one remediation.
func (j *Journal) Get(ctx context.Context, id string) (journal.Remediation, error) {
	var obj v1alpha1.Remediation
	if err := j.c.Get(ctx, client.ObjectKey{Namespace: j.ns, Name: id}, &obj); apierrors.IsNotFound(err) {
		return journal.Remediation{}, fmt.Errorf("%s: %w in namespace %s", id, journal.ErrNoRemediation, j.ns)
	} else if err != nil {
		return journal.Remediation{}, fmt.Errorf("reading remediation %s/%s: %w", j.ns, id, err)
	}
	return toHub(&obj), nil
}

// Active returns every remediation in progress, oldest first.
func (j *Journal) Active(ctx context.Context) ([]journal.Remediation, error) {
	return j.hubList(ctx, "", true)
}

// History returns a machine's remediations, oldest first.
func (j *Journal) History(ctx context.Context, machine string) ([]journal.Remediation, error) {
	return j.hubList(ctx, machine, false)
}

func (j *Journal) hubList(ctx context.Context, machine string, active bool) ([]journal.Remediation, error) {
	list, err := j.list(ctx, machine, active)
	if err != nil {
		return nil, err
	}
	out := make([]journal.Remediation, len(list))
	for i := range list {
		out[i] = toHub(&list[i])
	}
	return out, nil
}

func toHub(obj *v1alpha1.Remediation) journal.Remediation {
	r := journal.Remediation{ID: obj.Name, Machine: obj.Spec.Machine, Strategy: obj.Spec.Strategy, RequestedBy: obj.Spec.RequestedBy,
		Reason: obj.Spec.Reason, Hard: obj.Spec.Hard, Forced: obj.Spec.Force, Attempt: int(obj.Spec.Attempt), Members: obj.Spec.Members,
		WhileDead: obj.Spec.WhileDead, State: journal.State(obj.Status.Phase), Created: begunAt(obj)}
	if r.State == "" { // created, status not written yet (the hub died in between): nothing was done
		r.State = journal.InProgress
	}
	if obj.Spec.AgentStarted != nil {
		r.AgentStarted = obj.Spec.AgentStarted.UTC()
	}
	r.Updated = r.Created
	for _, e := range obj.Status.History {
		r.History = append(r.History, journal.Entry{At: e.Time.UTC(), Step: int(e.Step), Kind: journal.EntryKind(e.Kind), Result: journal.Result(e.Result), Ends: journal.State(e.Ends), Detail: e.Detail, Epoch: uint64(e.Epoch)})
		r.Updated = e.Time.UTC()
	}
	for i, text := range obj.Spec.Steps {
		step, err := quorum.ParseStep(text)
		if err != nil {
			// Not the hub's writing: the plan is unreadable, and a resume aborts it (planOf) with this.
			r.Steps = nil
			r.History = append(r.History, journal.Entry{At: r.Updated, Step: -1, Kind: journal.EntryNote, Detail: fmt.Sprintf("spec.steps[%d]: %v", i, err)})
			break
		}
		r.Steps = append(r.Steps, step)
	}
	return r
}
