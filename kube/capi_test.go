package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/test/kubeenv"
)

// The MachineHealthCheck contract on real Cluster API v1beta2 Machines: the two conditions KCP and
// MachineSet act on, skip-remediation honoured, remediate-machine recognised, the Machine
// controller's other status fields left alone.
func TestHandOverToOwner(t *testing.T) {
	c, _ := kubeenv.Start(t)
	ctx := t.Context()
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "prod"}}))
	machine := func(name string, annotations map[string]string) client.ObjectKey {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "prod", Annotations: annotations},
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
	assert.False(t, HandedOver(get(cp1)))
	require.NoError(t, HandOverToOwner(ctx, c, cp1, "cp-1 dead per the hub and 2 of 2 live observers"))
	m := get(cp1)
	assert.True(t, HandedOver(m))
	hc := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition)
	require.NotNil(t, hc)
	assert.Equal(t, clusterv1.MachineHealthCheckUnhealthyMachineReason, hc.Reason)
	assert.Equal(t, "cp-1 dead per the hub and 2 of 2 live observers", hc.Message)
	or := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineOwnerRemediatedCondition)
	require.NotNil(t, or)
	assert.Equal(t, clusterv1.MachineOwnerRemediatedWaitingForRemediationReason, or.Reason)
	assert.True(t, meta.IsStatusConditionTrue(m.Status.Conditions, "Ready"), "other conditions kept")
	assert.Equal(t, "cp-1", m.Status.NodeRef.Name, "other status fields kept")
	// Idempotent.
	require.NoError(t, HandOverToOwner(ctx, c, cp1, "again"))
	assert.Equal(t, "cp-1 dead per the hub and 2 of 2 live observers",
		meta.FindStatusCondition(get(cp1).Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition).Message)

	skipped := machine("cp-2", map[string]string{clusterv1.MachineSkipRemediationAnnotation: ""})
	err := HandOverToOwner(ctx, c, skipped, "dead")
	require.ErrorIs(t, err, ErrSkipRemediation)
	assert.Contains(t, err.Error(), "prod/cp-2")
	assert.False(t, HandedOver(get(skipped)))

	manual := machine("cp-3", map[string]string{clusterv1.RemediateMachineAnnotation: ""})
	assert.True(t, ManualRemediationRequested(get(manual)))
	require.NoError(t, HandOverToOwner(ctx, c, manual, "requested by an operator"))
	assert.Equal(t, clusterv1.MachineHealthCheckHasRemediateAnnotationReason,
		meta.FindStatusCondition(get(manual).Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition).Reason)

	assert.ErrorContains(t, HandOverToOwner(ctx, c, client.ObjectKey{Namespace: "prod", Name: "nope"}, "x"), "reading machine prod/nope")
}
