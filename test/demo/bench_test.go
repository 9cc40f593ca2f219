package demo

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/test/lab/inproc"
)

// BenchmarkDetectionToAction hangs one machine of the demo topology at a time (its agent and etcd
// member stop, no goodbye) and measures, over HALE_TRIALS trials (default 20): failure → the hub's
// verdict Unhealthy, Unhealthy → the first request at the machine's BMC (seen by the simulator), and
// failure → first BMC request; the rate limit is lifted. Targets: ≤ 2 s p99 to Unhealthy, ≤ 100 ms p99 from Unhealthy to the BMC.
// Run it with -benchtime 1x: all the trials are one iteration.
func BenchmarkDetectionToAction(b *testing.B) {
	trials := 20
	if s := os.Getenv("HALE_TRIALS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err, "HALE_TRIALS")
		trials = n
	}
	var mu sync.Mutex
	var armed time.Time // the failure of the trial under way
	var victim string
	var unhealthyAt, bmcAt time.Time
	tb, err := inproc.Start(inproc.Options{Dir: b.TempDir(),
		OnRequest: func(_ string, _ *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if !armed.IsZero() && bmcAt.IsZero() {
				bmcAt = time.Now()
			}
		},
		OnNotice: func(at time.Time, msg string) {
			mu.Lock()
			defer mu.Unlock()
			if !armed.IsZero() && unhealthyAt.IsZero() && strings.HasPrefix(msg, victim+" is Unhealthy") {
				unhealthyAt = at
			}
		}})
	require.NoError(b, err)
	b.Cleanup(tb.Close)
	// 20 remediations in ~60 s is a storm by design: lift the rate limit, which is not what is measured.
	require.NoError(b, tb.StartHub(inproc.HubOptions{Inventory: func(inv *pass.Inventory) { inv.Policy.RateMax = 1000 }}))
	ctx := b.Context()

	var toUnhealthy, toBMC, total []time.Duration
	for b.Loop() {
		for trial := range trials {
			i := trial % inproc.Machines
			require.NoError(b, tb.Settle(ctx))
			before := takeSnapshot(InProcess(tb))
			mu.Lock()
			victim, unhealthyAt, bmcAt = inproc.Name(i), time.Time{}, time.Time{}
			armed = time.Now()
			failed := armed
			mu.Unlock()
			tb.Hang(i)
			require.NoError(b, tb.WaitFor(ctx, 60*time.Second, "the remediation to succeed", succeeded(InProcess(tb), before, i)))
			mu.Lock()
			armed = time.Time{}
			u, c := unhealthyAt, bmcAt
			mu.Unlock()
			require.False(b, u.IsZero() || c.IsZero(), "trial %d: no Unhealthy verdict or no BMC request seen", trial)
			toUnhealthy, toBMC, total = append(toUnhealthy, u.Sub(failed)), append(toBMC, c.Sub(u)), append(total, c.Sub(failed))
		}
	}
	report := func(name string, lat []time.Duration, target time.Duration) {
		slices.Sort(lat)
		pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
		b.ReportMetric(float64(pct(0.50).Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(pct(0.99).Microseconds())/1000, name+"-p99-ms")
		if target > 0 {
			verdict := "met"
			if pct(0.99) > target {
				verdict = "MISSED"
			}
			fmt.Printf("%s: p50 %v p99 %v max %v over %d trials (target p99 ≤ %v: %s)\n", name, pct(0.50).Round(time.Millisecond),
				pct(0.99).Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), len(lat), target, verdict)
		}
	}
	report("to-unhealthy", toUnhealthy, 2*time.Second)
	report("unhealthy-to-bmc", toBMC, 100*time.Millisecond)
	report("failure-to-bmc", total, 0)
}
