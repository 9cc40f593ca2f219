package hub

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	bolt "go.etcd.io/bbolt"

	"github.com/hale-dev/hale/quorum"
)

func openJournal(t *testing.T, path string) *Journal {
	t.Helper()
	j, err := OpenJournal(path, 3)
	require.NoError(t, err)
	return j
}

// A hub that dies between intent and outcome leaves the intent pending; the next hub (a new epoch)
// finds it and can finish the remediation.
func TestJournalSurvivesACrashBetweenIntentAndOutcome(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openJournal(t, path)
	assert.Equal(t, uint64(1), j.Epoch())
	r, err := j.Begin(t.Context(), Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Reason: "cp-2 dead",
		Steps: steps("power-cycle etcd-2", "await-healthy etcd-2")})
	require.NoError(t, err)
	require.NoError(t, j.Intent(t.Context(), r.ID, 0, "PowerCycle via redfish://10.0.0.12"))
	_, err = j.Begin(t.Context(), Remediation{Machine: "cp-2", Reason: "again"})
	require.ErrorIs(t, err, ErrActive)
	require.NoError(t, j.Close()) // the crash: no outcome written

	j2 := openJournal(t, path)
	defer j2.Close()
	assert.Equal(t, uint64(2), j2.Epoch())
	active, err := j2.Active(t.Context())
	require.NoError(t, err)
	require.Len(t, active, 1)
	pending, ok := active[0].Pending()
	require.True(t, ok, "the intent without an outcome is pending")
	assert.Equal(t, 0, pending.Step)
	assert.Equal(t, uint64(1), pending.Epoch)

	require.NoError(t, j2.Outcome(t.Context(), r.ID, 0, ResultNotRepeated, "power state On, LastResetTime moved: the cycle happened; not repeated"))
	_, ok = mustGet(t, j2, "cp-2").Pending()
	assert.False(t, ok)
	require.NoError(t, j2.Finish(t.Context(), r.ID, Succeeded, "member healthy again"))
	active, err = j2.Active(t.Context())
	require.NoError(t, err)
	assert.Empty(t, active)
	assert.ErrorIs(t, j2.Intent(t.Context(), r.ID, 1, "x"), ErrFinished, "is Succeeded already")
	assert.ErrorIs(t, j2.Finish(t.Context(), "nope/1", Failed, ""), ErrNoRemediation)
}

func mustGet(t *testing.T, j *Journal, machine string) Remediation {
	t.Helper()
	h, err := j.History(t.Context(), machine)
	require.NoError(t, err)
	require.NotEmpty(t, h)
	return h[len(h)-1]
}

func TestJournalRefusesAStaleEpoch(t *testing.T) {
	j := openJournal(t, filepath.Join(t.TempDir(), "journal.db"))
	defer j.Close()
	r, err := j.Begin(t.Context(), Remediation{Machine: "cp-1", Reason: "test"})
	require.NoError(t, err)
	// Another hub took over (in Kubernetes mode the epoch comes from the lease): bump the stored epoch.
	require.NoError(t, j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyEpoch, binary.BigEndian.AppendUint64(nil, j.epoch+1))
	}))
	err = j.Intent(t.Context(), r.ID, 0, "power off")
	require.ErrorIs(t, err, ErrStaleEpoch)
	assert.Contains(t, err.Error(), "epoch 1, journal at 2")
}

func TestJournalKeepsABoundedHistory(t *testing.T) {
	j := openJournal(t, filepath.Join(t.TempDir(), "journal.db"))
	defer j.Close()
	clock := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	j.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	for i := range 5 {
		r, err := j.Begin(t.Context(), Remediation{Machine: "cp-1", Reason: fmt.Sprint("round ", i)})
		require.NoError(t, err)
		require.NoError(t, j.Finish(t.Context(), r.ID, Succeeded, "ok"))
	}
	h, err := j.History(t.Context(), "cp-1")
	require.NoError(t, err)
	require.Len(t, h, 3, "keepFinished is 3")
	assert.Equal(t, "begun: round 4", h[2].History[0].Detail)
	assert.Equal(t, "begun: round 2", h[0].History[0].Detail)
}

func TestJournalBadInput(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.db")
	require.NoError(t, os.WriteFile(garbage, []byte("this is not a bbolt file, it is much too short and wrong anyway......"), 0o600))
	_, err := OpenJournal(garbage, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "journal "+garbage)
	assert.Contains(t, err.Error(), "move the file aside")

	// A directory that is not there (the default /var/lib/hale on a new host): that is the fix to name.
	_, err = OpenJournal(filepath.Join(dir, "missing", "journal.db"), 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "its directory "+filepath.Join(dir, "missing")+" does not exist or is no directory: create it")
	assert.NotContains(t, err.Error(), "move the file aside")

	path := filepath.Join(dir, "journal.db")
	j := openJournal(t, path)
	defer j.Close()
	_, err = OpenJournal(path, 0)
	require.EqualError(t, err, "journal "+path+" is locked by another process (is another hub running?)")

	_, err = j.Begin(t.Context(), Remediation{Machine: "a/b"})
	require.ErrorContains(t, err, `machine name "a/b" must be non-empty and without /`)
	assert.ErrorContains(t, j.Finish(t.Context(), "x", InProgress, ""), "is not a final state")
}

func steps(texts ...string) []quorum.Step {
	out := make([]quorum.Step, len(texts))
	for i, t := range texts {
		s, err := quorum.ParseStep(t)
		if err != nil {
			panic(err)
		}
		out[i] = s
	}
	return out
}

// The ledger knows when each remediation's power cycle was done, from the outcomes the hub writes and
// from the journal when a restarted hub loads it: a cycle that did not bring an unseen machine back
// is not repeated (holdOf), and a restart must not forget it.
func TestLedgerKnowsWhenAPowerCycleWasDone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openJournal(t, path)
	l := newLedger(keepFinished)
	rec := recorder{Store: j, l: l}
	r, err := rec.Begin(t.Context(), Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Reason: "cp-2 dead",
		Steps: steps("power-cycle etcd-2", "await-healthy etcd-2")})
	require.NoError(t, err)
	assert.Zero(t, l.of("cp-2")[0].cycled, "no cycle yet")
	require.NoError(t, rec.Intent(t.Context(), r.ID, 0, "PowerCycle"))
	before := time.Now()
	require.NoError(t, rec.Outcome(t.Context(), r.ID, 0, ResultDone, "On: reset"))
	cycled := l.of("cp-2")[0].cycled
	assert.False(t, cycled.Before(before), "the cycle's outcome sets cycled")
	assert.Equal(t, "On: reset", l.of("cp-2")[0].shown)
	require.NoError(t, rec.Outcome(t.Context(), r.ID, 1, ResultDone, "recovered"))
	assert.Equal(t, cycled, l.of("cp-2")[0].cycled, "the await step is no cycle")
	require.NoError(t, rec.Finish(t.Context(), r.ID, Failed, "not recovered"))

	w, err := rec.Begin(t.Context(), Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Steps: steps("power-cycle etcd-2", "await-healthy etcd-2")})
	require.NoError(t, err)
	require.NoError(t, rec.Outcome(t.Context(), w.ID, 0, ResultWithdrawn, "not sent"))
	require.NoError(t, rec.Finish(t.Context(), w.ID, Aborted, "withdrawn"))
	assert.Zero(t, l.of("cp-2")[1].cycled, "a withdrawn request cycled nothing")
	require.NoError(t, j.Close())

	j2 := openJournal(t, path)
	defer j2.Close()
	l2 := newLedger(keepFinished)
	require.NoError(t, l2.load(t.Context(), j2, []string{"cp-2"}))
	got := l2.of("cp-2")
	require.Len(t, got, 2)
	assert.WithinDuration(t, cycled, got[0].cycled, time.Second, "read back from the journal")
	assert.Equal(t, "On: reset", got[0].shown)
	assert.Zero(t, got[1].cycled)
	c, unseen := unseenSinceCycle(got, time.Time{})
	assert.True(t, unseen, "a restarted hub that has not seen cp-2 since its cycle holds it")
	assert.Equal(t, r.ID, c.id)
	_, unseen = unseenSinceCycle(got, time.Now())
	assert.False(t, unseen, "seen since")
}
