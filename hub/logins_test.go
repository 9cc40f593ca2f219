package hub

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/pass"
)

func loginMachine(t *testing.T, name, endpoint, user, password string) pass.Machine {
	t.Helper()
	ep, err := bmc.ParseEndpoint(endpoint)
	require.NoError(t, err)
	return pass.Machine{MachineRef: assess.MachineRef{Name: name}, Endpoint: ep, Credentials: bmc.NewCredentials(user, password)}
}

// The login record: a failed login starts a wait for the account (the BMC and the user: its other
// systems share it) that doubles with each failure in a row up to 12 times the base; a success ends
// it, other answers keep it, and other credentials for the account are not held by it.
func TestLoginWaits(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	authErr := fmt.Errorf("redfish://bmc:443 power cycle: %w: 401", bmc.ErrAuth)
	a := loginMachine(t, "cp-0", "redfish://bmc/systems/1", "admin", "wrong")
	sameBMC := loginMachine(t, "cp-1", "redfish://bmc/systems/2", "admin", "wrong")
	otherUser := loginMachine(t, "cp-1", "redfish://bmc/systems/2", "ops", "wrong")
	otherBMC := loginMachine(t, "cp-2", "redfish://bmc2/systems/1", "admin", "wrong")
	fixed := loginMachine(t, "cp-0", "redfish://bmc/systems/1", "admin", "right")

	l := newLogins(time.Minute)
	assert.Empty(t, l.blocked(a, t0), "nothing failed yet")
	l.record(a, authErr, t0)
	why := l.blocked(sameBMC, t0.Add(59*time.Second))
	assert.Contains(t, why, `its BMC redfish://bmc:443 refused the credentials of user "admin" at 12:00:00 (1 in a row`)
	assert.Contains(t, why, "no login to that account before 12:01:00, so that it does not lock")
	assert.NotContains(t, why, "wrong", "never the password")
	assert.Empty(t, l.blocked(a, t0.Add(time.Minute)), "the wait ends")
	assert.Empty(t, l.blocked(otherUser, t0), "another account")
	assert.Empty(t, l.blocked(otherBMC, t0), "another BMC")
	assert.Empty(t, l.blocked(fixed, t0), "other credentials try at once")

	// Each failure in a row doubles the wait, up to 12 times the base.
	at := t0
	for i, want := range []time.Duration{2, 4, 8, 12, 12} {
		at = at.Add(time.Hour)
		l.record(a, authErr, at)
		assert.NotEmpty(t, l.blocked(a, at.Add(want*time.Minute-time.Second)), "failure %d", i+2)
		assert.Empty(t, l.blocked(a, at.Add(want*time.Minute)), "failure %d", i+2)
	}
	for range 100 { // days of failures: the wait stays at its longest
		at = at.Add(time.Hour)
		l.record(a, authErr, at)
	}
	assert.NotEmpty(t, l.blocked(a, at.Add(12*time.Minute-time.Second)), "after 106 failures in a row")
	l.record(a, fmt.Errorf("%w: 500", bmc.ErrRefused), at)
	assert.NotEmpty(t, l.blocked(a, at), "an answer that proves no login keeps the wait")
	l.record(a, nil, at)
	assert.Empty(t, l.blocked(a, at), "a login that worked ends it")
	l.record(a, authErr, at)
	assert.Contains(t, l.blocked(a, at), "(1 in a row", "counted again from one")

	// A wait recorded for old credentials is not the new ones', and their failure starts afresh.
	l.record(fixed, authErr, at)
	assert.Contains(t, l.blocked(fixed, at), "(1 in a row")

	// An operator's check now (`hub check --now`) lifts the wait for one login; refused again, the
	// wait is the next one in the row.
	l.lift(at)
	assert.Empty(t, l.blocked(fixed, at), "lifted")
	l.record(fixed, authErr, at)
	assert.Contains(t, l.blocked(fixed, at.Add(2*time.Minute-time.Second)), "(2 in a row")
}

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
	r.hub.logins = newLogins(time.Hour)
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

	_, err = r.hub.Reboot(t.Context(), RebootRequest{Machine: "cp-0", Force: true, By: "alice"})
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
