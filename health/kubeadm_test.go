package health

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An upgrade is under way while kubeadm's directory of new manifests is there (the newest one's time);
// other directories and files, or no directory at all, say none.
func TestKubeadmUpgradeSince(t *testing.T) {
	dir := t.TempDir()
	assert.True(t, KubeadmUpgradeSince(filepath.Join(dir, "missing")).IsZero())
	require.NoError(t, os.Mkdir(filepath.Join(dir, "kubeadm-backup-manifests-2026-11-28-20-01-02"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kubeadm-upgraded-manifests-stray-file"), nil, 0o600))
	assert.True(t, KubeadmUpgradeSince(dir).IsZero(), "a backup, or a file, is no upgrade under way")

	older, newer := filepath.Join(dir, "kubeadm-upgraded-manifests111"), filepath.Join(dir, "kubeadm-upgraded-manifests222")
	require.NoError(t, os.Mkdir(older, 0o700))
	require.NoError(t, os.Mkdir(newer, 0o700))
	at := time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC)
	require.NoError(t, os.Chtimes(older, at, at))
	require.NoError(t, os.Chtimes(newer, at.Add(time.Minute), at.Add(time.Minute)))
	assert.True(t, KubeadmUpgradeSince(dir).Equal(at.Add(time.Minute)))
	require.NoError(t, os.Remove(newer))
	require.NoError(t, os.Remove(older))
	assert.True(t, KubeadmUpgradeSince(dir).IsZero(), "done: kubeadm removed it")
}
