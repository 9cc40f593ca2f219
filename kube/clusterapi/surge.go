package clusterapi

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/quorum"
)

// SurgeFromAnnotation on the machine being replaced records the MachineDeployment's replicas before
// Hale added one, so that a hand-over signalled again (after a hub restart) adds none more, and the
// count can be restored.
const SurgeFromAnnotation = "hale.dev/surge-from"

// DeploymentOwner replaces a MachineDeployment's machine scale-up first where the plan says so: one
// more replica, wait until a new machine of the deployment has a Ready node (and, when the machine
// ran an etcd member, until Hale sees the new one healthy), then mark the old one with
// cluster.x-k8s.io/delete-machine (which every MachineSet delete policy removes first) and put the
// replica count back. A plan that begins with the remove (scaling up first would cost quorum) is the
// MachineSet's own delete-first remediation, through the MachineHealthCheck contract. It is a
// hub.Owner.
type DeploymentOwner struct {
	MachineOwner // the MachineSet, for the delete-first way
	Deployment   client.ObjectKey
	// EtcdMember: the machine ran an etcd member, so the new one must be healthy in Hale's eyes too
	// (Healthy: its agent reporting, its member a healthy voter), not only have a Ready node.
	EtcdMember bool
	Healthy    func(machine string) bool
}

// Describe names the deployment and the way.
func (o *DeploymentOwner) Describe() string {
	return fmt.Sprintf("MachineDeployment %s (scale up first where the plan allows, else MachineSet %s deletes first)", o.Deployment, o.OwnerName)
}

// HandOver adds a replica (scale up first) or hands the machine to its MachineSet (delete first).
func (o *DeploymentOwner) HandOver(ctx context.Context, reason string, steps []quorum.Step) error {
	if len(steps) == 0 || (steps[0].Op != quorum.OpAddVoter && steps[0].Op != quorum.OpAddLearner) {
		return o.MachineOwner.HandOver(ctx, reason, steps)
	}
	// The MachineDeployment is patched under an optimistic lock, so that someone else's scaling is never
	// overwritten; a conflict with a write of its own controller is tried again from a fresh read (the
	// surge is idempotent: seen added, it is done). Found by TestClusterAPIWithTheRealControllers.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error { return o.surge(ctx) })
}

// surge records the replica count on the machine (once) and scales its MachineDeployment up by one.
func (o *DeploymentOwner) surge(ctx context.Context) error {
	var m clusterv1.Machine
	if err := o.Client.Get(ctx, o.Machine, &m); err != nil {
		return fmt.Errorf("reading machine %s: %w", o.Machine, err)
	}
	if _, skip := m.Annotations[clusterv1.MachineSkipRemediationAnnotation]; skip {
		return fmt.Errorf("machine %s: %w", o.Machine, ErrSkipRemediation)
	}
	var md clusterv1.MachineDeployment
	if err := o.Client.Get(ctx, o.Deployment, &md); err != nil {
		return fmt.Errorf("reading MachineDeployment %s: %w", o.Deployment, err)
	}
	if md.Spec.Replicas == nil {
		return fmt.Errorf("MachineDeployment %s: spec.replicas unset (an autoscaler owns it?): not surging", o.Deployment)
	}
	from, recorded := surgeFrom(&m)
	if !recorded {
		from = *md.Spec.Replicas
		before := m.DeepCopy()
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[SurgeFromAnnotation] = strconv.Itoa(int(from))
		if err := o.Client.Patch(ctx, &m, client.MergeFrom(before)); err != nil {
			return fmt.Errorf("recording the replica count on machine %s: %w", o.Machine, err)
		}
	}
	switch *md.Spec.Replicas {
	case from + 1:
		return nil // added already
	case from:
		return o.scale(ctx, &md, from+1)
	}
	return fmt.Errorf("MachineDeployment %s: spec.replicas is %d, not %d as when Hale began: someone else scaled it; not surging", o.Deployment, *md.Spec.Replicas, from)
}

func surgeFrom(m *clusterv1.Machine) (int32, bool) {
	v, ok := m.Annotations[SurgeFromAnnotation]
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	return int32(n), err == nil
}

func (o *DeploymentOwner) scale(ctx context.Context, md *clusterv1.MachineDeployment, replicas int32) error {
	before := md.DeepCopy()
	md.Spec.Replicas = &replicas
	if err := o.Client.Patch(ctx, md, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("scaling MachineDeployment %s to %d: %w", o.Deployment, replicas, err)
	}
	return nil
}

// Progress follows the surge: the new machine ready → ready for the old one to go (the hub then
// calls Remove) → the old one gone. For the delete-first way, see MachineOwner.Progress.
func (o *DeploymentOwner) Progress(ctx context.Context) (execute.OwnerProgress, string, error) {
	var m clusterv1.Machine
	err := o.Client.Get(ctx, o.Machine, &m)
	if apierrors.IsNotFound(err) {
		return o.MachineOwner.Progress(ctx)
	} else if err != nil {
		return execute.OwnerWorking, "", fmt.Errorf("reading machine %s: %w", o.Machine, err)
	}
	from, surging := surgeFrom(&m)
	if !surging {
		return o.MachineOwner.Progress(ctx)
	}
	if _, marked := m.Annotations[clusterv1.DeleteMachineAnnotation]; marked {
		return execute.OwnerWorking, fmt.Sprintf("machine %s marked for deletion, MachineDeployment %s back to %d: waiting for its MachineSet to delete it", o.Machine, o.Deployment, from), nil
	}
	ready, err := o.readyNewMachines(ctx)
	if err != nil {
		return execute.OwnerWorking, "", err
	}
	if ready < from {
		return execute.OwnerWorking, fmt.Sprintf("MachineDeployment %s scaled to %d: %d of %d other machines ready", o.Deployment, from+1, ready, from), nil
	}
	return execute.OwnerReadyToRemove, fmt.Sprintf("MachineDeployment %s: %d other machines ready", o.Deployment, ready), nil
}

// Withdraw is nothing to do: Hale scales the MachineDeployment itself, there is no answer to refuse.
func (o *DeploymentOwner) Withdraw(context.Context) error { return nil }

// Remove marks the old machine with cluster.x-k8s.io/delete-machine (every MachineSet delete policy
// removes it first) and puts the replica count back: the MachineSet deletes it (a conflict is tried
// again from a fresh read, as in HandOver).
func (o *DeploymentOwner) Remove(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error { return o.remove(ctx) })
}

func (o *DeploymentOwner) remove(ctx context.Context) error {
	var m clusterv1.Machine
	if err := o.Client.Get(ctx, o.Machine, &m); apierrors.IsNotFound(err) {
		return nil // gone already
	} else if err != nil {
		return fmt.Errorf("reading machine %s: %w", o.Machine, err)
	}
	from, surging := surgeFrom(&m)
	if !surging {
		return fmt.Errorf("machine %s has no %s: Hale did not surge its MachineDeployment", o.Machine, SurgeFromAnnotation)
	}
	if _, marked := m.Annotations[clusterv1.DeleteMachineAnnotation]; !marked {
		before := m.DeepCopy()
		m.Annotations[clusterv1.DeleteMachineAnnotation] = "hale: replaced, scaled up first"
		if err := o.Client.Patch(ctx, &m, client.MergeFrom(before)); err != nil {
			return fmt.Errorf("marking machine %s for deletion: %w", o.Machine, err)
		}
	}
	var md clusterv1.MachineDeployment
	if err := o.Client.Get(ctx, o.Deployment, &md); err != nil {
		return fmt.Errorf("reading MachineDeployment %s: %w", o.Deployment, err)
	}
	if md.Spec.Replicas != nil && *md.Spec.Replicas == from+1 {
		return o.scale(ctx, &md, from)
	}
	return nil
}

// readyNewMachines counts the deployment's other machines with a Ready node (and, replacing an etcd
// member, healthy in Hale's eyes).
func (o *DeploymentOwner) readyNewMachines(ctx context.Context) (int32, error) {
	var list clusterv1.MachineList
	if err := o.Client.List(ctx, &list, client.InNamespace(o.Machine.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: o.Deployment.Name}); err != nil {
		return 0, fmt.Errorf("listing the machines of MachineDeployment %s: %w", o.Deployment, err)
	}
	n := int32(0)
	for _, m := range list.Items {
		if m.Name == o.Machine.Name || m.DeletionTimestamp != nil || m.Status.NodeRef.Name == "" {
			continue
		}
		if !o.nodeReady(ctx, &m) || (o.EtcdMember && (o.Healthy == nil || !o.Healthy(m.Name))) {
			continue
		}
		n++
	}
	return n, nil
}

// nodeReady: the Machine's NodeReady condition, which Cluster API's Machine controller copies from the
// workload cluster's Node (so a hub in a management cluster, which cannot read those Nodes, sees it);
// without it (an older Cluster API), the Node in this cluster, for a self-hosted one.
func (o *DeploymentOwner) nodeReady(ctx context.Context, m *clusterv1.Machine) bool {
	if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineNodeReadyCondition); c != nil {
		return c.Status == metav1.ConditionTrue
	}
	var node corev1.Node
	if err := o.Client.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, &node); err != nil {
		return false
	}
	return nodeReady(&node)
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
