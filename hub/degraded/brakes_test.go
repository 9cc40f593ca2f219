package degraded

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
)

// The brakes a degraded term recorded are carried back into the policy's store: each one it lacks is
// added with who set it and why; none the policy holds is replaced or lifted.
func TestImportBrakes(t *testing.T) {
	since := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	recovery := &pass.Brake{By: "alice", Reason: "etcd recovery hale-c1-1", Since: since}
	maintenance := &pass.Brake{By: "bob", Reason: "maintenance window", Since: since}
	tests := []struct {
		name         string
		policy, term pass.Brakes
		want         pass.Brakes
		added        []string
	}{
		{name: "nothing recorded", policy: pass.Brakes{Paused: maintenance}, want: pass.Brakes{Paused: maintenance}},
		{name: "the recovery's pause carried back", term: pass.Brakes{Paused: recovery}, want: pass.Brakes{Paused: recovery},
			added: []string{"paused by alice: etcd recovery hale-c1-1 (since 2026-11-26T03:00:00Z)"}},
		{name: "the policy's own pause kept", policy: pass.Brakes{Paused: maintenance}, term: pass.Brakes{Paused: recovery}, want: pass.Brakes{Paused: maintenance}},
		{name: "a suspend and a detach added to the policy's", policy: pass.Brakes{Detached: map[string]pass.Brake{"cp-0": *maintenance}},
			term:  pass.Brakes{Suspended: maintenance, Detached: map[string]pass.Brake{"cp-0": *recovery, "cp-1": *recovery}},
			want:  pass.Brakes{Suspended: maintenance, Detached: map[string]pass.Brake{"cp-0": *maintenance, "cp-1": *recovery}},
			added: []string{"suspended by bob: maintenance window (since 2026-11-26T03:00:00Z)", "cp-1 detached by alice: etcd recovery hale-c1-1 (since 2026-11-26T03:00:00Z)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store, err := boltfile.Open(filepath.Join(t.TempDir(), "policy.db"), 0)
			require.NoError(t, err)
			defer store.Close()
			require.NoError(t, store.SaveBrakes(t.Context(), tt.policy))
			added, err := ImportBrakes(t.Context(), store, tt.term)
			require.NoError(t, err)
			assert.Equal(t, tt.added, added)
			got, err := store.LoadBrakes(t.Context())
			require.NoError(t, err)
			assert.Equal(t, tt.want.Paused, got.Paused)
			assert.Equal(t, tt.want.Suspended, got.Suspended)
			assert.Equal(t, len(tt.want.Detached), len(got.Detached))
			for m, b := range tt.want.Detached {
				assert.Equal(t, b, got.Detached[m], m)
			}
		})
	}
}
