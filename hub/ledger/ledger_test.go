package ledger

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// keepFinished is how many finished remediations per machine the ledger keeps here.
const keepFinished = 20

func openJournal(t *testing.T, path string) *boltfile.File {
	t.Helper()
	j, err := boltfile.Open(path, 3)
	require.NoError(t, err)
	return j
}

// The ledger knows when each remediation's power cycle was done, from the outcomes the hub writes and
// from the journal when a restarted hub loads it: a cycle that did not bring an unseen machine back
// is not repeated (holdOf), and a restart must not forget it.
func TestLedgerKnowsWhenAPowerCycleWasDone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openJournal(t, path)
	l := New(keepFinished)
	rec := Recorder{Store: j, Ledger: l}
	r, err := rec.Begin(t.Context(), journal.Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Reason: "cp-2 dead",
		Steps: quorum.MustParseSteps("power-cycle etcd-2", "await-healthy etcd-2")})
	require.NoError(t, err)
	assert.Zero(t, l.Of("cp-2")[0].Cycled, "no cycle yet")
	require.NoError(t, rec.Intent(t.Context(), r.ID, 0, "PowerCycle"))
	before := time.Now()
	require.NoError(t, rec.Outcome(t.Context(), r.ID, 0, journal.ResultDone, "On: reset"))
	cycled := l.Of("cp-2")[0].Cycled
	assert.False(t, cycled.Before(before), "the cycle's outcome sets cycled")
	assert.Equal(t, "On: reset", l.Of("cp-2")[0].Shown)
	require.NoError(t, rec.Outcome(t.Context(), r.ID, 1, journal.ResultDone, "recovered"))
	assert.Equal(t, cycled, l.Of("cp-2")[0].Cycled, "the await step is no cycle")
	require.NoError(t, rec.Finish(t.Context(), r.ID, journal.Failed, "not recovered"))

	w, err := rec.Begin(t.Context(), journal.Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Steps: quorum.MustParseSteps("power-cycle etcd-2", "await-healthy etcd-2")})
	require.NoError(t, err)
	require.NoError(t, rec.Outcome(t.Context(), w.ID, 0, journal.ResultWithdrawn, "not sent"))
	require.NoError(t, rec.Finish(t.Context(), w.ID, journal.Aborted, "withdrawn"))
	assert.Zero(t, l.Of("cp-2")[1].Cycled, "a withdrawn request cycled nothing")
	require.NoError(t, j.Close())

	j2 := openJournal(t, path)
	defer j2.Close()
	l2 := New(keepFinished)
	require.NoError(t, l2.Load(t.Context(), j2, []string{"cp-2"}))
	got := l2.Of("cp-2")
	require.Len(t, got, 2)
	assert.WithinDuration(t, cycled, got[0].Cycled, time.Second, "read back from the journal")
	assert.Equal(t, "On: reset", got[0].Shown)
	assert.Zero(t, got[1].Cycled)
	c, unseen := pass.UnseenSinceCycle(got, time.Time{})
	assert.True(t, unseen, "a restarted hub that has not seen cp-2 since its cycle holds it")
	assert.Equal(t, r.ID, c.ID)
	_, unseen = pass.UnseenSinceCycle(got, time.Now())
	assert.False(t, unseen, "seen since")
}

// The rate limit counts the hub's remediations that acted (or may have: an intent written, or still
// in progress), in memory and when a restarted hub loads the journal; one that ended idle (its only
// step withdrawn) takes no slot and starts no cooldown.
func TestIdleRemediationsTakeNoSlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openJournal(t, path)
	l := New(keepFinished)
	rec := Recorder{Store: j, Ledger: l}
	plan := quorum.MustParseSteps("power-cycle etcd-2", "await-healthy etcd-2")
	idle, err := rec.Begin(t.Context(), journal.Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Steps: plan})
	require.NoError(t, err)
	assert.Equal(t, 1, l.StartsWithin(time.Now(), time.Hour), "in progress: it may yet act")
	require.NoError(t, rec.Intent(t.Context(), idle.ID, 0, "PowerCycle"))
	require.NoError(t, rec.Outcome(t.Context(), idle.ID, 0, journal.ResultWithdrawn, "not sent: cp-2 is Healthy again"))
	require.NoError(t, rec.Finish(t.Context(), idle.ID, journal.Aborted, "withdrawn"))
	assert.Zero(t, l.StartsWithin(time.Now(), time.Hour), "ended idle")
	assert.True(t, pass.Ended(l.Of("cp-2")).IsZero(), "no cooldown after an idle end")

	acted, err := rec.Begin(t.Context(), journal.Remediation{Machine: "cp-1", Strategy: "reboot", RequestedBy: "hub", Steps: plan})
	require.NoError(t, err)
	require.NoError(t, rec.Intent(t.Context(), acted.ID, 0, "PowerCycle"))
	require.NoError(t, rec.Finish(t.Context(), acted.ID, journal.Failed, "re-check refused"))
	assert.Equal(t, 1, l.StartsWithin(time.Now(), time.Hour), "an intent written: it may have acted")
	assert.False(t, pass.Ended(l.Of("cp-1")).IsZero())
	require.NoError(t, j.Close())

	j2 := openJournal(t, path)
	defer j2.Close()
	l2 := New(keepFinished)
	require.NoError(t, l2.Load(t.Context(), j2, []string{"cp-1", "cp-2"}))
	assert.Equal(t, 1, l2.StartsWithin(time.Now(), time.Hour), "read back from the journal")
	assert.True(t, l2.Of("cp-2")[0].Idle())
	assert.False(t, l2.Of("cp-1")[0].Idle())
}
