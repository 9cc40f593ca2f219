package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/lab/inproc"
)

// A standby names the leader's pod when the Lease holder has the default name (hub-POD-RANDOM).
func TestHolderPod(t *testing.T) {
	for holder, pod := range map[string]string{
		"hub-hale-hub-5d8f7c9b4-x2x9k-ab12cd": "hale-hub-5d8f7c9b4-x2x9k",
		"hub-node1-q1w2e3":                    "node1",
		"hub-a":                               "", // a --node of the operator's: no pod in it
		"hub-node1-abc":                       "",
		"hub--ab12cd":                         "",
		"witness-x-ab12cd":                    "",
		"":                                    "",
	} {
		assert.Equal(t, pod, holderPod(holder), holder)
	}
}

// `hub run --kubernetes` twice on the demo topology and a real kube-apiserver: one replica leads, the
// other stands by (its API says so); the leader is killed in the middle of a remediation's BMC step;
// the other takes over, resumes the same Remediation object and finishes it with one power action in
// all. The replicas discover the machines from the cluster's Nodes (--discover); the inventory file
// gives their BMCs, and every decision is an Event on the Node.
func TestKubernetesModeFailover(t *testing.T) {
	c, cfg := kubeenv.Start(t)
	ctx := t.Context()
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hale-system"}}))
	require.NoError(t, c.Create(ctx, &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "hale-system"}}))
	dir := t.TempDir()
	tb, inv := startBed(t, dir)
	createBedNodes(t, c, tb)

	type replica struct {
		socket string
		logs   *capture.Buffer
		stop   context.CancelFunc
		done   chan error
	}
	start := func(name string) *replica {
		r := &replica{socket: filepath.Join(dir, name, "hub.sock"), logs: &capture.Buffer{}, done: make(chan error, 1)}
		rctx, cancel := context.WithCancel(context.Background())
		r.stop = cancel
		ready := make(chan runAddrs, 1)
		go func() {
			r.done <- runHub(rctx, runOptions{inventory: inv, node: name, bind: "127.0.0.1:0", join: tb.Seeds(), keyFile: tb.GossipKeyFile(), identityFile: tb.HubIdentityFile(), pinnedFile: tb.PinnedKeysFile(),
				api: apiListen{socket: r.socket}, logLevel: "info", keep: 20,
				kube: &kubeOptions{config: cfg, namespace: "hale-system", lease: "hale-hub", policy: "default", leaseDuration: 2 * time.Second,
					discover: true, discoverEvery: time.Second}},
				r.logs, ready)
		}()
		select {
		case <-ready:
		case err := <-r.done:
			t.Fatalf("%s: %v\n%s", name, err, r.logs)
		}
		t.Cleanup(func() {
			cancel()
			<-r.done
			if t.Failed() {
				t.Logf("%s logs:\n%s", name, r.logs)
			}
		})
		return r
	}
	status := func(r *replica) (string, int) {
		var out bytes.Buffer
		root := newRootCommand(&out, &out)
		root.SetArgs([]string{"status", "--socket", r.socket})
		err := root.ExecuteContext(context.Background())
		if err != nil {
			out.WriteString(err.Error())
		}
		return out.String(), exitCode(err)
	}

	a := start("hub-a")
	require.Eventually(t, func() bool { out, code := status(a); return code == 0 && strings.Count(out, "Healthy") == 3 }, 60*time.Second, 100*time.Millisecond, "every machine Healthy under hub-a (a loaded run: the rig's etcd and agents start slowly)")
	b := start("hub-b")
	out, code := status(b)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, out, "this hub replica stands by: hub-a holds the Lease hale-system/hale-hub", "it names the one to ask")

	// A slow BMC, so that hub-a dies inside the BMC step.
	tb.Sim().SetFaults(bmcsim.Faults{Latency: 400 * time.Millisecond})
	tb.Hang(2)
	remediation := func() *v1alpha1.Remediation { return onlyRemediation(t, c, "hale-system") }
	require.Eventually(t, func() bool {
		r := remediation()
		return r != nil && slices.ContainsFunc(r.Status.History, func(e v1alpha1.RemediationEvent) bool { return e.Kind == "intent" })
	}, 60*time.Second, 20*time.Millisecond, "hub-a's remediation of cp-2, its intent journaled (a full run's starved rig: the observers' "+
		"reports came and went for 30 s, quorum seen lost and back, and hub-a rightly planned nothing meanwhile)")
	a.stop() // killed: the lease is not released
	killed := time.Now()
	require.NoError(t, <-a.done)
	a.done <- nil // for the cleanup
	tb.Sim().SetFaults(bmcsim.Faults{})

	require.Eventually(t, func() bool {
		r := remediation()
		return r != nil && r.Status.Phase == v1alpha1.PhaseSucceeded
	}, 60*time.Second, 50*time.Millisecond)
	t.Logf("hub-a killed → the remediation finished by hub-b %v later", time.Since(killed).Round(time.Millisecond))
	assert.Len(t, tb.Resets(2), 1, "one power action in all")
	r := remediation()
	epochs := map[int64]bool{}
	for _, e := range r.Status.History {
		epochs[e.Epoch] = true
	}
	assert.Len(t, epochs, 2, "written by both leaders: %+v", r.Status.History)
	assert.True(t, slices.ContainsFunc(r.Status.History, func(e v1alpha1.RemediationEvent) bool {
		return strings.Contains(e.Detail, "after a hub restart")
	}), "hub-b resumed it after reading the BMC: %+v", r.Status.History)
	out, code = status(b)
	assert.Equal(t, 0, code, out)
	var p v1alpha1.HealthPolicy
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "hale-system", Name: "default"}, &p))
	assert.Equal(t, "Running", p.Status.Pause, "hub-b follows the HealthPolicy")
	require.Eventually(t, func() bool {
		var events eventsv1.EventList
		require.NoError(t, c.List(ctx, &events, client.InNamespace("default")))
		return slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Kind == "Node" && e.Regarding.Name == "cp-2" && e.Reason == "Remediated" && e.ReportingInstance == "hub-b"
		})
	}, 10*time.Second, 100*time.Millisecond, "an Event on Node cp-2 from hub-b")
}

// `hub reboot --kubernetes`: the request is a Remediation object, so Kubernetes RBAC decides who may
// reboot. alice may create Remediations in hale-system and her reboot is carried out by the leading
// hub, recorded in her object; bob may not and is told so; a request for an unknown machine is closed
// Aborted with the reason.
func TestRebootThroughARemediationObject(t *testing.T) {
	c, cfg := kubeenv.Start(t)
	ctx := t.Context()
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hale-system"}}))
	require.NoError(t, c.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "hale-reboot", Namespace: "hale-system"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"hale.dev"}, Resources: []string{"remediations"}, Verbs: []string{"create", "get", "list", "watch"}}}}))
	require.NoError(t, c.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-reboots", Namespace: "hale-system"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "hale-reboot"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "alice"}}}))
	dir := t.TempDir()
	tb, inv := startBed(t, dir)
	socket := filepath.Join(dir, "hub.sock")
	runReplica(t, runOptions{inventory: inv, node: "hub-a", bind: "127.0.0.1:0", join: tb.Seeds(), keyFile: tb.GossipKeyFile(), identityFile: tb.HubIdentityFile(), pinnedFile: tb.PinnedKeysFile(),
		api: apiListen{socket: socket}, logLevel: "info", keep: 20,
		kube: &kubeOptions{config: cfg, namespace: "hale-system", lease: "hale-hub", leaseDuration: 2 * time.Second}})
	// Every machine Healthy for 2 s on end: on a loaded machine the gossip may still settle after the
	// first Healthy (a Suspect, an etcd view gone stale), and the hub rightly aborts a reboot whose
	// quorum re-check then finds no fresh etcd view.
	var steadySince time.Time
	require.Eventually(t, func() bool {
		var out bytes.Buffer
		root := newRootCommand(&out, &out)
		root.SetArgs([]string{"status", "--socket", socket})
		if root.ExecuteContext(ctx) != nil || strings.Count(out.String(), "Healthy") != 3 {
			steadySince = time.Time{}
			return false
		}
		if steadySince.IsZero() {
			steadySince = time.Now()
		}
		return time.Since(steadySince) >= 2*time.Second
	}, 30*time.Second, 100*time.Millisecond)

	reboot := func(user string, args ...string) (string, int) {
		var out bytes.Buffer
		root := newRootCommand(&out, &out)
		root.SetArgs(append([]string{"reboot", "--kubernetes", "--kubeconfig", kubeenv.Kubeconfig(t, cfg, dir, user), "--namespace", "hale-system"}, args...))
		err := root.ExecuteContext(ctx)
		if err != nil {
			out.WriteString(err.Error())
		}
		return out.String(), exitCode(err)
	}
	// The hub re-checks quorum with reports sent after the request just before the power action; on
	// a loaded machine an agent's etcd read may time out then, the check finds too few views and the
	// request ends Aborted, with no power action; or the hub cannot check quorum at all when asked (too
	// few fresh etcd views for a moment): alice asks again (twice at most).
	var out string
	var code, tries int
	for tries = 1; ; tries++ {
		out, code = reboot("alice", "cp-1", "--wait")
		t.Logf("alice (request %d): %s", tries, out)
		if code == 0 || tries == 3 || !strings.Contains(out, "confirming the quorum check with fresh reports") && !strings.Contains(out, "cannot check quorum") {
			break
		}
	}
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "accepted by the hub")
	assert.Contains(t, out, "Succeeded")
	assert.Len(t, tb.Resets(1), 1, "one power action")
	var list v1alpha1.RemediationList
	require.NoError(t, c.List(ctx, &list, client.InNamespace("hale-system")))
	require.Len(t, list.Items, tries, "each request recorded in alice's object, not a second one")
	i := slices.IndexFunc(list.Items, func(r v1alpha1.Remediation) bool {
		return strings.Contains(out, "remediation hale-system/"+r.Name+"\n")
	})
	require.GreaterOrEqual(t, i, 0, "the object the last request named: %s", out)
	r := list.Items[i]
	assert.True(t, strings.HasPrefix(r.Name, "reboot-cp-1-"), r.Name)
	assert.Equal(t, v1alpha1.PhaseSucceeded, r.Status.Phase)
	assert.Contains(t, r.Spec.RequestedBy, "kubernetes: Remediation hale-system/reboot-cp-1-")

	out, code = reboot("bob", "cp-1")
	assert.Equal(t, exitRefused, code, out)
	assert.Contains(t, out, "Kubernetes RBAC: you may not create Remediations in hale-system")

	out, code = reboot("alice", "nope")
	assert.Equal(t, exitRefused, code, out)
	assert.Contains(t, out, `refused: machine "nope"`)
	assert.Len(t, tb.Resets(1), 1)
}

// runReplica runs `hub run` with o until the test ends, once it serves, and returns its logs (shown
// when the test fails).
func runReplica(t *testing.T, o runOptions) *capture.Buffer {
	t.Helper()
	logs := &capture.Buffer{}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan runAddrs, 1)
	go func() { done <- runHub(ctx, o, logs, ready) }()
	t.Cleanup(func() {
		stop()
		<-done
		if t.Failed() {
			t.Logf("%s logs:\n%s", o.node, logs)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("%s: %v\n%s", o.node, err, logs)
	}
	return logs
}

// createBedNodes describes the in-process cluster to the API server: a control-plane Node per machine, its etcd
// member named by annotation. It returns the in-process cluster's inventory.
func createBedNodes(t *testing.T, c client.Client, tb *inproc.Cluster) pass.Inventory {
	t.Helper()
	bed, err := tb.Inventory()
	require.NoError(t, err)
	for _, m := range bed.Machines {
		require.NoError(t, c.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.Node,
			Labels: map[string]string{kube.ControlPlaneLabel: ""}, Annotations: map[string]string{kube.EtcdMemberAnnotation: m.Member}}}))
	}
	return bed
}

// onlyRemediation is the one Remediation object in ns (nil: none yet); a second fails the test.
func onlyRemediation(t *testing.T, c client.Client, ns string) *v1alpha1.Remediation {
	t.Helper()
	var list v1alpha1.RemediationList
	require.NoError(t, c.List(t.Context(), &list, client.InNamespace(ns)))
	if len(list.Items) == 0 {
		return nil
	}
	require.Len(t, list.Items, 1, "one remediation, never a second")
	return &list.Items[0]
}

// The management cluster's hub sets no client-side limit: one client serves every cell, and client-go's
// default (5 requests a second for each kind of object) queued every cell's reads and journal writes
// of a kind behind the others' past five cells. A hub of its own cluster keeps client-go's default.
// Checked on client-go's own REST client, made from the configuration the hub's client is made from.
func TestManagementClientHasNoClientSideLimit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		management bool
		wantQPS    float32 // 0: no limiter at all
	}{
		{"a hub of its own cluster: client-go's default", false, rest.DefaultQPS},
		{"a management cluster's hub: none (the API server's priority and fairness limits it)", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := kubeOptions{management: tc.management, leaseDuration: 15 * time.Second}
			cc := k.clientConfig(&rest.Config{Host: "https://127.0.0.1:6443"})
			assert.Equal(t, 3*time.Second, cc.Timeout, "a fifth of the lease")
			cc.GroupVersion, cc.APIPath, cc.NegotiatedSerializer = &corev1.SchemeGroupVersion, "/api", clientgoscheme.Codecs.WithoutConversion()
			rc, err := rest.RESTClientFor(cc)
			require.NoError(t, err)
			if tc.wantQPS == 0 {
				assert.Nil(t, rc.GetRateLimiter())
				return
			}
			require.NotNil(t, rc.GetRateLimiter())
			assert.Equal(t, tc.wantQPS, rc.GetRateLimiter().QPS())
		})
	}
}
