package bmcval

import (
	"fmt"
	"strings"
	"time"
)

// Evidence is what a BMC says of its machine beyond the power state: whether it proves a hang.
type Evidence struct {
	// Power is the power state read.
	Power PowerState `json:"power"`
	// Health is the system's health as the BMC rolls it up (Redfish's Status.Health: OK, Warning,
	// Critical); empty when the BMC does not say (IPMI).
	Health string `json:"health,omitempty"`
	// Hangs are the entries of the system's event log that say it hung or stopped, oldest first.
	Hangs []LogEntry `json:"hangs,omitempty"`
	// LogError says why the event log could not be read (the power and health were): empty when it was.
	LogError string `json:"logError,omitempty"`
	// Read is when the BMC answered, in the reader's clock.
	Read time.Time `json:"read"`
}

// HealthCritical is the Redfish health that proves the system is in a critical state.
const HealthCritical = "Critical"

// Kinds of hang a BMC's event log records.
const (
	HangOSCriticalStop = "OS critical stop" // a kernel panic or a stop during the OS's load
	HangMachineCheck   = "machine check"    // an uncorrectable machine check exception
	HangIERR           = "IERR"             // a processor's internal error
	HangWatchdog       = "watchdog expired" // the watchdog timer expired and did not restart the machine
)

// LogEntry is one entry of a BMC's event log that proves a hang.
type LogEntry struct {
	ID string `json:"id"`
	// Kind is what it proves: one of the Hang* kinds.
	Kind string `json:"kind"`
	// Message is the entry as the BMC words it (sensor and event).
	Message string `json:"message"`
	// At is when it was logged, in the reader's clock: the BMC's own time moved by how far the BMC's
	// clock was from the reader's when the log was read (the BMC's time as is when it gives no clock).
	At time.Time `json:"at"`
	// Logged is the entry's time as the BMC wrote it.
	Logged string `json:"logged"`
}

// String says what the evidence proves, in a line: "power Off", "health Critical", or the hangs.
func (ev Evidence) String() string {
	parts := []string{fmt.Sprintf("power %s", ev.Power)}
	if ev.Health != "" {
		parts = append(parts, "health "+ev.Health)
	}
	for _, h := range ev.Hangs {
		parts = append(parts, fmt.Sprintf("%s logged %s (%s)", h.Kind, h.Logged, h.Message))
	}
	if ev.LogError != "" {
		parts = append(parts, "event log not read: "+ev.LogError)
	}
	return strings.Join(parts, "; ")
}

// ProofMargin: an entry of a BMC's event log proves the hang of an episode when it was logged at most
// this long before the machine's last sign of life. A panic is logged as it happens, its agent's last
// report went out a moment before, and the BMC's clock is read to the second.
const ProofMargin = 5 * time.Second

// HangSince is the first of hangs logged since from, at most ProofMargin before it (ok false: none):
// the entry that proves the hang of a machine whose last sign of life was at from. An entry older
// than that is of an earlier episode, one the machine came back from.
func HangSince(hangs []LogEntry, from time.Time) (LogEntry, bool) {
	for _, h := range hangs {
		if !h.At.Before(from.Add(-ProofMargin)) {
			return h, true
		}
	}
	return LogEntry{}, false
}
