package hub

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/bmcaccess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
)

// Across passes, machines and requests, the hub makes one failed login to a BMC account that refuses
// its credentials until the wait ends (here: never, within the test): the first remediation fails;
// the other machine behind the same BMC is held with the reason, a manual reboot is refused with it,
// status and /metrics show it, and nothing else reaches the BMC. An inventory with the corrected
// password ends the wait at once and both are healed.
func TestOneFailedLoginPerBMCAccountAcrossPasses(t *testing.T) {
	p := testPolicy()
	p.RateMax = 1 // one start at a time, so that the second machine meets the wait, not a running login
	pool := newTestPool(5, "cp-3", "cp-4")
	r := newPassRig(t, pool, p, nil)
	r.hub.logins = bmcaccess.NewLogins(time.Hour)
	good := r.hub.inventory()
	bad := good
	bad.Machines = append([]pass.Machine(nil), good.Machines...)
	for i := range bad.Machines {
		bad.Machines[i].Credentials = bmc.NewCredentials("admin", "wrong-password")
	}
	require.NoError(t, r.hub.SetInventory(bad))
	r.run(t)

	require.Eventually(t, func() bool { return r.sim.FailedLogins() == 1 }, 15*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return r.machine("cp-3").Remediation == nil && r.machine("cp-4").Remediation == nil },
		15*time.Second, 10*time.Millisecond, "the failed remediation ends")
	r.awaitPasses(t, 50)
	assert.Equal(t, 1, r.sim.FailedLogins(), "one failed login in 50 passes")
	requests := r.sim.Requests()
	held := 0
	for _, name := range []string{"cp-3", "cp-4"} {
		if d := r.machine(name).Decision; d != "" {
			assert.Contains(t, d, "refused the credentials", name)
			held++
		}
	}
	assert.Positive(t, held, "a machine is held by the wait: %+v", r.hub.Status(t.Context()).Machines)
	for _, m := range r.hub.Status(t.Context()).Machines {
		assert.Contains(t, m.BMCLogin, `refused the credentials of user "admin"`, m.Name)
		assert.NotContains(t, m.BMCLogin, "wrong-password")
	}
	reg := r.hub.cfg.Metrics.(*prometheus.Registry)
	n, err := testutil.GatherAndCount(reg, "hale_hub_bmc_login_waits")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "hale_hub_bmc_login_waits" {
			assert.Equal(t, 5.0, mf.GetMetric()[0].GetGauge().GetValue(), "every machine behind the BMC")
		}
	}

	_, err = r.hub.Reboot(t.Context(), operator.RebootRequest{Machine: "cp-0", Force: true, By: "alice"})
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "cp-0: its BMC")
	assert.Contains(t, err.Error(), "correct the credentials in the inventory")
	assert.Equal(t, requests, r.sim.Requests(), "nothing reached the BMC while the account waits")
	assert.Equal(t, 1, r.sim.FailedLogins())

	good.Policy.RateMax, good.Policy.Cooldown = 3, time.Millisecond // (cp-3's failed remediation is no reason to wait)
	require.NoError(t, r.hub.SetInventory(good))
	require.Eventually(t, func() bool { return len(r.sim.Resets("cp-3")) > 0 && len(r.sim.Resets("cp-4")) > 0 }, 30*time.Second, 10*time.Millisecond,
		"the corrected password ends the wait")
	assert.Equal(t, 1, r.sim.FailedLogins())
	assert.Empty(t, r.machine("cp-0").BMCLogin)
}
