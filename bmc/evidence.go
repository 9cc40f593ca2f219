package bmc

import (
	"context"
	"strings"
	"time"

	"github.com/hale-dev/hale/bmc/bmcval"
)

// A machine that stops answering may be hung, or only paused: a VM stunned for a snapshot or a live
// migration, a storage or CPU stall, a member catching up. The first needs a power cycle; the second
// resumes by itself, and a power cycle only costs it a reboot. The BMC is the one witness that can
// tell them apart early: the power read Off unasked, a hang logged in its event log (an OS critical
// stop from a kernel panic, a machine check or IERR, a watchdog that expired and did not reset the
// machine itself), or the system's health rolled up to Critical. Evidence is what a BMC says of that.

// Evidence is what a BMC says of its machine beyond the power state: whether it proves a hang
// (bmcval.Evidence).
type Evidence = bmcval.Evidence

// LogEntry is one entry of a BMC's event log that proves a hang (bmcval.LogEntry).
type LogEntry = bmcval.LogEntry

// HealthCritical is the Redfish health that proves the system is in a critical state.
const HealthCritical = bmcval.HealthCritical

// Kinds of hang a BMC's event log records.
const (
	HangOSCriticalStop = bmcval.HangOSCriticalStop
	HangMachineCheck   = bmcval.HangMachineCheck
	HangIERR           = bmcval.HangIERR
	HangWatchdog       = bmcval.HangWatchdog
)

// hangKind says which hang an event log entry records ("" when none): sensor is the sensor type or
// name ("OS Critical Stop #0x01", Redfish's "OS Stop/Shutdown", "Processor", "Watchdog2"), event the
// event and its assertion ("Run-time critical stop : Asserted", a Redfish entry's message and code). A
// deasserted event, an OS's graceful shutdown and a watchdog that reset or power-cycled the machine
// itself (it restarts on its own) prove nothing to act on.
func hangKind(sensor, event string) string {
	s, e := strings.ToLower(sensor), strings.ToLower(event)
	osStop := strings.Contains(s, "os critical stop") || strings.Contains(s, "os stop")
	switch {
	case strings.Contains(e, "deassert"):
		return ""
	case osStop && strings.Contains(e, "critical stop"), strings.Contains(e, "panic"):
		return HangOSCriticalStop
	case strings.Contains(e, "machine check"):
		return HangMachineCheck
	case strings.Contains(s, "processor") && strings.Contains(e, "ierr"):
		return HangIERR
	case strings.Contains(s, "watchdog") && (strings.Contains(e, "expired") || strings.Contains(e, "power down")):
		return HangWatchdog
	}
	return ""
}

// hangReader is a conn that reads what its BMC says of a hang (both drivers are).
type hangReader interface {
	// hangs reads the system's health and the entries of its event log that prove a hang. An error is
	// a failure to read the health, where there is one; a log that cannot be read is said in the result.
	hangs(ctx context.Context) (logRead, error)
}

// logRead is what a hangReader read: the system's health ("" when the BMC does not say), the entries
// that prove a hang, and why the event log could not be read (nil when it was).
type logRead struct {
	health string
	hangs  []LogEntry
	err    error
}

// Evidence reads the power state, the system's health and the hangs its event log records. A log
// that cannot be read (the BMC has none, or refuses it) is said in LogError, not returned as an error:
// the power state is evidence on its own.
func (c *Controller) Evidence(ctx context.Context) (Evidence, error) {
	var ev Evidence
	err := c.session(ctx, "status", func(cn conn) error { // a status read, the health and the log with it
		st, _, err := c.read(ctx, cn)
		if err != nil {
			return err
		}
		ev.Power = st
		if r, ok := cn.(hangReader); ok {
			lr, err := r.hangs(ctx)
			if err != nil {
				return err
			}
			ev.Health, ev.Hangs = lr.health, lr.hangs
			if lr.err != nil {
				ev.LogError = lr.err.Error()
			}
		}
		ev.Read = time.Now()
		return nil
	})
	return ev, err
}

// clockOffset is how far the reader's clock is ahead of a BMC's that said bmcNow when the reader's
// said readAt (0 when the BMC gave no time).
func clockOffset(bmcNow, readAt time.Time) time.Duration {
	if bmcNow.IsZero() {
		return 0
	}
	return readAt.Sub(bmcNow)
}
