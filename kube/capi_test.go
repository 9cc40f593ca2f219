package kube

import (
	"testing"

	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The MachineHealthCheck contract on real Cluster API v1beta2 Machines: the two conditions KCP and
// MachineSet act on, skip-remediation honoured, remediate-machine recognised, the Machine
// controller's other status fields left alone.
func TestHandOverToOwner(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	machine := func(name string, annotations map[string]string) client.ObjectKey {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
			Spec: clusterv1.MachineSpec{ClusterName: "prod", Bootstrap: clusterv1.Bootstrap{DataSecretName: new("bootstrap")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine", Name: name}}}
		require.NoError(t, c.Create(ctx, m))
		m.Status.NodeRef = clusterv1.MachineNodeReference{Name: name}
		m.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}}
		require.NoError(t, c.Status().Update(ctx, m))
		return client.ObjectKeyFromObject(m)
	}
	get := func(key client.ObjectKey) *clusterv1.Machine {
		var m clusterv1.Machine
		require.NoError(t, c.Get(ctx, key, &m))
		return &m
	}

	cp1 := machine("cp-1", nil)
	assert.False(t, clusterapi.HandedOver(get(cp1)))
	require.NoError(t, clusterapi.HandOverToOwner(ctx, c, cp1, "cp-1 dead per the hub and 2 of 2 live observers"))
	m := get(cp1)
	assert.True(t, clusterapi.HandedOver(m))
	hc := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition)
	require.NotNil(t, hc)
	assert.Equal(t, clusterv1.MachineHealthCheckUnhealthyMachineReason, hc.Reason)
	assert.Equal(t, "Hale: cp-1 dead per the hub and 2 of 2 live observers", hc.Message)
	or := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineOwnerRemediatedCondition)
	require.NotNil(t, or)
	assert.Equal(t, clusterv1.MachineOwnerRemediatedWaitingForRemediationReason, or.Reason)
	assert.True(t, meta.IsStatusConditionTrue(m.Status.Conditions, "Ready"), "other conditions kept")
	assert.Equal(t, "cp-1", m.Status.NodeRef.Name, "other status fields kept")
	// Idempotent.
	require.NoError(t, clusterapi.HandOverToOwner(ctx, c, cp1, "again"))
	assert.Equal(t, "Hale: cp-1 dead per the hub and 2 of 2 live observers",
		meta.FindStatusCondition(get(cp1).Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition).Message)

	skipped := machine("cp-2", map[string]string{clusterv1.MachineSkipRemediationAnnotation: ""})
	err := clusterapi.HandOverToOwner(ctx, c, skipped, "dead")
	require.ErrorIs(t, err, clusterapi.ErrSkipRemediation)
	assert.Contains(t, err.Error(), ns+"/cp-2")
	assert.False(t, clusterapi.HandedOver(get(skipped)))

	manual := machine("cp-3", map[string]string{clusterv1.RemediateMachineAnnotation: ""})
	assert.True(t, clusterapi.ManualRemediationRequested(get(manual)))
	require.NoError(t, clusterapi.HandOverToOwner(ctx, c, manual, "requested by an operator"))
	assert.Equal(t, clusterv1.MachineHealthCheckHasRemediateAnnotationReason,
		meta.FindStatusCondition(get(manual).Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition).Reason)

	assert.ErrorContains(t, clusterapi.HandOverToOwner(ctx, c, client.ObjectKey{Namespace: ns, Name: "nope"}, "x"), "reading machine "+ns+"/nope")

	// The owner's answer, as KubeadmControlPlane writes it on OwnerRemediated.
	owner := &clusterapi.MachineOwner{Client: c, Machine: cp1, OwnerAPIVersion: "controlplane.cluster.x-k8s.io/v1beta2", OwnerKind: "KubeadmControlPlane", OwnerName: "prod"}
	answer := func(key client.ObjectKey, reason, message string) {
		m := get(key)
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition,
			Status: metav1.ConditionFalse, Reason: reason, Message: message})
		require.NoError(t, c.Status().Update(ctx, m))
	}
	answer(cp1, "RemediationDeferred", "KubeadmControlPlane waiting for control plane Machine provisioning to complete before triggering remediation")
	st, where, err := owner.Progress(ctx)
	require.NoError(t, err)
	assert.Equal(t, execute.OwnerWorking, st)
	assert.Equal(t, "KubeadmControlPlane defers deleting Machine "+ns+"/cp-1: KubeadmControlPlane waiting for control plane Machine provisioning to complete before triggering remediation", where)
	answer(cp1, "CannotBeRemediated", "KubeadmControlPlane can't remediate this machine because the operation already failed 3 times (MaxRetry)")
	st, where, err = owner.Progress(ctx)
	require.NoError(t, err)
	assert.Equal(t, execute.OwnerRefused, st)
	assert.Equal(t, "KubeadmControlPlane "+ns+"/prod: KubeadmControlPlane can't remediate this machine because the operation already failed 3 times (MaxRetry)", where)
	require.NoError(t, owner.Withdraw(ctx))
	m = get(cp1)
	assert.False(t, clusterapi.HandedOver(m), "withdrawn: the owner will not act on it later")
	assert.Nil(t, meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineOwnerRemediatedCondition))
	assert.True(t, meta.IsStatusConditionTrue(m.Status.Conditions, "Ready"), "other conditions kept")
	require.NoError(t, owner.Withdraw(ctx), "idempotent")

	// A MachineHealthCheck's marks are not Hale's to withdraw.
	byMHC := machine("cp-4", nil)
	m = get(byMHC)
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition,
		Status: metav1.ConditionFalse, Reason: clusterv1.MachineHealthCheckUnhealthyNodeReason, Message: "Condition Ready on Node is reporting status False for more than 5m0s"})
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition,
		Status: metav1.ConditionFalse, Reason: clusterv1.MachineOwnerRemediatedWaitingForRemediationReason})
	require.NoError(t, c.Status().Update(ctx, m))
	require.NoError(t, clusterapi.WithdrawHandOver(ctx, c, byMHC))
	assert.True(t, clusterapi.HandedOver(get(byMHC)))
	require.NoError(t, clusterapi.WithdrawHandOver(ctx, c, client.ObjectKey{Namespace: ns, Name: "gone"}))
}
