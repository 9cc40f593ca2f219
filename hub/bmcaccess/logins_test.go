package bmcaccess

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/execute"
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
	l.Record(a, authErr, t0, t0)
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
		l.Record(a, authErr, at, at)
		assert.NotEmpty(t, l.Blocked(a, at.Add(want*time.Minute-time.Second)), "failure %d", i+2)
		assert.Empty(t, l.Blocked(a, at.Add(want*time.Minute)), "failure %d", i+2)
	}
	for range 100 { // days of failures: the wait stays at its longest
		at = at.Add(time.Hour)
		l.Record(a, authErr, at, at)
	}
	assert.NotEmpty(t, l.Blocked(a, at.Add(12*time.Minute-time.Second)), "after 106 failures in a row")
	l.Record(a, fmt.Errorf("%w: 500", bmc.ErrRefused), at, at)
	assert.NotEmpty(t, l.Blocked(a, at), "an answer that proves no login keeps the wait")
	l.Record(a, nil, at, at)
	assert.Empty(t, l.Blocked(a, at), "a login that worked ends it")
	l.Record(a, authErr, at, at)
	assert.Contains(t, l.Blocked(a, at), "(1 in a row", "counted again from one")

	// A wait recorded for old credentials is not the new ones', and their failure starts afresh.
	l.Record(fixed, authErr, at, at)
	assert.Contains(t, l.Blocked(fixed, at), "(1 in a row")

	// An operator's check now (`hub check --now`) lifts the wait for one login; refused again, the
	// wait is the next one in the row.
	l.lift(keyOf(fixed), at)
	assert.Empty(t, l.Blocked(fixed, at), "lifted")
	l.Record(fixed, authErr, at, at)
	assert.Contains(t, l.Blocked(fixed, at.Add(2*time.Minute-time.Second)), "(2 in a row")

	// A refusal of a call begun before a login that worked (the operator's check, once the password
	// was put right, while an older call was still under way) is not the credentials'.
	l.lift(keyOf(fixed), at)
	l.Record(fixed, nil, at, at.Add(time.Second))
	l.Record(fixed, authErr, at.Add(-time.Second), at.Add(2*time.Second))
	assert.Empty(t, l.Blocked(fixed, at.Add(2*time.Second)), "a call begun before the login that worked")
	l.Record(fixed, authErr, at.Add(time.Millisecond), at.Add(2*time.Second))
	assert.Contains(t, l.Blocked(fixed, at.Add(2*time.Second)), "(1 in a row", "one begun after it")
}

// statusPower is a Power whose Status answers the next error sent on answers (a test's BMC);
// started is told each Status begun.
type statusPower struct {
	execute.Power
	started chan struct{}
	answers chan error
}

func (p *statusPower) Status(ctx context.Context) (bmc.PowerState, time.Time, error) {
	p.started <- struct{}{}
	select {
	case err := <-p.answers:
		return bmc.PowerOn, time.Now(), err
	case <-ctx.Done():
		return "", time.Time{}, ctx.Err()
	}
}

// An operator's check now, while a periodic check of the account is under way (begun before the
// operator fixed the password, it is refused): it waits for that check and logs in itself, and its
// finding stands; the periodic check's refusal, older than its success, holds nothing. A periodic
// check at that moment leaves the account unchecked.
func TestCheckNowWaitsForACheckUnderWay(t *testing.T) {
	m := loginMachine(t, "cp-0", "redfish://bmc/systems/1", "admin", "secret")
	p := &statusPower{started: make(chan struct{}), answers: make(chan error)}
	powerFor := func(pass.Machine) (execute.Power, error) { return p, nil }
	l := NewLogins(time.Minute)
	periodic := make(chan map[string]pass.BMCReadiness)
	go func() { periodic <- l.Check(t.Context(), []pass.Machine{m}, powerFor) }()
	<-p.started // the periodic check logs in

	assert.Empty(t, l.Check(t.Context(), []pass.Machine{m}, powerFor), "another periodic check: not checked")
	now := make(chan map[string]pass.BMCReadiness)
	go func() { now <- l.CheckNow(t.Context(), []pass.Machine{m}, powerFor) }()
	select {
	case <-now:
		t.Fatal("the check now did not wait for the check under way")
	case <-time.After(50 * time.Millisecond):
	}
	p.answers <- fmt.Errorf("%w: 401", bmc.ErrAuth)
	assert.Equal(t, bmc.ProblemLogin, (<-periodic)["cp-0"].Problem)
	<-p.started // the check now logs in, after it
	p.answers <- nil
	assert.True(t, (<-now)["cp-0"].Ready)
	assert.Empty(t, l.Blocked(m, time.Now()))
}
