package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/quorum"
)

// Lister is where a poll lists what it looks for: the API server (a client.Client), or one informer
// cache that many pollers share (kube/lists).
type Lister interface {
	List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error
}

// Rebooter is what RequestSync needs of the hub.
type Rebooter interface {
	Reboot(ctx context.Context, req operator.RebootRequest) (operator.RebootResult, error)
	// Assessment is the hub's latest verdict on machine; History its remediations, as journaled;
	// Inventory the machines it heals.
	Assessment(machine string) (assess.Assessment, bool)
	Inventory() pass.Inventory
	History(ctx context.Context, machine string) ([]journal.Remediation, error)
}

// RequestSync carries out the reboots operators ask for by creating a Remediation (with kubectl or
// `hub reboot --kubernetes`), so that Kubernetes RBAC decides who may reboot: whoever may create
// Remediations in the hub's namespace. A request is a Remediation without Hale's phase label and
// without status. It goes through the same checks as `hub reboot` (quorum plan, pause, suspend,
// detach; spec.force overrides the quorum check only); an accepted one is recorded in the request
// object itself, a refused one is closed Aborted with the reason. Only the leader runs it.
type RequestSync struct {
	Client    client.Client
	Namespace string
	Hub       Rebooter
	// Epoch: the leader's, for refusals written to a request's status.
	Epoch uint64
	// Machines, when set, also carries out Cluster API's cluster.x-k8s.io/remediate-machine on the
	// Machines in MachineNamespace (all when empty), as a MachineHealthCheck would: the machine's own
	// way (its owner replaces it, or it is rebooted), through the same checks; the annotation is
	// removed once the hub has taken the request, and stays while it is refused.
	Machines bool
	// MachineNamespace is also where the HaleRemediations are carried out (all when empty: a
	// NodeHealthCheck makes them in its template's namespace): syncExternal.
	MachineNamespace string
	// Cluster, when set, is the Cluster API Cluster this hub heals (a management cluster's cell): only
	// the requests labelled cluster.x-k8s.io/cluster-name with it are its own (a MachineHealthCheck's
	// HaleRemediations are; a Remediation without the label is taken when it names a machine of this
	// Cluster), and only its Machines' annotations.
	Cluster string
	// Lists is where its polls list the requests and the Machines (a management-mode hub's lists.Shared;
	// nil: Client). A candidate found there is read again through Client before it is acted on.
	Lists    Lister
	Interval time.Duration
	Log      *slog.Logger

	refused map[string]string // the last refusal logged per annotated Machine
}

// Run handles requests every Interval (default 1 s) until ctx ends.
func (s *RequestSync) Run(ctx context.Context) {
	interval := s.Interval
	if interval <= 0 {
		interval = time.Second
	}
	for {
		if err := s.Sync(ctx); err != nil && ctx.Err() == nil {
			s.Log.Warn("handling remediation requests", "namespace", s.Namespace, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// Sync handles every pending request once, oldest first.
func (s *RequestSync) Sync(ctx context.Context) error {
	var list v1alpha1.RemediationList
	if err := s.lists().List(ctx, &list, client.InNamespace(s.Namespace)); err != nil {
		return fmt.Errorf("listing remediations in %s: %w", s.Namespace, err)
	}
	var errs []error
	pending := func(r *v1alpha1.Remediation) bool {
		_, begun := r.Labels[v1alpha1.LabelPhase]
		return !begun && r.Status.Phase == "" && r.DeletionTimestamp == nil && s.asksThis(r)
	}
	for i := range list.Items {
		r := &list.Items[i]
		if !pending(r) {
			continue
		}
		if ok, err := s.fresh(ctx, r); err != nil || !ok || !pending(r) {
			errs = append(errs, err) // taken, refused or deleted since the list was made (nil)
			continue
		}
		if err := s.handle(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	if s.Machines {
		errs = append(errs, s.syncMachines(ctx))
	}
	errs = append(errs, s.syncExternal(ctx))
	return errors.Join(errs...)
}

func (s *RequestSync) syncMachines(ctx context.Context) error {
	var list clusterv1.MachineList
	err := s.lists().List(ctx, &list, client.InNamespace(s.MachineNamespace))
	if meta.IsNoMatchError(err) || apierrors.IsForbidden(err) {
		return nil // no Cluster API here, or not Hale's to read (discovery says so once)
	} else if err != nil {
		return fmt.Errorf("listing Cluster API machines: %w", err)
	}
	if s.refused == nil {
		s.refused = map[string]string{}
	}
	for i := range list.Items {
		m := &list.Items[i]
		key := client.ObjectKeyFromObject(m)
		if s.Cluster != "" && m.Spec.ClusterName != s.Cluster {
			continue // another cell's
		}
		requested := func() bool { return clusterapi.ManualRemediationRequested(m) && m.DeletionTimestamp == nil }
		if !requested() {
			delete(s.refused, key.String())
			continue
		}
		if ok, err := s.fresh(ctx, m); err != nil {
			return err
		} else if !ok || !requested() {
			continue // taken, or deleted, since the list was made
		}
		by := fmt.Sprintf("%s on Machine %s", clusterv1.RemediateMachineAnnotation, key)
		res, err := s.Hub.Reboot(ctx, operator.RebootRequest{Machine: m.Name, OwnWay: true, By: by})
		if err != nil {
			if s.refused[key.String()] != err.Error() {
				s.refused[key.String()] = err.Error()
				s.Log.Warn("remediation requested by annotation: not now", "machine", key, "err", err)
			}
			continue
		}
		delete(s.refused, key.String())
		s.Log.Info("remediation requested by annotation", "machine", key, "remediation", res.Remediation, "steps", res.Steps)
		before := m.DeepCopy()
		delete(m.Annotations, clusterv1.RemediateMachineAnnotation)
		if err := s.Client.Patch(ctx, m, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("removing %s from Machine %s (its remediation %s is under way): %w", clusterv1.RemediateMachineAnnotation, key, res.Remediation, err)
		}
	}
	return nil
}

func (s *RequestSync) lists() Lister { return listerOr(s.Lists, s.Client) }

func listerOr(l Lister, c client.Client) Lister {
	if l != nil {
		return l
	}
	return c
}

// fresh reads obj, a candidate a poll found in Lists, again through Client: a cache that has not seen
// the write that took it would have it taken twice. false: it is gone. Listed through Client, it is
// fresh already.
func (s *RequestSync) fresh(ctx context.Context, obj client.Object) (bool, error) {
	if s.Lists == nil {
		return true, nil
	}
	key := client.ObjectKeyFromObject(obj)
	switch err := s.Client.Get(ctx, key, obj); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading %T %s again before acting on it: %w", obj, key, err)
	}
	return true, nil
}

// asksThis says whether request r is this hub's: every one without Cluster; with it, one labelled
// with it, or unlabelled and naming one of its machines (the others are other cells').
func (s *RequestSync) asksThis(r *v1alpha1.Remediation) bool {
	if s.Cluster == "" {
		return true
	}
	if c, ok := r.Labels[clusterv1.ClusterNameLabel]; ok {
		return c == s.Cluster
	}
	_, ok := s.Hub.Inventory().Machine(r.Spec.Machine)
	return ok
}

func (s *RequestSync) handle(ctx context.Context, r *v1alpha1.Remediation) error {
	key := client.ObjectKeyFromObject(r)
	by := "kubernetes: Remediation " + key.String()
	if r.Spec.RequestedBy != "" {
		by = r.Spec.RequestedBy + " (" + by + ")"
	}
	var err error
	switch {
	case r.Spec.Machine == "":
		err = errors.New("spec.machine: required (the machine to reboot, as `hub status` names it)")
	case r.Spec.Strategy != "" && r.Spec.Strategy != quorum.Reboot.String():
		err = fmt.Errorf("spec.strategy: %q cannot be requested; only %q (leave it empty)", r.Spec.Strategy, quorum.Reboot)
	default:
		var res operator.RebootResult
		res, err = s.Hub.Reboot(ctx, operator.RebootRequest{Machine: r.Spec.Machine, Hard: r.Spec.Hard, Force: r.Spec.Force, By: by, Adopt: r.Name})
		if err == nil {
			s.Log.Info("remediation requested", "remediation", key, "machine", r.Spec.Machine, "by", by, "steps", res.Steps)
			return nil
		}
	}
	s.Log.Info("remediation request refused", "remediation", key, "machine", r.Spec.Machine, "err", err)
	return s.refuse(ctx, key, err)
}

// refuse closes a request Aborted with the reason: labelled, so that it is not taken again.
func (s *RequestSync) refuse(ctx context.Context, key client.ObjectKey, why error) error {
	var obj v1alpha1.Remediation
	if err := s.Client.Get(ctx, key, &obj); err != nil {
		return fmt.Errorf("reading remediation %s: %w", key, err)
	}
	if obj.Labels == nil {
		obj.Labels = map[string]string{}
	}
	obj.Labels[v1alpha1.LabelPhase] = string(v1alpha1.PhaseAborted)
	if l := machineLabel(obj.Spec.Machine); l != "" {
		obj.Labels[v1alpha1.LabelMachine] = l
	}
	if err := s.Client.Update(ctx, &obj); err != nil {
		return fmt.Errorf("closing remediation request %s: %w", key, err)
	}
	now := metav1.NewMicroTime(time.Now())
	obj.Status = v1alpha1.RemediationStatus{Phase: v1alpha1.PhaseAborted, Epoch: int64(s.Epoch),
		History: []v1alpha1.RemediationEvent{{Time: now, Step: -1, Kind: string(journal.EntryNote), Detail: "refused: " + why.Error(), Epoch: int64(s.Epoch)}}}
	meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Refused",
		Message: why.Error(), ObservedGeneration: obj.Generation})
	if err := s.Client.Status().Update(ctx, &obj); err != nil {
		return fmt.Errorf("writing the refusal of remediation request %s: %w", key, err)
	}
	return nil
}
