package pass

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/hub/assess"
)

// Stalls become visible, not silent: each stretch of time a machine is Unhealthy is an episode, and
// when it ends (the machine no longer Unhealthy, or its kind changed) the hub journals it briefly,
// counts it by outcome with its length (hale_hub_episodes_total, hale_hub_episode_seconds) and, for one
// that ended with nothing done, says so (Resumed). How close the episodes that resumed by themselves
// come to the stall tolerance is what tells an operator whether the tolerance is long enough for the
// pauses their machines really have (alert HaleStallsNearTolerance), before a needless reboot.

// Kinds of episode.
const (
	EpisodeDead    = "dead"    // dead to a majority of the observers
	EpisodeFailing = "failing" // its agent reports, a component fails
)

// EpisodeOutcome is how an episode ended.
type EpisodeOutcome string

// Outcomes.
const (
	EpisodeResumed EpisodeOutcome = "resumed" // back by itself: no remediation began during it
	EpisodeActed   EpisodeOutcome = "acted"   // a remediation began (past the tolerance or grace, or an operator's)
	EpisodeProved  EpisodeOutcome = "proved"  // the hub's remediation began on its BMC's proof of a hang
)

// Outcomes lists the outcomes, for metrics.
func Outcomes() []EpisodeOutcome {
	return []EpisodeOutcome{EpisodeResumed, EpisodeActed, EpisodeProved}
}

// Episode is one stretch of time a machine was Unhealthy and how it ended.
type Episode struct {
	Machine string `json:"machine"`
	Kind    string `json:"kind"`
	// Began is its last sign of life (dead), or when what fails began to (failing); Ended is when the
	// hub saw it end.
	Began time.Time `json:"began"`
	Ended time.Time `json:"ended"`
	// Outcome is how it ended; Grounds, for a remediation the hub began, why it did then.
	Outcome EpisodeOutcome `json:"outcome"`
	Grounds string         `json:"grounds,omitempty"`
	// Why is what made it Unhealthy (the verdict's first reason).
	Why string `json:"why"`
}

// EpisodeLog is the last episodes of each machine, oldest first.
type EpisodeLog map[string][]Episode

// Length is how long it lasted.
func (e Episode) Length() time.Duration { return e.Ended.Sub(e.Began) }

// String says it in a line, as `hub explain` lists it.
func (e Episode) String() string {
	s := fmt.Sprintf("%s %s for %v (%s to %s): %s", e.Kind, e.Outcome, e.Length().Round(100*time.Millisecond), clock(e.Began), clock(e.Ended), e.Why)
	if e.Grounds != "" {
		s += "; acted on: " + e.Grounds
	}
	return s
}

// episodeKind is the kind of episode a says machine is in ("" when none): dead when it is Unhealthy
// with no sign that it runs (dead to a majority of the observers, or its agent silent), failing when
// it runs with a component failing.
func episodeKind(a *assess.Assessment) string {
	switch {
	case a.Verdict != assess.VerdictUnhealthy:
		return ""
	case a.Alive && !a.Dead:
		return EpisodeFailing
	}
	return EpisodeDead
}

// trackEpisode keeps machine a's episode: one begins when it turns Unhealthy (or the kind of its
// episode changes). A dead one ends only with a sign of life after it began (a verdict that turns
// Suspect because the evidence is judged again, after a partition or quorum's return, is no sign
// that the machine resumed), at that sign; a failing one when the machine is no longer Unhealthy so.
// A remediation in flight during an episode makes it acted: one that begins or ends while a
// remediation runs (a machine power-cycled comes and goes from view as it reboots) did not come back
// by itself. It returns the episode that ended (ok).
func (s *State) trackEpisode(f *Facts, a *assess.Assessment) (Episode, bool) {
	kind := episodeKind(a)
	_, inFlight := f.Flights[a.Machine]
	cur, open := s.episodes[a.Machine]
	if open {
		ended := kind != cur.Kind
		if cur.Kind == EpisodeDead {
			ended = ended && newest(s.lifeAt, a.Machine, a.LifeAt).After(cur.Began)
		}
		if inFlight && cur.Outcome == EpisodeResumed {
			cur.Outcome = EpisodeActed
			s.episodes[a.Machine] = cur
		}
		if !ended {
			return Episode{}, false
		}
		cur.Ended = f.Now
		if cur.Kind == EpisodeDead {
			cur.Ended = newest(s.lifeAt, a.Machine, a.LifeAt)
		}
		delete(s.episodes, a.Machine)
	}
	if kind != "" {
		began := a.Since
		if kind == EpisodeDead {
			began = deadFrom(Facts{lifeAt: s.lifeAt}, *a)
		}
		e := Episode{Machine: a.Machine, Kind: kind, Began: began, Outcome: EpisodeResumed, Why: firstReason(*a)}
		if inFlight {
			e.Outcome = EpisodeActed
		}
		s.episodes[a.Machine] = e
	}
	return cur, open
}

// actedOn marks the episode of a machine whose remediation this pass begins: acted, or proved, and why.
func (s *State) actedOn(b ToBegin) {
	if e, ok := s.episodes[b.Machine.Name]; ok {
		e.Outcome, e.Grounds = EpisodeActed, b.grounds
		if b.proved {
			e.Outcome = EpisodeProved
		}
		s.episodes[b.Machine.Name] = e
	}
}

// resumedNotice says that an episode ended with nothing done.
func resumedNotice(e Episode) Notice {
	what := fmt.Sprintf("no sign of life for %v (from %s to %s)", e.Length().Round(100*time.Millisecond), clock(e.Began), clock(e.Ended))
	if e.Kind == EpisodeFailing {
		what = fmt.Sprintf("failing for %v (from %s to %s: %s)", e.Length().Round(100*time.Millisecond), clock(e.Began), clock(e.Ended), e.Why)
	}
	return Notice{Machine: e.Machine, Reason: ReasonResumed, Message: fmt.Sprintf("%s came back by itself after %s; nothing was done", e.Machine, what)}
}
