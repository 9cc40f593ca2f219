package bmc

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/stmcginnis/gofish/common"
)

// hangs reads the system's Status.Health and, through its LogServices, the event log entries that
// prove a hang, each dated against its log service's clock (DateTime), read with it.
func (c *redfishConn) hangs(context.Context) (logRead, error) {
	var sys struct {
		Status      common.Status
		LogServices common.Link
	}
	if err := c.inSession("read system", func() error {
		_, err := getJSON(c.client, c.system.ODataID, &sys)
		return err
	}); err != nil {
		return logRead{}, err
	}
	lr := logRead{health: string(sys.Status.Health)}
	if sys.LogServices == "" {
		lr.err = errors.New("the system has no LogServices")
		return lr, nil
	}
	lr.err = c.inSession("read the event log", func() (err error) {
		lr.hangs, err = c.logHangs(sys.LogServices.String())
		return err
	})
	return lr, nil
}

// Bounds on what one read of a system's logs reads: log services, and entries fetched one by one (a
// collection that lists its members by link only; most give them whole).
const maxLogServices, maxFetchedEntries = 8, 64

// logEntry is a Redfish LogEntry, as much of it as says what it records and when.
type logEntry struct {
	ODataID    string `json:"@odata.id"`
	ID         string `json:"Id"`
	Created    string
	Message    string
	MessageID  string `json:"MessageId"`
	EntryCode  string
	SensorType string
}

// logHangs reads the log services at uri and returns the entries that prove a hang.
func (c *redfishConn) logHangs(uri string) ([]LogEntry, error) {
	var services struct{ Members []common.Link }
	if _, err := getJSON(c.client, uri, &services); err != nil {
		return nil, err
	}
	var out []LogEntry
	fetched := 0
	for _, link := range services.Members[:min(len(services.Members), maxLogServices)] {
		var ls struct {
			DateTime string
			Entries  common.Link
		}
		if _, err := getJSON(c.client, link.String(), &ls); err != nil {
			return out, err
		}
		var off time.Duration
		if now, err := time.Parse(time.RFC3339, ls.DateTime); err == nil {
			off = clockOffset(now, time.Now())
		}
		for page, next := 0, ls.Entries.String(); next != "" && page < maxMemberPages; page++ {
			var coll struct {
				Members []json.RawMessage
				Next    string `json:"Members@odata.nextLink"`
			}
			if _, err := getJSON(c.client, next, &coll); err != nil {
				return out, err
			}
			for _, raw := range coll.Members {
				var e logEntry
				if json.Unmarshal(raw, &e) != nil {
					continue // one entry the BMC wrote badly hides no other
				}
				if e.Created == "" && e.Message == "" && e.ODataID != "" && fetched < maxFetchedEntries {
					fetched++
					if _, err := getJSON(c.client, e.ODataID, &e); err != nil {
						continue
					}
				}
				kind := hangKind(e.SensorType, strings.Join([]string{e.Message, e.EntryCode, e.MessageID}, " "))
				created, err := time.Parse(time.RFC3339, e.Created)
				if kind == "" || err != nil {
					continue
				}
				msg := strings.TrimSpace(e.SensorType + ": " + e.Message)
				out = append(out, LogEntry{ID: e.ID, Kind: kind, Message: strings.TrimPrefix(msg, ": "), Logged: e.Created, At: created.Add(off)})
			}
			next = coll.Next
		}
	}
	return out, nil
}
