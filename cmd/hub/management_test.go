package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/kube/cells"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/kubeassets"
	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/metal3sim"
	"github.com/hale-dev/hale/test/silent"
)

// `hub run --kubernetes --management` in a management cluster (a real API server with Cluster API's
// and metal3's CRDs) heals the control plane of a workload cluster (another real API server, its
// Nodes; the in-process cluster's real etcd members and agents behind them): the Cluster opts in with
// its label, the hub reaches the workload through the kubeconfig Secret Cluster API keeps, serves the
// Cluster's gossip pool on its one gossip port (the agents' name for it in an annotation, their key in
// a Secret), finds the machines across both clusters, follows the HealthPolicy named after the
// Cluster, and power-cycles a hung machine through its BareMetalHost (metal3's operator stood in for
// on the management cluster), journaled in the Cluster's namespace with its label; its metrics carry
// the Cluster's name. Another Cluster's Machines naming the same Nodes, and its hosts, are untouched.
func TestManagementModeHealsAWorkloadCluster(t *testing.T) {
	mc, mcfg := kubeenv.Start(t)
	wc, wcfg := kubeenv.StartBare(t)
	ctx := t.Context()
	dir := t.TempDir()
	tb, inv := startBed(t, dir)
	bed := createBedNodes(t, wc, tb)
	seed, err := net.ResolveTCPAddr("tcp", tb.Seeds()[0])
	require.NoError(t, err)
	for _, m := range bed.Machines { // the agents at their Nodes' address (one port: the first agent's, the rest found through it)
		var n corev1.Node
		require.NoError(t, wc.Get(ctx, client.ObjectKey{Name: m.Node}, &n))
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
		require.NoError(t, wc.Status().Update(ctx, &n))
	}

	// docs/install.md's commands, in its order: the management cluster's install, then a workload
	// Cluster's (w1, its agents' pool named as the in-process cluster's, with their key).
	const ns = "fleet"
	require.NoError(t, mc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	blocks, err := kubeenv.DocShellBlocks("install.md", "## In a management cluster")
	require.NoError(t, err)
	// (the last two make an existing self-hosted install the fallback: test/kubeadm types them)
	require.Len(t, blocks, 5, "docs/install.md's management install: the management cluster's commands, each workload Cluster's, its fallback's, an existing install's two")
	typeBlock(t, blocks[0], kubeenv.Kubeconfig(t, mcfg, dir, ""), nil)
	kubeconfig, err := os.ReadFile(kubeenv.Kubeconfig(t, wcfg, dir, ""))
	require.NoError(t, err)
	key, err := os.ReadFile(tb.GossipKeyFile())
	require.NoError(t, err)
	require.NoError(t, mc.Create(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w1"}, Spec: clusterv1.ClusterSpec{Paused: new(false)}}))
	require.NoError(t, mc.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w1-kubeconfig"}, Data: map[string][]byte{"value": kubeconfig}}))
	typeBlock(t, blocks[1], kubeenv.Kubeconfig(t, mcfg, dir, ""), map[string]string{"ns=": "ns=fleet cluster=w1 pool=demo", "key=": "key=$(cat " + tb.GossipKeyFile() + ")"})
	// Its fallback hub's install (run in this process below, as the manifests run it): its inventory is
	// the in-process cluster's BMCs.
	typeBlock(t, blocks[2], kubeenv.Kubeconfig(t, mcfg, dir, ""), map[string]string{"ns=": "ns=fleet cluster=w1 pool=demo",
		`cp deploy/components/bmc/inventory.yaml`:                                                              `cp ` + inv + ` "$cluster-fallback/inventory.yaml"`,
		`kubectl --kubeconfig "$cluster.kubeconfig" -n hale-system create secret generic hale-bmc-credentials`: `kubectl --kubeconfig "$cluster.kubeconfig" -n hale-system create secret generic hale-bmc-credentials --from-file=credentials=` + tb.CredentialsFile()})
	var cm corev1.ConfigMap
	require.NoError(t, wc.Get(ctx, client.ObjectKey{Namespace: "hale-system", Name: "hale-pool"}, &cm))
	assert.Equal(t, "demo", cm.Data["cluster"], "the agents' pool name, for deploy/workload's DaemonSet")
	// The agents enrol their keys in the workload cluster, as those deploy/workload runs there do (its
	// account and permissions): the cell pins them there (and its own), and verifies their reports by
	// what is pinned there.
	var csrs []string
	for _, m := range bed.Machines {
		csrs = append(csrs, kubeenv.EnrolAgent(t, wc, wcfg, "hale-system", m.Node, tb.Identity(m.Node)))
	}
	// optIn labels Cluster name for Hale, its agents' pool named pool, with the Secrets Cluster API and
	// the operator make: its kubeconfig (of the workload cluster at kubeconfig) and its gossip key (the
	// agents').
	optIn := func(name, pool string, kubeconfig []byte) {
		require.NoError(t, mc.Create(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{cells.OptInLabel: "true"}, Annotations: map[string]string{cells.GossipNameAnnotation: pool}},
			Spec: clusterv1.ClusterSpec{Paused: new(false)}}))
		for suffix, data := range map[string]map[string][]byte{"-kubeconfig": {"value": kubeconfig}, "-hale-gossip": {"key": key}} {
			require.NoError(t, mc.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + suffix}, Data: data}))
		}
	}
	// w3's workload API server hangs (it accepts and never answers): its cell waits on it, w1's does not.
	hung := silent.Listen(t)
	hungCfg := rest.CopyConfig(wcfg)
	hungCfg.Host = "https://" + hung.Addr()
	hungKubeconfig, err := os.ReadFile(kubeenv.Kubeconfig(t, hungCfg, t.TempDir(), ""))
	require.NoError(t, err)
	optIn("w3", "w3-agents", hungKubeconfig)
	short := &metav1.Duration{Duration: 5 * time.Second}
	require.NoError(t, mc.Create(ctx, &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w1"},
		Spec: v1alpha1.HealthPolicySpec{Cooldown: &metav1.Duration{Duration: time.Second},
			StallTolerance: &v1alpha1.QuorumWaits{QuorumHeld: short, QuorumNeeded: short}, ComponentGrace: &v1alpha1.QuorumWaits{QuorumHeld: short, QuorumNeeded: short}}}))
	// Both Clusters' Machines name the same Nodes (w2's pool clashes with w1's below, so its cell never
	// runs: what w1's cell does to w2's objects is all there is to see); w2's hosts are detached (the
	// stand-in leaves them alone), w1's named after the Nodes (the stand-in finds a host's BMC so).
	yes := true
	for _, m := range bed.Machines {
		for _, cluster := range []string{"w1", "w2"} {
			name := cluster + "-" + m.Node
			machine := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "controlplane.cluster.x-k8s.io/v1beta2", Kind: "KubeadmControlPlane", Name: cluster + "-cp",
					UID: "0e3c6b4a-0000-4000-8000-000000000001", Controller: &yes}}},
				Spec: clusterv1.MachineSpec{ClusterName: cluster, Bootstrap: clusterv1.Bootstrap{DataSecretName: new("bootstrap")},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine", Name: name}}}
			require.NoError(t, mc.Create(ctx, machine))
			machine.Status.NodeRef = clusterv1.MachineNodeReference{Name: m.Node}
			require.NoError(t, mc.Status().Update(ctx, machine))
			host := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"online": true,
				"bmc":         map[string]any{"address": m.Endpoint.String(), "credentialsName": m.Node + "-bmc"},
				"consumerRef": map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine", "name": name, "namespace": ns}}}}
			host.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
			host.SetNamespace(ns)
			host.SetName(m.Node)
			if cluster == "w2" {
				host.SetName("w2-host-" + m.Node)
				host.SetAnnotations(map[string]string{clusterapi.HostDetachedAnnotation: ""})
			}
			require.NoError(t, mc.Create(ctx, host))
		}
	}
	op := &metal3sim.Operator{Client: mc, Namespace: ns, Interval: 50 * time.Millisecond, Log: tb.Log(), Power: metal3sim.InventoryPower(bed)}
	go op.Run(ctx)

	// The hub's requests to the management API server, counted.
	// polls: lists (not watches) of what each cell polls for requests and rediscovers; policyReads:
	// reads of one HealthPolicy or Cluster (each cell's policy sync, every second).
	var reads, lease, polls, policyReads atomic.Int64
	policyRead := regexp.MustCompile(`/(healthpolicies|clusters)/[^/]+$`)
	pollsOf := []string{"remediations", "haleremediations", "machines", "machinehealthchecks", "baremetalhosts"}
	var writesMu sync.Mutex
	var writes []string // each write's method and path
	// The hub reaches the management API server through a proxy that can freeze (the server hangs, or
	// a partition drops everything between them).
	counted := rest.CopyConfig(mcfg)
	u, err := url.Parse(mcfg.Host)
	require.NoError(t, err)
	reach := silent.Forward(t, u.Host)
	counted.Host = "https://" + reach.Addr()
	// As the ServiceAccount deploy/management makes, with its permissions (nothing forbidden, below).
	counted.Impersonate = rest.ImpersonationConfig{UserName: hubSA, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:hale-system", "system:authenticated"}}
	counted.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			switch {
			case strings.Contains(r.URL.Path, "/leases/"):
				lease.Add(1)
			case r.Method == http.MethodGet:
				reads.Add(1)
				if k := path.Base(r.URL.Path); slices.Contains(pollsOf, k) && r.URL.Query().Get("watch") != "true" {
					polls.Add(1)
				}
				if policyRead.MatchString(r.URL.Path) {
					policyReads.Add(1)
				}
			default:
				writesMu.Lock()
				writes = append(writes, r.Method+" "+r.URL.Path)
				writesMu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	})
	t.Setenv("POD_IP", "10.244.0.7") // the pod's address, as the downward API gives it (the Service's endpoint: never loopback)
	socket := filepath.Join(dir, "hub.sock")
	// A lease of 4 s: each request of it may take 750 ms (with 2 s, 375 ms; a loaded full run's API
	// server took longer, and the hub lost its term in the middle of the test).
	addrs, logs := runInBackground(t, "hub", runOptions{node: "hub-m", bind: "127.0.0.1:0", api: apiListen{socket: socket}, identityFile: tb.HubIdentityFile(),
		metrics: "127.0.0.1:0", logLevel: "info", keep: 20, bmcCheckEvery: time.Minute, bmcRequestTimeout: 5 * time.Second, bmcVerifyTimeout: 20 * time.Second,
		kube: &kubeOptions{config: counted, namespace: "hale-system", lease: "hale-hub", leaseDuration: 4 * time.Second, discoverEvery: time.Second,
			agentPort: seed.Port, management: true, gossipService: "hale-hub-gossip", agents: []string{"hale-agent"}, hubs: []string{"hale-hub"}}})
	policy := func() v1alpha1.HealthPolicy {
		var p v1alpha1.HealthPolicy
		require.NoError(t, mc.Get(ctx, client.ObjectKey{Namespace: ns, Name: "w1"}, &p))
		return p
	}
	require.Eventually(t, func() bool {
		p := policy()
		healthy := 0
		for _, m := range p.Status.Machines {
			if m.Verdict == "Healthy" {
				healthy++
			}
		}
		return healthy == 3
	}, 60*time.Second, 100*time.Millisecond, "the cell's verdicts in the Cluster's HealthPolicy")
	for _, name := range csrs {
		var csr certificatesv1.CertificateSigningRequest
		require.NoError(t, wc.Get(ctx, client.ObjectKey{Name: name}, &csr))
		require.Len(t, csr.Status.Conditions, 1, name)
		assert.Equal(t, certificatesv1.CertificateApproved, csr.Status.Conditions[0].Type, name)
	}
	var pinnedCM corev1.ConfigMap
	require.NoError(t, wc.Get(ctx, client.ObjectKey{Namespace: "hale-system", Name: identity.PinnedConfigMap}, &pinnedCM))
	hubKey, _, err := identity.LoadOrCreateIdentity(tb.HubIdentityFile())
	require.NoError(t, err)
	assert.Contains(t, pinnedCM.Data[identity.PinnedKeysKey], "\nhub-m "+hubKey.Public().String()+"\n", "the cell's own key, pinned in its workload cluster")
	for _, m := range bed.Machines {
		assert.Contains(t, pinnedCM.Data[identity.PinnedKeysKey], "\n"+m.Node+" "+tb.Identity(m.Node).Public().String(), "pinned in the workload cluster")
	}
	// Steady (w1's cell heals nothing, w3's waits on its workload API server), the management cluster
	// is written only on change: a verdict's Event, the HealthPolicy's status when the hub's view
	// changed (on a loaded machine a machine's reasons may), the raft mark when it rose (at most every
	// 10 s); never a Remediation, a Machine, a host or the gossip Service's endpoint.
	writtenSince := func(from int) []string {
		writesMu.Lock()
		defer writesMu.Unlock()
		return slices.Clone(writes[from:])
	}
	time.Sleep(time.Second)
	r0, w0, l0, p0, pr0, t0 := reads.Load(), len(writtenSince(0)), lease.Load(), polls.Load(), policyReads.Load(), time.Now()
	time.Sleep(3 * time.Second)
	elapsed := time.Since(t0).Seconds()
	steady := writtenSince(w0)
	t.Logf("the management API server, steady, two cells (rediscovering every second): %.1f reads/s, %.1f writes/s (and the Lease: %.1f requests/s); written: %v",
		float64(reads.Load()-r0)/elapsed, float64(len(steady))/elapsed, float64(lease.Load()-l0)/elapsed, steady)
	// Each cell polls its Remediations, Machines and HaleRemediations every second and rediscovers its
	// Machines, MachineHealthChecks and BareMetalHosts (here every second), from the one shared cache
	// (lists.Shared, its watches allowed by deploy/management's RBAC): none is listed from the API
	// server.
	assert.Zero(t, polls.Load()-p0, "lists of %v in a steady state (the cells read the shared cache)", pollsOf)
	// Their policy syncs read their HealthPolicies and Clusters there too (12 reads in these 3 s when
	// read live): from the API server only just after a cell's own write that the cache has not seen
	// yet (a status that changed).
	assert.LessOrEqual(t, policyReads.Load()-pr0, int64(2), "reads of a HealthPolicy or a Cluster in a steady state")
	for _, w := range steady {
		assert.Regexp(t, `^(PATCH /apis/hale.dev/v1alpha1/namespaces/fleet/healthpolicies/w1(/status)?|POST /apis/events.k8s.io/v1/namespaces/fleet/events)$`, w,
			"a write to the management cluster in a steady state")
	}
	hubCmd := func(args ...string) (string, int) { return hubAt(socket, args...) }
	// The cell's own status, as its verdicts stand: Healthy once its etcd answers in time (a full run,
	// the rigs starving the in-process cluster, once showed every member Suspect for 3 s just then).
	var out string
	var code int
	require.Eventually(t, func() bool {
		out, code = hubCmd("status", "--cluster", "fleet/w1")
		return code == 0 && regexp.MustCompile(`(?m)^w1-cp-0\s+Healthy`).MatchString(out)
	}, 30*time.Second, 500*time.Millisecond, "hub status --cluster fleet/w1: w1-cp-0 Healthy")
	assert.Regexp(t, `(?m)^cluster demo `, out)
	out, code = hubCmd("status")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, out, "this hub heals the control planes of several clusters (management mode): name one with --cluster NAMESPACE/NAME; "+
		"the Clusters labelled hale.dev/heal=true are fleet/w1 (running), fleet/w3 (")
	out, code = hubCmd("status", "--cluster", "w1")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, out, `--cluster "w1": want NAMESPACE/NAME (a Cluster API Cluster)`)
	out, _ = hubCmd("status", "--cluster", "fleet/nope")
	assert.Contains(t, out, "no cell of Cluster API Cluster fleet/nope runs here: the Clusters labelled hale.dev/heal=true are fleet/w1 (running), fleet/w3 (")

	// A second Cluster whose agents' pool has the same name cannot be served beside it: its cell says
	// why (and is tried again), the first heals on.
	optIn("w2", "demo", kubeconfig)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), `its gossip pool \"demo\" is older Cluster API Cluster fleet/w1's: each cluster's pool needs a name of its own (annotation hale.dev/gossip-cluster)`)
	}, 20*time.Second, 100*time.Millisecond)
	out, _ = hubCmd("status")
	assert.Regexp(t, `fleet/w2 \(not running: its gossip pool "demo" is older Cluster API Cluster fleet/w1's`, out)

	victim := "w1-" + tb.Name(2)
	tb.Hang(2)
	remediation := func() *v1alpha1.Remediation { return onlyRemediation(t, mc, ns) }
	require.Eventually(t, func() bool {
		r := remediation()
		return r != nil && r.Status.Phase == v1alpha1.PhaseSucceeded
	}, 60*time.Second, 100*time.Millisecond, "%s healed through its BareMetalHost", victim)
	r := remediation()
	assert.Equal(t, victim, r.Spec.Machine)
	assert.Equal(t, "w1", r.Labels[clusterv1.ClusterNameLabel])
	assert.NotEmpty(t, tb.Resets(2), "the operator stand-in powered its BMC off and on")
	for _, m := range bed.Machines {
		host := &unstructured.Unstructured{}
		host.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
		require.NoError(t, mc.Get(ctx, client.ObjectKey{Namespace: ns, Name: "w2-host-" + m.Node}, host))
		assert.Equal(t, map[string]string{clusterapi.HostDetachedAnnotation: ""}, host.GetAnnotations(), "w2's hosts: untouched")
		var machine clusterv1.Machine
		require.NoError(t, mc.Get(ctx, client.ObjectKey{Namespace: ns, Name: "w2-" + m.Node}, &machine))
		assert.Empty(t, machine.Annotations, "w2's Machines: untouched")
		assert.Empty(t, machine.Status.Conditions, "w2's Machines: untouched")
	}

	require.Eventually(t, func() bool {
		out, _ = hubCmd("status")
		return regexp.MustCompile(`fleet/w3 \((not running: |running; )its cell ended at [0-9:]+Z: listing control-plane nodes in the workload cluster of Cluster API Cluster fleet/w3: `).MatchString(out)
	}, 30*time.Second, 200*time.Millisecond, "the cell whose workload API server hangs waits on it (10 s a request), then says why it stopped, and is tried again: %s", out)

	// Counted as the remediation ends, a moment after its journal says so.
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addrs.Metrics + "/metrics")
		require.NoError(t, err)
		page, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		return regexp.MustCompile(`hale_hub_remediations_total\{cluster="fleet/w1",[^}]*result="succeeded"[^}]*\} 1`).Match(page)
	}, 5*time.Second, 50*time.Millisecond, "the cell's metrics, labelled with its Cluster")

	// The leader is the gossip Service's one endpoint; nothing it did was forbidden.
	var slice discoveryv1.EndpointSlice
	require.NoError(t, mc.Get(ctx, client.ObjectKey{Namespace: "hale-system", Name: "hale-hub-gossip"}, &slice))
	require.Len(t, slice.Endpoints, 1)
	assert.Equal(t, []string{"10.244.0.7"}, slice.Endpoints[0].Addresses)
	assert.Equal(t, "hale-hub-gossip", slice.Labels[discoveryv1.LabelServiceName])
	assert.NotContains(t, strings.ToLower(logs.String()), "forbidden", "the hub's account lacks a permission it uses")

	// The cell holds its workload cluster's claim (the Lease hale-system/hale-hub there), and copied its
	// remediation into that cluster's journal, named by its Node: a fallback taking the claim finds it.
	claimHolder := func() string {
		var l coordinationv1.Lease
		if err := wc.Get(ctx, client.ObjectKey{Namespace: "hale-system", Name: "hale-hub"}, &l); err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	assert.Equal(t, "hub-m@fleet/w1", claimHolder())
	inWorkload := func(node string) *v1alpha1.Remediation {
		var list v1alpha1.RemediationList
		require.NoError(t, wc.List(ctx, &list, client.InNamespace("hale-system")))
		for i := range list.Items {
			if list.Items[i].Spec.Machine == node {
				return &list.Items[i]
			}
		}
		return nil
	}
	if copied := inWorkload(tb.Name(2)); assert.NotNil(t, copied, "the cell's remediation, copied to the workload cluster") {
		assert.Equal(t, v1alpha1.PhaseSucceeded, copied.Status.Phase)
		assert.Equal(t, r.Name, copied.Name)
	}

	// The workload cluster's own hub, run with --fallback (its inventory names the BMCs), stands by
	// while the cell holds the claim.
	fsocket := filepath.Join(dir, "fallback.sock")
	_, flogs := runInBackground(t, "fallback hub", runOptions{inventory: inv, node: "hub-f", bind: "127.0.0.1:0", join: tb.Seeds(), keyFile: tb.GossipKeyFile(),
		identityFile: tb.HubIdentityFile(), pinnedFile: tb.PinnedKeysFile(), api: apiListen{socket: fsocket}, logLevel: "info", keep: 20,
		kube: &kubeOptions{config: wcfg, namespace: "hale-system", lease: "hale-hub", leaseDuration: 4 * time.Second, fallback: true}})
	fallbackCmd := func(args ...string) string {
		out, _ := hubAt(fsocket, args...)
		return out
	}
	time.Sleep(5 * time.Second) // longer than the claim's lease duration: the cell renews it
	assert.Equal(t, "hub-m@fleet/w1", claimHolder())
	assert.Contains(t, fallbackCmd("status"), "stands by: the management cluster's hub hub-m heals this cluster (as Cluster API Cluster fleet/w1) and holds the claim, the Lease hale-system/hale-hub")

	// The management cluster's API server stops answering the hub: its Lease lapses and its cells stop;
	// the fallback takes the claim once nobody has renewed it for its duration, and heals a hung
	// machine through its BMC, journaled in the workload cluster.
	frozen := time.Now()
	reach.Freeze()
	require.Eventually(t, func() bool { return claimHolder() == "hub-f" }, 20*time.Second, 100*time.Millisecond, "the fallback takes the claim")
	// Its cells stop (and with them the claim's renewal) before the term's end is logged, once they have:
	// the fallback may take the claim in between (a full run: 3.3 s after the freeze, the line not yet out).
	assert.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"no longer leading"`) }, 10*time.Second, 100*time.Millisecond,
		"the hub's term ended with its Lease")
	t.Logf("the fallback took the claim %v after the management API server stopped answering (lease duration 4 s)", time.Since(frozen).Round(time.Millisecond))
	// Hale's power actions on a machine: what its BMC was asked but the power-ons of the stand-in for
	// metal3's operator (which, as the real one, powers on a host that should be online).
	actions := func(i int) int {
		n := 0
		for _, r := range tb.Resets(i) {
			if r != "On" {
				n++
			}
		}
		return n
	}
	resetsBefore := actions(1)
	tb.Hang(1)
	require.Eventually(t, func() bool {
		r := inWorkload(tb.Name(1))
		return r != nil && r.Status.Phase == v1alpha1.PhaseSucceeded
	}, 60*time.Second, 100*time.Millisecond, "the fallback heals %s", tb.Name(1))
	assert.Equal(t, resetsBefore+1, actions(1), "one power action, the fallback's")

	// The management API server answers again: the hub leads again, its cell wants the claim, and the
	// fallback, with nothing in flight, hands it back at once; the cell heals on. Nothing was acted on
	// twice. (w2 opts out first: it shares w1's workload cluster, and its cell, started first, would
	// take w1's gossip pool and, as a candidate of its own, could take the claim.)
	var w2 clusterv1.Cluster
	require.NoError(t, mc.Get(ctx, client.ObjectKey{Namespace: ns, Name: "w2"}, &w2))
	delete(w2.Labels, cells.OptInLabel)
	require.NoError(t, mc.Update(ctx, &w2))
	healing := strings.Count(logs.String(), `"msg":"healing"`)
	reach.Thaw()
	back := time.Now()
	require.Eventually(t, func() bool { return claimHolder() == "hub-m@fleet/w1" }, 30*time.Second, 100*time.Millisecond, "the fallback hands the claim back")
	t.Logf("the claim handed back %v after the management API server answered again", time.Since(back).Round(time.Millisecond))
	assert.Contains(t, flogs.String(), "handing it back")
	require.Eventually(t, func() bool {
		return strings.Contains(fallbackCmd("status"), "stands by: the management cluster's hub hub-m heals this cluster (as Cluster API Cluster fleet/w1) and holds the claim, the Lease hale-system/hale-hub")
	}, 10*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool { return strings.Count(logs.String(), `"msg":"healing"`) > healing }, 30*time.Second, 100*time.Millisecond,
		"the cell heals again")
	assert.Equal(t, r.Name, remediation().Name, "the management cluster's journal: the one remediation of the cell's")
	assert.Equal(t, resetsBefore+1, actions(1), "nothing acted on twice")
}

// runInBackground runs `hub run` with o until the test ends (its logs shown, as name's, when the test
// failed) and returns once it serves: what it serves, and its logs.
func runInBackground(t *testing.T, name string, o runOptions) (runAddrs, *capture.Buffer) {
	t.Helper()
	logs := &capture.Buffer{}
	ctx, stop := context.WithCancel(context.Background())
	done, ready := make(chan error, 1), make(chan runAddrs, 1)
	go func() { done <- runHub(ctx, o, logs, ready) }()
	var addrs runAddrs
	select {
	case addrs = <-ready:
	case err := <-done:
		stop()
		t.Fatalf("%s: %v\n%s", name, err, logs)
	}
	t.Cleanup(func() {
		stop()
		<-done
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, logs)
		}
	})
	return addrs, logs
}

// hubAt runs the hub command args against the hub at socket, as an operator would, and returns what it
// printed (its error included) and its exit code.
func hubAt(socket string, args ...string) (string, int) {
	var out bytes.Buffer
	root := newRootCommand(&out, &out)
	root.SetArgs(append(args, "--socket", socket))
	err := root.ExecuteContext(context.Background())
	if err != nil {
		out.WriteString(err.Error())
	}
	return out.String(), exitCode(err)
}

// typeBlock runs a documented shell block as an operator would, with kubectl (the one
// test/kube/build-assets built) using kubeconfig, in a directory of their own with the repository's
// deploy/; a line starting with a key of set is replaced by its value (the operator's own names).
func typeBlock(t *testing.T, block, kubeconfig string, set map[string]string) {
	t.Helper()
	lines := strings.Split(block, "\n")
	for i, l := range lines {
		for prefix, v := range set {
			if strings.HasPrefix(l, prefix) {
				lines[i] = v
			}
		}
	}
	dir := t.TempDir()
	deploy, err := filepath.Abs(filepath.Join("..", "..", "deploy"))
	require.NoError(t, err)
	require.NoError(t, os.Symlink(deploy, filepath.Join(dir, "deploy")))
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.Join(lines, "\n"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "PATH="+kubeassets.Dir()+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s\n%s", strings.Join(lines, "\n"), out)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
