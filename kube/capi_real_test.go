package kube

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/quorum"
	capilab "github.com/hale-dev/hale/test/capi"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/lab/inproc"
)

// inMemoryCluster is a plain Cluster (no ClusterClass) on CAPD's in-memory backend: a
// KubeadmControlPlane of 3 that remediates at most once per machine (maxRetry 0: a replacement handed
// over again within minHealthyPeriodSeconds is refused) and a MachineDeployment of 1.
const inMemoryCluster = `
apiVersion: infrastructure.cluster.x-k8s.io/v1beta2
kind: DevCluster
metadata:
  name: prod
  namespace: prod
  # CAPD v1.14.2's in-memory backend writes an annotation into a nil map and panics on every reconcile of
  # a DevCluster created without annotations (inmemorycluster_backend.go:67): give it one.
  annotations: {hale.dev/test: in-memory}
spec:
  backend:
    inMemory: {}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1beta2
kind: DevMachineTemplate
metadata: {name: prod, namespace: prod}
spec:
  template:
    spec:
      backend:
        inMemory:
          vm: {provisioning: {startupDuration: "2s", startupJitter: "0.2"}}
          node: {provisioning: {startupDuration: "1s", startupJitter: "0.2"}}
          apiServer: {provisioning: {startupDuration: "1s", startupJitter: "0.2"}}
          etcd: {provisioning: {startupDuration: "1s", startupJitter: "0.2"}}
---
apiVersion: controlplane.cluster.x-k8s.io/v1beta2
kind: KubeadmControlPlane
metadata: {name: prod, namespace: prod}
spec:
  replicas: 3
  version: v1.35.0
  machineTemplate:
    spec:
      infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: DevMachineTemplate, name: prod}
  remediation:
    maxRetry: 0
  kubeadmConfigSpec:
    clusterConfiguration:
      apiServer:
        certSANs: [localhost, 127.0.0.1]
---
apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfigTemplate
metadata: {name: prod-md, namespace: prod}
spec:
  template:
    spec:
      joinConfiguration:
        nodeRegistration: {criSocket: unix:///var/run/containerd/containerd.sock}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {name: prod-md, namespace: prod}
spec:
  clusterName: prod
  replicas: 1
  template:
    spec:
      clusterName: prod
      version: v1.35.0
      bootstrap:
        configRef: {apiGroup: bootstrap.cluster.x-k8s.io, kind: KubeadmConfigTemplate, name: prod-md}
      infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: DevMachineTemplate, name: prod}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: prod, namespace: prod}
spec:
  clusterNetwork:
    pods: {cidrBlocks: ["192.168.0.0/16"]}
    services: {cidrBlocks: ["10.128.0.0/12"]}
  infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: DevCluster, name: prod}
  controlPlaneRef: {apiGroup: controlplane.cluster.x-k8s.io, kind: KubeadmControlPlane, name: prod}
`

// Cluster API's real controllers (core, kubeadm bootstrap and control plane, CAPD in memory) bring up
// two Clusters side by side, each in a namespace of its own (a cluster takes over a minute to come
// up, as KCP adds its machines one at a time: one start of the controllers serves both parts).
func TestClusterAPIWithTheRealControllers(t *testing.T) {
	t.Parallel() // beside the other real controllers' tests, each on its own API server
	c := inMemoryClustersUp(t, "prod", "kcp")
	// One cluster each (namespaces prod and kcp), side by side: they mostly wait on the controllers.
	t.Run("OwnersAnswerHandOvers", func(t *testing.T) { t.Parallel(); ownersAnswerHandOvers(t, c) })
	t.Run("KCPReplacesWhatHaleHandsOver", func(t *testing.T) { t.Parallel(); kcpReplacesWhatHaleHandsOver(t, c, "kcp") })
}

// Hale hands a KubeadmControlPlane Machine and a MachineSet Machine over with the MachineHealthCheck
// contract and each owner replaces its machine its own way (delete first); a hand-over KCP refuses
// (its retry limit) is read as the owner's answer and withdrawn, not waited for. In namespace prod.
func ownersAnswerHandOvers(t *testing.T, c client.Client) {
	ctx := t.Context()

	kcpMachine := ownedMachines(ctx, t, c, "prod", "KubeadmControlPlane")[0]
	start := time.Now()
	kcp := &clusterapi.MachineOwner{Client: c, Machine: client.ObjectKeyFromObject(&kcpMachine), OwnerAPIVersion: "controlplane.cluster.x-k8s.io/v1beta2",
		OwnerKind: "KubeadmControlPlane", OwnerName: "prod"}
	require.NoError(t, kcp.HandOver(ctx, "cp dead per 5 of 6 expected observers", nil))
	st, where := awaitOwnerAnswer(ctx, t, kcp, 3*time.Minute)
	require.Equal(t, execute.OwnerDone, st, where)
	t.Logf("KubeadmControlPlane replaced %s in %v: %s", kcpMachine.Name, time.Since(start).Round(time.Second), where)
	var replacement *clusterv1.Machine
	for _, m := range ownedMachines(ctx, t, c, "prod", "KubeadmControlPlane") {
		if strings.Contains(m.Annotations["controlplane.cluster.x-k8s.io/remediation-for"], kcpMachine.Name) {
			replacement = &m
		}
	}
	require.NotNil(t, replacement, "KCP's replacement carries remediation-for naming %s", kcpMachine.Name)

	// The replacement handed over within minHealthyPeriodSeconds: KCP's retry limit (maxRetry 0).
	again := &clusterapi.MachineOwner{Client: c, Machine: client.ObjectKeyFromObject(replacement), OwnerAPIVersion: kcp.OwnerAPIVersion,
		OwnerKind: "KubeadmControlPlane", OwnerName: "prod"}
	start = time.Now()
	require.NoError(t, again.HandOver(ctx, "dead again", nil))
	st, where = awaitOwnerAnswer(ctx, t, again, time.Minute)
	require.Equal(t, execute.OwnerRefused, st, where)
	assert.Contains(t, where, "(MaxRetry)")
	t.Logf("KubeadmControlPlane refused in %v: %s", time.Since(start).Round(100*time.Millisecond), where)
	require.NoError(t, again.Withdraw(ctx))
	var m clusterv1.Machine
	require.NoError(t, c.Get(ctx, again.Machine, &m))
	assert.False(t, clusterapi.HandedOver(&m))
	time.Sleep(3 * time.Second)
	require.NoError(t, c.Get(ctx, again.Machine, &m), "the refused machine is still there")
	assert.Nil(t, m.DeletionTimestamp)

	msMachine := ownedMachines(ctx, t, c, "prod", "MachineSet")[0]
	ms := &clusterapi.MachineOwner{Client: c, Machine: client.ObjectKeyFromObject(&msMachine), OwnerAPIVersion: clusterv1.GroupVersion.String(),
		OwnerKind: "MachineSet", OwnerName: metav1.GetControllerOf(&msMachine).Name}
	start = time.Now()
	require.NoError(t, ms.HandOver(ctx, "worker dead", nil))
	st, where = awaitOwnerAnswer(ctx, t, ms, 3*time.Minute)
	require.Equal(t, execute.OwnerDone, st, where)
	t.Logf("MachineSet replaced %s in %v: %s", msMachine.Name, time.Since(start).Round(time.Second), where)

	// Scale up first, through the real MachineDeployment and MachineSet controllers: one more replica, the
	// new machine's node ready (the Machine's NodeReady condition, as the Machine controller copies it
	// from the workload cluster), then delete-machine on the old one and the count back.
	old := ownedMachines(ctx, t, c, "prod", "MachineSet")[0]
	surge := &clusterapi.DeploymentOwner{MachineOwner: clusterapi.MachineOwner{Client: c, Machine: client.ObjectKeyFromObject(&old), OwnerAPIVersion: clusterv1.GroupVersion.String(),
		OwnerKind: "MachineSet", OwnerName: metav1.GetControllerOf(&old).Name}, Deployment: client.ObjectKey{Namespace: "prod", Name: "prod-md"}}
	start = time.Now()
	require.NoError(t, surge.HandOver(ctx, "worker dead", []quorum.Step{{Op: quorum.OpAddVoter, Member: "none"}}))
	st, where = awaitOwnerAnswer(ctx, t, surge, 3*time.Minute, execute.OwnerReadyToRemove)
	require.Equal(t, execute.OwnerReadyToRemove, st, where)
	t.Logf("MachineDeployment surged, its new machine ready in %v: %s", time.Since(start).Round(time.Second), where)
	require.NoError(t, c.Get(ctx, surge.Machine, &m), "the old machine stays until its replacement is ready")
	require.NoError(t, surge.Remove(ctx))
	st, where = awaitOwnerAnswer(ctx, t, surge, 3*time.Minute)
	require.Equal(t, execute.OwnerDone, st, where)
	t.Logf("MachineSet deleted the machine marked delete-machine, %v after the surge began: %s", time.Since(start).Round(time.Second), where)
	var md clusterv1.MachineDeployment
	require.NoError(t, c.Get(ctx, surge.Deployment, &md))
	assert.Equal(t, int32(1), *md.Spec.Replicas, "the count put back")
	assert.Len(t, ownedMachines(ctx, t, c, "prod", "MachineSet"), 1)

	// A paused Cluster: KCP leaves a handed-over machine alone, and Hale says why it waits; resumed, KCP
	// replaces it. minHealthyPeriodSeconds 1 makes this hand-over a new remediation for KCP, not a retry.
	var kcpObj unstructured.Unstructured
	kcpObj.SetAPIVersion(kcp.OwnerAPIVersion)
	kcpObj.SetKind("KubeadmControlPlane")
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "prod", Name: "prod"}, &kcpObj))
	require.NoError(t, c.Patch(ctx, &kcpObj, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"remediation":{"minHealthyPeriodSeconds":1}}}`))))
	var cluster clusterv1.Cluster
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "prod", Name: "prod"}, &cluster))
	require.NoError(t, c.Patch(ctx, &cluster, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"paused":true}}`))))
	var original *clusterv1.Machine
	for _, m := range ownedMachines(ctx, t, c, "prod", "KubeadmControlPlane") {
		if _, ok := m.Annotations["controlplane.cluster.x-k8s.io/remediation-for"]; !ok {
			original = &m
		}
	}
	require.NotNil(t, original)
	pausedOwner := &clusterapi.MachineOwner{Client: c, Machine: client.ObjectKeyFromObject(original), OwnerAPIVersion: kcp.OwnerAPIVersion,
		OwnerKind: "KubeadmControlPlane", OwnerName: "prod"}
	require.NoError(t, pausedOwner.HandOver(ctx, "dead while the cluster is paused", nil))
	time.Sleep(10 * time.Second)
	st, where, err := pausedOwner.Progress(ctx)
	require.NoError(t, err)
	assert.Equal(t, execute.OwnerWorking, st)
	assert.Contains(t, where, "Cluster prod/prod is paused")
	require.NoError(t, c.Get(ctx, pausedOwner.Machine, &m))
	assert.Nil(t, m.DeletionTimestamp, "KCP does nothing while the Cluster is paused")
	require.NoError(t, c.Patch(ctx, &cluster, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"paused":false}}`))))
	start = time.Now()
	st, where = awaitOwnerAnswer(ctx, t, pausedOwner, 3*time.Minute)
	require.Equal(t, execute.OwnerDone, st, where)
	t.Logf("Cluster resumed: KubeadmControlPlane replaced %s in %v", original.Name, time.Since(start).Round(time.Second))

	// A MachineHealthCheck on the MachineDeployment's machines, whose remediation is held back
	// (maxInFlight 0): the MachineSet defers, which Hale reads as the owner's answer, and the
	// MachineHealthCheck rewrites the conditions Hale set, since it sees the node healthy. This is why
	// Discovery leaves such a Machine to its MachineHealthCheck.
	var mdObj clusterv1.MachineDeployment
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "prod", Name: "prod-md"}, &mdObj))
	require.NoError(t, c.Patch(ctx, &mdObj, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"remediation":{"maxInFlight":0}}}`))))
	mhc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": clusterv1.GroupVersion.String(), "kind": "MachineHealthCheck",
		"metadata": map[string]any{"namespace": "prod", "name": "prod-md"},
		"spec": map[string]any{"clusterName": "prod", "selector": map[string]any{"matchLabels": map[string]any{clusterv1.MachineDeploymentNameLabel: "prod-md"}},
			"checks": map[string]any{"unhealthyNodeConditions": []any{map[string]any{"type": "Ready", "status": "False", "timeoutSeconds": int64(300)}}}}}}
	require.NoError(t, c.Create(ctx, mhc))
	watched := ownedMachines(ctx, t, c, "prod", "MachineSet")[0]
	deferred := &clusterapi.MachineOwner{Client: c, Machine: client.ObjectKeyFromObject(&watched), OwnerAPIVersion: clusterv1.GroupVersion.String(),
		OwnerKind: "MachineSet", OwnerName: metav1.GetControllerOf(&watched).Name}
	time.Sleep(3 * time.Second) // the MachineHealthCheck has looked at the machine once
	start = time.Now()
	require.NoError(t, deferred.HandOver(ctx, "worker dead", nil))
	sawDeferral := false
	for time.Since(start) < time.Minute {
		_, where, err := deferred.Progress(ctx)
		require.NoError(t, err)
		sawDeferral = sawDeferral || strings.Contains(where, "MachineSet defers deleting Machine")
		require.NoError(t, c.Get(ctx, deferred.Machine, &m))
		if !clusterapi.HandedOver(&m) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	require.NoError(t, c.Get(ctx, deferred.Machine, &m))
	assert.False(t, clusterapi.HandedOver(&m), "the MachineHealthCheck rewrote Hale's conditions")
	assert.True(t, sawDeferral, "the MachineSet's deferral read as its answer")
	t.Logf("MachineSet deferred; the MachineHealthCheck rewrote Hale's conditions %v after the hand-over: %+v", time.Since(start).Round(100*time.Millisecond),
		meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition))
}

// inMemoryClustersUp starts an API server and Cluster API's controllers, creates inMemoryCluster in
// each namespace given (its objects named after the namespace) and waits until all are whole.
func inMemoryClustersUp(t *testing.T, namespaces ...string) client.Client {
	t.Helper()
	c, cfg := kubeenv.StartBare(t)
	ctx := t.Context()
	start := time.Now()
	capilab.Start(t, c, kubeenv.Kubeconfig(t, cfg, t.TempDir(), ""), 20*time.Second)
	t.Logf("Cluster API %s: CRDs, webhooks and 4 managers ready in %v", capilab.Version, time.Since(start).Round(100*time.Millisecond))
	for _, ns := range namespaces {
		require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(strings.ReplaceAll(inMemoryCluster, "prod", ns)), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
			require.NoError(t, c.Create(ctx, &u), "creating %s %s/%s", u.GetKind(), ns, u.GetName())
		}
	}
	start = time.Now()
	for _, ns := range namespaces {
		waitWhole(ctx, t, c, ns, 4*time.Minute)
	}
	t.Logf("%d clusters up (KubeadmControlPlane 3 ready, MachineDeployment 1 ready) in %v", len(namespaces), time.Since(start).Round(time.Second))
	return c
}

// waitWhole waits until the KubeadmControlPlane and the MachineDeployment in ns have all their
// replicas ready.
func waitWhole(ctx context.Context, t *testing.T, c client.Client, ns string, timeout time.Duration) {
	t.Helper()
	ready := func(apiVersion, kind, name string) int64 {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(apiVersion)
		u.SetKind(kind)
		if c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, u) != nil {
			return -1
		}
		n, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		return n
	}
	deadline := time.Now().Add(timeout)
	for {
		kcp := ready("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlane", ns)
		md := ready(clusterv1.GroupVersion.String(), "MachineDeployment", ns+"-md")
		if kcp == 3 && md == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster %s did not come up in %v: KubeadmControlPlane ready %d/3, MachineDeployment ready %d/1", ns, timeout, kcp, md)
		}
		time.Sleep(time.Second)
	}
}

// ownedMachines lists the live Machines in ns whose controller is of kind.
func ownedMachines(ctx context.Context, t *testing.T, c client.Client, ns, kind string) []clusterv1.Machine {
	t.Helper()
	var all clusterv1.MachineList
	require.NoError(t, c.List(ctx, &all, client.InNamespace(ns)))
	var out []clusterv1.Machine
	for _, m := range all.Items {
		if ref := metav1.GetControllerOf(&m); ref != nil && ref.Kind == kind && m.DeletionTimestamp == nil {
			out = append(out, m)
		}
	}
	require.NotEmpty(t, out, "no Machine of a %s", kind)
	return out
}

// awaitOwnerAnswer polls the owner's progress until it is done or refused (or one of also), as the
// hub's executor does.
func awaitOwnerAnswer(ctx context.Context, t *testing.T, o execute.Owner, timeout time.Duration, also ...execute.OwnerProgress) (execute.OwnerProgress, string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var where string
	for time.Now().Before(deadline) {
		st, w, err := o.Progress(ctx)
		require.NoError(t, err)
		where = w
		if st == execute.OwnerDone || st == execute.OwnerRefused || slices.Contains(also, st) {
			return st, where
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s: no answer in %v: %s", o.Describe(), timeout, where)
	return 0, ""
}

// The whole pipeline with the real KubeadmControlPlane: Hale's agents watch real etcd members, one per
// KCP Machine and named after its node; a machine hangs; Hale finds it dead, plans KCP's delete-first
// replacement against the real membership and hands the Machine over; the real KCP deletes it and
// creates a replacement. The harness plays what KCP and kubeadm would do to the real etcd (the in-memory
// provider's etcd is simulated): the deleted Machine's member is removed, the new Machine's joins, its
// agent starts and its Node appears. Hale closes the Remediation once KCP is whole, and the new machine
// is Healthy in its eyes. In namespace ns.
func kcpReplacesWhatHaleHandsOver(t *testing.T, c client.Client, ns string) {
	ctx := t.Context()
	machines := ownedMachines(ctx, t, c, ns, "KubeadmControlPlane")
	slices.SortFunc(machines, func(a, b clusterv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	var names []string
	for _, m := range machines {
		require.NotEmpty(t, m.Status.NodeRef.Name)
		names = append(names, m.Status.NodeRef.Name)
	}
	timeline := &capture.Buffer{}
	tb, err := inproc.Start(inproc.Options{Dir: t.TempDir(), Timeline: timeline, Names: names})
	require.NoError(t, err)
	t.Cleanup(func() {
		tb.Close()
		if t.Failed() {
			t.Logf("timeline:\n%s", timeline)
		}
	})
	inv, err := tb.Inventory()
	require.NoError(t, err)
	for _, m := range inv.Machines {
		createNode(t, c, m.Node, m.Member, true)
	}
	go mirrorToEtcd(ctx, t, c, ns, tb, names)
	// The first machine is in the inventory file with its BMC (healed by a power-cycle, below, when the
	// MachineHealthCheck asks); the others are healed by their owner, KCP.
	d := &Discovery{Client: c, Namespace: ns, Base: pass.Inventory{Cluster: inv.Cluster, Policy: inv.Policy, Witnesses: inv.Witnesses, Machines: inv.Machines[:1]}}
	startDiscoveredHub(t, c, tb, d)

	sick := machines[2].Name
	start := time.Now()
	tb.Hang(2)
	require.NoError(t, tb.WaitFor(ctx, 3*time.Minute, "the Remediation of "+sick+" closed", func() bool {
		hist, err := tb.Hub().History(ctx, sick)
		return err == nil && len(hist) == 1 && hist[0].State != journal.InProgress
	}))
	hist, _ := tb.Hub().History(ctx, sick)
	require.Equal(t, journal.Succeeded, hist[0].State, "%+v", hist[0].History)
	t.Logf("hung → replaced by the real KubeadmControlPlane, Remediation Succeeded: %v", time.Since(start).Round(time.Second))
	assert.Equal(t, "remove "+inv.Machines[2].Member+" → add-voter "+inv.Machines[2].Member+"-replacement → await-healthy "+inv.Machines[2].Member+"-replacement",
		quorum.StepList(hist[0].Steps))
	var replacement string
	for _, m := range ownedMachines(ctx, t, c, ns, "KubeadmControlPlane") {
		if strings.Contains(m.Annotations["controlplane.cluster.x-k8s.io/remediation-for"], sick) {
			replacement = m.Name
		}
	}
	require.NotEmpty(t, replacement, "KCP's replacement names the machine it remediates")
	require.NoError(t, tb.WaitFor(ctx, time.Minute, "every machine Healthy, the replacement included", func() bool {
		st := tb.Hub().Status(ctx)
		healthy := 0
		for _, m := range st.Machines {
			if m.Verdict == assess.VerdictHealthy && m.EtcdHealth == quorum.Healthy.String() {
				healthy++
			}
		}
		return len(st.Machines) == 3 && healthy == 3
	}))
	t.Logf("the replacement %s Healthy in Hale's eyes %v after the hang", replacement, time.Since(start).Round(time.Second))
	time.Sleep(3 * time.Second)
	n, _ := tb.Remediations(2)
	assert.Equal(t, 1, n, "one remediation")
	for _, m := range tb.Hub().Status(ctx).Machines {
		assert.Nil(t, m.Remediation, "nothing more in flight: %s", m.Name)
	}
	assert.Contains(t, eventsAbout(t, c, ns, "Machine", sick), "RemediationStarted")
	assert.NoError(t, tb.WaitFor(ctx, 10*time.Second, "the Remediated Event on the Machine KCP deleted", func() bool {
		return slices.Contains(eventsAbout(t, c, ns, "Machine", sick), "Remediated")
	}))
	machineHealthCheckHandsToHale(t, c, ns, tb, machines[0].Name, machines[1].Name)
}

// The real MachineHealthCheck hands its remediations to Hale (spec.remediation.templateRef: a
// HaleRemediationTemplate): it judges two KCP Machines unhealthy at once (a Machine condition it is
// told to watch), and makes a HaleRemediation for each; Discovery holds the hub's own remediations
// on the machines it judges (ExternallyChecked); Hale carries out each the machine's own way: the
// first power-cycled through its BMC (the inventory file's), the second handed to the real KCP, which
// replaces it. Whichever goes first, the other waits, saying why (either while the first is under
// way would cost etcd's quorum); once power-cycled, the first's fault clears and the
// MachineHealthCheck deletes its request.
func machineHealthCheckHandsToHale(t *testing.T, c client.Client, ns string, tb *inproc.Cluster, first, second string) {
	ctx := t.Context()
	template := &v1alpha1.HaleRemediationTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hale"}}
	require.NoError(t, c.Create(ctx, template))
	mhc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": clusterv1.GroupVersion.String(), "kind": "MachineHealthCheck",
		"metadata": map[string]any{"namespace": ns, "name": ns + "-cp"},
		"spec": map[string]any{"clusterName": ns, "selector": map[string]any{"matchLabels": map[string]any{clusterv1.MachineControlPlaneLabel: ""}},
			"checks":      map[string]any{"unhealthyMachineConditions": []any{map[string]any{"type": "hale.dev/TestFault", "status": "True", "timeoutSeconds": int64(0)}}},
			"remediation": map[string]any{"templateRef": map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": HaleRemediationTemplateKind, "name": "hale"}}}}}
	require.NoError(t, c.Create(ctx, mhc))
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "the hub's own remediations held for the MachineHealthCheck", func() bool {
		for _, m := range tb.Hub().Inventory().Machines {
			if m.Name == first && strings.Contains(m.CheckedBy, "MachineHealthCheck "+ns+"/"+ns+"-cp") {
				return true
			}
		}
		return false
	}))
	start := time.Now()
	// fault sets the condition the MachineHealthCheck watches on a Machine.
	fault := func(name string, status metav1.ConditionStatus, reason string) {
		var m clusterv1.Machine
		require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &m))
		before := m.DeepCopy()
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: "hale.dev/TestFault", Status: status, Reason: reason})
		require.NoError(t, c.Status().Patch(ctx, &m, client.MergeFrom(before)))
	}
	for _, name := range []string{first, second} {
		fault(name, metav1.ConditionTrue, "Injected")
	}
	phase := func(name string) v1alpha1.HaleRemediationStatus {
		var r v1alpha1.HaleRemediation
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
			return v1alpha1.HaleRemediationStatus{Message: err.Error()}
		}
		return r.Status
	}
	// Either goes first (both requests come at once); the other waits, saying why.
	var waited string
	require.NoError(t, tb.WaitFor(ctx, 3*time.Minute, "the MachineHealthCheck's request for the first carried out", func() bool {
		for _, name := range []string{first, second} {
			if st := phase(name); st.Phase == v1alpha1.ExternalWaiting && waited == "" {
				waited = name + ": " + st.Message
			}
		}
		return phase(first).Phase == v1alpha1.ExternalSucceeded
	}), "%+v; %+v", phase(first), phase(second))
	t.Logf("MachineHealthCheck → two HaleRemediations → the first power-cycled through its BMC, Succeeded %v after both were asked; "+
		"one waited for the other: %s", time.Since(start).Round(time.Second), waited)
	assert.Contains(t, waited, "quorum", "one waited for the other, and said why")
	// Power-cycled, the first is healthy again: its fault goes (the condition this test made), and the
	// MachineHealthCheck withdraws its request, as the contract says. KCP counts it ready again.
	fault(first, metav1.ConditionFalse, "PowerCycled")
	require.NoError(t, tb.WaitFor(ctx, time.Minute, "the MachineHealthCheck's request for the first deleted once it is healthy", func() bool {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: first}, &v1alpha1.HaleRemediation{})
		return apierrors.IsNotFound(err)
	}))
	require.NoError(t, tb.WaitFor(ctx, 3*time.Minute, "the second request carried out", func() bool {
		return phase(second).Phase == v1alpha1.ExternalSucceeded
	}), "%+v", phase(second))
	t.Logf("the second, replaced by the real KCP, Succeeded %v after both were asked (its record closes once KCP is whole again)", time.Since(start).Round(time.Second))
	var rems []journal.Remediation
	for _, name := range []string{first, second} {
		hist, err := tb.Hub().History(ctx, name)
		require.NoError(t, err)
		// One that ended before it acted (its re-check refused, as on a loaded machine when too few
		// observers' reports were fresh) is asked again: it did nothing, and is not counted.
		hist = slices.DeleteFunc(hist, func(r journal.Remediation) bool {
			if r.State == journal.Aborted {
				t.Logf("%s: %s ended before it acted: %s", name, r.ID, r.History[len(r.History)-1].Detail)
			}
			return r.State == journal.Aborted
		})
		require.Len(t, hist, 1, name)
		r := hist[0]
		assert.Contains(t, r.RequestedBy, "MachineHealthCheck (HaleRemediation "+ns+"/"+name+")")
		assert.Equal(t, journal.Succeeded, r.State)
		t.Logf("%s: %s, from %s to %s; etcd's members then: %v", name, quorum.StepList(r.Steps), r.Created.Format("15:04:05.0"), r.Updated.Format("15:04:05.0"), r.Members)
		rems = append(rems, r)
	}
	// The first power-cycled through its BMC, the second handed to KCP, never both at once: the reboot
	// came after the replacement's new member had joined (its old one gone, three again), or the
	// replacement after the reboot had ended.
	reboot, replace := rems[0], rems[1]
	assert.Equal(t, quorum.OpPowerCycle, reboot.Steps[0].Op, quorum.StepList(reboot.Steps))
	assert.Equal(t, quorum.OpRemove, replace.Steps[0].Op, quorum.StepList(replace.Steps))
	if reboot.Created.Before(replace.Created) {
		assert.False(t, replace.Created.Before(reboot.Updated), "the replacement began (%s) once the reboot had ended (%s)",
			replace.Created.Format("15:04:05.0"), reboot.Updated.Format("15:04:05.0"))
	} else {
		assert.NotContains(t, reboot.Members, replace.Steps[0].Member, "the reboot began once the replaced member was gone")
		assert.Len(t, reboot.Members, 3, "… and its replacement in")
	}
}

// mirrorToEtcd does to the real etcd what KCP and kubeadm do to a real control plane's, while the
// in-memory provider only simulates it: a KCP Machine that is deleted (or deleting) has its member
// removed and its Node deleted; a new one with a node gets a member joined, an agent and a Node.
func mirrorToEtcd(ctx context.Context, t *testing.T, c client.Client, ns string, tb *inproc.Cluster, names []string) {
	gone := map[string]bool{}
	known := slices.Clone(names)
	for ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		var list clusterv1.MachineList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			continue
		}
		live := map[string]bool{}
		for _, m := range list.Items {
			ref := metav1.GetControllerOf(&m)
			if ref == nil || ref.Kind != "KubeadmControlPlane" || m.Status.NodeRef.Name == "" {
				continue
			}
			node := m.Status.NodeRef.Name
			if m.DeletionTimestamp == nil {
				live[node] = true
			}
			if !slices.Contains(known, node) && m.DeletionTimestamp == nil {
				known = append(known, node)
				_, member, err := tb.AddMachine(ctx, node)
				if err != nil {
					t.Errorf("joining %s's etcd member: %v", node, err)
					continue
				}
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{ControlPlaneLabel: ""},
					Annotations: map[string]string{EtcdMemberAnnotation: member}}}
				if err := c.Create(ctx, n); err != nil && ctx.Err() == nil {
					t.Errorf("creating Node %s: %v", node, err)
				}
			}
		}
		for i, node := range known {
			if live[node] || gone[node] {
				continue
			}
			gone[node] = true
			if err := tb.RemoveMember(ctx, i); err != nil && ctx.Err() == nil {
				t.Errorf("removing %s's etcd member: %v", node, err)
			}
			if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil && ctx.Err() == nil {
				t.Errorf("deleting Node %s: %v", node, err)
			}
		}
	}
}
