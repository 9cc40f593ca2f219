package bmc

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/ipmisim"
)

func ipmiController(t *testing.T, sim *ipmisim.Sim, password string, logs *capture.Buffer) *Controller {
	t.Helper()
	ep, err := ParseEndpoint(sim.Endpoint())
	require.NoError(t, err)
	c, err := New(ep, NewCredentials(sim.Username, password), Options{PollInterval: 50 * time.Millisecond,
		VerifyTimeout: 10 * time.Second, GracefulTimeout: 5 * time.Second, RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	return c
}

// TestIPMIAgainstIPMISim drives Debian's ipmi_sim through bmclib's ipmitool provider: status, off
// (graceful), on, cycle, reboot, each verified, and counts the power actions the BMC received.
func TestIPMIAgainstIPMISim(t *testing.T) {
	sim := ipmisim.Start(t)
	logs := &capture.Buffer{}
	c := ipmiController(t, sim, sim.Password, logs)
	ctx := context.Background()

	st, err := c.PowerState(ctx)
	require.NoError(t, err)
	assert.Equal(t, PowerOn, st)

	res, err := c.PowerOff(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"chassis power soft"}, res.Requests, "graceful first; the simulated OS shuts down")
	assert.Equal(t, PowerOff, res.After)
	assert.False(t, sim.Power())

	res, err = c.PowerOff(ctx)
	require.NoError(t, err)
	assert.True(t, res.Already, "off when already off is success")

	res, err = c.PowerOn(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"chassis power on"}, res.Requests)
	assert.True(t, sim.Power())

	before := len(sim.Actions())
	res, err = c.PowerCycle(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"chassis power cycle"}, res.Requests)
	assert.Equal(t, "Off then On observed after PowerCycle", res.Evidence)
	assert.Equal(t, []string{"power 0", "power 1"}, sim.Actions()[before:], "exactly one cycle at the BMC")

	res, err = c.Reboot(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"chassis power cycle"}, res.Requests, "IPMI has no graceful restart: hard cycle")
	assert.True(t, sim.Power())
	assert.NotContains(t, logs.String(), sim.Password)
}

func TestIPMIErrors(t *testing.T) {
	sim := ipmisim.Start(t)
	ctx := context.Background()

	t.Run("wrong password is an auth failure, not retried", func(t *testing.T) {
		logs := &capture.Buffer{}
		start := time.Now()
		_, err := ipmiController(t, sim, "wrong-password", logs).PowerOff(ctx)
		require.ErrorIs(t, err, ErrAuth)
		assert.Contains(t, err.Error(), `the BMC rejected user "admin"`)
		assert.Contains(t, err.Error(), "check the credentials")
		assert.NotContains(t, logs.String(), "retrying")
		assert.Less(t, time.Since(start), 5*time.Second)
		assert.True(t, sim.Power(), "nothing happened to the machine")
		noSecret(t, err)
	})
	t.Run("a session failure from a BMC that does not answer is transient", func(t *testing.T) {
		// ipmitool says the same for a wrong password and for silence; one verbose call tells them apart.
		ep, err := ParseEndpoint("ipmi://127.0.0.1:1")
		require.NoError(t, err)
		c, err := New(ep, NewCredentials("admin", "x"), Options{})
		require.NoError(t, err)
		cerr := c.drv.(*ipmiDriver).classify(ctx, ctx, "chassis power status", errors.New(sessionFailure))
		assert.Equal(t, classTransient, classOf(cerr))
		assert.ErrorIs(t, cerr, ErrUnreachable)
		assert.EqualError(t, cerr, "chassis power status: no IPMI session with 127.0.0.1:1 (or IPMI over LAN disabled)")
		assert.Equal(t, "ipmi://127.0.0.1:1 status: BMC unreachable: chassis power status: no IPMI session with 127.0.0.1:1 (or IPMI over LAN disabled); "+
			"check the address, the port and the network path to the BMC", c.explain("status", cerr).Error())
		assert.Equal(t, ProblemUnreachable, ProblemOf(c.explain("status", cerr)))
	})
	t.Run("an unreachable BMC ends at the caller's deadline", func(t *testing.T) {
		ep, err := ParseEndpoint("ipmi://127.0.0.1:1")
		require.NoError(t, err)
		c, err := New(ep, NewCredentials("admin", "x"), Options{Retries: -1})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err = c.PowerState(ctx)
		require.ErrorIs(t, err, ErrRefused)
		assert.NotErrorIs(t, err, ErrAuth)
		assert.Less(t, time.Since(start), 6*time.Second)
	})
	t.Run("ipmitool missing says so", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		ep, err := ParseEndpoint(sim.Endpoint())
		require.NoError(t, err)
		_, err = New(ep, NewCredentials("admin", "x"), Options{})
		require.ErrorContains(t, err, "ipmitool is not on PATH; install it (Debian: apt-get install ipmitool)")
	})
}
