package hub

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
)

// A leading hub checks every BMC when it starts: a BMC that fails is said once (a Warning, an Event in
// Kubernetes mode), shown in status and explain and counted in hale_hub_bmc_ready; fixed, the next
// check says it is ready again.
func TestHubChecksItsBMCs(t *testing.T) {
	r := newPassRig(t, newTestPool(3), testPolicy(), nil)
	r.hub.cfg.BMC.Retries, r.hub.cfg.BMCCheckInterval = -1, time.Hour
	var mu sync.Mutex
	var said []string
	r.hub.cfg.OnNotice = func(_ time.Time, msg string) { mu.Lock(); said = append(said, msg); mu.Unlock() }
	saidAbout := func(prefix string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range said {
			if strings.HasPrefix(s, prefix) {
				n++
			}
		}
		return n
	}
	r.sim.SetFaults(bmcsim.Faults{Fail500: 1 << 30})
	r.run(t)
	require.Eventually(t, func() bool {
		for _, m := range r.hub.Status(context.Background()).Machines {
			if m.BMC == nil || m.BMC.Ready {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)
	st := r.machine("cp-1")
	assert.Equal(t, bmc.ProblemAnswer, st.BMC.Problem)
	assert.Contains(t, st.BMC.Error, "HTTP 500")
	assert.Equal(t, 1, saidAbout("cp-1: BMC not ready (BadAnswer): "+st.BMC.Error))
	assert.Equal(t, map[string]float64{"cp-0": 0, "cp-1": 0, "cp-2": 0}, bmcReadyGauges(t, r.hub.cfg.Metrics.(*prometheus.Registry)))
	why, err := r.hub.Explain(context.Background(), "cp-1")
	require.NoError(t, err)
	assert.Contains(t, why.String(), "bmc: NOT READY (BadAnswer), checked at ")

	r.sim.SetFaults(bmcsim.Faults{})
	r.hub.checkBMCsOnce(t.Context())
	assert.Equal(t, 1, saidAbout("cp-1: BMC ready again (power On)"))
	assert.True(t, r.machine("cp-1").BMC.Ready)
	assert.Equal(t, map[string]float64{"cp-0": 1, "cp-1": 1, "cp-2": 1}, bmcReadyGauges(t, r.hub.cfg.Metrics.(*prometheus.Registry)))
	r.hub.checkBMCsOnce(t.Context())
	assert.Equal(t, 1, saidAbout("cp-1: BMC"+" ready again"), "said once, when it changed")

	// A wrong password, put right in the inventory (SIGHUP): checked again at once, not an hour later.
	inv := r.hub.inventory()
	bad := inv
	bad.Machines = slices.Clone(inv.Machines)
	for i := range bad.Machines {
		bad.Machines[i].Credentials = bmc.NewCredentials("admin", "wrong-password")
	}
	require.NoError(t, r.hub.SetInventory(bad))
	require.Eventually(t, func() bool { return r.machine("cp-1").BMC.Problem == bmc.ProblemLogin }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, r.hub.SetInventory(inv))
	require.Eventually(t, func() bool { return r.machine("cp-1").BMC.Ready }, 10*time.Second, 10*time.Millisecond,
		"the corrected login checked at once")
}

// bmcReadyGauges is hale_hub_bmc_ready by machine.
func bmcReadyGauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "hale_hub_bmc_ready" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	return out
}
