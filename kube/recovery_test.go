package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// An etcd recovery a degraded term carried out, written back once the API server answers: the record
// into the HealthPolicy (a new leader finds it there: the members it retired stay held), a fence
// Remediation per lost member, and Events; imported twice (the first cut short after it), nothing is
// written twice and the same notices are returned again (said once the whole import succeeded); a
// record changed later (done) is written over.
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
	j := NewJournal(c, ns, 3, 5)
	said, err := ImportRecovery(ctx, j, store, rec, "recorded during a degraded term")
	require.NoError(t, err)
	again, err := ImportRecovery(ctx, j, store, rec, "recorded during a degraded term")
	require.NoError(t, err)
	assert.Equal(t, said, again)
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
	assert.Equal(t, []string{"cp-0", "cp-1"}, machines, "an Event per fenced machine")
	require.Len(t, policy, 1)
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

	// The episodes' log beside them: each machine's last episodes, the newest maxPolicyEpisodes of all.
	episodes := PolicyEpisodes{Client: c, Policy: store.Policy}
	l, err := episodes.Episodes(ctx)
	require.NoError(t, err)
	assert.Empty(t, l)
	log := pass.EpisodeLog{}
	for i := range maxPolicyEpisodes + 5 {
		m := fmt.Sprintf("cp-%d", i%3)
		at := began.Add(time.Duration(i) * time.Minute)
		log[m] = append(log[m], pass.Episode{Machine: m, Kind: pass.EpisodeDead, Began: at, Ended: at.Add(3 * time.Second), Outcome: pass.EpisodeResumed, Why: "dead"})
	}
	require.NoError(t, episodes.RecordEpisodes(ctx, log))
	l, err = episodes.Episodes(ctx)
	require.NoError(t, err)
	n := 0
	for _, eps := range l {
		n += len(eps)
		for _, e := range eps {
			assert.False(t, e.Ended.Before(began.Add(5*time.Minute)), "the oldest dropped first: %v", e.Ended)
		}
	}
	assert.Equal(t, maxPolicyEpisodes, n)
	p.Annotations = nil
	require.NoError(t, c.Get(ctx, store.Policy, &p))
	p.Annotations[EpisodesAnnotation] = "{"
	require.NoError(t, c.Update(ctx, &p))
	_, err = episodes.Episodes(ctx)
	require.ErrorContains(t, err, "annotation hale.dev/episodes")

	// No policy: no mark, and a mark made with the policy.
	other := PolicyMarks{Client: c, Policy: client.ObjectKey{Namespace: ns, Name: "other"}}
	m, err = other.RaftMark(ctx)
	require.NoError(t, err)
	assert.Zero(t, m)
	require.NoError(t, other.RecordRaftMark(ctx, pass.RaftMark{ClusterID: "c3", Index: 1}))
}

// termRecovery is the record of an etcd recovery a degraded term carried out (token): rebuilt from
// etcd-2 on cp-2, the machines cp-N of fenced powered off through their BMCs.
func termRecovery(token string, fenced ...int) pass.RecoveryRecord {
	var fence []quorum.FenceStep
	for _, i := range fenced {
		fence = append(fence, quorum.FenceStep{Machine: fmt.Sprintf("cp-%d", i), Member: fmt.Sprintf("etcd-%d", i),
			How: "powered off through its BMC, read back Off", Fenced: true})
	}
	return pass.RecoveryRecord{By: "alice", Began: time.Now().UTC(), Plan: pass.RecoveryPlan{Rebuild: quorum.Rebuild{Token: token,
		Survivor: &quorum.Survivor{Member: "etcd-2", Machine: "cp-2", ClusterID: "c1", Index: 900}, Fence: fence}}}
}

// A degraded term's import cut short (the leader's fence refused a write halfway: a lost lease, the
// API server gone again) says nothing; the next import writes no object twice and returns every
// notice of the term, each once, and removes the local journal; a third finds nothing to import.
func TestDegradedImportCutShortSaysEverythingOnce(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "degraded.db")
	local, err := boltfile.Open(path, 0)
	require.NoError(t, err)
	r, err := local.Begin(ctx, journal.Remediation{Machine: "cp-5", Strategy: "reboot", RequestedBy: "hub", Reason: "agent silent"})
	require.NoError(t, err)
	require.NoError(t, local.Finish(ctx, r.ID, journal.Succeeded, "back"))
	require.NoError(t, local.RecordRecovery(ctx, termRecovery("hale-c1-7", 0, 1)))
	require.NoError(t, local.Close())
	policy := client.ObjectKey{Namespace: ns, Name: "default"}
	brakes, recoveries := PolicyBrakes{Client: c, Policy: policy}, PolicyRecoveries{Client: c, Policy: policy}
	log := slog.New(slog.DiscardHandler)

	writes := 0
	cut := NewJournal(c, ns, 4, 5).WithFence(func(context.Context) error {
		if writes++; writes == 3 {
			return errors.New("not leading: lease lost")
		}
		return nil
	})
	_, err = ImportDegraded(ctx, path, cut, brakes, recoveries, log)
	require.ErrorContains(t, err, "importing the fence of cp-1 by etcd recovery hale-c1-7: not leading: lease lost")
	var list v1alpha1.RemediationList
	require.NoError(t, c.List(ctx, &list, client.InNamespace(ns)))
	require.Len(t, list.Items, 2, "cp-5's and cp-0's written before the cut")

	said, err := ImportDegraded(ctx, path, NewJournal(c, ns, 5, 5), brakes, recoveries, log)
	require.NoError(t, err)
	perMachine := map[string]int{}
	var whole []pass.Reason
	for _, n := range said {
		if n.Machine != "" {
			perMachine[n.Machine]++
		} else {
			whole = append(whole, n.Reason)
		}
	}
	assert.Equal(t, map[string]int{"cp-5": 1, "cp-0": 1, "cp-1": 1}, perMachine, "the fence of cp-0, written by the import cut short, is said too")
	assert.Equal(t, []pass.Reason{pass.ReasonEtcdRecovery, pass.ReasonDegradedMode}, whole)
	require.NoError(t, c.List(ctx, &list, client.InNamespace(ns)))
	assert.Len(t, list.Items, 3, "nothing written twice")
	assert.NoFileExists(t, path)

	said, err = ImportDegraded(ctx, path, NewJournal(c, ns, 6, 5), brakes, recoveries, log)
	require.NoError(t, err)
	assert.Empty(t, said, "imported: nothing said again")
}

// A new leader imports its pod's degraded journal before anything else, trying again while it leads:
// writes refused for a while (the API server comes and goes while etcd restarts after a recovery) are
// waited out, never a reason to give the Lease up to a standby that knows nothing of the term; one that
// keeps failing past its patience gives up with the local journal kept for this pod's next term.
func TestDegradedImportTriedAgainWhileLeading(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "degraded.db")
	local, err := boltfile.Open(path, 0)
	require.NoError(t, err)
	require.NoError(t, local.RecordRecovery(ctx, termRecovery("hale-c1-8", 0)))
	require.NoError(t, local.Close())
	policy := client.ObjectKey{Namespace: ns, Name: "default"}
	brakes, recoveries := PolicyBrakes{Client: c, Policy: policy}, PolicyRecoveries{Client: c, Policy: policy}
	log := slog.New(slog.DiscardHandler)
	gone := errors.New("connect: connection refused")

	refused := 0
	never := NewJournal(c, ns, 7, 5).WithFence(func(context.Context) error { refused++; return gone })
	// A patience of many retries: one import may take tens of milliseconds on a busy machine (20 ms
	// allowed one attempt alone in a cold run).
	said, ok := ImportDegradedWhileLeading(ctx, path, never, brakes, recoveries, 10*time.Millisecond, time.Second, log)
	assert.False(t, ok, "past its patience")
	assert.Empty(t, said)
	assert.Greater(t, refused, 1, "tried again before giving up")
	assert.FileExists(t, path, "kept for the next term")

	writes := 0
	flaky := NewJournal(c, ns, 8, 5).WithFence(func(context.Context) error {
		if writes++; writes <= 3 {
			return gone
		}
		return nil
	})
	said, ok = ImportDegradedWhileLeading(ctx, path, flaky, brakes, recoveries, time.Millisecond, time.Minute, log)
	require.True(t, ok)
	assert.Equal(t, 4, writes, "three refusals waited out")
	var machines []string
	for _, n := range said {
		machines = append(machines, n.Machine)
	}
	assert.Equal(t, []string{"cp-0", "", ""}, machines, "the fence, the recovery, the term")
	got, err := recoveries.Recovery(ctx)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, "hale-c1-8", got.Plan.Token, "the recovery is Hale's, for any leader to find")
	assert.NoFileExists(t, path)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, ok = ImportDegradedWhileLeading(cancelled, path, never, brakes, recoveries, time.Hour, 2*time.Hour, log)
	assert.False(t, ok, "the leadership ended")
}
