package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube/lists"
	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/lab/inproc"
	"github.com/hale-dev/hale/test/silent"
)

// The same pipeline in Kubernetes mode's journal: the demo topology (real etcd, agents, simulated
// BMCs) with a hub that leads a Lease and records its remediations as Remediation objects on a real
// kube-apiserver. A hung machine is healed once, and the object tells the whole story.
func TestHubOnRemediationObjects(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	leaders := make(chan *Leader, 1)
	go func() {
		// The shipped lease timing (the zero LeaseTiming): this test is not about failover, and a 2 s
		// lease lost on a loaded run (the API server slower than its 375 ms renew timeout for a few
		// seconds) fenced the journal of the one leader the test holds, so the heal could never be
		// journaled.
		_ = Elect(ctx, cfg, c, ns, "hale-hub", "hub-test", LeaseTiming{}, func(lctx context.Context, l *Leader) {
			leaders <- l
			<-lctx.Done()
		}, nil)
	}()
	leader := <-leaders

	tb := startInproc(t)
	require.NoError(t, tb.StartHub(inproc.HubOptions{Store: NewJournal(c, ns, leader.Epoch(), 5).WithFence(leader.Check)}))
	require.NoError(t, tb.Settle(ctx))

	tb.Hang(2)
	require.NoError(t, tb.WaitFor(ctx, 60*time.Second, "cp-2 healed", func() bool {
		n, st := tb.Remediations(2)
		return n == 1 && st == journal.Succeeded
	}))
	assert.Len(t, tb.Resets(2), 1, "one power action")

	var list v1alpha1.RemediationList
	require.NoError(t, c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelMachine: "cp-2"}))
	require.Len(t, list.Items, 1)
	obj := list.Items[0]
	assert.Equal(t, v1alpha1.PhaseSucceeded, obj.Status.Phase)
	assert.Equal(t, "hub", obj.Spec.RequestedBy)
	assert.Equal(t, []string{"power-cycle etcd-2", "await-healthy etcd-2"}, obj.Spec.Steps)
	assert.Equal(t, int64(leader.Epoch()), obj.Status.Epoch)
	var kinds []string
	for _, e := range obj.Status.History {
		kinds = append(kinds, e.Kind)
	}
	assert.Equal(t, []string{"note", "intent", "outcome", "outcome", "note"}, kinds, "begun, BMC intent, BMC outcome, recovered, succeeded")
}

// Pause through the HealthPolicy and through a paused Cluster API Cluster, acknowledged in the
// policy's status in two phases: Pausing while a BMC step is in flight, Paused once it is done.
func TestPauseThroughHealthPolicyAndCluster(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	policy := &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
	require.NoError(t, c.Create(ctx, policy))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "prod", Namespace: ns}, Spec: clusterv1.ClusterSpec{Paused: new(false)}}
	require.NoError(t, c.Create(ctx, cluster))

	// The Cluster is found as the capi overlay's --capi-cluster=auto finds it: the one whose Machine a
	// control-plane Node is.
	createNode(t, c, ns+"-cp", "", true)
	createMachine(t, c, ns, "cp", ns+"-cp", "kcp", nil)

	tb := startInproc(t)
	require.NoError(t, tb.StartHub(inproc.HubOptions{}))
	require.NoError(t, tb.Settle(ctx))
	sync := &PolicySync{Client: c, Policy: client.ObjectKeyFromObject(policy), FindCluster: true, MachineNamespace: ns, Hub: tb.Hub(), Interval: 50 * time.Millisecond}
	go sync.Run(ctx)
	pauseState := func() string {
		var p v1alpha1.HealthPolicy
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(policy), &p))
		return p.Status.Pause
	}
	waitPause := func(want string) {
		t.Helper()
		require.Eventually(t, func() bool { return pauseState() == want }, 30*time.Second, 20*time.Millisecond, "status.pause %s", want)
	}
	waitPause("Running")
	// The budget as the hub last planned: all three voters healthy once the in-process cluster's etcd answers its
	// probes in time (on a loaded machine a pass may plan with a member whose probe just failed).
	var p v1alpha1.HealthPolicy
	require.Eventually(t, func() bool {
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(policy), &p))
		return p.Status.Budget != nil && p.Status.Budget.HealthyVoters == 3
	}, 30*time.Second, 50*time.Millisecond, "status.budget: %+v", p.Status.Budget)
	assert.Len(t, p.Status.Machines, 3)

	// A slow BMC so that the power step is in flight when the pause arrives. On a loaded machine the
	// gossip may have called cp-1 dead for a moment as the hub started: a remediation begun then, and
	// withdrawn unacted once cp-1 was Healthy again, is in its history too, and holds the next one for
	// up to 30 s (an idle end's retry).
	// Each BMC answer takes 1 s, so that the step is still in flight when the policy sync, a patch
	// and a poll later, sees the pause (with 300 ms, a full run beside the real cluster saw the step
	// done first: Paused at once, never Pausing).
	before, _ := tb.Remediations(1)
	tb.Sim().SetFaults(bmcsim.Faults{Latency: time.Second})
	tb.Hang(1)
	require.NoError(t, tb.WaitFor(ctx, 60*time.Second, "cp-1's BMC step", func() bool {
		for _, m := range tb.Hub().Status(ctx).Machines {
			if m.Name == "cp-1" && m.Remediation != nil && m.Remediation.Busy {
				return true
			}
		}
		return false
	}))
	require.NoError(t, c.Patch(ctx, &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns},
		Spec: v1alpha1.HealthPolicySpec{Paused: true}}, client.Merge))
	waitPause("Pausing")
	// The step in flight completes, and then the pause is acknowledged. Each answer taking 1 s, the
	// step alone takes some 11 s on an idle machine (a full run's starved testbed did not finish it
	// within 30 s): the BMC answers at once again as soon as the pause is seen.
	tb.Sim().SetFaults(bmcsim.Faults{})
	waitPause("Paused")
	require.NoError(t, c.Patch(ctx, &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"paused":null}}`))))
	waitPause("Running")
	require.NoError(t, tb.WaitFor(ctx, 60*time.Second, "cp-1 healed", func() bool { n, st := tb.Remediations(1); return n == before+1 && st == journal.Succeeded }))

	// A paused Cluster API Cluster pauses Hale too, and says why.
	cluster.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	require.NoError(t, c.Update(ctx, cluster))
	waitPause("Paused")
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(policy), &p))
	cond := meta.FindStatusCondition(p.Status.Conditions, "Paused")
	require.NotNil(t, cond)
	assert.Equal(t, "ClusterPaused", cond.Reason)
	assert.Contains(t, cond.Message, "paused by Cluster API Cluster "+ns+"/prod")
	assert.Equal(t, operator.Paused, tb.Hub().PauseState())
}

// The Cluster of the control plane (--capi-cluster=auto): none while no Machine is a control-plane
// Node's, the one whose Machines they are, and an error that names them and the flag when they are
// several Clusters' (a Machine of a worker Node does not count).
func TestClusterOfControlPlane(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	createNode(t, c, ns+"-a", "", true)
	createNode(t, c, ns+"-b", "", true)
	createNode(t, c, ns+"-w", "", false)
	got, err := ClusterOfControlPlane(ctx, c, ns)
	require.NoError(t, err)
	assert.Nil(t, got, "no Machine yet")
	createMachine(t, c, ns, "a", ns+"-a", "kcp", nil)
	got, err = ClusterOfControlPlane(ctx, c, ns)
	require.NoError(t, err)
	assert.Equal(t, &client.ObjectKey{Namespace: ns, Name: "prod"}, got)
	other := func(name, node string) {
		m := &clusterv1.Machine{}
		require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, m))
		m2 := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: *m.Spec.DeepCopy()}
		m2.Spec.ClusterName = "staging"
		require.NoError(t, c.Create(ctx, m2))
		before := m2.DeepCopy()
		m2.Status.NodeRef = clusterv1.MachineNodeReference{Name: node}
		require.NoError(t, c.Status().Patch(ctx, m2, client.MergeFrom(before)))
	}
	other("w", ns+"-w") // a worker's Machine of another Cluster: not the control plane's
	got, err = ClusterOfControlPlane(ctx, c, ns)
	require.NoError(t, err)
	assert.Equal(t, &client.ObjectKey{Namespace: ns, Name: "prod"}, got)
	other("b", ns+"-b")
	_, err = ClusterOfControlPlane(ctx, c, ns)
	require.ErrorContains(t, err, "Machines of 2 Cluster API Clusters ("+"["+ns+"/prod "+ns+"/staging]): name the one Hale heals with --capi-cluster NAMESPACE/NAME")
}

// policyBed is an in-process cluster whose hub (started with withPolicyBrakes, settled) keeps its brakes in the
// HealthPolicy "default" of ns, beside a Cluster API Cluster "prod", not paused.
func policyBed(t *testing.T, c client.Client, ns string, cache Cache) (tb *inproc.Cluster, policyKey client.ObjectKey, cluster *clusterv1.Cluster, withPolicyBrakes inproc.HubOptions) {
	t.Helper()
	policyKey = client.ObjectKey{Namespace: ns, Name: "default"}
	cluster = &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "prod", Namespace: ns}, Spec: clusterv1.ClusterSpec{Paused: new(false)}}
	require.NoError(t, c.Create(t.Context(), cluster))
	tb = startInproc(t)
	withPolicyBrakes = inproc.HubOptions{Configure: func(cfg *hub.Config) { cfg.Brakes = PolicyBrakes{Client: c, Policy: policyKey, Cache: cache} }}
	require.NoError(t, tb.StartHub(withPolicyBrakes))
	require.NoError(t, tb.Settle(t.Context()))
	return tb, policyKey, cluster, withPolicyBrakes
}

// The operator's brakes live in the HealthPolicy: a pause, observe-only or a detach asked over a
// replica's socket is written there (who and why included) and the sync does not undo it; kubectl's
// change to the same fields reaches the hub; a paused Cluster API Cluster is a pause of its own, and
// any pause holds; a new leader finds the brakes where the last one left them. The sync reads as a
// management-mode hub's cells do, from the hub's shared cache: the brakes the hub writes are read
// back no older than written, also while the cache's watch is stuck.
func TestBrakesLiveInTheHealthPolicy(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	u, err := url.Parse(cfg.Host)
	require.NoError(t, err)
	watch := silent.Forward(t, u.Host) // the cache's link to the API server
	cacheCfg := rest.CopyConfig(cfg)
	cacheCfg.Host = "https://" + watch.Addr()
	var logs strings.Builder
	cache, err := lists.New(ctx, cacheCfg, c.Scheme(), c, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	tb, policyKey, cluster, withPolicyBrakes := policyBed(t, c, ns, cache)
	clusterKey := client.ObjectKeyFromObject(cluster)
	syncCtx, stopSync := context.WithCancel(ctx)
	sync := &PolicySync{Client: c, Cache: cache, Policy: policyKey, Cluster: &clusterKey, Hub: tb.Hub(), Interval: 50 * time.Millisecond}
	go sync.Run(syncCtx)
	policy := func() v1alpha1.HealthPolicy {
		var p v1alpha1.HealthPolicy
		require.NoError(t, c.Get(ctx, policyKey, &p))
		return p
	}
	h := tb.Hub()
	require.Eventually(t, func() bool {
		var p v1alpha1.HealthPolicy
		return c.Get(ctx, policyKey, &p) == nil && p.Status.Pause == string(operator.Running)
	}, 10*time.Second, 20*time.Millisecond, "the sync has made the policy and read it (and the Cluster) from the cache")

	// As `hub pause --reason …` over the socket does, while the cache sees no write.
	watch.Freeze()
	require.NoError(t, h.SetPaused(ctx, true, "operator alice", "maintenance window"))
	require.NoError(t, h.SetDetached(ctx, "cp-0", true, "operator carol", "disk swap"))
	p := policy()
	assert.True(t, p.Spec.Paused)
	assert.Contains(t, p.Annotations[PausedByAnnotation], `"by":"operator alice","reason":"maintenance window"`)
	require.Len(t, p.Spec.Detached, 1)
	assert.Equal(t, "cp-0", p.Spec.Detached[0].Name)
	assert.Equal(t, "disk swap", p.Spec.Detached[0].Reason)
	time.Sleep(500 * time.Millisecond) // ten syncs
	require.Equal(t, operator.Paused, h.PauseState(), "the sync does not undo the socket's pause (nor reads it from a cache that has not seen it)")
	require.Len(t, h.Status(ctx).PausedBy, 1)
	watch.Thaw()

	// A paused Cluster is a pause of its own; lifting it leaves alice's.
	cluster.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	require.NoError(t, c.Update(ctx, cluster))
	require.Eventually(t, func() bool { return len(h.Status(ctx).PausedBy) == 2 }, 10*time.Second, 20*time.Millisecond)
	delete(cluster.Annotations, clusterv1.PausedAnnotation)
	require.NoError(t, c.Update(ctx, cluster))
	require.Eventually(t, func() bool { return len(h.Status(ctx).PausedBy) == 1 }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, "operator alice", h.Status(ctx).PausedBy[0].By)

	// kubectl lifts the pause: the hub follows.
	require.NoError(t, c.Patch(ctx, &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"paused":null}}`))))
	require.Eventually(t, func() bool { return h.PauseState() == operator.Running }, 10*time.Second, 20*time.Millisecond)

	assert.NotContains(t, strings.Join(h.Timeline(), "\n"), "cp-0 attached", "the detach never flickered off")
	assert.Empty(t, logs.String(), "the cache served every kind")

	// A new leader: the detach is where the last one left it, before any sync.
	stopSync()
	tb.StopHub()
	require.NoError(t, tb.StartHub(withPolicyBrakes))
	require.Eventually(t, func() bool { return tb.Hub().Status(ctx).Machines[0].DetachedBy != nil }, 10*time.Second, 20*time.Millisecond)
	st := tb.Hub().Status(ctx)
	assert.Equal(t, "operator carol", st.Machines[0].DetachedBy.By)
	assert.Equal(t, operator.Running, st.Pause)
}

// While an etcd recovery pauses Hale, the Cluster API Cluster is paused too (KubeadmControlPlane and
// the MachineHealthChecks leave the machines alone while their members are rebuilt and rejoined), and
// `hub resume` lifts both. That pause of the Cluster is no second pause of Hale's; an operator's own
// pause of Hale does not pause the Cluster, and a Cluster the operator paused is never resumed by Hale.
func TestRecoveryPausesTheCluster(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	tb, policyKey, cluster, _ := policyBed(t, c, ns, nil)
	clusterKey := client.ObjectKeyFromObject(cluster)
	sync := &PolicySync{Client: c, Policy: policyKey, Cluster: &clusterKey, Hub: tb.Hub(), Interval: 50 * time.Millisecond}
	go sync.Run(ctx)
	h := tb.Hub()
	annotations := func() map[string]string {
		var got clusterv1.Cluster
		require.NoError(t, c.Get(ctx, clusterKey, &got))
		return got.Annotations
	}
	paused := func() bool { _, ok := annotations()[clusterv1.PausedAnnotation]; return ok }

	require.NoError(t, h.SetPaused(ctx, true, "alice", "maintenance window"))
	time.Sleep(300 * time.Millisecond) // several syncs
	assert.False(t, paused(), "an operator's pause of Hale is not the Cluster's")
	require.NoError(t, h.SetPaused(ctx, false, "alice", ""))

	// As `hub recover --yes` pauses the hub (the reason names the recovery).
	require.NoError(t, h.SetPaused(ctx, true, "alice", "etcd recovery hale-c1-1"))
	require.Eventually(t, paused, 10*time.Second, 20*time.Millisecond, "the Cluster paused for the recovery")
	assert.Equal(t, "etcd recovery hale-c1-1", annotations()[ClusterPausedForAnnotation])
	time.Sleep(300 * time.Millisecond)
	require.Len(t, h.Status(ctx).PausedBy, 1, "Hale's own pause of the Cluster pauses Hale no further")
	require.NoError(t, h.SetPaused(ctx, false, "alice", "")) // hub resume
	require.Eventually(t, func() bool { return !paused() && h.PauseState() == operator.Running }, 10*time.Second, 20*time.Millisecond)
	assert.NotContains(t, annotations(), ClusterPausedForAnnotation)

	// A Cluster the operator paused stays paused, and keeps pausing Hale.
	require.NoError(t, c.Patch(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "prod", Namespace: ns}},
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"cluster.x-k8s.io/paused":""}}}`))))
	require.NoError(t, h.SetPaused(ctx, true, "alice", "etcd recovery hale-c1-2"))
	require.NoError(t, h.SetPaused(ctx, false, "alice", ""))
	time.Sleep(300 * time.Millisecond)
	assert.True(t, paused())
	assert.NotContains(t, annotations(), ClusterPausedForAnnotation)
	require.Eventually(t, func() bool {
		st := h.Status(ctx)
		return len(st.PausedBy) == 1 && strings.HasPrefix(st.PausedBy[0].By, "Cluster API Cluster")
	},
		10*time.Second, 20*time.Millisecond)
}

// A notice about the hub as a whole (it lost the majority of its expected observers, or heard one
// again) is an Event on its HealthPolicy, where `kubectl describe healthpolicy` shows it.
func TestHubNoticeIsAnEventOnTheHealthPolicy(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	sink := NewEventSink(c, &Discovery{Client: c}, "hub-test", slog.New(slog.DiscardHandler))
	sink.Hub = corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HealthPolicy", Namespace: ns, Name: "default"}
	go sink.Run(ctx)
	sink.Notify(pass.Notice{Reason: "ObserverMajorityLost", Warning: true,
		Message: "the hub hears 2 of 6 expected observers (the hub, cp-0); a strict majority is 4: a partition and a crash look the same from here"})
	require.Eventually(t, func() bool {
		var events eventsv1.EventList
		require.NoError(t, c.List(ctx, &events, client.InNamespace(ns)))
		return slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Kind == "HealthPolicy" && e.Regarding.Name == "default" && e.Reason == "ObserverMajorityLost" &&
				e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "hears 2 of 6")
		})
	}, 10*time.Second, 50*time.Millisecond)
}

// The HealthPolicy's spec is the policy: each field set with kubectl is in force from the next pass
// (the hub's status says so, minFaultTolerance visibly in the budget) and the policy's PolicyApplied
// condition says what is in force and which fields come from the policy; a bad value names its
// field and keeps what is in force; a field unset falls back to the inventory's.
func TestHealthPolicySpecIsThePolicy(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	policy := &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
	require.NoError(t, c.Create(ctx, policy))
	tb := startInproc(t)
	require.NoError(t, tb.StartHub(inproc.HubOptions{}))
	require.NoError(t, tb.Settle(ctx))
	sync := &PolicySync{Client: c, Policy: client.ObjectKeyFromObject(policy), Hub: tb.Hub(), Interval: 50 * time.Millisecond}
	go sync.Run(ctx)
	kc := kubeenv.Kubeconfig(t, cfg, t.TempDir(), "")
	patch := func(spec string) {
		t.Helper()
		out, err := kubeenv.Kubectl("--kubeconfig", kc, "-n", ns, "patch", "healthpolicy", "default", "--type", "merge", "-p", `{"spec":`+spec+`}`)
		require.NoError(t, err, out)
	}
	applied := func() *metav1.Condition {
		var p v1alpha1.HealthPolicy
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(policy), &p))
		return meta.FindStatusCondition(p.Status.Conditions, "PolicyApplied")
	}
	require.Eventually(t, func() bool {
		cond := applied()
		return cond != nil && cond.Status == metav1.ConditionTrue && strings.Contains(cond.Message, "all from the inventory")
	}, 30*time.Second, 20*time.Millisecond)
	// 3 healthy voters, minFaultTolerance 0: one may be disrupted (once the assessor hears every
	// observer again: a loaded machine's late report makes a member's health unknown for a pass).
	require.Eventually(t, func() bool {
		st := tb.Hub().Status(ctx)
		return st.Budget != nil && st.Budget.Available == 1
	}, 30*time.Second, 20*time.Millisecond, "%+v", tb.Hub().Status(ctx).Budget)

	for _, tc := range []struct {
		spec string
		in   func(operator.Status) bool
	}{
		{`{"minFaultTolerance": 1}`, func(st operator.Status) bool {
			return st.Policy.MinFaultTolerance == 1 && st.Budget != nil && st.Budget.Available == 0
		}},
		{`{"maxInFlight": "2"}`, func(st operator.Status) bool { return st.Policy.MaxInFlight == "2" }},
		{`{"maxUnhealthy": "40%"}`, func(st operator.Status) bool { return st.Policy.MaxUnhealthy == "40%" }},
		{`{"probeTimeouts": {"etcd": "7s"}}`, func(st operator.Status) bool { return st.Policy.ProbeTimeouts["etcd"].Duration == 7*time.Second }},
		{`{"cooldown": "90s"}`, func(st operator.Status) bool { return st.Policy.Cooldown.Duration == 90*time.Second }},
		{`{"maxAttempts": 5}`, func(st operator.Status) bool { return st.Policy.MaxAttempts == 5 }},
		{`{"stallTolerance": {"quorumHeld": "45s"}}`, func(st operator.Status) bool {
			return st.Policy.StallTolerance.QuorumHeld.Duration == 45*time.Second && st.Policy.StallTolerance.QuorumNeeded.Duration == 0 // the in-process inventory's
		}},
		{`{"componentGrace": {"quorumHeld": "4m", "quorumNeeded": "20s"}}`, func(st operator.Status) bool {
			return st.Policy.ComponentGrace.QuorumHeld.Duration == 4*time.Minute && st.Policy.ComponentGrace.QuorumNeeded.Duration == 20*time.Second
		}},
	} {
		patch(tc.spec)
		require.Eventually(t, func() bool { return tc.in(tb.Hub().Status(ctx)) }, 10*time.Second, 20*time.Millisecond, "%s in force", tc.spec)
	}
	require.Eventually(t, func() bool {
		return strings.Contains(applied().Message, "overridden: minFaultTolerance, maxInFlight, maxUnhealthy, probeTimeouts, cooldown, maxAttempts, stallTolerance, componentGrace")
	}, 10*time.Second, 20*time.Millisecond, "%+v", applied())
	assert.Contains(t, applied().Message, "in force: minFaultTolerance 1, maxInFlight 2, maxUnhealthy 40%, cooldown 1m30s, maxAttempts 5")

	// A bad value: said, naming the field; what was in force stays.
	patch(`{"maxInFlight": "lots"}`)
	require.Eventually(t, func() bool { c := applied(); return c.Status == metav1.ConditionFalse }, 10*time.Second, 20*time.Millisecond)
	cond := applied()
	assert.Equal(t, "Invalid", cond.Reason)
	assert.Contains(t, cond.Message, `spec.maxInFlight`)
	assert.Contains(t, cond.Message, "the policy in force stays")
	assert.Equal(t, "2", tb.Hub().Status(ctx).Policy.MaxInFlight)
	patch(`{"maxInFlight": "2", "probeTimeouts": {"kubelt": "5s"}}`) // a probe no agent has
	require.Eventually(t, func() bool {
		return strings.Contains(applied().Message, `spec.probeTimeouts.kubelt: no probe named "kubelt" (known: `)
	}, 10*time.Second, 20*time.Millisecond, "%+v", applied())
	patch(`{"probeTimeouts": {"kubelt": null, "etcd": "7s"}}`)
	patch(`{"stallTolerance": {"quorumNeeded": "-5s"}}`)
	require.Eventually(t, func() bool {
		return strings.Contains(applied().Message, `spec.stallTolerance.quorumNeeded: -5s must not be negative`)
	}, 10*time.Second, 20*time.Millisecond, "%+v", applied())
	assert.Equal(t, 45*time.Second, tb.Hub().Status(ctx).Policy.StallTolerance.QuorumHeld.Duration, "the policy in force stays")
	patch(`{"stallTolerance": {"quorumNeeded": null}}`)

	// Unset: the inventory's again.
	patch(`{"maxInFlight": null, "minFaultTolerance": null}`)
	require.Eventually(t, func() bool {
		st := tb.Hub().Status(ctx)
		return st.Policy.MinFaultTolerance == 0 && st.Policy.MaxInFlight != "2" && st.Budget != nil && st.Budget.Available == 1
	}, 30*time.Second, 20*time.Millisecond, "the budget with every machine healthy (a loaded run may take a member for unhealthy a while)")
}

// The hub's pass reads nothing from the API server: failure counts, cooldowns, holds and brakes are
// in memory (loaded at start, updated on write). Every API request of the pass's dependencies (the
// Remediation journal, the HealthPolicy brakes, the Event sink) is counted: in steady state, with a
// machine held (detached and hung, said once), N passes, a status and a scrape make none.
func TestPassesMakeNoAPIRequests(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	require.NoError(t, c.Create(ctx, &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}))

	var mu sync.Mutex
	var requests []string
	counted := rest.CopyConfig(cfg)
	counted.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			requests = append(requests, r.Method+" "+r.URL.Path)
			mu.Unlock()
			return rt.RoundTrip(r)
		})
	}
	cc, err := client.New(counted, client.Options{Scheme: c.Scheme()})
	require.NoError(t, err)
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(requests)
	}

	sink := NewEventSink(cc, &Discovery{Client: cc}, "hub-test", slog.New(slog.DiscardHandler))
	go sink.Run(ctx)
	reg := prometheus.NewRegistry()
	tb := startInproc(t)
	require.NoError(t, tb.StartHub(inproc.HubOptions{Store: NewJournal(cc, ns, 1, 5), Configure: func(hc *hub.Config) {
		hc.Brakes = PolicyBrakes{Client: cc, Policy: client.ObjectKey{Namespace: ns, Name: "default"}}
		hc.Notify = sink.Notify
		hc.Metrics = reg
	}}))
	require.NoError(t, tb.Settle(ctx))
	require.NoError(t, tb.Hub().SetDetached(ctx, "cp-1", true, "operator carol", "disk swap"))
	tb.Hang(1)
	require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "cp-1 held", func() bool {
		m := tb.Hub().Status(ctx).Machines[1]
		return m.Verdict == assess.VerdictUnhealthy && m.Detached
	}))
	require.NoError(t, tb.Passes(ctx, 3)) // the hold's notice said, and its Event written
	require.NotEmpty(t, seen(), "the counter sees the journal's load and the detach's write")

	before := len(seen())
	require.NoError(t, tb.Passes(ctx, 50))
	st := tb.Hub().Status(ctx)
	_, err = reg.Gather()
	require.NoError(t, err)
	require.NoError(t, tb.Passes(ctx, 1))
	assert.Empty(t, seen()[before:], "API requests in 51 passes, a status and a scrape")
	// Held all along (nothing done: no reset, below); what the status says of it is read again when a
	// loaded pass found it Suspect for a moment (no decision to state then).
	if !strings.Contains(st.Machines[1].Decision, "detached") {
		require.NoError(t, tb.WaitFor(ctx, 30*time.Second, "cp-1's decision: detached", func() bool {
			return strings.Contains(tb.Hub().Status(ctx).Machines[1].Decision, "detached")
		}), "the machine is held: %+v", st.Machines[1])
	}
	assert.Empty(t, tb.Resets(1), "nothing done to the detached machine")
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// An Event the API server does not take for a moment (503, as just after a quorum loss) is tried
// again until it is written; one it refuses (400) is tried once and dropped.
func TestEventsOutlastABriefOutage(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	var mu sync.Mutex
	posts, fail := 0, map[int]int{1: http.StatusServiceUnavailable, 2: http.StatusServiceUnavailable, 4: http.StatusBadRequest}
	flaky := rest.CopyConfig(cfg)
	flaky.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method != http.MethodPost || !strings.Contains(r.URL.Path, "/events") {
				return rt.RoundTrip(r)
			}
			mu.Lock()
			posts++
			code := fail[posts]
			mu.Unlock()
			if code == 0 {
				return rt.RoundTrip(r)
			}
			return &http.Response{StatusCode: code, Header: http.Header{"Content-Type": {"application/json"}}, Request: r,
				Body: io.NopCloser(strings.NewReader(fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d}`, code)))}, nil
		})
	}
	cc, err := client.New(flaky, client.Options{Scheme: c.Scheme()})
	require.NoError(t, err)
	sink := NewEventSink(cc, &Discovery{Client: cc}, "hub-test", slog.New(slog.DiscardHandler))
	sink.Hub = corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HealthPolicy", Namespace: ns, Name: "default"}
	sink.Retries = []time.Duration{10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond}
	go sink.Run(ctx)
	sink.Notify(pass.Notice{Reason: pass.ReasonEtcdRecovery, Message: "recovered", Warning: true})
	sink.Notify(pass.Notice{Reason: pass.ReasonDegradedMode, Message: "refused"})
	sink.Notify(pass.Notice{Reason: pass.ReasonPaused, Message: "after"})
	require.Eventually(t, func() bool {
		return slices.Equal(eventsAbout(t, c, ns, "HealthPolicy", "default"), []string{string(pass.ReasonEtcdRecovery), string(pass.ReasonPaused)})
	}, 10*time.Second, 50*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 5, posts, "the first Event tried 3 times, the refused one once, the last once")
}

// A term that ends before its Events are written (the API server restarted just after an import)
// hands them on: the sink returns what it did not write, and the next term's sink writes it.
func TestEventsUnwrittenWhenTheTermEnds(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	down := rest.CopyConfig(cfg)
	down.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPost && strings.Contains(r.URL.Path, "/events") {
				return nil, errors.New("connection refused")
			}
			return rt.RoundTrip(r)
		})
	}
	policy := corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HealthPolicy", Namespace: ns, Name: "default"}
	term := func(cfg *rest.Config) *EventSink {
		cc, err := client.New(cfg, client.Options{Scheme: c.Scheme()})
		require.NoError(t, err)
		sink := NewEventSink(cc, &Discovery{Client: cc}, "hub-test", slog.New(slog.DiscardHandler))
		sink.Hub, sink.Retries = policy, []time.Duration{time.Hour}
		return sink
	}
	first := term(down)
	notices := []pass.Notice{{Reason: pass.ReasonEtcdRecovery, Message: "recovered", Warning: true}, {Reason: pass.ReasonPaused, Message: "paused"}}
	for _, n := range notices {
		first.Notify(n)
	}
	ctx, end := context.WithCancel(t.Context())
	unwritten := make(chan []pass.Notice, 1)
	go func() { unwritten <- first.Run(ctx) }()
	time.Sleep(100 * time.Millisecond) // the first write failed: it waits to try again
	end()
	assert.Equal(t, notices, <-unwritten, "the one being tried, then the one still queued")

	next := term(cfg)
	next.Carry(notices)
	go next.Run(t.Context())
	require.Eventually(t, func() bool {
		return slices.Equal(eventsAbout(t, c, ns, "HealthPolicy", "default"), []string{string(pass.ReasonEtcdRecovery), string(pass.ReasonPaused)})
	}, 10*time.Second, 50*time.Millisecond)
}
