package kube

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// An etcd recovery a degraded term carried out, written back once the API server answers: the record
// into the HealthPolicy (a new leader finds it there: the members it retired stay held), a fence
// Remediation per lost member, and Events; imported twice, nothing is written twice; a record changed
// later (done) is written over.
func TestRecoveryLivesInTheHealthPolicy(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	store := PolicyRecoveries{Client: c, Policy: client.ObjectKey{Namespace: ns, Name: "default"}}
	none, err := store.Recovery(ctx)
	require.NoError(t, err)
	assert.Nil(t, none, "no policy yet: no recovery")

	began := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	rec := pass.RecoveryRecord{By: "alice", Began: began, Plan: pass.RecoveryPlan{Rebuild: quorum.Rebuild{Token: "hale-c1-1", BumpRevision: 20_000,
		Survivor: &quorum.Survivor{Member: "etcd-2", Machine: "cp-2", ClusterID: "c1", Index: 900},
		Fence: []quorum.FenceStep{{Machine: "cp-0", Member: "etcd-0", How: "powered off through its BMC, read back Off", Fenced: true},
			{Machine: "cp-1", Member: "etcd-1", How: "confirmed off by name by alice", Fenced: true, ByHand: true}}}}}
	var said []pass.Notice
	j := NewJournal(c, ns, 3, 5)
	for range 2 {
		notices, err := ImportRecovery(ctx, j, store, rec, "recorded during a degraded term")
		require.NoError(t, err)
		said = append(said, notices...)
	}
	got, err := store.Recovery(ctx)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, rec.Plan.Token, got.Plan.Token)
	assert.Equal(t, rec.Plan.Fence, got.Plan.Fence)
	assert.True(t, got.Began.Equal(began))

	var list v1alpha1.RemediationList
	require.NoError(t, c.List(ctx, &list, client.InNamespace(ns)))
	require.Len(t, list.Items, 2, "a fence Remediation per lost member, once")
	for _, r := range list.Items {
		assert.Equal(t, "fence", r.Spec.Strategy)
		assert.Equal(t, "alice", r.Spec.RequestedBy)
		assert.Equal(t, v1alpha1.PhaseSucceeded, r.Status.Phase)
		assert.Contains(t, r.Spec.Reason, "etcd recovery hale-c1-1")
	}
	var machines, policy []string
	for _, n := range said {
		assert.Equal(t, pass.ReasonEtcdRecovery, n.Reason)
		if n.Machine != "" {
			machines = append(machines, n.Machine)
		} else {
			policy = append(policy, n.Message)
		}
	}
	assert.Equal(t, []string{"cp-0", "cp-1"}, machines, "an Event per fenced machine, once")
	require.Len(t, policy, 2)
	assert.Contains(t, policy[0], "etcd recovery hale-c1-1 by alice, begun 2026-11-26T03:00:00Z while the API server did not answer: rebuilt from etcd-2 (cp-2), fenced cp-0 (etcd-0), cp-1 (etcd-1); under way")

	done := time.Now().UTC()
	rec.Done, rec.NewClusterID = &done, "c2"
	require.NoError(t, store.RecordRecovery(ctx, rec))
	got, err = store.Recovery(ctx)
	require.NoError(t, err)
	assert.Equal(t, "c2", got.NewClusterID)

	// The raft mark beside it, where a new leader finds it (and a cluster rebuilt while another
	// replica led, by its ID).
	marks := PolicyMarks{Client: c, Policy: store.Policy}
	require.NoError(t, marks.RecordRaftMark(ctx, pass.RaftMark{ClusterID: "c2", Term: 2, Index: 40, Member: "etcd-2", At: began}))
	m, err := marks.RaftMark(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(40), m.Index)
	assert.Equal(t, "c2", m.ClusterID)
	got, err = store.Recovery(ctx)
	require.NoError(t, err)
	assert.Equal(t, "c2", got.NewClusterID, "each annotation written alone")

	// A record someone broke by hand is named, with what to do.
	var p v1alpha1.HealthPolicy
	require.NoError(t, c.Get(ctx, store.Policy, &p))
	p.Annotations[RecoveryAnnotation], p.Annotations[MarkAnnotation] = "{", "{"
	require.NoError(t, c.Update(ctx, &p))
	_, err = store.Recovery(ctx)
	require.ErrorContains(t, err, "annotation hale.dev/etcd-recovery")
	_, err = marks.RaftMark(ctx)
	require.ErrorContains(t, err, "annotation hale.dev/raft-mark")
	assert.ErrorContains(t, err, "remove it, and the hub starts it again")

	// No policy: no mark, and a mark made with the policy.
	other := PolicyMarks{Client: c, Policy: client.ObjectKey{Namespace: ns, Name: "other"}}
	m, err = other.RaftMark(ctx)
	require.NoError(t, err)
	assert.Zero(t, m)
	require.NoError(t, other.RecordRaftMark(ctx, pass.RaftMark{ClusterID: "c3", Index: 1}))
}
