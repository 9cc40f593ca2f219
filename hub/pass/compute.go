// Package pass is the pure part of the hub's pass: from the facts a pass gathered and the state the
// previous pass left, Compute says what this pass leaves and what to do (Ready): each machine's hold or
// begin, the membership, the quorum loss, the raft mark, and every notice. It holds the values those
// decisions are about (the inventory, the brakes, the reasons, the recovery record) and does no I/O:
// no clock, lock, log, journal, BMC or Kubernetes call (docs/hub-internals.md). The hub (package hub)
// gathers the facts and carries Ready out.
package pass

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/health/report"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/quorum"
)

// A pass is raft's Ready loop in small (hub/pass.go runs it): observe gathers the facts (the gossip's
// reports, the assessor's verdicts, a snapshot of the remediations in flight, the brakes and the
// ledger), compute turns them and what the previous pass left into what this pass leaves and a Ready
// (what to say, what to begin, whom to keep joined), and apply does it: apply is a pass's only I/O.
// Compute reads no clock, no journal, no gossip and no lock: the same state and facts give the same
// Ready, which is what its table tests and its randomized check rely on.

// State is what one pass leaves the next. It is the pass goroutine's alone: compute updates it, and
// nothing else reads it; what others read is its view, replaced whole by every pass.
type State struct {
	View View
	// unhealthyAt: when each machine's verdict last became Unhealthy (the detection time a hub
	// remediation's detection-to-action metric counts from); healthyAt: when each machine that is not
	// Healthy now was last Healthy (its failed remediations count from then; written when it leaves
	// Healthy, not every pass).
	unhealthyAt, healthyAt map[string]time.Time
	// seenAt: when each machine was last in view (assess.Assessment.SeenAt), lifeAt: when it last
	// showed a sign of life (assess.Assessment.LifeAt), each the newest of any pass since the hub
	// started: newest(map, this pass's assessment). The map holds a machine's time only once a pass's
	// assessment fell behind an earlier one (it went out of view), so most passes write neither, and a
	// pass copies them only when it writes one (stampsCopied): copied each pass, 5,000 machines' were a
	// tenth of a pass.
	seenAt, lifeAt map[string]time.Time
	stampsCopied   bool
	// episodes: each Unhealthy machine's episode under way (episode.go).
	episodes map[string]Episode
	// beginFailed: machines whose remediation the planner admitted and the hub could not begin.
	beginFailed map[string]BeginFailure
	// kept: the observers the gossip is told to keep joined; watched: the machines whose BMCs the hub
	// was last told to read for proof of a hang.
	kept    assess.Expected
	watched []string
	// What was said last, so that each thing is said once, when it changes: whether the hub hears a
	// majority of its observers (nil: nothing said yet), and why each machine is not started.
	saidMajority *bool
	saidHold     map[string]Hold
	// Mark is the highest raft index seen (or journaled, when the hub started); recorded is the one in
	// the journal, written at recordedAt; markErr why the last write failed.
	Mark, Recorded RaftMark
	recordedAt     time.Time
	// MarkEvery is how often a rising mark is written at most (zero: the package's MarkEvery).
	MarkEvery time.Duration
	markErr   string
	// rebuilt: the etcd cluster's ID changed (from → to) and no pass has yet told which members the
	// new cluster left out (decide: rebuiltOutside).
	rebuilt *clusterChange
	// scratch is memory each pass reuses (shared by every state of one hub: only its pass goroutine
	// computes).
	scratch *scratch
}

// scratch is memory a pass reuses from the pass before and never reads across passes: the planner's
// input, 5,000 machines of 180 bytes, made afresh each pass was 40 % of a pass's garbage.
type scratch struct{ planned []quorum.Machine }

// clusterChange is the etcd cluster's ID changing: it was rebuilt from a snapshot or a survivor.
type clusterChange struct{ from, to string }

func NewState() State {
	return State{unhealthyAt: map[string]time.Time{}, healthyAt: map[string]time.Time{}, seenAt: map[string]time.Time{},
		lifeAt: map[string]time.Time{}, episodes: map[string]Episode{}, beginFailed: map[string]BeginFailure{}, saidHold: map[string]Hold{},
		scratch: &scratch{}}
}

// View is what the latest pass saw and decided, as `hub status`, the executor's world and degraded
// mode read it. Each pass publishes a new one; none is changed once published.
type View struct {
	// Assessments: each machine's, in the inventory's order (as the assessor returns them).
	Assessments []assess.Assessment
	Hearing     assess.Hearing
	// NotPlanning says why the latest pass did not plan ("" when it did). cluster, outcome, needs and
	// holds are those of the latest pass that planned.
	NotPlanning string
	Cluster     quorum.Cluster
	Outcome     quorum.Outcome
	// Needs: the Unhealthy machines the hub will not heal again by itself; holds: why each machine the
	// planner considered and the hub did not start waits.
	Needs map[string]OperatorNeed
	Holds map[string]Hold
	// PlannedWork: the planned work under way on each machine that has some (PlannedWorkOn), whatever
	// its verdict: the hub starts nothing there, and `hub status` says so before the machine fails.
	PlannedWork map[string]string
	// quorumLost: the latest pass that planned saw etcd's quorum lost; loss what the hub knows of it;
	// planned: when that pass gathered its facts.
	quorumLost bool
	lostSince  time.Time // when the passes that planned began to see it lost (quorumLost), without a break
	planned    time.Time
	Loss       *QuorumLoss
	// Mark: the highest raft index seen or journaled (State.Mark).
	Mark RaftMark
	// at: when the pass that made this view gathered its facts (the previous pass's, for compute).
	at time.Time
}

// Ready is what a pass does: its only effects, applied in this order.
type Ready struct {
	// Notices: what apply says (Hub.say), in the order they happened.
	Notices []Notice
	// QuorumBack, when set, is when etcd's quorum, lost in the previous planning pass, was seen back;
	// nothing was decided. The assessor judges what it gathered during the loss again, from then
	// (assess.Assessor.QuorumBack), and the next pass decides on that fresh assessment.
	QuorumBack time.Time
	// Retire, when set, is a rebuild of etcd no recovery of Hale's journaled: its old members are
	// retired from now on, and it is journaled as the last recovery.
	Retire *RecoveryRecord
	// Seen is what this pass saw of the last recovery's rebuilt cluster for the first time (zero:
	// nothing): its survivor healthy, old members back in it; journaled, they are held no longer.
	Seen Seen
	// KeepJoined, when not nil, is the set of observers the gossip keeps joined from now on.
	KeepJoined []string
	// RecordMark, when set, is the raft mark to journal.
	RecordMark *RaftMark
	// CheckBMCs: check every BMC now, not at the next interval (quorum was just lost, or its lost
	// voters changed: the evidence of a permanent loss should be fresh).
	CheckBMCs bool
	// Watch, when not nil, is the machines whose BMCs the hub reads for proof of a hang from now on
	// (dead within their stall tolerance: stall.go); empty: none.
	Watch []string
	// Episodes are the episodes that ended in this pass (episode.go), to journal and count.
	Episodes []Episode
	// Begin: the remediations to begin, in the planner's order.
	Begin []ToBegin
	// OutOfService, when not nil, says which machines' Nodes must carry the out-of-service taint now
	// (OutOfService). Nil: no change at all (a pass that only listens, or a paused or suspended hub).
	OutOfService *Taints
}

// queue adds a notice to those apply says (Hub.say emits it).
func (rd *Ready) queue(n Notice) { rd.Notices = append(rd.Notices, n) }

// Compute is a pass's pure core: from what the previous pass left and this pass's facts, what this
// pass leaves and what it does. It records the verdicts, then decides (decide) unless the pass only
// listens, and says what changed. prev is not changed: the maps are copied before anything is
// written, so that a pass's state is the one it returns, whole, or the one before it.
func Compute(prev State, f Facts) (State, Ready) {
	s := prev.own()
	rd := s.update(f)
	return s, rd
}

// own returns a copy of s whose maps are its own (the rest is replaced whole, never changed in place;
// seenAt and lifeAt are copied when first written, keepNewest).
func (s State) own() State {
	s.unhealthyAt, s.healthyAt = maps.Clone(s.unhealthyAt), maps.Clone(s.healthyAt)
	s.episodes, s.stampsCopied = maps.Clone(s.episodes), false
	s.beginFailed, s.saidHold = maps.Clone(s.beginFailed), maps.Clone(s.saidHold)
	return s
}

// keepNewest keeps at as machine's time in times (s.seenAt or s.lifeAt) when it is newer than the one
// held, copying both maps first if this pass has not (they are the state before's too).
func (s *State) keepNewest(times *map[string]time.Time, machine string, at time.Time) {
	if !at.After((*times)[machine]) {
		return
	}
	if !s.stampsCopied {
		s.seenAt, s.lifeAt, s.stampsCopied = maps.Clone(s.seenAt), maps.Clone(s.lifeAt), true
	}
	(*times)[machine] = at
}

// newest is a machine's time in times (seenAt, lifeAt), or its assessment's own (at) if newer.
func newest(times map[string]time.Time, machine string, at time.Time) time.Time {
	if held := times[machine]; held.After(at) {
		return held
	}
	return at
}

// update is compute on a state of its own.
func (s *State) update(f Facts) Ready {
	var rd Ready
	prev := s.View
	v := prev
	v.Assessments, v.Hearing, v.at = f.Assessments, f.Hearing, f.Now
	defer func() { s.View = v }()
	var none assess.Assessment
	for i := range f.Assessments { // by pointer: an assessment is 184 bytes, and there is one per machine
		a, old := &f.Assessments[i], cmp.Or(assessmentAt(prev.Assessments, i, f.Assessments[i].Machine), &none)
		if old.Verdict != a.Verdict {
			rd.queue(verdictNotice(*a))
			if a.Verdict == assess.VerdictUnhealthy {
				s.unhealthyAt[a.Machine] = f.Now
			}
			if old.Verdict == assess.VerdictHealthy { // last seen Healthy in the previous pass
				s.healthyAt[a.Machine] = prev.at
			}
		}
		if old.SeenAt.After(a.SeenAt) { // out of view: the newest is the last pass's (or older, held)
			s.keepNewest(&s.seenAt, a.Machine, old.SeenAt)
		}
		if old.LifeAt.After(a.LifeAt) {
			s.keepNewest(&s.lifeAt, a.Machine, old.LifeAt)
		}
		if e, ended := s.trackEpisode(&f, a); ended && f.Listen == "" { // a hub that stands by keeps no journal
			rd.Episodes = append(rd.Episodes, e)
			if e.Outcome == EpisodeResumed {
				rd.queue(resumedNotice(e))
			}
		}
	}
	if w := f.MarkWritten; w != nil {
		if n, news := s.MarkWritten(w.Mark, w.Err); news {
			rd.queue(n)
		}
	}
	for _, b := range f.Begun {
		if n, news := s.began(b.Machine, b.Err, b.At); news {
			rd.queue(n)
		}
	}
	s.RaiseMark(&rd, f.Inventory, f.Observations.Reports, func(r report.Report) bool {
		return assess.Live(r, f.Observations, f.Inventory.Policy.Assess.StaleAfter)
	})
	v.Mark = s.Mark
	v.PlannedWork = plannedWork(f) // a map of this view's own: the previous view's is published
	if e := f.Hearing.Set; !slices.Equal(e.Agents, s.kept.Agents) || !slices.Equal(e.Witnesses, s.kept.Witnesses) {
		// Every expected observer the pool has lost is joined again for as long as it is expected, so
		// that after a partition all observers hear each other within seconds.
		rd.KeepJoined = append(slices.Clone(e.Agents), e.Witnesses...)
		s.kept = e
	}
	if f.Listen != "" { // standing by or warming up: remediations begun before go on, nothing new starts
		v.NotPlanning = notPlanning(&rd, prev.NotPlanning, f.Listen)
		return rd
	}
	if f.Paused == "" && !f.Suspended {
		t := OutOfService(f)
		rd.OutOfService = &t
	}
	s.queueHearing(&rd, f.Hearing)
	f.healthyAt, f.seenAt, f.lifeAt, f.beginFailed, f.quorumLost, f.lostIn = s.healthyAt, s.seenAt, s.lifeAt, s.beginFailed, prev.quorumLost, prev.Cluster
	// A loss of etcd's quorum counts (stallOf's shorter waits) from the pass that first saw it, and a pass
	// that sees it back ends it: one seen again later counts afresh. (Until 2026-12-06 a loss seen again
	// within 10 s of its return was the same loss: with two of three members hung, a late report made
	// the hub see quorum back for a moment, because a hung member whose observers' views were set aside
	// counted healthy on its own last report. Healthy now needs evidence nothing newer contradicts, so
	// that moment no longer comes; and the rule made blips a few seconds apart one long loss: a member
	// frozen 11 s, while probes of the others timed out now and then on a loaded machine, was
	// power-cycled on the 10 s wait of a member needed for quorum: TestNoDisruptionCostsQuorumThroughFlapsRandomized.)
	f.lostSince = f.Now
	if prev.quorumLost {
		f.lostSince = prev.lostSince
	}
	f.rebuilt, f.scratch = s.rebuilt, s.scratch
	d := decide(f)
	if s.rebuilt != nil && (d.retire != nil || len(d.cluster.Members) > 0) {
		// Told: the observers agreed on the new membership, and decide retired the members it left out
		// (if any, and unless a recovery of Hale's had retired them already). Kept pending, a later
		// member removal (an owner's replace) would be taken for one the rebuild left out.
		s.rebuilt = nil
	}
	if d.retire != nil {
		rd.Retire = d.retire
		rd.queue(Notice{Reason: ReasonRetired, Warning: true, Message: d.retire.rebuiltOutsideMessage()})
	}
	if d.quorumBack {
		// Nothing is decided in this pass (the next decides on a fresh assessment): its view says so,
		// rather than the lost quorum of the pass before.
		v.quorumLost, rd.QuorumBack = false, f.Now
		v.NotPlanning = "etcd's quorum is back: the evidence gathered while it was lost is judged again"
		msg := "etcd's quorum is back: the evidence gathered while it was lost counts again from now"
		if d.rebuilt {
			msg = fmt.Sprintf("etcd's voters are now %s, where %s had lost quorum (rebuilt from a survivor): "+
				"the evidence gathered while quorum was lost counts again from now", strings.Join(voters(d.cluster), ", "), strings.Join(voters(prev.Cluster), ", "))
		}
		rd.queue(Notice{Reason: ReasonQuorumBack, Message: msg})
		return rd
	}
	if d.notPlanning != "" {
		v.NotPlanning = notPlanning(&rd, prev.NotPlanning, d.notPlanning)
		rd.RecordMark = s.ToRecord(f.Now, prev.NotPlanning == "")
		return rd
	}
	if d.survivorSeen {
		r := f.Retired
		rd.Seen = Seen{Token: r.Token, Survivor: true}
		rd.queue(Notice{Machine: r.survivor.Machine, Reason: ReasonSurvivor, Message: fmt.Sprintf("the cluster etcd recovery %s rebuilt from %s is healthy: "+
			"a strict majority of the observers reach %s since the rebuild; %s is held as its survivor no longer", r.Token, r.survivor.Machine, r.survivor.Member, r.survivor.Machine)})
	}
	if back := f.Retired.RejoinedNow(f.Observations, f.Inventory.Policy.Assess.StaleAfter); len(back) > 0 {
		rd.Seen.Token, rd.Seen.Rejoined = f.Retired.Token, back
		for _, x := range back {
			rd.queue(Notice{Machine: x.Machine, Reason: ReasonRejoined, Message: fmt.Sprintf("%s is back in the new etcd cluster as %s: retired by etcd recovery %s no more, "+
				"it is healed as any other machine from now on", x.Machine, x.Member, f.Retired.Token)})
		}
	}
	v.NotPlanning, v.Cluster, v.Outcome, v.Needs, v.Holds, v.planned = "", d.cluster, d.outcome, d.needs, d.holds, f.Now
	v.quorumLost = d.outcome.Budget.QuorumLost()
	if v.quorumLost {
		v.lostSince = f.lostSince
	}
	rd.RecordMark = s.ToRecord(f.Now, v.quorumLost && !prev.quorumLost)
	if v.quorumLost && !prev.quorumLost {
		rd.queue(Notice{Reason: ReasonQuorumLost, Warning: true, Message: fmt.Sprintf("etcd: %s (%s)", d.outcome.Budget, f.Hearing)})
	}
	v.Loss = assessLoss(d, f.Inventory, f.BMCs)
	queueLoss(&rd, prev.Loss, v.Loss)
	s.queueHolds(&rd, d)
	if !slices.Equal(d.watch, s.watched) {
		rd.Watch, s.watched = append([]string{}, d.watch...), d.watch
	}
	for _, b := range d.begin {
		b.Detected = s.unhealthyAt[b.Machine.Name]
		s.actedOn(b)
		rd.Begin = append(rd.Begin, b)
	}
	return rd
}

func verdictNotice(a assess.Assessment) Notice {
	msg := fmt.Sprintf("%s is %s", a.Machine, a.Verdict)
	if len(a.Reasons) > 0 {
		msg += ": " + strings.Join(a.Reasons, "; ")
	}
	return Notice{Machine: a.Machine, Reason: Reason(a.Verdict), Message: msg, Warning: a.Verdict == assess.VerdictUnhealthy}
}

// notPlanning says why a pass does not plan when that changed to something, and returns it.
func notPlanning(rd *Ready, before, why string) string {
	if why != before {
		rd.queue(Notice{Reason: ReasonNotPlanning, Message: "not planning: " + why})
	}
	return why
}

// queueHearing queues the notices that the hub lost the majority of its expected observers, and that
// it hears one again after it had lost it (each once, when it changes).
func (s *State) queueHearing(rd *Ready, hearing assess.Hearing) {
	now, before := hearing.Majority(), s.saidMajority
	s.saidMajority = &now
	switch {
	case !now && (before == nil || *before):
		rd.queue(Notice{Reason: ReasonObserverMajorityLost, Message: hearing.NoMajority(), Warning: true})
	case now && before != nil && !*before:
		rd.queue(Notice{Reason: ReasonObserverMajorityHeard, Message: hearing.String() + ": planning again"})
	}
}

// queueHolds queues, for each machine the planner considered and the hub does not start, why, under its
// hold's one reason: when the hold changes, not every pass. A machine that starts, is in flight or
// is no longer considered (Healthy again) is forgotten, so that its next hold is news.
func (s *State) queueHolds(rd *Ready, d decision) {
	considered := map[string]bool{}
	for _, qd := range d.outcome.Decisions {
		h, held := d.holds[qd.Machine]
		if !held {
			delete(s.saidHold, qd.Machine)
			continue
		}
		considered[qd.Machine] = true
		if h = (Hold{Reason: h.Reason, Why: h.Why}); s.saidHold[qd.Machine] == h {
			continue
		}
		s.saidHold[qd.Machine] = h
		rd.queue(Notice{Machine: qd.Machine, Reason: h.Reason, Warning: true, Message: fmt.Sprintf("%s of %s not started: %s", qd.Strategy, qd.Machine, h.Why)})
	}
	for m := range s.saidHold {
		if !considered[m] {
			delete(s.saidHold, m)
		}
	}
}

// began records how a begin went, and returns what to say: a remediation that could not begin is held
// and tried again after its wait (BeginFailure; said once per reason), without a slot of the rate
// limit, which only a remediation in the journal takes.
func (s *State) began(name string, err error, now time.Time) (Notice, bool) {
	prev := s.beginFailed[name]
	if err == nil {
		delete(s.beginFailed, name)
		return Notice{}, false
	}
	f := BeginFailure{why: err.Error(), at: now, InARow: prev.InARow + 1}
	s.beginFailed[name] = f
	return Notice{Machine: name, Reason: ReasonRemediationNotBegun, Warning: true,
		Message: fmt.Sprintf("cannot remediate %s: %v (trying again in %v)", name, err, f.Wait())}, prev.why != err.Error()
}
