package kube

import (
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/kube/lists"
	"github.com/hale-dev/hale/quorum"
)

// BenchmarkSharedCacheMemory measures the heap that a management-mode hub's shared informer cache
// (lists.Shared) holds for each workload cluster, on a real API server: every kind the cells read
// there (Remediations, HaleRemediations, Machines, MachineHealthChecks, HealthPolicies, Clusters),
// for clusters of 3 control-plane Machines, each machine with as many finished remediations as a
// journal keeps by default (20), each written through the Kubernetes journal as the hub writes a
// power-cycle (begun, two steps' intents and outcomes, finished), and the cluster's HealthPolicy with
// its status. The heap after a GC is taken with the informers synced and empty, and again once the
// cache holds everything; the difference over the clusters is the cost of one (BareMetalHosts,
// metal3's, are not on this server: one per machine, a few KiB each).
//
//	go test -run '^$' -bench SharedCacheMemory -benchtime 1x ./kube
func BenchmarkSharedCacheMemory(b *testing.B) {
	c, cfg, ns := shared.Namespace(b)
	ctx := b.Context()
	const clusters, machines, keep = 8, 3, 20
	kinds := []client.ObjectList{&v1alpha1.RemediationList{}, &v1alpha1.HaleRemediationList{}, &clusterv1.MachineList{},
		&clusterv1.MachineHealthCheckList{}, &v1alpha1.HealthPolicyList{}, &clusterv1.ClusterList{}}
	cache, err := lists.New(ctx, cfg, c.Scheme(), c, slog.New(slog.DiscardHandler))
	require.NoError(b, err)
	for _, l := range kinds {
		require.NoError(b, cache.List(ctx, l), "%T", l) // each informer started and synced, empty
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for i := range clusters {
		name := fmt.Sprintf("w%d", i)
		require.NoError(b, c.Create(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{"hale.dev/heal": "true"}}, Spec: clusterv1.ClusterSpec{Paused: new(false)}}))
		require.NoError(b, c.Create(ctx, &clusterv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-cp"},
			Spec: clusterv1.MachineHealthCheckSpec{ClusterName: name, Selector: metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}}}}))
		policy := &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		require.NoError(b, c.Create(ctx, policy))
		j := NewJournal(c, ns, 1, keep).ForCluster(name)
		for m := range machines {
			machine := fmt.Sprintf("%s-cp-%d", name, m)
			policy.Status.Machines = append(policy.Status.Machines, v1alpha1.MachineSummary{Name: machine, Verdict: "Healthy"})
			require.NoError(b, c.Create(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: machine,
				Labels: map[string]string{clusterv1.ClusterNameLabel: name, clusterv1.MachineControlPlaneLabel: ""}},
				Spec: clusterv1.MachineSpec{ClusterName: name, Bootstrap: clusterv1.Bootstrap{DataSecretName: new(machine + "-bootstrap")},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine", Name: machine}}}))
			for range keep {
				writePowerCycle(b, j, machine)
			}
		}
		policy.Status.Pause = "Running"
		require.NoError(b, c.Status().Update(ctx, policy))
	}
	want := clusters * machines * keep
	require.Eventually(b, func() bool {
		var l v1alpha1.RemediationList
		return cache.List(ctx, &l) == nil && len(l.Items) == want
	}, time.Minute, 100*time.Millisecond, "the cache holds the %d remediations", want)
	var l v1alpha1.RemediationList
	require.NoError(b, c.List(ctx, &l, client.InNamespace(ns)))
	require.Len(b, l.Items, want, "the journals kept %d finished remediations a machine", keep)
	b.ReportMetric(float64(heap()-before)/clusters/1024, "KiB/cluster")
}

// writePowerCycle journals a finished power-cycle of machine through j, as the hub's executor does.
func writePowerCycle(b *testing.B, j *Journal, machine string) {
	ctx := b.Context()
	r, err := j.Begin(ctx, journal.Remediation{Machine: machine, Strategy: "reboot", RequestedBy: "hale",
		Reason:    "dead to 4 of 5 observers; no sign of life for 30.2s (stall tolerance 30s; quorum held)",
		Steps:     []quorum.Step{{Op: quorum.OpPowerCycle, Member: machine}, {Op: quorum.OpAwaitHealthy, Member: machine}},
		WhileDead: true, Attempt: 1, Members: []string{machine, "a", "b"}})
	require.NoError(b, err)
	for step, detail := range []string{"power-cycle " + machine + " through its BMC (redfish, ForceRestart)", "await " + machine + " healthy (its agent restarted, its etcd member reachable)"} {
		require.NoError(b, j.Intent(ctx, r.ID, step, detail))
		require.NoError(b, j.Outcome(ctx, r.ID, step, journal.ResultDone, detail+": done after 41.7s"))
	}
	require.NoError(b, j.Finish(ctx, r.ID, journal.Succeeded, machine+" is Healthy again after 58.3s"))
}
