package bmc

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/ipmisim"
)

func TestHangKind(t *testing.T) {
	for _, tc := range []struct {
		sensor, event, want string
	}{
		// ipmitool's `sel list`, as bmclib splits it.
		{"OS Critical Stop #0x01", "Run-time critical stop : Asserted", HangOSCriticalStop},
		{"OS Critical Stop #0x01", "Critical stop during OS load : Asserted", HangOSCriticalStop},
		{"OS Critical Stop #0x01", "Run-time critical stop : Deasserted", ""},
		{"OS Critical Stop #0x01", "OS graceful shutdown : Asserted", ""},
		{"OS Critical Stop #0x01", "OS graceful stop : Asserted", ""},
		{"Processor #0x02", "IERR : Asserted", HangIERR},
		{"Processor #0x02", "Uncorrectable machine check exception : Asserted", HangMachineCheck},
		{"Processor #0x02", "Correctable machine check error : Deasserted", ""},
		{"Watchdog2 #0x03", "Timer expired : Asserted", HangWatchdog},
		{"Watchdog2 #0x03", "Power down : Asserted", HangWatchdog},
		{"Watchdog2 #0x03", "Hard reset : Asserted", ""}, // the BMC restarted it: it comes back by itself
		{"Watchdog2 #0x03", "Power cycle : Asserted", ""},
		{"Temperature #0x30", "Upper Critical going high : Asserted", ""},
		{"Memory #0x11", "Uncorrectable ECC : Asserted", ""},
		// Redfish LogEntry: SensorType, then the message, EntryCode and MessageId.
		{"OS Stop/Shutdown", "Run-time critical stop Assert ", HangOSCriticalStop},
		{"OS Stop/Shutdown", "OS graceful shutdown Assert ", ""},
		{"", "Kernel panic - not syncing: Fatal exception  OpenBMC.0.1.HostKernelPanic", HangOSCriticalStop},
		{"Processor", "CPU 1 machine check error Assert ", HangMachineCheck},
		{"Watchdog", "Host watchdog timer expired Assert ", HangWatchdog},
		{"", "The system booted", ""},
	} {
		assert.Equal(t, tc.want, hangKind(tc.sensor, tc.event), "%q %q", tc.sensor, tc.event)
	}
}

func TestParseSELTime(t *testing.T) {
	rel := func(d time.Duration) selTime { return selTime{t: time.Time{}.Add(d), relative: true} }
	for _, tc := range []struct {
		in   string
		want selTime
		err  bool
	}{
		{in: "12/02/26 03:23:43 UTC", want: selTime{t: time.Date(2026, 12, 2, 3, 23, 43, 0, time.UTC)}},
		{in: "12/01/26 22:23:43 EST", want: selTime{t: time.Date(2026, 12, 1, 22, 23, 43, 0, time.UTC)}},
		{in: "12/02/2026 03:23:43", want: selTime{t: time.Date(2026, 12, 2, 3, 23, 43, 0, time.UTC)}},
		{in: "Pre-Init 0000000511", want: rel(511 * time.Second)},
		{in: "S+ 00:08:36", want: rel(516 * time.Second)},
		{in: "S+ 27:00:01", want: rel(27*time.Hour + time.Second)},
		{in: "Pre-Init nope", err: true},
		{in: "yesterday", err: true},
		{in: "", err: true},
	} {
		got, err := parseSELTime(tc.in)
		if tc.err {
			assert.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
}

// TestRedfishEvidence reads the evidence of a hang from the simulator through gofish: the power, the
// health roll-up, and the SEL's entries that prove a hang (only those), dated in the reader's clock
// though the BMC's is two hours behind.
func TestRedfishEvidence(t *testing.T) {
	r := newRig(t, bmcsim.Config{ClockOffset: -2 * time.Hour})
	c := r.controller(r.sim.Endpoint()+"/systems/1", r.opts(), secret)
	ctx := context.Background()

	ev, err := c.Evidence(ctx)
	require.NoError(t, err)
	assert.Equal(t, PowerOn, ev.Power)
	assert.Equal(t, "OK", ev.Health)
	assert.Empty(t, ev.Hangs)
	assert.Empty(t, ev.LogError)

	r.sim.LogEvent("1", bmcsim.Event{SensorType: "OS Stop/Shutdown", Message: "OS graceful shutdown", Severity: "OK"})
	r.sim.LogEvent("1", bmcsim.Event{SensorType: "Temperature", Message: "Upper critical going high"})
	at := r.sim.LogEvent("1", bmcsim.Event{SensorType: "OS Stop/Shutdown", Message: "Run-time critical stop"})
	ev, err = c.Evidence(ctx)
	require.NoError(t, err)
	require.Len(t, ev.Hangs, 1, "only the critical stop proves a hang: %+v", ev.Hangs)
	h := ev.Hangs[0]
	assert.Equal(t, HangOSCriticalStop, h.Kind)
	assert.Equal(t, "3", h.ID)
	assert.Equal(t, "OS Stop/Shutdown: Run-time critical stop", h.Message)
	assert.WithinDuration(t, at, h.At, 2*time.Second, "dated against the BMC's clock, two hours behind (logged %s)", h.Logged)

	r.sim.SetHealth("1", HealthCritical)
	r.sim.SetPowerState("1", bmcsim.Off)
	ev, err = c.Evidence(ctx)
	require.NoError(t, err)
	assert.Equal(t, PowerOff, ev.Power)
	assert.Equal(t, HealthCritical, ev.Health)
	assert.Contains(t, ev.String(), "power Off; health Critical; OS critical stop logged ")
}

// TestIPMIEvidence reads ipmi_sim's SEL through bmclib's ipmitool provider: a kernel panic's OS
// critical stop, a machine check and a watchdog expiry prove a hang, each dated by the SEL's clock; a
// graceful shutdown, a temperature alarm and a watchdog that reset the host do not.
func TestIPMIEvidence(t *testing.T) {
	sim := ipmisim.Start(t)
	logs := &capture.Buffer{}
	c := ipmiController(t, sim, sim.Password, logs)
	ctx := context.Background()

	ev, err := c.Evidence(ctx)
	require.NoError(t, err)
	assert.Equal(t, PowerOn, ev.Power)
	assert.Empty(t, ev.Health, "IPMI has no health roll-up")
	assert.Empty(t, ev.Hangs)
	assert.Empty(t, ev.LogError)

	require.NoError(t, sim.AddSEL(ctx, ipmisim.SELOSShutdown, ipmisim.SELTemperature, ipmisim.SELWatchdogReset))
	logged := time.Now()
	require.NoError(t, sim.AddSEL(ctx, ipmisim.SELOSCriticalStop, ipmisim.SELMachineCheck, ipmisim.SELWatchdogExpiry))
	ev, err = c.Evidence(ctx)
	require.NoError(t, err)
	require.Empty(t, ev.LogError)
	var kinds []string
	for _, h := range ev.Hangs {
		kinds = append(kinds, h.Kind)
		assert.WithinDuration(t, logged, h.At, 3*time.Second, "%s logged %s", h.Kind, h.Logged)
	}
	assert.Equal(t, []string{HangOSCriticalStop, HangMachineCheck, HangWatchdog}, kinds)
	assert.Contains(t, ev.Hangs[0].Message, "OS Critical Stop")
	assert.NotContains(t, logs.String(), sim.Password)
}
