// Package clusterapi is how Hale hands a machine to Cluster API and metal3, in the cluster that holds their
// objects: the Machine's owner (a KubeadmControlPlane or a MachineSet: MachineOwner; a
// MachineDeployment scaled up first: DeploymentOwner) through the MachineHealthCheck contract, and a
// machine's power through its metal3 BareMetalHost (Metal3Host). Package kube finds which applies to
// each machine.
package clusterapi

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ErrSkipRemediation: the Machine carries cluster.x-k8s.io/skip-remediation; Hale leaves it alone, as a
// MachineHealthCheck would.
var ErrSkipRemediation = errors.New("the machine is annotated " + clusterv1.MachineSkipRemediationAnnotation)

// ManualRemediationRequested reports whether an operator asked for the machine to be remediated with
// cluster.x-k8s.io/remediate-machine: Hale treats it as a manual request, through the same quorum plan.
func ManualRemediationRequested(m *clusterv1.Machine) bool {
	_, ok := m.Annotations[clusterv1.RemediateMachineAnnotation]
	return ok
}

// haleMark starts the message of the HealthCheckSucceeded condition Hale sets: how its own hand-over is
// told from a MachineHealthCheck's.
const haleMark = "Hale: "

// HandOverToOwner marks a Cluster API Machine the way a MachineHealthCheck does, so that its owner
// (KubeadmControlPlane, MachineSet) remediates it its own way: HealthCheckSucceeded=False and
// OwnerRemediated=False (WaitingForRemediation). KCP and MachineSet read exactly these two v1beta2
// conditions (collections.IsUnhealthyAndOwnerRemediated). The caller calls it only when Hale's quorum
// plan allows the owner's action now: the owner acts as soon as it sees them. Machines annotated
// skip-remediation are refused with ErrSkipRemediation; a machine already handed over is left as is.
//
// The conditions are written with a merge patch of the status, so that the Machine controller's own
// status writes are not overwritten.
func HandOverToOwner(ctx context.Context, c client.Client, key client.ObjectKey, message string) error {
	var m clusterv1.Machine
	if err := c.Get(ctx, key, &m); err != nil {
		return fmt.Errorf("reading machine %s: %w", key, err)
	}
	if _, skip := m.Annotations[clusterv1.MachineSkipRemediationAnnotation]; skip {
		return fmt.Errorf("machine %s: %w", key, ErrSkipRemediation)
	}
	if HandedOver(&m) {
		return nil
	}
	reason := clusterv1.MachineHealthCheckUnhealthyMachineReason
	if ManualRemediationRequested(&m) {
		reason = clusterv1.MachineHealthCheckHasRemediateAnnotationReason
	}
	before := m.DeepCopy()
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition,
		Status: metav1.ConditionFalse, Reason: reason, Message: haleMark + message, ObservedGeneration: m.Generation})
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition,
		Status: metav1.ConditionFalse, Reason: clusterv1.MachineOwnerRemediatedWaitingForRemediationReason,
		Message: "Hale's quorum plan allows the owner to remediate this machine now", ObservedGeneration: m.Generation})
	if err := c.Status().Patch(ctx, &m, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("marking machine %s for its owner's remediation: %w", key, err)
	}
	return nil
}

// WithdrawHandOver takes a refused hand-over back: it removes the two conditions HandOverToOwner set, so
// that the owner does not act on them later, outside Hale's plan. A Machine that is gone, or whose
// HealthCheckSucceeded condition is not Hale's (a MachineHealthCheck's), is left as is.
func WithdrawHandOver(ctx context.Context, c client.Client, key client.ObjectKey) error {
	var m clusterv1.Machine
	if err := c.Get(ctx, key, &m); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("reading machine %s: %w", key, err)
	}
	check := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition)
	if check == nil || !strings.HasPrefix(check.Message, haleMark) {
		return nil
	}
	before := m.DeepCopy()
	meta.RemoveStatusCondition(&m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition)
	meta.RemoveStatusCondition(&m.Status.Conditions, clusterv1.MachineOwnerRemediatedCondition)
	if err := c.Status().Patch(ctx, &m, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("withdrawing the hand-over of machine %s: %w", key, err)
	}
	return nil
}

// HandedOver reports whether the machine carries the MachineHealthCheck contract's marks.
func HandedOver(m *clusterv1.Machine) bool {
	return meta.IsStatusConditionFalse(m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition) &&
		meta.IsStatusConditionFalse(m.Status.Conditions, clusterv1.MachineOwnerRemediatedCondition)
}
