package boltfile

import (
	"encoding/binary"
	"fmt"
	"github.com/hale-dev/hale/hub/journal"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	bolt "go.etcd.io/bbolt"

	"github.com/hale-dev/hale/quorum"
)

func openJournal(t *testing.T, path string) *File {
	t.Helper()
	j, err := Open(path, 3)
	require.NoError(t, err)
	return j
}

// A hub that dies between intent and outcome leaves the intent pending; the next hub (a new epoch)
// finds it and can finish the remediation.
func TestJournalSurvivesACrashBetweenIntentAndOutcome(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openJournal(t, path)
	assert.Equal(t, uint64(1), j.Epoch())
	r, err := j.Begin(t.Context(), journal.Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Reason: "cp-2 dead",
		Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-2"}, {Op: quorum.OpAwaitHealthy, Member: "etcd-2"}}})
	require.NoError(t, err)
	require.NoError(t, j.Intent(t.Context(), r.ID, 0, "PowerCycle via redfish://10.0.0.12"))
	_, err = j.Begin(t.Context(), journal.Remediation{Machine: "cp-2", Reason: "again"})
	require.ErrorIs(t, err, journal.ErrActive)
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

	require.NoError(t, j2.Outcome(t.Context(), r.ID, 0, journal.ResultNotRepeated, "power state On, LastResetTime moved: the cycle happened; not repeated"))
	h, err := j2.History(t.Context(), "cp-2")
	require.NoError(t, err)
	require.Len(t, h, 1)
	_, ok = h[0].Pending()
	assert.False(t, ok)
	require.NoError(t, j2.Finish(t.Context(), r.ID, journal.Succeeded, "member healthy again"))
	active, err = j2.Active(t.Context())
	require.NoError(t, err)
	assert.Empty(t, active)
	assert.ErrorIs(t, j2.Intent(t.Context(), r.ID, 1, "x"), journal.ErrFinished, "is Succeeded already")
	assert.ErrorIs(t, j2.Finish(t.Context(), "nope/1", journal.Failed, ""), journal.ErrNoRemediation)
}

func TestJournalRefusesAStaleEpoch(t *testing.T) {
	j := openJournal(t, filepath.Join(t.TempDir(), "journal.db"))
	defer j.Close()
	r, err := j.Begin(t.Context(), journal.Remediation{Machine: "cp-1", Reason: "test"})
	require.NoError(t, err)
	// Another hub took over (in Kubernetes mode the epoch comes from the lease): bump the stored epoch.
	require.NoError(t, j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyEpoch, binary.BigEndian.AppendUint64(nil, j.epoch+1))
	}))
	err = j.Intent(t.Context(), r.ID, 0, "power off")
	require.ErrorIs(t, err, journal.ErrStaleEpoch)
	assert.Contains(t, err.Error(), "epoch 1, journal at 2")
}

func TestJournalKeepsABoundedHistory(t *testing.T) {
	j := openJournal(t, filepath.Join(t.TempDir(), "journal.db"))
	defer j.Close()
	clock := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	j.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	for i := range 5 {
		r, err := j.Begin(t.Context(), journal.Remediation{Machine: "cp-1", Reason: fmt.Sprint("round ", i)})
		require.NoError(t, err)
		require.NoError(t, j.Finish(t.Context(), r.ID, journal.Succeeded, "ok"))
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
	_, err := Open(garbage, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "journal "+garbage)
	assert.Contains(t, err.Error(), "move the file aside")

	// A directory that is not there (the default /var/lib/hale on a new host): that is the fix to name.
	_, err = Open(filepath.Join(dir, "missing", "journal.db"), 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "its directory "+filepath.Join(dir, "missing")+" does not exist or is no directory: create it")
	assert.NotContains(t, err.Error(), "move the file aside")

	path := filepath.Join(dir, "journal.db")
	j := openJournal(t, path)
	defer j.Close()
	_, err = Open(path, 0)
	require.EqualError(t, err, "journal "+path+" is locked by another process (is another hub running?)")

	_, err = j.Begin(t.Context(), journal.Remediation{Machine: "a/b"})
	require.ErrorContains(t, err, `machine name "a/b" must be non-empty and without /`)
	assert.ErrorContains(t, j.Finish(t.Context(), "x", journal.InProgress, ""), "is not a final state")
}
