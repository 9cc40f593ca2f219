package clusterapi

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/quorum"
)

// MachineOwner is a Cluster API Machine's owner controller (KubeadmControlPlane or MachineSet) as the
// hub's hub.Owner. Both remediate a machine handed over with the MachineHealthCheck contract the same
// way: they delete it first and then create its replacement (KCP's remediation is delete-and-recreate
// whatever its rollout strategy; a MachineSet deletes and scales back up). For an etcd member that is
// remove-then-add, the order Hale's plan for the owner is made with and checked against before the
// hand-over. The owner is done when the old Machine is gone and its spec.replicas are all ready again.
type MachineOwner struct {
	Client          client.Client
	Machine         client.ObjectKey
	OwnerAPIVersion string
	OwnerKind       string
	OwnerName       string
}

// Describe names the owner and its way.
func (o *MachineOwner) Describe() string {
	return fmt.Sprintf("%s %s/%s (deletes the machine, then creates its replacement)", o.OwnerKind, o.Machine.Namespace, o.OwnerName)
}

// HandOver marks the Machine with the MachineHealthCheck contract (see HandOverToOwner).
func (o *MachineOwner) HandOver(ctx context.Context, reason string, _ []quorum.Step) error {
	return HandOverToOwner(ctx, o.Client, o.Machine, reason)
}

// Progress: done when the old Machine is gone and the owner has all its replicas ready; refused when
// the owner answered on the Machine's OwnerRemediated condition that it cannot remediate it (both
// KubeadmControlPlane and MachineSet write reason CannotBeRemediated: a retry limit, one replica,
// KCP's own etcd check, a rollout); a deferral (RemediationDeferred) is waited out, its message shown.
func (o *MachineOwner) Progress(ctx context.Context) (execute.OwnerProgress, string, error) {
	var m clusterv1.Machine
	err := o.Client.Get(ctx, o.Machine, &m)
	switch {
	case err == nil && m.DeletionTimestamp != nil:
		return execute.OwnerWorking, fmt.Sprintf("Machine %s is being deleted", o.Machine), nil
	case err == nil:
		answer := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineOwnerRemediatedCondition)
		if answer != nil && answer.Status == metav1.ConditionFalse {
			switch answer.Reason {
			case clusterv1.MachineSetMachineCannotBeRemediatedReason:
				return execute.OwnerRefused, fmt.Sprintf("%s %s/%s: %s", o.OwnerKind, o.Machine.Namespace, o.OwnerName, answer.Message), nil
			case clusterv1.MachineSetMachineRemediationDeferredReason:
				return execute.OwnerWorking, fmt.Sprintf("%s defers deleting Machine %s: %s", o.OwnerKind, o.Machine, answer.Message), nil
			}
		}
		if paused, err := clusterPaused(ctx, o.Client, o.Machine.Namespace, m.Spec.ClusterName); err != nil {
			return execute.OwnerWorking, "", err
		} else if paused {
			return execute.OwnerWorking, fmt.Sprintf("Cluster %s/%s is paused (spec.paused or %s): %s does nothing until it is resumed",
				o.Machine.Namespace, m.Spec.ClusterName, clusterv1.PausedAnnotation, o.OwnerKind), nil
		}
		return execute.OwnerWorking, fmt.Sprintf("waiting for %s to delete Machine %s", o.OwnerKind, o.Machine), nil
	case !apierrors.IsNotFound(err):
		return execute.OwnerWorking, "", fmt.Errorf("reading Machine %s: %w", o.Machine, err)
	}
	done, where, err := o.replaced(ctx)
	if done {
		return execute.OwnerDone, where, err
	}
	return execute.OwnerWorking, where, err
}

// clusterPaused: Cluster API's controllers leave a paused Cluster's objects alone (spec.paused or the
// paused annotation). A Cluster that does not exist is not paused.
func clusterPaused(ctx context.Context, c client.Client, ns, name string) (bool, error) {
	var cl clusterv1.Cluster
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cl); apierrors.IsNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("reading Cluster %s/%s: %w", ns, name, err)
	}
	_, annotated := cl.Annotations[clusterv1.PausedAnnotation]
	return annotated || (cl.Spec.Paused != nil && *cl.Spec.Paused), nil
}

// Remove is nothing to do: a delete-first owner removes the machine itself.
func (o *MachineOwner) Remove(context.Context) error { return nil }

// Withdraw takes Hale's marks off the Machine (see WithdrawHandOver).
func (o *MachineOwner) Withdraw(ctx context.Context) error {
	return WithdrawHandOver(ctx, o.Client, o.Machine)
}

// replaced: the old Machine is gone; is the owner whole again?
func (o *MachineOwner) replaced(ctx context.Context) (bool, string, error) {
	owner := &unstructured.Unstructured{}
	owner.SetGroupVersionKind(schema.FromAPIVersionAndKind(o.OwnerAPIVersion, o.OwnerKind))
	key := client.ObjectKey{Namespace: o.Machine.Namespace, Name: o.OwnerName}
	if err := o.Client.Get(ctx, key, owner); err != nil {
		return false, "", fmt.Errorf("reading %s %s: %w", o.OwnerKind, key, err)
	}
	want, _, _ := unstructured.NestedInt64(owner.Object, "spec", "replicas")
	ready, _, _ := unstructured.NestedInt64(owner.Object, "status", "readyReplicas")
	// The owner's status can lag the deletion: its own Machines with a node are counted too, which
	// with the old one gone proves the replacement exists.
	var all clusterv1.MachineList
	if err := o.Client.List(ctx, &all, client.InNamespace(o.Machine.Namespace)); err != nil {
		return false, "", fmt.Errorf("listing the Machines of %s %s: %w", o.OwnerKind, key, err)
	}
	withNode := int64(0)
	for _, m := range all.Items {
		if ref := metav1.GetControllerOf(&m); ref != nil && ref.Kind == o.OwnerKind && ref.Name == o.OwnerName &&
			m.DeletionTimestamp == nil && m.Status.NodeRef.Name != "" {
			withNode++
		}
	}
	where := fmt.Sprintf("Machine %s deleted; %s %s: %d of %d machines with a node, %d ready", o.Machine, o.OwnerKind, key, withNode, want, ready)
	return want > 0 && withNode >= want && ready >= want, where, nil
}
