package kube

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// The Kubernetes journal on a real kube-apiserver: the same contract as the bbolt journal (intent
// before, outcome after, pending intents found by the next hub, one remediation in progress per
// machine, bounded history), a deposed hub's writes refused, and the objects readable with kubectl.
func TestJournalOnAPIServer(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()

	t.Run("crash between intent and outcome", func(t *testing.T) {
		agent := time.Unix(1700000000, 734000000).UTC() // as an agent reports it, to the nanosecond
		j1 := NewJournal(c, ns, 1, 3)
		r, err := j1.Begin(ctx, journal.Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Reason: "cp-2 dead",
			Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-2"}, {Op: quorum.OpAwaitHealthy, Member: "etcd-2"}}, Attempt: 1, AgentStarted: agent})
		require.NoError(t, err)
		require.NoError(t, j1.Intent(ctx, r.ID, 0, "reboot etcd-2 (graceful, then hard)"))
		_, err = j1.Begin(ctx, journal.Remediation{Machine: "cp-2", Strategy: "reboot", Reason: "again"})
		require.ErrorIs(t, err, journal.ErrActive)

		// The hub dies; the next one (a newer epoch, as its lease says) finds the pending intent.
		j2 := NewJournal(c, ns, 2, 3)
		active, err := j2.Active(ctx)
		require.NoError(t, err)
		require.Len(t, active, 1)
		assert.Equal(t, r.ID, active[0].ID)
		assert.Equal(t, []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-2"}, {Op: quorum.OpAwaitHealthy, Member: "etcd-2"}}, active[0].Steps, "typed, written as text")
		assert.Equal(t, []string{"power-cycle etcd-2", "await-healthy etcd-2"}, remediationObject(t, c, ns, r.ID).Spec.Steps)
		assert.Equal(t, time.Unix(1700000000, 0).UTC(), active[0].AgentStarted, "kept to the second (a metav1.Time)")
		assert.False(t, r.AgentRestarted(agent), "the agent the remediation began with is no new one, read back as written")
		assert.False(t, active[0].AgentRestarted(agent), "nor as the API server kept it")
		assert.True(t, active[0].AgentRestarted(agent.Add(3*time.Second)), "an agent started after the reboot")
		pending, ok := active[0].Pending()
		require.True(t, ok)
		assert.Equal(t, 0, pending.Step)
		assert.Equal(t, uint64(1), pending.Epoch)
		require.NoError(t, j2.Outcome(ctx, r.ID, 0, journal.ResultNotRepeated, "after a hub restart: not repeated"))

		// The deposed hub cannot write any more.
		err = j1.Note(ctx, r.ID, "still here")
		require.ErrorIs(t, err, journal.ErrStaleEpoch)
		assert.Contains(t, err.Error(), "this hub's epoch 1, the remediation's 2")

		require.NoError(t, j2.Finish(ctx, r.ID, journal.Succeeded, "every step done"))
		active, err = j2.Active(ctx)
		require.NoError(t, err)
		assert.Empty(t, active)
		assert.ErrorIs(t, j2.Intent(ctx, r.ID, 1, "x"), journal.ErrFinished, "is Succeeded already")

		// What kubectl shows.
		var obj v1alpha1.Remediation
		require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: r.ID}, &obj))
		assert.Equal(t, v1alpha1.PhaseSucceeded, obj.Status.Phase)
		assert.Equal(t, "Succeeded", obj.Labels[v1alpha1.LabelPhase])
		assert.Equal(t, "cp-2", obj.Labels[v1alpha1.LabelMachine])
		require.Len(t, obj.Status.Conditions, 1)
		assert.Equal(t, metav1.ConditionTrue, obj.Status.Conditions[0].Status)
		got, err := j2.Get(ctx, r.ID)
		require.NoError(t, err)
		kinds := []journal.EntryKind{}
		for _, e := range got.History {
			kinds = append(kinds, e.Kind)
		}
		assert.Equal(t, []journal.EntryKind{journal.EntryNote, journal.EntryIntent, journal.EntryOutcome, journal.EntryNote}, kinds)
		assert.Equal(t, journal.ResultNotRepeated, got.History[2].Result, "the outcome's result reads back typed")
		assert.Equal(t, "NotRepeated", obj.Status.History[2].Result)
		assert.True(t, got.History[1].At.Before(got.History[2].At), "microsecond timestamps keep the order")
	})

	t.Run("created, its status never written: in progress, and carried on", func(t *testing.T) {
		// A begin's second write (the status) failed, or its hub died between the two: the object
		// holds the machine (Begin refuses another), so whoever picks it up must be able to write.
		obj := &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Name: "cp-7-halfway", Namespace: ns,
			Labels: map[string]string{v1alpha1.LabelPhase: string(v1alpha1.PhaseInProgress), v1alpha1.LabelMachine: "cp-7"}},
			Spec: v1alpha1.RemediationSpec{Machine: "cp-7", Strategy: "reboot", RequestedBy: "hub", Steps: []string{"power-cycle etcd-7", "await-healthy etcd-7"}}}
		require.NoError(t, c.Create(ctx, obj))
		j := NewJournal(c, ns, 5, 3)
		_, err := j.Begin(ctx, journal.Remediation{Machine: "cp-7", Strategy: "reboot"})
		require.ErrorIs(t, err, journal.ErrActive)
		active, err := j.Active(ctx)
		require.NoError(t, err)
		require.True(t, slices.ContainsFunc(active, func(r journal.Remediation) bool { return r.ID == obj.Name && r.State == journal.InProgress }))
		require.NoError(t, j.Intent(ctx, obj.Name, 0, "reboot etcd-7"), "its first write")
		require.NoError(t, j.Outcome(ctx, obj.Name, 0, journal.ResultDone, "cycled"))
		require.NoError(t, j.Finish(ctx, obj.Name, journal.Succeeded, "every step done"))
		got := remediationObject(t, c, ns, obj.Name)
		assert.Equal(t, v1alpha1.PhaseSucceeded, got.Status.Phase)
		assert.Equal(t, string(v1alpha1.PhaseSucceeded), got.Labels[v1alpha1.LabelPhase])
	})

	t.Run("every typed result is one the CRD accepts", func(t *testing.T) {
		j := NewJournal(c, ns, 1, 3)
		results := []journal.Result{journal.ResultDone, journal.ResultFailed, journal.ResultHandedOver, journal.ResultOldRemoved, journal.ResultReplaced,
			journal.ResultNotRepeated, journal.ResultRetaken, journal.ResultWithdrawn}
		for i, res := range results {
			r, err := j.Begin(ctx, journal.Remediation{Machine: fmt.Sprintf("results-%d", i), Strategy: "reboot", RequestedBy: "hub", Reason: "test",
				Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-9"}}})
			require.NoError(t, err)
			require.NoError(t, j.Intent(ctx, r.ID, 0, "reboot etcd-9"))
			require.NoError(t, j.Outcome(ctx, r.ID, 0, res, "test"), res)
			got, err := j.Get(ctx, r.ID)
			require.NoError(t, err)
			assert.Equal(t, res, got.History[len(got.History)-1].Result)
			require.NoError(t, j.Finish(ctx, r.ID, journal.Aborted, "test"))
		}
	})

	t.Run("bounded history, oldest first", func(t *testing.T) {
		j := NewJournal(c, ns, 5, 3)
		for i := range 5 {
			r, err := j.Begin(ctx, journal.Remediation{Machine: "Worker_7", Strategy: "reboot", Reason: fmt.Sprint("round ", i)})
			require.NoError(t, err)
			require.NoError(t, j.Finish(ctx, r.ID, journal.Failed, "BMC refused"))
		}
		h, err := j.History(ctx, "Worker_7")
		require.NoError(t, err)
		require.Len(t, h, 3, "keep is 3")
		assert.Equal(t, "begun: round 2", h[0].History[0].Detail)
		assert.Equal(t, "begun: round 4", h[2].History[0].Detail)
		assert.Regexp(t, `^worker-7-[0-9a-z]{13}$`, h[0].ID, "a DNS-1123 name that sorts by time")
	})

	t.Run("bad input", func(t *testing.T) {
		j := NewJournal(c, ns, 5, 3)
		_, err := j.Begin(ctx, journal.Remediation{Strategy: "reboot"})
		assert.ErrorContains(t, err, "machine name is empty")
		assert.ErrorIs(t, j.Finish(ctx, "nope", journal.Failed, ""), journal.ErrNoRemediation)
		assert.ErrorContains(t, j.Finish(ctx, "nope", journal.InProgress, ""), "is not a final state")
		_, err = j.Begin(ctx, journal.Remediation{Machine: "cp-1", Strategy: "explode"})
		assert.ErrorContains(t, err, `spec.strategy: Unsupported value: "explode"`, "the CRD's validation holds")
	})
}

func remediationObject(t *testing.T, c client.Client, ns, name string) *v1alpha1.Remediation {
	t.Helper()
	var o v1alpha1.Remediation
	require.NoError(t, c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &o))
	return &o
}
