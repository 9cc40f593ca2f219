package main

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/netns"
)

func machinesOf(actions []powerAction) []string {
	var out []string
	for _, a := range actions {
		out = append(out, a.Machine)
	}
	return out
}

// TestChaos is CI's short campaign on real processes: the checker's self-test (it must object to a
// healthy voter power-cycled behind the hub's back), the named schedules (permanent-loss: the whole
// recovery, run by the operator's commands), and a few fixed seeds (seed 3
// made way for the far-side schedule; HALE_CHAOS_SEEDS=1,2,3 runs it). The
// README has the long campaign's command and figures. HALE_CHAOS_SEEDS overrides the seeds (a
// comma-separated list; "none" for none).
func TestChaos(t *testing.T) {
	if why := netns.Available(); why != "" {
		t.Fatalf("test/chaos: %s (test/run installs what it needs and runs as root)", why)
	}
	// Not t.TempDir: a failing run's logs outlive the test (its line says where they are).
	dir, err := os.MkdirTemp("", "hale-chaos-test-")
	require.NoError(t, err)
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
	bins, cleanup, err := build(dir)
	require.NoError(t, err)
	t.Cleanup(cleanup)
	base := options{runs: 1, heal: 120 * time.Second, dir: dir, binaries: bins,
		replay: "go run ./test/chaos"}
	campaignOf := func(t *testing.T, o options) []result {
		var out bytes.Buffer
		o.out = &out
		results, err := campaign(t.Context(), o)
		fmt.Print(out.String())
		require.NoError(t, err)
		require.Len(t, results, 1)
		require.Empty(t, results[0].Err, "the harness failed:\n%s", out.String())
		return results
	}

	// The runs go side by side (test/run gives -test.parallel 2; go test's default is GOMAXPROCS): each
	// lab keeps well under a core busy, and safety does not depend on a quiet machine (test/run prints
	// the stage's cores busy).
	t.Run("checker-selftest", func(t *testing.T) {
		t.Parallel()
		o := base
		o.schedule, o.duration = selfTest(0).Name, 40*time.Second
		r := campaignOf(t, o)[0]
		require.NotEmpty(t, r.Violations[1], "the checker missed a healthy voter power-cycled behind the hub's back: %s", r.line())
		require.Contains(t, r.Violations[1][0], "cp-1 powered off by Hale while a healthy voter of a working quorum")
	})
	for _, name := range scheduleNames() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := base
			o.schedule, o.duration = name, 60*time.Second
			r := campaignOf(t, o)[0]
			require.True(t, r.passed(), r.line())
			switch name {
			case "hub-dies-in-step":
				require.Equal(t, 1, r.KilledInStep, "the hub was not killed inside the BMC step: %s", r.line())
				require.Equal(t, 1, r.count("hale"), "the dead member's machine power-cycled once, across the hub's death: %s", r.line())
			case "far-side":
				// At most one cycle per far-side member (the checker fails a repeat), none on the
				// hub's side at or after the heal, and after it every machine healthy, none held.
				per := map[string]int{}
				for _, a := range r.Actions {
					per[a.Machine]++
				}
				require.Zero(t, per["cp-0"], "cp-0, on the hub's side, was power-cycled: %s", r.line())
				require.LessOrEqual(t, per["cp-1"], 1, r.line())
				require.LessOrEqual(t, per["cp-2"], 1, r.line())
				require.NotZero(t, r.HealedIn, r.line())
				refusedRecovery(t, r, "cp-1 (etcd-1): its BMC reads the host powered on")
				refusedRecovery(t, r, "cp-2 (etcd-2): its BMC reads the host powered on")
				require.NotContains(t, r.Recoveries[0], "cp-0", "cp-0's member answers the hub's side: a survivor, not lost")
			case "minority-hub":
				refusedRecovery(t, r, "does not plan")
			case "permanent-loss":
				// The operator's whole recovery ran to its end, Hale powered nothing off, and the second
				// lost machine's power-on was refused while the first could still run the old cluster.
				require.Equal(t, opRecoverAll+": ok", r.Operator[len(r.Operator)-1], "%q", r.Operator)
				require.Zero(t, r.count("hale"), r.line())
				require.NotZero(t, r.HealedIn, r.line())
				count := func(prefix string) int {
					n := 0
					for _, o := range r.Operator {
						if strings.HasPrefix(o, prefix) {
							n++
						}
					}
					return n
				}
				require.Equal(t, 1, count("agent-recover: ok"), "%q", r.Operator)
				require.Equal(t, 2, count("agent-rejoin: ok"), "%q", r.Operator)
				require.True(t, slices.ContainsFunc(r.Operator, func(o string) bool {
					return strings.HasPrefix(o, "reboot: failed:") && strings.Contains(o, "2 of the old cluster's members would run, its quorum (2)")
				}), "%q", r.Operator)
			case "forger":
				// cp-1 power-cycled once, for its real death; the forgers' reports and claims refused
				// and counted by the hub: cp-1's (signed by a key not pinned for it) and cp-9's (no key
				// pinned for that name).
				require.Equal(t, []string{"cp-1"}, machinesOf(r.Actions), r.line())
				require.Positive(t, r.Rejected["alive_bad_signature"]+r.Rejected["bad_signature"], "%v", r.Rejected)
				require.Positive(t, r.Rejected["alive_unknown_node"]+r.Rejected["unknown_node"], "%v", r.Rejected)
				require.True(t, r.HubSees, "after cp-0's key was rotated, the hub hears every observer and calls every machine Healthy: %s", r.line())
			}
		})
	}
	seeds := []string{"1", "2"}
	if s := os.Getenv("HALE_CHAOS_SEEDS"); s != "" {
		seeds = strings.Split(s, ",")
		if s == "none" {
			seeds = nil
		}
	}
	for _, s := range seeds {
		t.Run("seed-"+s, func(t *testing.T) {
			t.Parallel()
			o := base
			_, err := fmt.Sscan(s, &o.seed)
			require.NoError(t, err, "HALE_CHAOS_SEEDS")
			o.duration = 90 * time.Second
			r := campaignOf(t, o)[0]
			require.True(t, r.passed(), r.line())
		})
	}
}

// refusedRecovery: the run's one `hub recover --yes` (no machine confirmed lost) was refused, saying
// why (want) and what to do.
func refusedRecovery(t *testing.T, r result, want string) {
	t.Helper()
	require.Len(t, r.Recoveries, 1, r.line())
	require.Contains(t, r.Recoveries[0], "failed: hub: refused: the recovery plan is not ready")
	require.Contains(t, r.Recoveries[0], want)
}
