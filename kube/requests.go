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
	Cluster  string
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
	if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace)); err != nil {
		return fmt.Errorf("listing remediations in %s: %w", s.Namespace, err)
	}
	var errs []error
	for i := range list.Items {
		r := &list.Items[i]
		if _, begun := r.Labels[v1alpha1.LabelPhase]; begun || r.Status.Phase != "" || r.DeletionTimestamp != nil || !s.asksThis(r) {
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
	err := s.Client.List(ctx, &list, client.InNamespace(s.MachineNamespace))
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
		if !clusterapi.ManualRemediationRequested(m) || m.DeletionTimestamp != nil {
			delete(s.refused, key.String())
			continue
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

// RequestReboot creates a reboot request for machine in ns (what `hub reboot --kubernetes` does);
// the leading hub's RequestSync carries it out. Kubernetes RBAC decides whether the caller may.
func RequestReboot(ctx context.Context, c client.Client, ns, machine string, hard, force bool, by string) (client.ObjectKey, error) {
	obj := &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "reboot-" + dnsSafe(machine) + "-"},
		Spec: v1alpha1.RemediationSpec{Machine: machine, Strategy: quorum.Reboot.String(), RequestedBy: by, Reason: "manual reboot", Hard: hard, Force: force}}
	if err := c.Create(ctx, obj); err != nil {
		return client.ObjectKey{}, fmt.Errorf("creating a reboot request in %s: %w", ns, err)
	}
	return client.ObjectKeyFromObject(obj), nil
}

// WaitRequest waits until the hub has taken the request (accepted: InProgress; refused: Aborted)
// or, with done, until it has ended; it returns the object as last read.
func WaitRequest(ctx context.Context, c client.Client, key client.ObjectKey, done bool) (v1alpha1.Remediation, error) {
	for {
		var obj v1alpha1.Remediation
		if err := c.Get(ctx, key, &obj); err != nil {
			return obj, fmt.Errorf("reading remediation %s: %w", key, err)
		}
		switch p := obj.Status.Phase; {
		case p != "" && p != v1alpha1.PhaseInProgress, p == v1alpha1.PhaseInProgress && !done:
			return obj, nil
		}
		select {
		case <-ctx.Done():
			return obj, fmt.Errorf("waiting for the hub to take remediation %s (is a hub leading in %s?): %w", key, key.Namespace, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
