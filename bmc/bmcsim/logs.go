package bmcsim

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A system's event log (its LogService "SEL", IPMI's System Event Log as Redfish shows it) and its
// health roll-up: what a BMC knows of a machine that hung (a kernel panic's OS critical stop, a
// machine check, a watchdog that expired) beyond its power state.

// Event is one event a test logs in a system's SEL, as a BMC records what the host's OS or firmware
// tells it (Linux's ipmi_msghandler logs an OS critical stop at a panic).
type Event struct {
	// SensorType is Redfish's name of the IPMI sensor type: "OS Stop/Shutdown", "Processor",
	// "Watchdog", "Temperature".
	SensorType string
	// Message is the event: "Run-time critical stop", "Machine check exception", "Timer expired".
	Message string
	// Severity is OK, Warning or Critical (default Critical).
	Severity string
}

// logEntry is one logged event.
type logEntry struct {
	Event
	id      int
	created time.Time // the BMC's clock
}

// LogEvent logs an event in system id's SEL, dated by the BMC's clock (Config.ClockOffset), and
// returns when it did in the real clock.
func (s *Server) LogEvent(id string, e Event) time.Time {
	sy := s.system(id)
	if e.Severity == "" {
		e.Severity = "Critical"
	}
	now := time.Now()
	sy.mu.Lock()
	defer sy.mu.Unlock()
	sy.log = append(sy.log, logEntry{Event: e, id: len(sy.log) + 1, created: now.Add(s.cfg.ClockOffset)})
	return now
}

// SetHealth sets system id's health roll-up (Status.Health: OK, Warning, Critical).
func (s *Server) SetHealth(id, health string) {
	sy := s.system(id)
	sy.mu.Lock()
	defer sy.mu.Unlock()
	sy.health = health
}

// clock is the BMC's clock: the real one moved by ClockOffset (a BMC whose clock is wrong).
func (s *Server) clock() time.Time { return time.Now().Add(s.cfg.ClockOffset).UTC() }

// logResource serves a system's LogServices (one: "SEL"), the service, its entries and each entry;
// rest is what follows the system's path ("LogServices", "LogServices/SEL/Entries/3").
func (s *Server) logResource(w http.ResponseWriter, r *http.Request, id string, sy *system, rest string) {
	base := "/redfish/v1/Systems/" + id + "/LogServices"
	sel := base + "/SEL"
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	sy.mu.Lock()
	entries := slices.Clone(sy.log)
	sy.mu.Unlock()
	switch rest {
	case "LogServices":
		writeJSON(w, http.StatusOK, collection(base, "#LogServiceCollection.LogServiceCollection", "Log Service Collection", []string{sel}))
	case "LogServices/SEL":
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": sel, "@odata.type": "#LogService.v1_3_0.LogService", "Id": "SEL", "Name": "System Event Log",
			"LogEntryType": "SEL", "ServiceEnabled": true, "MaxNumberOfRecords": 1000, "OverWritePolicy": "WrapsWhenFull",
			"DateTime": s.clock().Format(time.RFC3339), "DateTimeLocalOffset": "+00:00", "Status": status(),
			"Entries": odataID(sel + "/Entries"),
		})
	case "LogServices/SEL/Entries":
		members := make([]map[string]any, len(entries))
		for i, e := range entries {
			members[i] = entryJSON(sel, e)
		}
		writeJSON(w, http.StatusOK, map[string]any{"@odata.id": sel + "/Entries", "@odata.type": "#LogEntryCollection.LogEntryCollection",
			"Name": "System Event Log Entries", "Members": members, "Members@odata.count": len(members)})
	default:
		n, err := strconv.Atoi(strings.TrimPrefix(rest, "LogServices/SEL/Entries/"))
		if !strings.HasPrefix(rest, "LogServices/SEL/Entries/") || err != nil || n < 1 || n > len(entries) {
			writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no resource at "+r.URL.Path)
			return
		}
		writeJSON(w, http.StatusOK, entryJSON(sel, entries[n-1]))
	}
}

func entryJSON(sel string, e logEntry) map[string]any {
	id := strconv.Itoa(e.id)
	return map[string]any{
		"@odata.id": sel + "/Entries/" + id, "@odata.type": "#LogEntry.v1_4_0.LogEntry", "Id": id, "Name": "Log Entry " + id,
		"EntryType": "SEL", "SensorType": e.SensorType, "Message": e.Message, "Severity": e.Severity, "EntryCode": "Assert",
		"Created": e.created.UTC().Format(time.RFC3339),
	}
}
