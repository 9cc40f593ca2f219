package hub

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// No step of a remediation in flight starts while the hub is paused or suspended (observe-only
// executes nothing); it starts once the last of them is lifted.
func TestGateHoldsStepsWhilePausedOrSuspended(t *testing.T) {
	type brake struct {
		set  func(h *Hub, on bool) error
		name string
	}
	pause := brake{func(h *Hub, on bool) error { return h.SetPaused(context.Background(), on, "test", "") }, "paused"}
	suspend := brake{func(h *Hub, on bool) error { return h.SetSuspended(context.Background(), on, "test", "") }, "suspended"}
	cluster := brake{func(h *Hub, on bool) error { h.SetPause("Cluster API Cluster ns/prod", on, "paused"); return nil }, "Cluster paused"}
	tests := []struct {
		name   string
		brakes []brake // set in order, lifted in order: the gate opens after the last
	}{
		{"paused", []brake{pause}},
		{"suspended", []brake{suspend}},
		{"paused by the Cluster", []brake{cluster}},
		{"suspended and paused", []brake{suspend, pause}},
		{"paused and suspended", []brake{pause, suspend}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := OpenJournal(filepath.Join(t.TempDir(), "journal.db"), 0)
			require.NoError(t, err)
			t.Cleanup(func() { _ = j.Close() })
			h, err := New(Config{Inventory: Inventory{Cluster: "test"}, Gossip: &testPool{}, Journal: j, Metrics: prometheus.NewRegistry()})
			require.NoError(t, err)
			for _, b := range tt.brakes {
				require.NoError(t, b.set(h, true))
			}
			passed := make(chan error, 1)
			go func() { passed <- h.gate("cp-0")(t.Context()) }()
			for _, b := range tt.brakes {
				select {
				case err := <-passed:
					t.Fatalf("the gate opened while %s: %v", b.name, err)
				case <-time.After(100 * time.Millisecond):
				}
				require.NoError(t, b.set(h, false))
			}
			select {
			case err := <-passed:
				assert.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("the gate stayed shut after every brake was lifted")
			}
		})
	}
}
