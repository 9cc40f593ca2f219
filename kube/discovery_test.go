package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/lab/inproc"
	"github.com/hale-dev/hale/test/metal3sim"
)

const kcpAPIVersion = "controlplane.cluster.x-k8s.io/v1beta2"

func createNode(t *testing.T, c client.Client, name, member string, controlPlane bool) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
	if controlPlane {
		n.Labels[ControlPlaneLabel] = ""
	}
	if member != "" {
		n.Annotations[EtcdMemberAnnotation] = member
	}
	require.NoError(t, c.Create(t.Context(), n))
}

// createMachine creates a Cluster API Machine owned by KubeadmControlPlane kcp, on node.
func createMachine(t *testing.T, c client.Client, ns, name, node, kcp string, annotations map[string]string) {
	t.Helper()
	createClusterMachine(t, c, ns, name, node, kcp, "prod", annotations)
}

// createClusterMachine is createMachine of Cluster API Cluster cluster.
func createClusterMachine(t *testing.T, c client.Client, ns, name, node, kcp, cluster string, annotations map[string]string) {
	t.Helper()
	ctx := t.Context()
	yes := true
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: kcpAPIVersion, Kind: "KubeadmControlPlane", Name: kcp, UID: "0e3c6b4a-0000-4000-8000-000000000001", Controller: &yes}}},
		Spec: clusterv1.MachineSpec{ClusterName: cluster, Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr("bootstrap")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine", Name: name + "-infra"}}}
	require.NoError(t, c.Create(ctx, m))
	before := m.DeepCopy()
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: node}
	require.NoError(t, c.Status().Patch(ctx, m, client.MergeFrom(before)))
}

func ptr[T any](v T) *T { return &v }

// createHost creates a BareMetalHost for a Metal3Machine (consumer; empty: none).
func createHost(t *testing.T, c client.Client, ns, name, address, consumer string, annotations map[string]string) {
	t.Helper()
	h := &unstructured.Unstructured{}
	h.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
	h.SetNamespace(ns)
	h.SetName(name)
	h.SetAnnotations(annotations)
	spec := map[string]any{"online": true, "bmc": map[string]any{"address": address, "credentialsName": name + "-bmc"}}
	if consumer != "" {
		spec["consumerRef"] = map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine", "name": consumer, "namespace": ns}
	}
	h.Object["spec"] = spec
	require.NoError(t, c.Create(t.Context(), h))
}

// What Discovery makes of a cluster with every kind of machine: each control-plane node once, named
// after its Cluster API Machine, healed the way what exists allows, held with the reason otherwise.
func TestDiscoveryMapsNodesMachinesAndHosts(t *testing.T) {
	c, _ := kubeenv.Start(t)
	ctx := t.Context()
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "capi"}}))
	for _, n := range []struct {
		node, member, machine string
		annotations           map[string]string
	}{
		{"node-a", "", "m-a", nil}, // KCP machine with a BareMetalHost (consumerRef)
		{"node-b", "", "m-b", nil}, // KCP machine, no host: replaced by KCP
		{"node-c", "etcd-c", "m-c", map[string]string{clusterv1.MachineSkipRemediationAnnotation: ""}},
		{"node-d", "", "", nil},    // no Cluster API: a host named after the node, detached
		{"node-e", "", "", nil},    // in the inventory file only: its own BMC
		{"node-f", "", "", nil},    // nothing at all
		{"node-g", "", "m-g", nil}, // KCP machine a MachineHealthCheck selects
	} {
		createNode(t, c, n.node, n.member, true)
		if n.machine != "" {
			createMachine(t, c, "capi", n.machine, n.node, "cp", n.annotations)
		}
	}
	for _, name := range []string{"m-b", "m-g"} {
		m := &clusterv1.Machine{}
		require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "capi", Name: name}, m))
		m.Labels = map[string]string{"watch": map[string]string{"m-b": "other", "m-g": "mhc"}[name]}
		require.NoError(t, c.Update(ctx, m))
	}
	for cluster, value := range map[string]string{"prod": "mhc", "dev": "other"} {
		require.NoError(t, c.Create(ctx, &clusterv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: cluster + "-watch"},
			Spec: clusterv1.MachineHealthCheckSpec{ClusterName: cluster, Selector: metav1.LabelSelector{MatchLabels: map[string]string{"watch": value}}}}))
	}
	createNode(t, c, "worker-1", "", false)
	createNode(t, c, "worker-2", "", false)
	w2 := &corev1.Node{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "worker-2"}, w2))
	w2.Labels = map[string]string{WitnessLabel: "true"}
	require.NoError(t, c.Update(ctx, w2))
	nodeA := &corev1.Node{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "node-a"}, nodeA))
	before := nodeA.DeepCopy()
	since := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	nodeA.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", LastTransitionTime: since, LastHeartbeatTime: since}}
	require.NoError(t, c.Status().Patch(ctx, nodeA, client.MergeFrom(before)))
	createHost(t, c, "capi", "host-a", "redfish://10.0.0.1/redfish/v1/Systems/1", "m-a-infra", nil)
	createHost(t, c, "capi", "node-d", "redfish://10.0.0.4/redfish/v1/Systems/1", "", map[string]string{clusterapi.HostDetachedAnnotation: ""})
	ep, err := bmc.ParseEndpoint("redfish+http://127.0.0.1:1/redfish/v1/Systems/1")
	require.NoError(t, err)
	base := pass.Inventory{Cluster: "prod", Witnesses: []string{"rack-2-witness"}, Machines: []pass.Machine{{MachineRef: assess.MachineRef{Name: "e", Node: "node-e", Member: "node-e"},
		Class: "file", Strategy: quorum.Reboot, Endpoint: ep}}}
	base.Policy.PlannedWork = inventory.PlannedWorkKinds()
	makePlannedWork(t, c)
	d := &Discovery{Client: c, Base: base}
	inv, err := d.Build(ctx)
	require.NoError(t, err)
	work := map[string]string{}
	for _, m := range inv.Machines {
		work[m.Name] = m.PlannedWork
	}
	assert.Regexp(t, `^Machine capi/m-h is being deleted \(since \d\d:\d\d:\d\dZ\): its owner or an operator is taking it away \(policy.plannedWork: deleting\)$`,
		work["m-h"], "deleting comes before rollout")
	delete(work, "m-h")
	rolling := "KubeadmControlPlane capi/cp is rolling out (RollingOut: Rolling out 1 not up-to-date replica) (policy.plannedWork: rollout)"
	assert.Equal(t, map[string]string{"m-a": rolling, "m-b": rolling, "m-c": rolling, "m-g": rolling, "node-d": "",
		"node-e": "Node node-e is cordoned (kubectl cordon or drain): planned work; `kubectl uncordon node-e` when it is done (policy.plannedWork: cordoned)",
		"node-f": "NodeMaintenance nm-f puts Node node-f in maintenance (PSU swap): its operator drains it; Hale waits until it is deleted (policy.plannedWork: nodeMaintenance)",
	}, work, "each machine's planned work, the first of the policy's kinds that applies")
	only := base
	only.Policy.PlannedWork = []string{inventory.WorkCordoned}
	invOnly, err := (&Discovery{Client: c, Base: only}).Build(ctx)
	require.NoError(t, err)
	for _, m := range invOnly.Machines {
		assert.Equal(t, m.Name == "node-e", m.PlannedWork != "", "policy.plannedWork [cordoned]: %s: %q", m.Name, m.PlannedWork)
	}
	inv.Machines = inv.Machines[:len(inv.Machines)-1] // m-h (node-h) was here for its deletion only

	type row struct{ name, node, member, strategy, hold string }
	var got []row
	for _, m := range inv.Machines {
		got = append(got, row{m.Name, m.Node, m.Member, m.Strategy.String(), m.Hold})
	}
	assert.Equal(t, []row{
		{"m-a", "node-a", "node-a", "reboot", ""},
		{"m-b", "node-b", "node-b", "replace", ""},
		{"m-c", "node-c", "etcd-c", "replace", "Machine capi/m-c is annotated cluster.x-k8s.io/skip-remediation"},
		{"node-d", "node-d", "node-d", "reboot", "BareMetalHost capi/node-d is annotated baremetalhost.metal3.io/detached: its operator does not act on it, so neither does Hale"},
		{"node-e", "node-e", "node-e", "reboot", ""},
		{"node-f", "node-f", "node-f", "reboot", "no way to heal it: no BareMetalHost, no BMC in the inventory file, no Cluster API owner"},
		{"m-g", "node-g", "node-g", "replace", "Machine capi/m-g is remediated by MachineHealthCheck capi/prod-watch, which rewrites the conditions Hale " +
			"would hand it over with: Hale watches it and leaves its remediation to that MachineHealthCheck (take the Machine out of its " +
			"selector, or delete it, to let Hale heal it with its quorum checks)"},
	}, got, "m-b: the MachineHealthCheck that selects its labels is another cluster's")
	assert.Equal(t, []quorum.Order{quorum.ScaleDownFirst}, inv.Machines[1].Replace.Orders, "KCP remediates delete-first")
	assert.Equal(t, []string{"rack-2-witness", "worker-2"}, inv.Witnesses, "the file's witnesses and the Nodes labelled "+WitnessLabel)
	assert.Equal(t, []assess.NodeCondition{{Type: "Ready", Status: "Unknown", Reason: "NodeStatusUnknown", Since: since.Time}}, inv.Machines[0].Conditions,
		"the Node's conditions, as evidence for the assessor")

	power := d.PowerFor(func(m pass.Machine) (execute.Power, error) { return nil, fmt.Errorf("BMC of %s", m.Name) })
	p, err := power(inv.Machines[0])
	require.NoError(t, err)
	assert.Equal(t, client.ObjectKey{Namespace: "capi", Name: "host-a"}, p.(*clusterapi.Metal3Host).Key)
	_, err = power(inv.Machines[4])
	assert.EqualError(t, err, "BMC of node-e", "the inventory file's machine, with its BMC")
	for _, m := range inv.Machines {
		// The hub checks the file's BMCs, reads a fenced machine's power and fences through them.
		if m.Name == "node-e" {
			assert.Equal(t, ep, m.Endpoint, "node-e carries the file's BMC")
		} else {
			assert.Empty(t, m.Endpoint.Driver, "%s: no BMC in the file", m.Name)
		}
	}
	_, err = power(inv.Machines[5])
	assert.ErrorContains(t, err, "nothing can power-cycle it")
	o, err := d.OwnerFor(inv.Machines[1])
	require.NoError(t, err)
	assert.Equal(t, "KubeadmControlPlane capi/cp (deletes the machine, then creates its replacement)", o.Describe())
	_, err = d.OwnerFor(inv.Machines[5])
	assert.ErrorContains(t, err, "nothing can replace it")
	ref, ok := d.Regarding("m-b")
	require.True(t, ok)
	assert.Equal(t, corev1.ObjectReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "Machine", Namespace: "capi", Name: "m-b"}, ref)
	ref, _ = d.Regarding("node-f")
	assert.Equal(t, corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "node-f"}, ref)

	// KCP deleted m-b (and its Node went with it): it leaves the inventory, but its binding stays a
	// while, so that the hub can close its remediation and say so on the Machine it was about.
	require.NoError(t, c.Delete(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: "m-b"}}))
	require.NoError(t, c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}))
	inv2, err := d.Build(ctx)
	require.NoError(t, err)
	assert.NotContains(t, fmt.Sprint(inv2.Machines), "m-b")
	ref, ok = d.Regarding("m-b")
	require.True(t, ok, "departed, still regarded")
	assert.Equal(t, "m-b", ref.Name)
	o, err = d.OwnerFor(inv.Machines[1])
	require.NoError(t, err)
	assert.Contains(t, o.Describe(), "KubeadmControlPlane capi/cp")
	_, ok = d.Regarding("never-there")
	assert.False(t, ok)

	discoverFromAManagementCluster(t, c)
}

// discoverFromAManagementCluster: Discovery in a management cluster's cell. The Nodes are the
// workload cluster's (TestDiscoveryMapsNodesMachinesAndHosts's server, its Nodes as that test left
// them); Cluster API's and metal3's objects are in the management cluster (the shared server), where
// two Clusters' Machines name the same Node: only Cluster a's are a's, and a host is found through a
// Machine's infrastructure only, never by a Node's name.
func discoverFromAManagementCluster(t *testing.T, workload client.Client) {
	mc, mcfg, ns := shared.Namespace(t)
	ctx := t.Context()
	createClusterMachine(t, mc, ns, "a-0", "node-a", "a-cp", "a", nil)
	createClusterMachine(t, mc, ns, "a-1", "node-c", "a-cp", "a", nil)
	createClusterMachine(t, mc, ns, "b-0", "node-a", "b-cp", "b", nil)
	createClusterMachine(t, mc, ns, "b-1", "node-e", "b-cp", "b", nil)
	createHost(t, mc, ns, "host-a0", "redfish://10.0.1.1/redfish/v1/Systems/1", "a-0-infra", nil)
	createHost(t, mc, ns, "node-d", "redfish://10.0.1.4/redfish/v1/Systems/1", "", nil) // another cluster's, named like a's Node
	d := &Discovery{Client: mc, Workload: workload, ClusterName: "a", Namespace: ns, Base: pass.Inventory{Cluster: "a"}}
	inv, err := d.Build(ctx)
	require.NoError(t, err)
	type row struct{ name, node, member, strategy, hold string }
	var got []row
	for _, m := range inv.Machines {
		got = append(got, row{m.Name, m.Node, m.Member, m.Strategy.String(), m.Hold})
	}
	none := "no way to heal it: no BareMetalHost, no BMC in the inventory file, no Cluster API owner"
	assert.Equal(t, []row{
		{"a-0", "node-a", "node-a", "reboot", ""},
		{"a-1", "node-c", "etcd-c", "replace", ""},
		{"node-d", "node-d", "node-d", "reboot", none},
		{"node-e", "node-e", "node-e", "reboot", none},
		{"node-f", "node-f", "node-f", "reboot", none},
		{"node-g", "node-g", "node-g", "reboot", none},
		{"node-h", "node-h", "node-h", "reboot", none},
	}, got, "the workload's Nodes, Cluster a's Machines (its member from the workload's Node annotation)")
	p, err := d.PowerFor(nil)(inv.Machines[0])
	require.NoError(t, err)
	assert.Equal(t, client.ObjectKey{Namespace: ns, Name: "host-a0"}, p.(*clusterapi.Metal3Host).Key, "the host in the management cluster")
	o, err := d.OwnerFor(inv.Machines[1])
	require.NoError(t, err)
	assert.Equal(t, "KubeadmControlPlane "+ns+"/a-cp (deletes the machine, then creates its replacement)", o.Describe())
	ref, ok := d.Regarding("a-0")
	assert.True(t, ok)
	assert.Equal(t, "Machine", ref.Kind)
	ref, ok = d.Regarding("node-d")
	assert.True(t, ok)
	assert.Empty(t, ref, "a workload Node is not in the management cluster: Events about it go to the cell's HealthPolicy")
	sink := NewEventSink(mc, d, "hub-test", slog.New(slog.DiscardHandler))
	sink.Hub = corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HealthPolicy", Namespace: ns, Name: "a"}
	require.NoError(t, sink.write(ctx, pass.Notice{Machine: "node-d", Reason: pass.ReasonSuspect, Message: "node-d is Suspect"}))
	var events eventsv1.EventList
	require.NoError(t, mc.List(ctx, &events, client.InNamespace(ns)))
	require.Len(t, events.Items, 1)
	assert.Equal(t, sink.Hub, events.Items[0].Regarding, "in the Cluster's namespace, regarding its HealthPolicy")

	gone := rest.CopyConfig(mcfg)
	gone.Host = "https://127.0.0.1:1" // nothing listens
	wc, err := client.New(gone, client.Options{Scheme: mc.Scheme()})
	require.NoError(t, err)
	d.Workload = wc
	_, err = d.Build(ctx)
	assert.ErrorContains(t, err, "listing control-plane nodes in the workload cluster of Cluster API Cluster "+ns+"/a: ")
}

// makePlannedWork makes planned work for TestDiscoveryMapsNodesMachinesAndHosts: node-e cordoned, a
// medik8s NodeMaintenance for node-f, Machine m-h (on node-h) being deleted (its finalizer keeps it),
// and KubeadmControlPlane cp, which owns the Machines, rolling out.
func makePlannedWork(t *testing.T, c client.Client) {
	ctx := t.Context()
	n := &corev1.Node{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "node-e"}, n))
	n.Spec.Unschedulable = true
	require.NoError(t, c.Update(ctx, n))
	nm := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"nodeName": "node-f", "reason": "PSU swap"}}}
	nm.SetGroupVersionKind(NodeMaintenanceGVK)
	nm.SetName("nm-f")
	require.NoError(t, c.Create(ctx, nm))
	createNode(t, c, "node-h", "", true)
	createMachine(t, c, "capi", "m-h", "node-h", "cp", nil)
	m := &clusterv1.Machine{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "capi", Name: "m-h"}, m))
	m.Finalizers = []string{"test.hale.dev/keep"}
	require.NoError(t, c.Update(ctx, m))
	require.NoError(t, c.Delete(ctx, m))
	t.Cleanup(func() { // let the API server's namespace go
		if c.Get(context.Background(), client.ObjectKey{Namespace: "capi", Name: "m-h"}, m) == nil {
			m.Finalizers = nil
			_ = c.Update(context.Background(), m)
		}
	})
	kcp := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"replicas": int64(3), "version": "v1.36.3",
		"machineTemplate":   map[string]any{"spec": map[string]any{"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3MachineTemplate", "name": "cp"}}},
		"kubeadmConfigSpec": map[string]any{"clusterConfiguration": map[string]any{"apiServer": map[string]any{"certSANs": []any{"localhost"}}}}}}}
	kcp.SetAPIVersion(kcpAPIVersion)
	kcp.SetKind("KubeadmControlPlane")
	kcp.SetNamespace("capi")
	kcp.SetName("cp")
	require.NoError(t, c.Create(ctx, kcp))
	require.NoError(t, unstructured.SetNestedSlice(kcp.Object, []any{map[string]any{"type": "RollingOut", "status": "True", "reason": "RollingOut",
		"message": "Rolling out 1 not up-to-date replica", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}}, "status", "conditions"))
	require.NoError(t, c.Status().Update(ctx, kcp))
}

// startInproc starts the demo topology; its timeline is logged when the test fails.
func startInproc(t *testing.T) *inproc.Cluster {
	t.Helper()
	timeline := &capture.Buffer{}
	tb, err := inproc.Start(inproc.Options{Dir: t.TempDir(), Timeline: timeline})
	require.NoError(t, err)
	t.Cleanup(func() {
		tb.Close()
		if t.Failed() || os.Getenv("HALE_TIMELINE") != "" {
			t.Logf("timeline:\n%s", timeline)
		}
	})
	return tb
}

// kubeInproc is the demo topology (real etcd members, agents, simulated Redfish BMCs) described to
// a real kube-apiserver, started for the test with namespace ns: a control-plane Node per machine,
// named as its agent, its etcd member named by annotation.
func kubeInproc(t *testing.T, ns string) (client.Client, *inproc.Cluster, pass.Inventory) {
	t.Helper()
	c, _ := kubeenv.Start(t)
	require.NoError(t, c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	tb := startInproc(t)
	inv, err := tb.Inventory()
	require.NoError(t, err)
	for _, m := range inv.Machines {
		createNode(t, c, m.Node, m.Member, true)
	}
	return c, tb, inv
}

// startDiscoveredHub starts the in-process cluster's hub on the inventory Discovery finds, with its actuators,
// Events, and a rediscovery every 200 ms.
func startDiscoveredHub(t *testing.T, c client.Client, tb *inproc.Cluster, d *Discovery) {
	t.Helper()
	ctx := t.Context()
	inv, err := d.Build(ctx)
	require.NoError(t, err)
	sink := NewEventSink(c, d, "hub-test", slog.New(slog.NewTextHandler(os.Stderr, nil)))
	sink.Hub = corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HealthPolicy", Namespace: "default", Name: "default"}
	go sink.Run(ctx)
	require.NoError(t, tb.StartHub(inproc.HubOptions{Configure: func(cfg *hub.Config) {
		cfg.Inventory = inv
		cfg.PowerFor = d.PowerFor(cfg.PowerFor)
		cfg.OwnerFor = d.OwnerFor
		cfg.Notify = sink.Notify
	}}))
	// The hub is gone (nil) once the test's cleanup stopped it, while this goroutine may still run.
	setInventory := func(inv pass.Inventory) error {
		if h := tb.Hub(); h != nil {
			return h.SetInventory(inv)
		}
		return nil
	}
	go d.Run(ctx, 200*time.Millisecond, setInventory, tb.Log())
	requests := &RequestSync{Client: c, Namespace: "default", Hub: tb.Hub(), Epoch: 1, Machines: true, Interval: 200 * time.Millisecond, Log: tb.Log()}
	go requests.Run(ctx)
	require.NoError(t, tb.Settle(ctx))
}

// inOrder says whether want occur in got in this order (not necessarily next to each other).
func inOrder(got []string, want ...string) bool {
	for _, g := range got {
		if len(want) > 0 && g == want[0] {
			want = want[1:]
		}
	}
	return len(want) == 0
}

// eventsAbout lists the reasons of Hale's Events regarding an object, oldest first.
func eventsAbout(t *testing.T, c client.Client, ns, kind, name string) []string {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, c.List(t.Context(), &list, client.InNamespace(ns)))
	var reasons []string
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.ReportingController == ReportingController {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}

// metal3: the machines are BareMetalHosts, so baremetal-operator owns their BMCs; a hung machine is
// rebooted through Hale's reboot annotation (never a direct BMC call), and a detached host is left
// alone, with the reason in status and an Event.
func TestMetal3HostRebootedThroughTheAnnotation(t *testing.T) {
	c, tb, inv := kubeInproc(t, "metal3")
	ctx := t.Context()
	for _, m := range inv.Machines {
		createHost(t, c, "metal3", m.Node, m.Endpoint.String(), "", nil)
	}
	op := &metal3sim.Operator{Client: c, Namespace: "metal3", Interval: 50 * time.Millisecond, Log: tb.Log(), Power: metal3sim.InventoryPower(inv)}
	go op.Run(ctx)
	// The inventory file still lists every machine with its BMC: the BareMetalHost wins.
	d := &Discovery{Client: c, Base: inv, MetalPoll: 50 * time.Millisecond, MetalTimeout: 20 * time.Second}
	startDiscoveredHub(t, c, tb, d)

	tb.Hang(2)
	require.NoError(t, tb.WaitFor(ctx, 60*time.Second, "cp-2 healed through its BareMetalHost", func() bool {
		n, st := tb.Remediations(2)
		return n == 1 && st == journal.Succeeded
	}))
	hist, err := tb.Hub().History(ctx, "cp-2")
	require.NoError(t, err)
	require.Len(t, hist, 1)
	var outcome string
	for _, e := range hist[0].History {
		if e.Kind == journal.EntryOutcome && outcome == "" {
			outcome = e.Detail
		}
	}
	assert.Contains(t, outcome, `annotate reboot.metal3.io/hale={}, remove reboot.metal3.io/hale`)
	host := &unstructured.Unstructured{}
	host.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "metal3", Name: "cp-2"}, host))
	assert.NotContains(t, host.GetAnnotations(), clusterapi.RebootAnnotation, "the annotation is removed: the host is on again")
	assert.NotEmpty(t, tb.Resets(2), "the operator stand-in powered it off and on")
	// In this order, with anything between (a verdict may change during the step: Suspect while
	// quorum is judged afresh).
	require.Eventually(t, func() bool {
		return inOrder(eventsAbout(t, c, "default", "Node", "cp-2"), "Unhealthy", "RemediationStarted", "StepDone", "Remediated")
	}, 10*time.Second, 100*time.Millisecond, "Events on Node cp-2: %v", eventsAbout(t, c, "default", "Node", "cp-2"))

	// A detached host: no action, and the reason is given.
	before := host.DeepCopy()
	host.SetAnnotations(map[string]string{clusterapi.HostDetachedAnnotation: ""})
	require.NoError(t, c.Patch(ctx, host, client.MergeFrom(before)))
	require.NoError(t, tb.WaitFor(ctx, 10*time.Second, "cooldown over and rediscovered", func() bool {
		for _, ms := range tb.Hub().Status(ctx).Machines {
			if ms.Name == "cp-2" {
				return ms.Verdict == assess.VerdictHealthy
			}
		}
		return false
	}))
	time.Sleep(time.Second) // the cooldown (1 s in the in-process cluster)
	resets := len(tb.Resets(2))
	tb.Hang(2)
	require.NoError(t, tb.WaitFor(ctx, 20*time.Second, "the detached host held", func() bool {
		return strings.Contains(fmt.Sprint(tb.Hub().Status(ctx).Machines), "baremetalhost.metal3.io/detached")
	}))
	require.NoError(t, tb.Passes(ctx, 20))
	n, _ := tb.Remediations(2)
	assert.Equal(t, 1, n, "no second remediation of a detached host")
	assert.Len(t, tb.Resets(2), resets)
	assert.Contains(t, eventsAbout(t, c, "default", "Node", "cp-2"), "HeldByOwner", "the hold's one reason")
}

// Cluster API: the machines have no BMC Hale may use, so a sick one is replaced by its
// KubeadmControlPlane. The hand-over (the MachineHealthCheck contract) happens only when Hale's plan
// allows KCP's delete-first steps: with two of three members down, removing one would need a quorum
// etcd no longer has, and nothing is handed over; once one is back, the dead one is. The test plays
// KCP (no Cluster API controllers run here): it deletes the marked Machine and creates its
// replacement, and Hale closes the Remediation when KCP has its replicas back.
func TestKCPMachineHandedOverOnlyWhenThePlanAllows(t *testing.T) {
	c, tb, inv := kubeInproc(t, "capi")
	ctx := t.Context()
	for _, m := range inv.Machines {
		createMachine(t, c, "capi", m.Name, m.Node, "cp", nil)
	}
	kcp := &unstructured.Unstructured{Object: map[string]any{"apiVersion": kcpAPIVersion, "kind": "KubeadmControlPlane",
		"metadata": map[string]any{"namespace": "capi", "name": "cp"},
		"spec": map[string]any{"replicas": int64(3), "version": "v1.36.3", "machineTemplate": map[string]any{"spec": map[string]any{
			"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3MachineTemplate", "name": "cp"}}}}}}
	require.NoError(t, c.Create(ctx, kcp))
	d := &Discovery{Client: c, Base: pass.Inventory{Cluster: inv.Cluster, Policy: inv.Policy, Witnesses: inv.Witnesses}}
	startDiscoveredHub(t, c, tb, d)
	handedOver := func(name string) bool {
		var m clusterv1.Machine
		if err := c.Get(ctx, client.ObjectKey{Namespace: "capi", Name: name}, &m); err != nil {
			return false
		}
		return clusterapi.HandedOver(&m)
	}

	// Both fail at once: the hub is paused while they hang (Hang takes a moment each), then resumed.
	require.NoError(t, tb.Hub().SetPaused(ctx, true, "test", ""))
	tb.Hang(1)
	tb.Hang(2)
	require.NoError(t, tb.WaitFor(ctx, 20*time.Second, "both Unhealthy", func() bool {
		return strings.Count(fmt.Sprint(tb.Hub().Status(ctx).Machines), "Unhealthy") >= 2
	}))
	require.NoError(t, tb.Hub().SetPaused(ctx, false, "test", ""))
	require.NoError(t, tb.WaitFor(ctx, 20*time.Second, "both refused", func() bool {
		return strings.Count(fmt.Sprint(tb.Hub().Status(ctx).Machines), "quorum") >= 2
	}))
	require.NoError(t, tb.Passes(ctx, 20))
	assert.False(t, handedOver("cp-1") || handedOver("cp-2"), "nothing handed over while etcd has no quorum")
	assert.Contains(t, eventsAbout(t, c, "capi", "Machine", "cp-2"), "Waiting")

	// An operator brings cp-1 back through its BMC; then only cp-2 is handed over.
	power, err := bmc.New(inv.Machines[1].Endpoint, inv.Machines[1].Credentials, bmc.Options{PollInterval: 20 * time.Millisecond, VerifyTimeout: 10 * time.Second})
	require.NoError(t, err)
	_, err = power.PowerCycle(ctx)
	require.NoError(t, err)
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "cp-2 handed over to KCP", func() bool { return handedOver("cp-2") }))
	assert.False(t, handedOver("cp-1"))
	assert.Empty(t, tb.Resets(2), "no BMC call: KCP replaces it")

	// KCP's part: delete the machine (and its node), create the replacement, report its replicas.
	require.NoError(t, c.Delete(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: "cp-2"}}))
	require.NoError(t, c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-2"}}))
	createMachine(t, c, "capi", "cp-3", "cp-3", "cp", nil)
	before := kcp.DeepCopy()
	require.NoError(t, unstructured.SetNestedField(kcp.Object, int64(3), "status", "readyReplicas"))
	require.NoError(t, c.Status().Patch(ctx, kcp, client.MergeFrom(before)))
	require.NoError(t, tb.WaitFor(ctx, 20*time.Second, "the Remediation closed", func() bool {
		hist, err := tb.Hub().History(ctx, "cp-2")
		return err == nil && len(hist) == 1 && hist[0].State == journal.Succeeded
	}))
	hist, _ := tb.Hub().History(ctx, "cp-2")
	assert.Equal(t, "remove etcd-2 → add-voter etcd-2-replacement → await-healthy etcd-2-replacement", quorum.StepList(hist[0].Steps))
	assert.Contains(t, eventsAbout(t, c, "capi", "Machine", "cp-2"), "RemediationStarted")
}

// A MachineDeployment's machine is replaced scale-up first: Hale adds a replica, waits for the new
// machine's node to be Ready, then marks the old machine with cluster.x-k8s.io/delete-machine and puts
// the count back; the MachineSet deletes the marked one. The test plays the MachineSet controller
// (none runs here). cp-2 runs no etcd member in this test (its Node says so), like a control-plane
// node of an external-etcd cluster.
func TestMachineDeploymentMachineReplacedScaleUpFirst(t *testing.T) {
	c, tb, inv := kubeInproc(t, "capi")
	ctx := t.Context()
	node := &corev1.Node{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "cp-2"}, node))
	before := node.DeepCopy()
	node.Annotations[EtcdMemberAnnotation] = ""
	require.NoError(t, c.Patch(ctx, node, client.MergeFrom(before)))

	yes := true
	template := clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{ClusterName: "prod", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr("bootstrap")},
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3MachineTemplate", Name: "md"}}}
	template.Labels = map[string]string{clusterv1.MachineDeploymentNameLabel: "md"}
	selector := metav1.LabelSelector{MatchLabels: template.Labels}
	md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: "md"},
		Spec: clusterv1.MachineDeploymentSpec{ClusterName: "prod", Replicas: ptr(int32(1)), Selector: selector, Template: template}}
	require.NoError(t, c.Create(ctx, md))
	ms := &clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: "ms", Labels: template.Labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineDeployment", Name: "md", UID: md.UID, Controller: &yes}}},
		Spec: clusterv1.MachineSetSpec{ClusterName: "prod", Replicas: ptr(int32(1)), Selector: selector, Template: template}}
	require.NoError(t, c.Create(ctx, ms))
	// newMachine is the MachineSet's work: a Machine of the deployment on node.
	newMachine := func(name, nodeName string) {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: name, Labels: template.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineSet", Name: "ms", UID: ms.UID, Controller: &yes}}},
			Spec: template.Spec}
		require.NoError(t, c.Create(ctx, m))
		before := m.DeepCopy()
		m.Status.NodeRef = clusterv1.MachineNodeReference{Name: nodeName}
		require.NoError(t, c.Status().Patch(ctx, m, client.MergeFrom(before)))
	}
	newMachine("cp-2", "cp-2")
	// cp-2 is the only machine of its pool: let the pool's maxUnhealthy allow it.
	policy := inv.Policy
	all, err := quorum.ParseLimit("100%")
	require.NoError(t, err)
	policy.Quorum.Pools.MaxUnhealthy = all
	d := &Discovery{Client: c, Base: pass.Inventory{Cluster: inv.Cluster, Policy: policy, Witnesses: inv.Witnesses}}
	startDiscoveredHub(t, c, tb, d)
	replicas := func() int32 {
		var got clusterv1.MachineDeployment
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(md), &got))
		return *got.Spec.Replicas
	}
	marked := func() bool {
		var m clusterv1.Machine
		return c.Get(ctx, client.ObjectKey{Namespace: "capi", Name: "cp-2"}, &m) == nil && m.Annotations[clusterv1.DeleteMachineAnnotation] != ""
	}

	tb.Hang(2)
	require.NoError(t, tb.WaitFor(ctx, 20*time.Second, "one more replica", func() bool { return replicas() == 2 }), "%+v", tb.Hub().Status(ctx))
	time.Sleep(time.Second)
	assert.False(t, marked(), "the old machine stays until its replacement is ready")
	assert.Equal(t, int32(2), replicas())

	// The MachineSet's new machine, and its node turning Ready.
	newMachine("cp-3", "cp-3")
	n3 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-3", Labels: map[string]string{ControlPlaneLabel: ""}, Annotations: map[string]string{EtcdMemberAnnotation: ""}}}
	require.NoError(t, c.Create(ctx, n3))
	time.Sleep(time.Second)
	assert.False(t, marked(), "a node that is not Ready does not count")
	before = n3.DeepCopy()
	n3.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	require.NoError(t, c.Status().Patch(ctx, n3, client.MergeFrom(before)))
	require.NoError(t, tb.WaitFor(ctx, 20*time.Second, "cp-2 marked for deletion, count restored", func() bool { return marked() && replicas() == 1 }))

	// The MachineSet deletes the marked machine and reports its replica ready.
	require.NoError(t, c.Delete(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: "cp-2"}}))
	require.NoError(t, c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-2"}}))
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(ms), ms))
	msBefore := ms.DeepCopy()
	ms.Status.ReadyReplicas = ptr(int32(1))
	require.NoError(t, c.Status().Patch(ctx, ms, client.MergeFrom(msBefore)))
	require.NoError(t, tb.WaitFor(ctx, 20*time.Second, "the Remediation closed", func() bool {
		hist, err := tb.Hub().History(ctx, "cp-2")
		return err == nil && len(hist) == 1 && hist[0].State == journal.Succeeded
	}))
	hist, _ := tb.Hub().History(ctx, "cp-2")
	assert.Equal(t, "add-voter cp-2-replacement → await-healthy cp-2-replacement → remove cp-2", quorum.StepList(hist[0].Steps))
	var intents []int
	for _, e := range hist[0].History {
		if e.Kind == journal.EntryIntent {
			intents = append(intents, e.Step)
		}
	}
	assert.Equal(t, []int{0, 2}, intents, "journaled before each side effect: the scale-up, then the scale-down")
	assert.Empty(t, tb.Resets(2), "no BMC call")

	// The deployment rolling out (an upgrade replacing its machines) is planned work for its machines.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(md), md))
	md.Status.Conditions = []metav1.Condition{{Type: clusterv1.RollingOutCondition, Status: metav1.ConditionTrue, Reason: clusterv1.RollingOutReason,
		Message: "Rolling out 1 not up-to-date replica", LastTransitionTime: metav1.Now()}}
	require.NoError(t, c.Status().Update(ctx, md))
	base := d.Base // (the running hub's Discovery is left as it is)
	base.Policy.PlannedWork = inventory.PlannedWorkKinds()
	inv2, err := (&Discovery{Client: c, Base: base}).Build(ctx)
	require.NoError(t, err)
	i := slices.IndexFunc(inv2.Machines, func(m pass.Machine) bool { return m.Name == "cp-3" })
	require.GreaterOrEqual(t, i, 0, "%v", inv2.Machines)
	assert.Equal(t, "MachineDeployment capi/md is rolling out (RollingOut: Rolling out 1 not up-to-date replica) (policy.plannedWork: rollout)",
		inv2.Machines[i].PlannedWork)
}

// Cluster API's cluster.x-k8s.io/remediate-machine is a manual request, carried out the machine's own
// way (here: its KubeadmControlPlane replaces it) through the same quorum plan; the annotation is
// removed once the hub has taken it, and stays while the plan refuses.
func TestRemediateMachineAnnotation(t *testing.T) {
	c, tb, inv := kubeInproc(t, "capi")
	ctx := t.Context()
	for _, m := range inv.Machines {
		createMachine(t, c, "capi", m.Name, m.Node, "cp", nil)
	}
	startDiscoveredHub(t, c, tb, &Discovery{Client: c, Base: pass.Inventory{Cluster: inv.Cluster, Policy: inv.Policy, Witnesses: inv.Witnesses}})
	machine := func(name string) *clusterv1.Machine {
		var m clusterv1.Machine
		require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "capi", Name: name}, &m))
		return &m
	}
	annotate := func(name string) {
		m := machine(name)
		before := m.DeepCopy()
		m.Annotations = map[string]string{clusterv1.RemediateMachineAnnotation: ""}
		require.NoError(t, c.Patch(ctx, m, client.MergeFrom(before)))
	}

	annotate("cp-1") // healthy: replacing it costs one healthy voter, which the policy allows
	require.NoError(t, tb.WaitFor(ctx, 20*time.Second, "cp-1 handed over to KCP", func() bool { return clusterapi.HandedOver(machine("cp-1")) }))
	require.Eventually(t, func() bool { return !clusterapi.ManualRemediationRequested(machine("cp-1")) }, 10*time.Second, 50*time.Millisecond, "the request is consumed")
	hist, err := tb.Hub().History(ctx, "cp-1")
	require.NoError(t, err)
	require.Len(t, hist, 1)
	assert.Equal(t, "replace", hist[0].Strategy)
	assert.Equal(t, "cluster.x-k8s.io/remediate-machine on Machine capi/cp-1", hist[0].RequestedBy)

	annotate("cp-0") // while cp-1's membership change is in flight, the plan refuses
	require.NoError(t, tb.Passes(ctx, 20))
	assert.True(t, clusterapi.ManualRemediationRequested(machine("cp-0")), "a refused request stays")
	assert.False(t, clusterapi.HandedOver(machine("cp-0")))
	assert.Empty(t, tb.Resets(0))
}
