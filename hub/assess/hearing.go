package assess

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/health/report"
)

// Expected is the fixed set of observers (DESIGN.md rule 6): the agent of every machine, the
// witnesses (agents on other hosts that observe and vote but hold no etcd member), and the hub. A
// verdict that can lead to action, and the membership the planner uses, need a strict majority of this
// set: never of the observers the hub happens to hear, which on the minority side of a partition are
// a majority of almost nothing.
type Expected struct {
	// Agents and Witnesses are gossip node names.
	Agents, Witnesses []string
	// JudgeNodes are the judges of etcd: the agents of etcd members and the witnesses.
	JudgeNodes []string
	members    []string // the etcd members of the machines, as ExpectedOf was given them
	built      bool     // made by ExpectedOf
}

// ExpectedOf is the expected set of an inventory's machines and witnesses.
func ExpectedOf(machines []MachineRef, witnesses []string) Expected {
	e := Expected{Witnesses: witnesses, built: true}
	for _, m := range machines {
		e.Agents = append(e.Agents, m.Node)
		e.members = append(e.members, m.Member)
		if m.Member != "" {
			e.JudgeNodes = append(e.JudgeNodes, m.Node)
		}
	}
	e.JudgeNodes = append(e.JudgeNodes, witnesses...)
	return e
}

// same says whether e is the expected set of these machines and witnesses.
func (e Expected) same(machines []MachineRef, witnesses []string) bool {
	if !e.built || len(machines) != len(e.Agents) || !slices.Equal(witnesses, e.Witnesses) {
		return false
	}
	for i, m := range machines {
		if m.Node != e.Agents[i] || m.Member != e.members[i] {
			return false
		}
	}
	return true
}

// Size counts the agents, the witnesses and the hub.
func (e Expected) Size() int { return len(e.Agents) + len(e.Witnesses) + 1 }

// Judges counts the observers that judge etcd: the agents of etcd members and the witnesses (not the
// hub, not the agents of workers, which have no etcd access).
func (e Expected) Judges() int { return len(e.JudgeNodes) }

// Hearing is how many of the expected observers the hub hears now: itself, and every expected agent
// and witness alive in its gossip view with a fresh report.
type Hearing struct {
	// Set is the expected set heard from.
	Set      Expected
	Expected int
	// Heard lists the observers heard, the hub first; Missing the others.
	Heard, Missing []string
	// freshest is when the report of the observer heard was sent that a strict majority needs beside
	// the hub, counted from the freshest (zero when it hears too few, or needs none).
	freshest time.Time
}

// Through is the time through which the hub hears a strict majority of its expected observers:
// itself (now) and the freshest reports of as many of the others as that majority needs (zero when
// it hears too few). What they say of a machine is said through then, and no further.
func (h Hearing) Through(now time.Time) time.Time {
	others := h.Expected / 2 // a strict majority is the hub and these
	if others == 0 {
		return now
	}
	if h.freshest.IsZero() {
		return time.Time{}
	}
	if h.freshest.Before(now) {
		return h.freshest
	}
	return now // (a report from a clock ahead of the hub's says no more than now)
}

// Majority reports whether the hub hears a strict majority of the expected observers.
func (h Hearing) Majority() bool { return 2*len(h.Heard) > h.Expected }

func (h Hearing) String() string {
	return fmt.Sprintf("the hub hears %d of %d expected observers (%s); a strict majority is %d", len(h.Heard), h.Expected,
		strings.Join(h.Heard, ", "), h.Expected/2+1)
}

// NoMajority is why a hub that does not hear a majority of its expected observers acts on nothing.
func (h Hearing) NoMajority() string {
	return fmt.Sprintf("%s: a partition and a crash look the same from here, so nothing is done until a majority is heard again "+
		"(not heard: %s)", h, strings.Join(h.Missing, ", "))
}

// Hear says which expected observers the hub hears: alive in its view, with a report fresher than
// staleAfter.
func Hear(e Expected, obs Observations, staleAfter time.Duration) Hearing {
	return hearingOf(e, appendLiveObservers(nil, nil, e, obs, staleAfter), nil)
}

// hearingOf is the Hearing of the live observers appendLiveObservers found (in the expected set's
// order, which it relies on). sent, when not nil, is a buffer to reuse.
func hearingOf(e Expected, observers []report.Report, sent *[]int64) Hearing {
	h := Hearing{Set: e, Expected: e.Size(), Heard: make([]string, 1, len(observers)+1)}
	h.Heard[0] = "the hub"
	j := 0
	for _, nodes := range [][]string{e.Agents, e.Witnesses} {
		for _, n := range nodes {
			if j < len(observers) && observers[j].Node == n {
				h.Heard = append(h.Heard, n)
				j++
			} else {
				h.Missing = append(h.Missing, n)
			}
		}
	}
	h.freshest = freshest(observers, h.Expected/2, sent)
	return h
}

// freshest is the sending time of the k-th freshest of the reports (zero when k is 0 or there are
// fewer): sorted as Unix nanoseconds (a live report's time is near now), and the report's own time
// returned, location and all. sent, when not nil, is a buffer to reuse.
func freshest(reports []report.Report, k int, sent *[]int64) time.Time {
	if k == 0 || len(reports) < k {
		return time.Time{}
	}
	var ns []int64
	if sent != nil {
		ns = (*sent)[:0]
		defer func() { *sent = ns }()
	}
	for i := range reports {
		ns = append(ns, reports[i].SentAt.UnixNano())
	}
	slices.Sort(ns)
	at := ns[len(ns)-k]
	for i := range reports {
		if reports[i].SentAt.UnixNano() == at {
			return reports[i].SentAt
		}
	}
	return time.Time{} // unreachable: at is one of theirs
}

// Live: the hub hears r's sender alive, and r is no older than staleAfter.
func Live(r report.Report, obs Observations, staleAfter time.Duration) bool {
	s := sighting{reported: true, sentAt: r.SentAt}
	s.hub, s.known = obs.HubPeers[r.Node]
	return s.live(obs.Now, staleAfter)
}

// sighting is what the observations hold of one node: whether it sent a report (reported, sent at
// sentAt), the hub's gossip view of it (known), and where its report is among the live observers
// (observer; -1 when it is none), looked up once a pass.
type sighting struct {
	reported bool
	sentAt   time.Time
	hub      report.PeerView
	known    bool
	observer int
}

// heard says whether the hub's gossip hears the node alive.
func (s sighting) heard() bool { return s.known && s.hub.State == report.PeerAlive }

// live says whether the node is a live observer at now: heard, with a report no older than staleAfter.
func (s sighting) live(now time.Time, staleAfter time.Duration) bool {
	return s.reported && s.heard() && now.Sub(s.sentAt) <= staleAfter
}

// appendLiveObservers appends the expected agents and witnesses the hub sees alive whose latest
// report is fresh (Live), in the expected set's order. Anyone else in the gossip pool is no observer.
// sightings, when not nil, gets each expected agent's sighting, in the expected set's order (the
// machines' own: AssessHearing reads them per machine), each pointing into the observers out holds.
func appendLiveObservers(out []report.Report, sightings *[]sighting, e Expected, obs Observations, staleAfter time.Duration) []report.Report {
	for i, nodes := range [][]string{e.Agents, e.Witnesses} {
		for _, node := range nodes {
			r, reported := obs.Reports[node]
			s := sighting{reported: reported, sentAt: r.SentAt, observer: -1}
			s.hub, s.known = obs.HubPeers[node]
			if s.live(obs.Now, staleAfter) {
				s.observer = len(out)
				out = append(out, r)
			}
			if i == 0 && sightings != nil {
				*sightings = append(*sightings, s)
			}
		}
	}
	return out
}
