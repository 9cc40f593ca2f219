package bmcaccess

import (
	"fmt"
	"testing"
	"time"

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

	l := NewLogins(time.Minute)
	assert.Empty(t, l.Blocked(a, t0), "nothing failed yet")
	l.Record(a, authErr, t0)
	why := l.Blocked(sameBMC, t0.Add(59*time.Second))
	assert.Contains(t, why, `its BMC redfish://bmc:443 refused the credentials of user "admin" at 12:00:00 (1 in a row`)
	assert.Contains(t, why, "no login to that account before 12:01:00, so that it does not lock")
	assert.NotContains(t, why, "wrong", "never the password")
	assert.Empty(t, l.Blocked(a, t0.Add(time.Minute)), "the wait ends")
	assert.Empty(t, l.Blocked(otherUser, t0), "another account")
	assert.Empty(t, l.Blocked(otherBMC, t0), "another BMC")
	assert.Empty(t, l.Blocked(fixed, t0), "other credentials try at once")

	// Each failure in a row doubles the wait, up to 12 times the base.
	at := t0
	for i, want := range []time.Duration{2, 4, 8, 12, 12} {
		at = at.Add(time.Hour)
		l.Record(a, authErr, at)
		assert.NotEmpty(t, l.Blocked(a, at.Add(want*time.Minute-time.Second)), "failure %d", i+2)
		assert.Empty(t, l.Blocked(a, at.Add(want*time.Minute)), "failure %d", i+2)
	}
	for range 100 { // days of failures: the wait stays at its longest
		at = at.Add(time.Hour)
		l.Record(a, authErr, at)
	}
	assert.NotEmpty(t, l.Blocked(a, at.Add(12*time.Minute-time.Second)), "after 106 failures in a row")
	l.Record(a, fmt.Errorf("%w: 500", bmc.ErrRefused), at)
	assert.NotEmpty(t, l.Blocked(a, at), "an answer that proves no login keeps the wait")
	l.Record(a, nil, at)
	assert.Empty(t, l.Blocked(a, at), "a login that worked ends it")
	l.Record(a, authErr, at)
	assert.Contains(t, l.Blocked(a, at), "(1 in a row", "counted again from one")

	// A wait recorded for old credentials is not the new ones', and their failure starts afresh.
	l.Record(fixed, authErr, at)
	assert.Contains(t, l.Blocked(fixed, at), "(1 in a row")

	// An operator's check now (`hub check --now`) lifts the wait for one login; refused again, the
	// wait is the next one in the row.
	l.Lift(at)
	assert.Empty(t, l.Blocked(fixed, at), "lifted")
	l.Record(fixed, authErr, at)
	assert.Contains(t, l.Blocked(fixed, at.Add(2*time.Minute-time.Second)), "(2 in a row")
}
