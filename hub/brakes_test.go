package hub

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
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
			j, err := boltfile.Open(filepath.Join(t.TempDir(), "journal.db"), 0)
			require.NoError(t, err)
			t.Cleanup(func() { _ = j.Close() })
			h, err := New(Config{Inventory: pass.Inventory{Cluster: "test"}, Gossip: &testPool{}, Journal: j, Metrics: prometheus.NewRegistry()})
			require.NoError(t, err)
			for _, b := range tt.brakes {
				require.NoError(t, b.set(h, true))
			}
			passed := make(chan error, 1)
			go func() { passed <- h.gate("cp-0", func() error { return nil })(t.Context()) }()
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

// `hub suspend` and `hub detach` answer once no step they hold is inside a BMC call: a step past its
// checkpoint when the brake came completes, and what the command returns is a brake in force over
// nothing still being carried out (as a pause is acknowledged).
func TestSuspendAndDetachAnswerOnceNoStepIsBusy(t *testing.T) {
	for _, tc := range []struct{ name, path string }{
		{"suspend", "/v1/suspend"},
		{"detach", "/v1/machines/cp-0/detach"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, err := boltfile.Open(filepath.Join(t.TempDir(), "journal.db"), 0)
			require.NoError(t, err)
			t.Cleanup(func() { _ = j.Close() })
			inv := pass.Inventory{Cluster: "test", Machines: []pass.Machine{{MachineRef: assess.MachineRef{Name: "cp-0", Node: "cp-0"}}}}
			h, err := New(Config{Inventory: inv, Gossip: &testPool{}, Journal: j, Metrics: prometheus.NewRegistry()})
			require.NoError(t, err)
			api := httptest.NewServer(h.APIHandler(""))
			t.Cleanup(api.Close)
			r := &running{rem: journal.Remediation{Machine: "cp-0"}, busy: true} // inside its power-cycle
			h.mu.Lock()
			h.running["cp-0"] = r
			h.mu.Unlock()
			answered := make(chan int, 1)
			go func() {
				resp, err := http.Post(api.URL+tc.path, "application/json", nil)
				if err != nil {
					answered <- 0
					return
				}
				resp.Body.Close()
				answered <- resp.StatusCode
			}()
			select {
			case code := <-answered:
				t.Fatalf("answered (%d) while a step it holds was inside a BMC call", code)
			case <-time.After(300 * time.Millisecond):
			}
			h.mu.Lock()
			r.busy = false // the step's outcome is recorded
			h.mu.Unlock()
			select {
			case code := <-answered:
				assert.Equal(t, http.StatusOK, code)
			case <-time.After(5 * time.Second):
				t.Fatal("no answer once the step was done")
			}
		})
	}
}
