package hub

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
)

func openJournal(t *testing.T, path string) *boltfile.File {
	t.Helper()
	j, err := boltfile.Open(path, 3)
	require.NoError(t, err)
	return j
}

// mustGet is the machine's latest remediation in j.
func mustGet(t *testing.T, j *boltfile.File, machine string) journal.Remediation {
	t.Helper()
	h, err := j.History(t.Context(), machine)
	require.NoError(t, err)
	require.NotEmpty(t, h)
	return h[len(h)-1]
}
