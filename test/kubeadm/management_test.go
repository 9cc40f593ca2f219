package kubeadm

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/test/capi"
	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/lab"
	"github.com/hale-dev/hale/test/metal3sim"
	"github.com/hale-dev/hale/test/proc"
	"github.com/hale-dev/hale/test/silent"
)

// managementCell moves the cluster, running Hale as installed (self-hosted, standalone-bmc), under a
// Cluster API management cluster's hub as install.md says for a workload cluster that already runs
// Hale: its install becomes the fallback and the management cluster's cell heals it. The management
// cluster is a real API server on the lab's network, at a host of its own, with Cluster API's real
// core manager on that host (test/capi: its CRDs, webhooks and controllers) reaching the workload
// cluster through the kubeconfig Secret (kubeadm's admin.conf, as Cluster API keeps it). It holds the
// Cluster, the control-plane Machines (their nodes found by Cluster API's Machine controller, by
// providerID), a MachineHealthCheck of them as coexistence.md has it beside Hale, and the
// BareMetalHosts of the Redfish BMCs. metal3's controllers are stood in for: the Metal3Cluster and
// Metal3Machines (ready; the machines' spec.providerID, and the providerID set on each Node, as
// Cluster API Provider Metal3 sets them) and the operator (test/metal3sim, through a forwarder to
// the BMCs from that host). The hub runs on that host as deploy/management runs it, as its
// ServiceAccount. The cell takes the claim from the fallback, sees every machine Healthy, and
// power-cycles a hung control-plane node through its BareMetalHost, after the stall tolerance: one
// power-cycle, the control plane healthy, and Cluster API's MachineHealthCheck leaves it to Hale.
// Then the management API server (and with it Cluster API's controllers) stops answering: the
// fallback takes the claim and heals another hung node through its own inventory's BMC; the API
// server answers again and the cell takes the claim back, acting on nothing twice. The management
// hub stops at the end: the fallback takes the claim back once it lapses.
func managementCell(ctx context.Context, t *testing.T, c *lab.KubeCluster) {
	t.Helper()
	start := time.Now()
	host := c.Lab.Host("mgmt")
	mc, mcfg := kubeenv.StartForCAPI(t)
	dir := t.TempDir()
	// The lab reaches it through a proxy that can freeze (the server hangs, or a partition drops
	// everything between it and the hub).
	u, err := url.Parse(mcfg.Host)
	require.NoError(t, err)
	reach := silent.Forward(t, u.Host)
	proxied := rest.CopyConfig(mcfg)
	proxied.Host = "https://" + reach.Addr()
	admin := lab.Expose(t, host, proxied, dir, "")
	// Cluster API's core manager on that host, through the same proxy: when the management cluster is
	// gone, so are its controllers.
	capi.StartWith(t, mc, admin, time.Minute, capi.Options{Providers: []string{"core"}, Start: host.Start,
		Reach: func(addr string) string { return lab.Reach(t, host, addr) }})
	// The hub's own, as the ServiceAccount deploy/management makes (its permissions, nothing more).
	asHub := lab.Kubeconfig(t, host, proxied, dir, "system:serviceaccount:hale-system:hale-hub",
		"system:serviceaccounts", "system:serviceaccounts:hale-system", "system:authenticated")
	repo, err := kubeenv.DeployRepo(t.TempDir(), "v0.1.0")
	require.NoError(t, err)
	sh := func(dir, line string) string {
		t.Helper()
		out, err := c.ShellOn(ctx, host, admin, dir, "set -euo pipefail\n"+line)
		require.NoError(t, err, "%s\n%s", line, out)
		return out
	}
	blocks, err := kubeenv.DocShellBlocks("install.md", "## In a management cluster")
	require.NoError(t, err)
	require.Len(t, blocks, 5, "install.md's management install: the management cluster's commands, a workload Cluster's, its fallback's, an existing install's two")
	// The management cluster's install (its hub's Deployment never runs here: no kubelet; the hub runs
	// on the host below as it would).
	sh(repo, blocks[0])

	// What Cluster API and metal3 keep in the management cluster for this workload cluster.
	const ns, name = "fleet", "w1"
	require.NoError(t, mc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	// metal3's infrastructure objects, as Cluster API Provider Metal3 keeps them: ready.
	infra := func(kind, obj string, spec map[string]any) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1", Kind: kind})
		u.SetNamespace(ns)
		u.SetName(obj)
		require.NoError(t, mc.Create(ctx, u))
		require.NoError(t, unstructured.SetNestedField(u.Object, true, "status", "ready"))
		require.NoError(t, mc.Status().Update(ctx, u))
	}
	infra("Metal3Cluster", name, map[string]any{})
	require.NoError(t, mc.Create(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: clusterv1.ClusterSpec{Paused: new(false),
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Cluster", Name: name}}}))
	kubeconfig, err := os.ReadFile(c.Kubeconfig)
	require.NoError(t, err)
	require.NoError(t, mc.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-kubeconfig",
		Labels: map[string]string{clusterv1.ClusterNameLabel: name}}, Data: map[string][]byte{"value": kubeconfig}}))
	yes := true
	redfish := map[string]string{} // the Redfish BMCs' endpoints, by node, as this process reaches them
	simulator := lab.Reach(t, host, c.OOB.Addr(8000))
	for _, n := range c.ControlPlanes() {
		// Its Metal3Machine, and the Node's providerID, as Cluster API Provider Metal3 sets them; Cluster
		// API's Machine controller finds the Node by it.
		providerID := "metal3://" + ns + "/" + n.Name + "/" + name + "-" + n.Name
		infra("Metal3Machine", name+"-"+n.Name, map[string]any{"providerID": providerID})
		out, err := c.Kubectl(ctx, "patch", "node", n.Name, "-p", `{"spec":{"providerID":"`+providerID+`"}}`)
		require.NoError(t, err, out)
		machine := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-" + n.Name,
			Labels: map[string]string{clusterv1.ClusterNameLabel: name, clusterv1.MachineControlPlaneLabel: ""},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "controlplane.cluster.x-k8s.io/v1beta2", Kind: "KubeadmControlPlane", Name: name + "-cp",
				UID: "0e3c6b4a-0000-4000-8000-000000000002", Controller: &yes}}},
			Spec: clusterv1.MachineSpec{ClusterName: name, Bootstrap: clusterv1.Bootstrap{DataSecretName: new("bootstrap")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine", Name: name + "-" + n.Name}}}
		require.NoError(t, mc.Create(ctx, machine))
		// cp-2's BMC is IPMI (UDP), which the stand-in, outside the lab's network, cannot reach through a
		// TCP forwarder: it has no host here (the cell then has no BMC for it; it is not the one hung).
		if c.IPMI[n.Name] != nil {
			continue
		}
		_, path, _ := strings.Cut(strings.TrimPrefix(n.BMC, "redfish+http://"), "/")
		redfish[n.Name] = "redfish+http://" + simulator + "/" + path
		bmh := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"online": true,
			"bmc":         map[string]any{"address": n.BMC, "credentialsName": n.Name + "-bmc"},
			"consumerRef": map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine", "name": machine.Name, "namespace": ns}}}}
		bmh.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
		bmh.SetNamespace(ns)
		bmh.SetName(n.Name)
		require.NoError(t, mc.Create(ctx, bmh))
	}
	// coexistence.md's MachineHealthCheck of the control plane beside Hale: it remediates itself (its
	// owner's way), on timeouts well above Hale's heal through a BareMetalHost.
	require.NoError(t, mc.Create(ctx, &clusterv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-cp"},
		Spec: clusterv1.MachineHealthCheckSpec{ClusterName: name,
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}},
			Checks: clusterv1.MachineHealthCheckChecks{UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: new(int32(300))},
				{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: new(int32(300))}}}}}))
	// Cluster API's Machine controller finds each Machine's Node in the workload cluster, and its
	// MachineHealthCheck controller watches them there: all healthy to it, none handed to its owner.
	capiHealthy := func() bool {
		var ms clusterv1.MachineList
		var mhc clusterv1.MachineHealthCheck
		if mc.List(ctx, &ms, client.InNamespace(ns)) != nil || len(ms.Items) != len(c.ControlPlanes()) ||
			mc.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-cp"}, &mhc) != nil {
			return false
		}
		for _, m := range ms.Items {
			if m.Status.NodeRef.Name != strings.TrimPrefix(m.Name, name+"-") ||
				meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineOwnerRemediatedCondition) != nil {
				return false
			}
		}
		return mhc.Status.CurrentHealthy != nil && int(*mhc.Status.CurrentHealthy) == len(ms.Items)
	}
	require.Eventually(t, capiHealthy, 3*time.Minute, time.Second, "Cluster API's controllers: every Machine's Node found by its providerID, every Machine healthy to the MachineHealthCheck")
	t.Logf("management: Cluster API's controllers found every Machine's Node and see them healthy %s after the management cluster started", time.Since(start).Round(time.Second))
	creds, err := bmc.LoadCredentials(c.BMCCreds)
	require.NoError(t, err)
	op := &metal3sim.Operator{Client: mc, Namespace: ns, Interval: 200 * time.Millisecond, Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
		Power: func(h string) (*bmc.Controller, error) {
			ep, err := bmc.ParseEndpoint(redfish[h])
			if err != nil {
				return nil, fmt.Errorf("host %s: %w", h, err)
			}
			return bmc.New(ep, creds, bmc.Options{PollInterval: 100 * time.Millisecond, VerifyTimeout: 20 * time.Second, GracefulTimeout: time.Second})
		}}
	go op.Run(ctx)

	// The hub, on its host, as deploy/management's Deployment runs it: its arguments, its pod's address,
	// and what install.md has the operator add (the address the agents reach it at).
	bin := filepath.Join(t.TempDir(), "hub")
	require.NoError(t, proc.Build(map[string]string{bin: "./cmd/hub"}))
	args := managementArgs(t, repo)
	socket := filepath.Join(dir, "hub.sock")
	for i, a := range args {
		if strings.HasPrefix(a, "--socket=") {
			args[i] = "--socket=" + socket
		}
	}
	args = append(args, "--kubeconfig="+asHub, "--gossip-advertise="+host.Addr(7947))
	hub := host.Start("management-hub", append([]string{"env", "POD_IP=" + host.IP, "NODE_NAME=mgmt", bin}, args...)...)
	defer hub.Stop(10 * time.Second) // the fallback takes the claim back once it lapses

	// install.md's commands for a workload cluster that already runs Hale, in its order, in the
	// operator's own overlay's directory.
	set := func(block string, lines map[string]string) string {
		var out []string
		for l := range strings.SplitSeq(block, "\n") {
			for prefix, v := range lines {
				if strings.HasPrefix(l, prefix) {
					l = v
				}
			}
			out = append(out, l)
		}
		return strings.Join(out, "\n")
	}
	vars := "ns=" + ns + " cluster=" + name + " overlay=" + c.Overlay
	sh(dir, set(blocks[3], map[string]string{"ns=": vars}))
	component := "- https://github.com/hale-dev/hale//deploy/components/fallback?ref=v0.1.0"
	c.Documented("install.md", "Add `"+component+"` to your overlay's\n`components:`")
	own, err := os.ReadFile(filepath.Join(c.Overlay, "kustomization.yaml"))
	require.NoError(t, err)
	withFallback := strings.Replace(string(own), "components:\n", "components:\n  "+strings.Replace(component, "https://github.com/hale-dev/hale", "file://"+repo, 1)+"\n", 1)
	require.NotEqual(t, string(own), withFallback, "the overlay has no components: list")
	require.NoError(t, os.WriteFile(filepath.Join(c.Overlay, "kustomization.yaml"), []byte(withFallback), 0o644))

	sh(dir, vars+"\n"+blocks[4]) // (the same shell as the first block's, as the operator types them)
	applied := time.Now()

	// The cell takes the claim (the fallback hands it over) and sees every machine Healthy.
	claim := func() string {
		out, _ := c.Kubectl(ctx, "-n", "hale-system", "get", "lease", "hale-hub", "-o", "jsonpath={.spec.holderIdentity}")
		return out
	}
	cellStatus := func(context.Context) (operator.Status, error) {
		return parseStatus(host.Run(bin, "status", "--socket", socket, "--cluster", ns+"/"+name, "-o", "json"))
	}
	st := waitFor(ctx, t, c, "the management cluster's cell: every machine Healthy", cellStatus, func(st operator.Status) bool {
		return strings.HasSuffix(claim(), "@"+ns+"/"+name) && settled(st)
	})
	fallback, err := c.Kubectl(ctx, "-n", "hale-system", "exec", "deploy/hale-hub", "--", "hub", "status")
	require.Contains(t, fallback, "stands by: the management cluster's hub", "the workload cluster's own hub, now the fallback: %v", err)
	t.Logf("management: the cell holds the claim and sees every machine Healthy %s after the label (%d observers heard), %s after the management cluster started",
		time.Since(applied).Round(time.Second), len(st.Observers.Heard), time.Since(start).Round(time.Second))

	// A Redfish node hangs: the cell power-cycles it through its BareMetalHost once its stall tolerance
	// has passed, and nothing else.
	n := c.Node("cp-1")
	before := len(c.PowerEvents())
	hung := time.Now()
	n.Freeze()
	waitFor(ctx, t, c, "every machine Healthy after "+n.Name+"'s power-cycle by the cell", cellStatus, func(st operator.Status) bool {
		return settled(st) && len(powerChanges(c, before)) >= 2
	})
	c.WaitReady(ctx)
	powered := powerChanges(c, before)
	require.Len(t, powered, 2, "one power-cycle of the hung node, nothing else: %v", powered)
	for i, kind := range []string{"power-off ", "power-on "} {
		require.True(t, strings.HasPrefix(powered[i], kind+n.Name+" Redfish"), "one power-cycle of the hung node by its BMC: %v", powered)
	}
	require.Eventually(t, capiHealthy, time.Minute, time.Second, "Cluster API's MachineHealthCheck: every Machine healthy again, none handed to its owner (Hale healed it first)")
	var list v1alpha1.RemediationList
	require.NoError(t, mc.List(ctx, &list, client.InNamespace(ns)))
	require.Len(t, list.Items, 1, "the cell's journal in the Cluster's namespace")
	require.Equal(t, name+"-"+n.Name, list.Items[0].Spec.Machine)
	require.Equal(t, v1alpha1.PhaseSucceeded, list.Items[0].Status.Phase)
	t.Logf("management: %s hung, power-cycled through its BareMetalHost by the management cluster's cell %s after, the control plane healthy %s after",
		n.Name, c.PowerEventAt(before).Sub(hung).Round(100*time.Millisecond), time.Since(hung).Round(time.Second))

	// The management API server stops answering the hub: the hub's term ends with its Lease, its cell
	// stops renewing the claim, and the fallback takes it once nobody has for its duration, then heals
	// a hung node through its own inventory's BMC.
	reach.Freeze()
	gone := time.Now()
	waitStatus(ctx, t, c, "the fallback holding the claim", func(operator.Status) bool {
		h := claim()
		return h != "" && !strings.Contains(h, "@")
	})
	t.Logf("management: the management API server stopped answering the hub, the fallback took the claim %s after", time.Since(gone).Round(time.Second))
	// cp-2: its BMC (IPMI) is one the cell could not reach.
	n = c.Node("cp-2")
	before = len(c.PowerEvents())
	hung = time.Now()
	n.Freeze()
	var waited []string // what the fallback said of it while it held it (the first and the last)
	waitStatus(ctx, t, c, "every machine Healthy after "+n.Name+"'s power-cycle by the fallback", func(st operator.Status) bool {
		if m, ok := machineIn(st, n.Name); ok && m.Decision != "" && len(powerChanges(c, before)) == 0 {
			waited = append(waited[:min(len(waited), 1)], m.Decision)
		}
		return settled(st) && len(powerChanges(c, before)) >= 2
	})
	c.WaitReady(ctx)
	powered = powerChanges(c, before)
	require.Len(t, powered, 2, "one power-cycle of the hung node, nothing else: %v", powered)
	for i, kind := range []string{"power-off ", "power-on "} {
		require.True(t, strings.HasPrefix(powered[i], kind+n.Name+" "+bmcOf(c, n)), "one power-cycle of the hung node by its BMC: %v", powered)
	}
	t.Logf("management: %s hung while the management cluster was gone, power-cycled by the fallback %s after, the control plane healthy %s after (meanwhile the fallback said: %q)",
		n.Name, c.PowerEventAt(before).Sub(hung).Round(100*time.Millisecond), time.Since(hung).Round(time.Second), waited)

	// It answers again: the hub leads again, its cell wants the claim and the fallback hands it over;
	// the cell finds the fallback's remediation done in the workload cluster's journal and acts on
	// nothing.
	reach.Thaw()
	back := time.Now()
	waitFor(ctx, t, c, "the cell holding the claim again, every machine Healthy", cellStatus, func(st operator.Status) bool {
		return strings.HasSuffix(claim(), "@"+ns+"/"+name) && settled(st)
	})
	require.Len(t, powerChanges(c, before), 2, "nothing acted on twice")
	require.Eventually(t, capiHealthy, time.Minute, time.Second, "Cluster API's MachineHealthCheck, back with the management cluster: every Machine healthy, none handed to its owner")
	t.Logf("management: the management API server answering again, the cell holds the claim and sees every machine Healthy %s after", time.Since(back).Round(time.Second))
}

// settled: the three machines Healthy, with healthy members and nothing in flight, the hub hearing
// at least the three agents and itself (who else it hears depends on the hub: witnesses, the other
// hub's replicas).
func settled(st operator.Status) bool {
	return healthyHearing(st, len(st.Observers.Heard)) && len(st.Observers.Heard) >= 4
}

// managementArgs are the arguments deploy/management's Deployment runs the hub with (rendered from
// the release's copy at repo).
func managementArgs(t *testing.T, repo string) []string {
	t.Helper()
	out, err := kubeenv.Kubectl("kustomize", filepath.Join(repo, "deploy", "management"))
	require.NoError(t, err, out)
	for doc := range strings.SplitSeq(out, "\n---\n") {
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err == nil && d.Kind == "Deployment" && d.Name == "hale-hub" {
			require.Equal(t, []string{"/usr/local/bin/hub"}, d.Spec.Template.Spec.Containers[0].Command)
			return d.Spec.Template.Spec.Containers[0].Args
		}
	}
	t.Fatalf("deploy/management makes no Deployment hale-hub:\n%s", out)
	return nil
}
