package kube

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/test/lab/inproc"
)

// External remediation on a real API server, with HaleRemediations made as a MachineHealthCheck makes
// them (named after the Machine, owned by it) and as medik8s' NodeHealthCheck makes them (named after
// the Node or annotated with it, owned by the NodeHealthCheck): Hale reboots the machine through its
// BMC with its quorum check and journal; two at once, the second waits (it would cost quorum) and
// says why, then goes once the first is done; a request for a machine Hale does not know, or owned by
// neither checker, waits and says why. A MachineHealthCheck's whose power-cycle fails ends Failed and
// hands the Machine to its owner (OwnerRemediated False), unless Hale sees the machine Healthy; a
// NodeHealthCheck's ends Failed with Succeeded False (its next remediator may go on) and
// PermanentNodeDeletionExpected False throughout. The machines are judged by the MachineHealthCheck
// (Machine.CheckedBy, as Discovery sets it): a hung one is held by the hub, which waits for the request.
func TestHaleRemediationsFromHealthCheckers(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	tb := startInproc(t)
	tb.StopHub()
	require.NoError(t, tb.StartHub(inproc.HubOptions{Store: NewJournal(c, ns, 1, 5), Inventory: func(inv *pass.Inventory) {
		for i := range inv.Machines {
			inv.Machines[i].CheckedBy = "judged by MachineHealthCheck prod/cp, which hands its remediations to Hale"
		}
	}}))
	require.NoError(t, tb.Settle(ctx))
	sync := &RequestSync{Client: c, Namespace: ns, Hub: tb.Hub(), Epoch: 1, Machines: true, MachineNamespace: ns, Interval: 100 * time.Millisecond, Log: tb.Log()}
	go sync.Run(ctx)

	request := func(name string, owned bool, hard ...bool) client.ObjectKey {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: clusterv1.MachineSpec{ClusterName: "prod", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr("bootstrap")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine", Name: name}}}
		if err := c.Create(ctx, m); apierrors.IsAlreadyExists(err) {
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(m), m))
		} else {
			require.NoError(t, err)
		}
		r := &v1alpha1.HaleRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:      map[string]string{clusterv1.ClusterNameLabel: "prod"},
			Annotations: map[string]string{clusterv1.TemplateClonedFromNameAnnotation: "hale", clusterv1.TemplateClonedFromGroupKindAnnotation: "HaleRemediationTemplate.hale.dev"}}}
		r.Spec.Hard = len(hard) > 0 && hard[0]
		if owned {
			r.OwnerReferences = []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: name, UID: m.UID}}
		}
		require.NoError(t, c.Create(ctx, r))
		return client.ObjectKeyFromObject(r)
	}
	status := func(key client.ObjectKey) v1alpha1.HaleRemediationStatus {
		var r v1alpha1.HaleRemediation
		require.NoError(t, c.Get(ctx, key, &r))
		return r.Status
	}
	waitPhase := func(key client.ObjectKey, phase v1alpha1.ExternalPhase, timeout time.Duration) v1alpha1.HaleRemediationStatus {
		t.Helper()
		var st v1alpha1.HaleRemediationStatus
		require.Eventually(t, func() bool { st = status(key); return st.Phase == phase }, timeout, 100*time.Millisecond, "%s %s: %+v", key.Name, phase, &st)
		return st
	}

	// Two at once: one goes, the other would take etcd below quorum and waits. Which goes first is
	// whichever the hub admits first (a starved run's testbed was unsettled when both were made, and
	// cp-2's was taken first once it settled).
	first, second := request(inproc.Name(1), true), request(inproc.Name(2), true)
	start := time.Now()
	require.Eventually(t, func() bool {
		if status(second).Phase == v1alpha1.ExternalRunning {
			first, second = second, first
		}
		return status(first).Phase == v1alpha1.ExternalRunning
	}, 30*time.Second, 100*time.Millisecond, "one of the two requests running")
	st := status(first)
	assert.NotEmpty(t, st.Remediation)
	assert.True(t, meta.IsStatusConditionTrue(st.Conditions, ConditionProcessing))
	waiting := waitPhase(second, v1alpha1.ExternalWaiting, 10*time.Second)
	assert.Contains(t, waiting.Message, "quorum", "why it waits")
	st = waitPhase(first, v1alpha1.ExternalSucceeded, 60*time.Second)
	assert.True(t, meta.IsStatusConditionTrue(st.Conditions, ConditionSucceeded))
	assert.False(t, meta.IsStatusConditionTrue(st.Conditions, ConditionProcessing))
	var rem v1alpha1.Remediation
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: st.Remediation}, &rem))
	assert.Equal(t, []string{"power-cycle " + strings.Replace(first.Name, "cp-", "etcd-", 1), "await-healthy " + strings.Replace(first.Name, "cp-", "etcd-", 1)}, rem.Spec.Steps)
	assert.Contains(t, rem.Spec.RequestedBy, "MachineHealthCheck (HaleRemediation "+first.String()+")")
	t.Logf("first request Succeeded %v after it was made", time.Since(start).Round(100*time.Millisecond))
	st2 := waitPhase(second, v1alpha1.ExternalSucceeded, 90*time.Second)
	t.Logf("second request, waiting for the first, Succeeded %v after it was made", time.Since(start).Round(100*time.Millisecond))
	var rem2 v1alpha1.Remediation
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: st2.Remediation}, &rem2))
	// Its outcome, not its last entry: a note may follow it (a hub that took over adopts the record).
	i := slices.IndexFunc(rem.Status.History, func(e v1alpha1.RemediationEvent) bool { return e.Kind == string(journal.EntryOutcome) })
	require.GreaterOrEqual(t, i, 0, "the first's outcome: %+v", rem.Status.History)
	firstEnded := rem.Status.History[i].Time
	assert.False(t, rem2.Status.History[0].Time.Before(&firstEnded), "the second began (%v) once the first had ended (%v): %+v; %+v",
		rem2.Status.History[0].Time, firstEnded, rem.Status.History, rem2.Status.History)
	assert.Len(t, tb.Resets(1), 1)
	assert.Len(t, tb.Resets(2), 1)

	// Requests Hale takes not.
	unknown := request("cp-9", true)
	assert.Contains(t, waitPhase(unknown, v1alpha1.ExternalWaiting, 10*time.Second).Message, "cp-9")
	stray := request(inproc.Name(0)+"-stray", false)
	assert.Contains(t, waitPhase(stray, v1alpha1.ExternalWaiting, 10*time.Second).Message, "neither owned by Machine")

	// medik8s' NodeHealthCheck: its request is named after the Node, or annotated with it, and owned by
	// the NodeHealthCheck; it reads Processing, Succeeded and PermanentNodeDeletionExpected.
	fromNHC := func(name, node string, hard bool) client.ObjectKey {
		r := &v1alpha1.HaleRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:          map[string]string{"app.kubernetes.io/part-of": "node-healthcheck-controller"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "remediation.medik8s.io/v1alpha1", Kind: "NodeHealthCheck", Name: "nhc-cp", UID: "0e3c6b4a-0000-4000-8000-00000000000a", Controller: new(false)}}},
			Spec: v1alpha1.HaleRemediationSpec{Hard: hard}}
		if node != name {
			r.Annotations = map[string]string{NodeNameAnnotation: node}
		}
		require.NoError(t, c.Create(ctx, r))
		return client.ObjectKeyFromObject(r)
	}
	start = time.Now()
	st = waitPhase(fromNHC("nhc-"+inproc.Name(1), inproc.Name(1), false), v1alpha1.ExternalSucceeded, 60*time.Second)
	t.Logf("a NodeHealthCheck's request Succeeded %v after it was made", time.Since(start).Round(100*time.Millisecond))
	assert.True(t, meta.IsStatusConditionTrue(st.Conditions, ConditionSucceeded))
	assert.True(t, meta.IsStatusConditionFalse(st.Conditions, ConditionProcessing))
	assert.True(t, meta.IsStatusConditionFalse(st.Conditions, ConditionPermanentNodeDeletionExpected))
	assert.Contains(t, waitPhase(fromNHC("nhc-cp-9", "cp-9", false), v1alpha1.ExternalWaiting, 10*time.Second).Message, "Node cp-9 is none of Hale's machines")

	// A power-cycle (spec.hard) that fails on a machine Hale sees Healthy: not handed over. Hung, held
	// by the hub (the MachineHealthCheck judges it), then asked for: Failed, handed to its owner.
	require.NoError(t, tb.WaitFor(ctx, 60*time.Second, "every machine healthy", tb.AllHealthy))
	tb.Sim().SetFaults(bmcsim.Faults{IgnoreResets: true})
	start = time.Now()
	failing := request(inproc.Name(0), true, true)
	st = waitPhase(failing, v1alpha1.ExternalFailed, 90*time.Second)
	t.Logf("a failed power-cycle: Failed %v after the request", time.Since(start).Round(100*time.Millisecond))
	assert.Contains(t, st.Message, "not handed to its owner: Hale sees "+inproc.Name(0)+" Healthy")
	var m clusterv1.Machine
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: inproc.Name(0)}, &m))
	assert.False(t, clusterapi.HandedOver(&m))
	require.NoError(t, c.Delete(ctx, &v1alpha1.HaleRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: inproc.Name(0)}}))

	tb.Hang(0)
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "cp-0 Unhealthy and held for its MachineHealthCheck", func() bool {
		return strings.Contains(tb.Hub().Status(ctx).Machines[0].Decision, "judged by MachineHealthCheck prod/cp")
	}))
	failing = request(inproc.Name(0), true, true)
	st = waitPhase(failing, v1alpha1.ExternalFailed, 90*time.Second)
	assert.Contains(t, st.Message, "the Machine is handed to its owner")
	assert.True(t, meta.IsStatusConditionFalse(st.Conditions, ConditionSucceeded))
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: inproc.Name(0)}, &m))
	assert.True(t, clusterapi.HandedOver(&m), "%+v", m.Status.Conditions)
	// A NodeHealthCheck's that fails: Succeeded False (it may go on to its next remediator), no owner.
	st = waitPhase(fromNHC("nhc-"+inproc.Name(0), inproc.Name(0), true), v1alpha1.ExternalFailed, 90*time.Second)
	assert.True(t, meta.IsStatusConditionFalse(st.Conditions, ConditionSucceeded))
	assert.NotContains(t, st.Message, "owner")
	// Three requests, none of the hub's own: a request whose remediation was withdrawn before it acted
	// (the quorum re-check, while the members settle after the reboots above) is asked again, and
	// journals one remediation more.
	hist, err := tb.Hub().History(ctx, inproc.Name(0))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(hist), 3)
	for _, r := range hist {
		assert.Contains(t, r.RequestedBy, "HealthCheck", "%s: a health checker's request, not the hub's own", r.ID)
	}
}
