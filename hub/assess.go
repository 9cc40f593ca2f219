// Package hub is Hale's decision maker: it assesses machines from the agents' reports, plans with
// quorum, acts through BMCs or owners, and records every step. This file is the assess stage.
package hub

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/quorum"
)

// Verdict is the hub's judgement of a machine.
type Verdict string

// Verdicts.
const (
	VerdictHealthy   Verdict = "Healthy"
	VerdictSuspect   Verdict = "Suspect"
	VerdictUnhealthy Verdict = "Unhealthy"
)

// MachineRef is what the assessor needs of an inventory machine.
type MachineRef struct {
	Name string
	// Node is the machine's name in the gossip pool (its agent's node name).
	Node string
	// Member is its etcd member name; empty when it is not an etcd member.
	Member string
	// Conditions are its Kubernetes Node's conditions (Kubernetes mode), one more source of evidence.
	Conditions []NodeCondition
}

// NodeCondition is one condition of a Node, as the API server last reported it.
type NodeCondition struct {
	Type, Status, Reason string
	Since                time.Time // its lastTransitionTime
}

// bad: Ready is bad when not True; the other conditions (MemoryPressure, DiskPressure, ...) when True.
func (c NodeCondition) bad() bool {
	if c.Type == "Ready" {
		return c.Status != "True"
	}
	return c.Status == "True"
}

// AssessPolicy holds the timeouts that turn observations into verdicts, like a MachineHealthCheck's
// unhealthyConditions.
type AssessPolicy struct {
	// ProbeTimeouts: how long a probe must fail before the machine is Unhealthy. Probes not listed are
	// reported but never make a machine unhealthy (a clock offset or a filling disk is not healed by a
	// reboot).
	ProbeTimeouts map[string]time.Duration
	// DeadTimeout: how long a machine must have been declared dead, by the hub and a majority of live
	// observers, before it is Unhealthy (0: at once; memberlist's suspicion already had its say).
	DeadTimeout time.Duration
	// EtcdUnreachableTimeout: how long a majority of observers must fail to reach a member.
	EtcdUnreachableTimeout time.Duration
	// StaleAfter: a report older than this is no evidence of anything (the agent may be stuck).
	StaleAfter time.Duration
	// EtcdCatchUp: how much longer the etcd probe may fail while the member follows the leader that
	// the other members follow and its raft index rises: it is catching up (see catchingUp).
	EtcdCatchUp time.Duration
	// NodeConditionTimeouts: how long a Node condition must be bad (Ready not True; another, True)
	// before it counts; conditions not listed are ignored. A Node condition is never enough alone: it
	// makes a machine Unhealthy only with other evidence against it (a probe failing, the hub and
	// observers losing it, etcd unreachable), and Suspect otherwise.
	NodeConditionTimeouts map[string]time.Duration
}

// DefaultAssessPolicy: kubelet, apiserver and etcd failing for 10 s (etcd 30 s more while it catches
// up); dead at once; etcd unreachable from a majority for 5 s; reports stale after 20 s (four missed 5 s
// reports); a Node not Ready for 30 s (with other evidence).
func DefaultAssessPolicy() AssessPolicy {
	return AssessPolicy{
		ProbeTimeouts:          map[string]time.Duration{"kubelet": 10 * time.Second, "apiserver": 10 * time.Second, "etcd": 10 * time.Second},
		EtcdUnreachableTimeout: 5 * time.Second,
		StaleAfter:             20 * time.Second,
		EtcdCatchUp:            30 * time.Second,
		NodeConditionTimeouts:  map[string]time.Duration{"Ready": 30 * time.Second},
	}
}

// Assessment is a machine's verdict with its reasons, and its etcd member's health for the planner.
type Assessment struct {
	Machine string
	Verdict Verdict
	// Since is when the evidence behind the verdict began (for Unhealthy: the earliest qualifying).
	Since   time.Time
	Reasons []string
	// EtcdHealth is the member's health as quorum counts it: Healthy only when a majority of live
	// observers reach it and its own etcd probe (when reported) passes.
	EtcdHealth quorum.Health
	// EtcdAnswers: the machine is not dead and its member answers a strict majority of the observers
	// that check it (it may still fail its own probe: "no leader" when quorum is lost).
	EtcdAnswers bool
	// SeenAt is when the newest evidence that the machine is in view was sent: a fresh report of its
	// own agent, or (its member answering) the oldest report among the observers that reach its
	// member. Zero: nobody sees it now.
	SeenAt time.Time
}

// Assessor turns reports into verdicts. It remembers when conditions without a since of their own
// (a member unreachable from a majority) were first seen.
type Assessor struct {
	policy    AssessPolicy
	firstSeen map[string]time.Time
	// heardSince is when the hub's view last changed: it began to hear a strict majority of its
	// expected observers (zero while it does not), or etcd's quorum came back (QuorumBack). Timed
	// evidence counts from there at the earliest (see counted); heardWhy says which.
	heardSince time.Time
	heardWhy   string
	// lostOnce: the hub has heard no majority (or etcd had no quorum) at some point since it started,
	// so a heardSince marks a return, not the hub's first pass.
	lostOnce bool
	// raft is each node's etcd raft index as its latest report gave it, and the index of the report
	// before (a member catching up: see catchingUp).
	raft map[string]raftProgress
	// deadBy counts, per node, the live observers that see it dead (this pass's; kept to be reused).
	deadBy map[string]*deadVotes
	// expected is the expected set of the latest pass; observers its live observers (a buffer the
	// next pass reuses: nothing keeps them).
	expected  Expected
	observers []health.Report
	// leader is the etcd leader that a strict majority of the members' agents that name one follow
	// (this pass's; "" when none), and leaderVotes how many name it.
	leader      string
	leaderVotes int
}

// raftProgress is one node's etcd raft index across its reports.
type raftProgress struct {
	version     uint64 // the report it is from
	index, from uint64 // the index, and the one before it
}

// deadVotes are the observers that see one node dead: how many, and since when at the earliest.
type deadVotes struct {
	n        int
	earliest time.Time
}

// NewAssessor returns an assessor with policy p.
func NewAssessor(p AssessPolicy) *Assessor {
	return &Assessor{policy: p, firstSeen: map[string]time.Time{}}
}

// Observations is what the hub sees at one moment.
type Observations struct {
	Now time.Time
	// Reports are the agents' latest reports, by node.
	Reports map[string]health.Report
	// HubPeers is the hub's own gossip view of each node.
	HubPeers map[string]health.PeerView
}

// SetPolicy replaces the timeouts (an inventory reload); what was first seen is kept.
func (a *Assessor) SetPolicy(p AssessPolicy) { a.policy = p }

// Expected is the fixed set of observers (DESIGN.md rule 6): the agent of every machine, the
// witnesses (agents on other hosts that observe and vote but hold no etcd member), and the hub. A
// verdict that can lead to action, and the membership the planner uses, need a strict majority of this
// set: never of the observers the hub happens to hear, which on the minority side of a partition are
// a majority of almost nothing.
type Expected struct {
	// Agents and Witnesses are gossip node names.
	Agents, Witnesses []string
	// judgeNodes are the judges of etcd: the agents of etcd members and the witnesses.
	judgeNodes []string
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
			e.judgeNodes = append(e.judgeNodes, m.Node)
		}
	}
	e.judgeNodes = append(e.judgeNodes, witnesses...)
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
func (e Expected) Judges() int { return len(e.judgeNodes) }

// Hearing is how many of the expected observers the hub hears now: itself, and every expected agent
// and witness alive in its gossip view with a fresh report.
type Hearing struct {
	// set is the expected set heard from.
	set      Expected
	Expected int
	// Heard lists the observers heard, the hub first; Missing the others.
	Heard, Missing []string
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
	return hearingOf(e, appendLiveObservers(nil, e, obs, staleAfter))
}

// hearingOf is the Hearing of the live observers appendLiveObservers found (in the expected set's
// order, which it relies on).
func hearingOf(e Expected, observers []health.Report) Hearing {
	h := Hearing{set: e, Expected: e.Size(), Heard: make([]string, 1, len(observers)+1)}
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
	return h
}

// Assess judges every machine. Rule 6 of DESIGN.md: the hub losing sight of a machine is never enough;
// dead needs a strict majority of the expected observers (the hub and the agents and witnesses that
// see it dead, with fresh reports) to agree, and so does a member unreachable.
func (a *Assessor) Assess(machines []MachineRef, witnesses []string, obs Observations) []Assessment {
	out, _ := a.AssessHearing(machines, witnesses, obs)
	return out
}

// AssessHearing is Assess, and also says which expected observers the hub hears (what Assess judges
// with): the pass needs both, from one look at the observations.
func (a *Assessor) AssessHearing(machines []MachineRef, witnesses []string, obs Observations) ([]Assessment, Hearing) {
	if !a.expected.same(machines, witnesses) { // built again only when the inventory changes
		a.expected = ExpectedOf(machines, witnesses)
	}
	e := a.expected
	a.observers = appendLiveObservers(a.observers[:0], e, obs, a.policy.StaleAfter)
	observers := a.observers
	hearing := hearingOf(e, observers)
	switch {
	case !hearing.Majority():
		a.heardSince, a.lostOnce = time.Time{}, true
	case a.heardSince.IsZero():
		a.heardSince, a.heardWhy = obs.Now, "the hub last began to hear a majority of its observers"
	}
	a.leader, a.leaderVotes = majorityLeader(observers)
	// Who sees whom dead, counted once a pass (per machine it would be quadratic).
	if a.deadBy == nil {
		a.deadBy = map[string]*deadVotes{}
	}
	for _, v := range a.deadBy {
		*v = deadVotes{}
	}
	for _, r := range observers {
		for _, p := range r.Peers {
			if p.State == health.PeerDead && p.Name != r.Node {
				v := a.deadBy[p.Name]
				if v == nil {
					v = &deadVotes{}
					a.deadBy[p.Name] = v
				}
				if v.n == 0 || p.Since.Before(v.earliest) {
					v.earliest = p.Since
				}
				v.n++
			}
		}
	}
	seen := map[string]bool{}
	out := make([]Assessment, 0, len(machines))
	for _, m := range machines {
		out = append(out, a.assessOne(m, e, obs, observers, seen))
	}
	for k := range a.firstSeen {
		if !seen[k] {
			delete(a.firstSeen, k) // the condition cleared
		}
	}
	return out, hearing
}

// appendLiveObservers appends the expected agents and witnesses the hub sees alive whose latest
// report is fresh, in the expected set's order. Anyone else in the gossip pool is no observer.
func appendLiveObservers(out []health.Report, e Expected, obs Observations, staleAfter time.Duration) []health.Report {
	for _, nodes := range [][]string{e.Agents, e.Witnesses} {
		for _, node := range nodes {
			r, reported := obs.Reports[node]
			if pv, ok := obs.HubPeers[node]; reported && ok && pv.State == health.PeerAlive && obs.Now.Sub(r.SentAt) <= staleAfter {
				out = append(out, r)
			}
		}
	}
	return out
}

type evidence struct {
	unhealthy, suspect []string
	since              time.Time
}

func (e *evidence) bad(since time.Time, format string, args ...any) {
	e.unhealthy = append(e.unhealthy, fmt.Sprintf(format, args...))
	if e.since.IsZero() || since.Before(e.since) {
		e.since = since
	}
}

func (e *evidence) doubt(format string, args ...any) {
	e.suspect = append(e.suspect, fmt.Sprintf(format, args...))
}

func (a *Assessor) assessOne(m MachineRef, e Expected, obs Observations, observers []health.Report, seen map[string]bool) Assessment {
	var ev evidence
	dead := a.liveness(m, e, obs, observers, &ev)
	own, fresh := obs.Reports[m.Node]
	fresh = fresh && obs.Now.Sub(own.SentAt) <= a.policy.StaleAfter && !dead
	if fresh {
		a.followRaft(own)
		a.probes(own, obs.Now, &ev)
	} else if !dead {
		ev.doubt("no fresh report from %s (stale after %v)", m.Node, a.policy.StaleAfter)
	}
	res := Assessment{Machine: m.Name, Verdict: VerdictHealthy, EtcdHealth: quorum.HealthUnknown}
	if fresh {
		res.SeenAt = own.SentAt
	}
	if m.Member != "" {
		var answeredAt time.Time
		res.EtcdHealth, res.EtcdAnswers, answeredAt = a.etcdHealth(m, e, obs.Now, own, fresh, dead, observers, seen, &ev)
		if answeredAt.After(res.SeenAt) {
			res.SeenAt = answeredAt
		}
	}
	a.nodeConditions(m, obs.Now, &ev)
	switch {
	case len(ev.unhealthy) > 0:
		res.Verdict, res.Since, res.Reasons = VerdictUnhealthy, ev.since, append(ev.unhealthy, ev.suspect...)
	case len(ev.suspect) > 0:
		res.Verdict, res.Reasons = VerdictSuspect, ev.suspect
	}
	return res
}

// rejoinSettle: a death that began while the hub heard no majority must still stand this long after
// the hub hears one again. The observers' views from a partition take a report or two to catch up when
// it heals (test/chaos seed 3: a machine cut off with the hub, seen dead by the others, its agent
// killed a second after the heal, was power-cycled on those views though its member was healthy).
const rejoinSettle = 5 * time.Second

// HeardNothing tells the assessor that the hub heard nothing for a while (it was not running: stopped,
// frozen, starved of CPU): what it holds is as old as that gap. As after a partition, timed evidence
// counts again from the next pass that hears a majority, and a death from before must stand
// rejoinSettle more.
func (a *Assessor) HeardNothing() { a.heardSince, a.lostOnce = time.Time{}, true }

// liveness weighs the hub's and the observers' views of m; it reports whether m counts as dead: the
// hub and enough others to make a strict majority of the expected observers see it dead.
func (a *Assessor) liveness(m MachineRef, e Expected, obs Observations, observers []health.Report, ev *evidence) bool {
	hub, known := obs.HubPeers[m.Node]
	if !known || hub.State == health.PeerAlive {
		return false
	}
	if hub.State == health.PeerLeft {
		ev.doubt("%s left the gossip pool on purpose (agent stopped) at %s", m.Node, hub.Since.Format(time.RFC3339))
		return false
	}
	others := len(observers)
	if slices.ContainsFunc(observers, func(r health.Report) bool { return r.Node == m.Node }) {
		others--
	}
	agree, earliest := 0, hub.Since
	if v := a.deadBy[m.Node]; v != nil && v.n > 0 {
		agree, earliest = v.n, minTime(earliest, v.earliest)
	}
	votes, need := 1+agree, e.Size()/2+1 // the hub's own among them
	if votes < need {
		ev.doubt("the hub lost sight of %s, but only %d of %d expected observers see it dead (the hub and %d of the %d others it hears; "+
			"a strict majority is %d): not corroborated", m.Node, votes, e.Size(), agree, others, need)
		return false
	}
	// An agent that dies (crashes, is OOM-killed, stops) takes its gossip member with it, and its
	// machine looks dead; but a dead machine's etcd member does not answer. When most of the observers
	// that check it reach m's member, the agent is what is down, not the machine: rebooting it would
	// take down a healthy voter (found by test/chaos: an agent stopped beside a dead member, and the
	// reboot cost quorum).
	if m.Member != "" {
		if reach, unreach, _ := reachability(m.Member, observers, m.Node); 2*reach > reach+unreach {
			ev.doubt("%s's agent is gone per %d of %d expected observers, but its etcd member %s answers %d of the %d observers that check it: "+
				"the agent is down, not the machine", m.Node, votes, e.Size(), m.Member, reach, reach+unreach)
			return false
		}
	}
	wait := a.policy.DeadTimeout
	if a.lostOnce && a.heardSince.After(earliest) && wait < rejoinSettle {
		wait = rejoinSettle
	}
	if d, _ := a.counted(obs.Now, earliest); d < wait {
		ev.doubt("%s dead for %v per %d of %d expected observers (unhealthy at %v)", m.Node, d.Round(time.Millisecond), votes, e.Size(), wait)
		return false
	}
	ev.bad(earliest, "%s dead since %s per %d of %d expected observers (the hub and %d others)", m.Node,
		earliest.UTC().Format("15:04:05.000Z07:00"), votes, e.Size(), agree)
	return true
}

// counted is how long a condition that began at since counts as evidence at now: time while the hub
// did not hear a majority of its observers does not count, so after a partition heals (or the hub
// starts) a failure must last its whole timeout again before it leads to action. A member on the
// minority side of a partition fails its own etcd probe ("no leader") for as long as the partition
// lasts, and is fine a second after it heals: that is no reason to reboot it. The note says so when
// it applies.
func (a *Assessor) counted(now, since time.Time) (time.Duration, string) {
	if a.heardSince.After(since) {
		return now.Sub(a.heardSince), fmt.Sprintf(", counted from %s when %s", a.heardSince.UTC().Format("15:04:05.000Z07:00"), a.heardWhy)
	}
	return now.Sub(since), ""
}

// QuorumBack tells the assessor that etcd's quorum, lost in the hub's previous pass, is back at now.
// What was gathered while it was lost is no evidence now: every member fails its own probe ("no
// leader") and every API server its own while quorum is lost, and the survivors recover within a
// report or two of its return. So timed evidence counts again from now, as after a partition (issue
// found in a far-side partition: cp-0, on the hub's side, had failed "no leader" for 16 minutes; 0.4 s
// after the heal its stale report made it Unhealthy while etcd-1 and etcd-2 were healthy again, and
// it was power-cycled). The caller assesses again before it decides anything.
func (a *Assessor) QuorumBack(now time.Time) {
	a.heardSince, a.heardWhy, a.lostOnce = now, "etcd's quorum came back", true
}

// probes weighs m's own probe results against the policy's timeouts. A failure is known to have
// lasted until the report that carries it was sent, not until now: an agent that dies (or is cut off)
// while its probe fails must not let the failure grow for as long as its last report stays fresh
// (found by test/chaos seed 3: a member with no leader during a partition, its agent killed just after
// the heal, was power-cycled on that last report though healthy again).
func (a *Assessor) probes(own health.Report, now time.Time, ev *evidence) {
	upTo := minTime(now, own.SentAt)
	for _, p := range own.Probes {
		timeout, counts := a.policy.ProbeTimeouts[p.Name]
		if p.OK || !counts {
			continue
		}
		if p.Name == "etcd" {
			if why := a.catchingUp(own); why != "" {
				timeout += a.policy.EtcdCatchUp
				p.Detail += fmt.Sprintf("; catching up (%s): %v more allowed", why, a.policy.EtcdCatchUp)
			}
		}
		if d, note := a.counted(upTo, p.Since); d >= timeout {
			ev.bad(p.Since, "%s failing for %v%s (unhealthy at %v): %s", p.Name, upTo.Sub(p.Since).Round(time.Second), note, timeout, p.Detail)
		} else {
			ev.doubt("%s failing for %v%s (unhealthy at %v): %s", p.Name, upTo.Sub(p.Since).Round(time.Millisecond), note, timeout, p.Detail)
		}
	}
}

// followRaft notes the raft index of a node's report, when it is a report not seen before.
func (a *Assessor) followRaft(r health.Report) {
	if r.Etcd == nil || r.Etcd.RaftIndex == 0 {
		return
	}
	if a.raft == nil {
		a.raft = map[string]raftProgress{}
	}
	if p := a.raft[r.Node]; p.version != r.Version {
		a.raft[r.Node] = raftProgress{version: r.Version, index: r.Etcd.RaftIndex, from: p.index}
	}
}

// catchingUp says why a member whose etcd probe fails is catching up rather than failing ("" when it
// is not): it follows the leader that the other members follow, and its raft index rose since its
// agent's report before. A member that rejoins after a partition or a restart gets the entries it
// missed (or a snapshot) from that leader, and until it has applied up to the leader's commit index it
// cannot serve a linearizable read: etcd answers "request timed out" after its request timeout (5 s +
// 2 election timeouts: 7 s by default) and the probe fails again (test: a member of the minority side
// had a leader 1 s after a 60 s partition healed and answered no linearizable read for 12 s, past the
// probe's 10 s). EtcdCatchUp bounds the extra time: a member that never catches up is judged as usual.
func (a *Assessor) catchingUp(own health.Report) string {
	v, p := own.Etcd, a.raft[own.Node]
	// Its own word is not enough: another member must follow that leader too.
	if v == nil || a.leader == "" || a.leaderVotes < 2 || v.LeaderID != a.leader || p.version != own.Version || p.from == 0 || p.index <= p.from {
		return ""
	}
	return fmt.Sprintf("it follows leader %s, as the other members do, and its raft index rose from %d to %d", v.LeaderID, p.from, p.index)
}

// majorityLeader is the etcd leader a strict majority of the observers that name one follow, and how
// many name it ("" when none: quorum lost, or views that disagree).
func majorityLeader(observers []health.Report) (string, int) {
	counts, total := map[string]int{}, 0
	for _, r := range observers {
		if r.Etcd != nil && r.Etcd.LeaderID != "" && r.Etcd.LeaderID != "0" {
			counts[r.Etcd.LeaderID]++
			total++
		}
	}
	for id, n := range counts {
		if 2*n > total {
			return id, n
		}
	}
	return "", 0
}

// nodeConditions weighs m's Node conditions: past their timeout they count as unhealthy only when
// other evidence already stands against m (never alone: the API server's view of a node is one more
// observer, not a verdict), otherwise they are doubts.
func (a *Assessor) nodeConditions(m MachineRef, now time.Time, ev *evidence) {
	corroborated := len(ev.unhealthy)+len(ev.suspect) > 0
	for _, c := range m.Conditions {
		timeout, counts := a.policy.NodeConditionTimeouts[c.Type]
		if !counts || !c.bad() {
			continue
		}
		d, note := a.counted(now, c.Since)
		what := fmt.Sprintf("node %s %s=%s (%s) for %v%s", m.Node, c.Type, c.Status, c.Reason, now.Sub(c.Since).Round(time.Second), note)
		switch {
		case d >= timeout && corroborated:
			ev.bad(c.Since, "%s, with the evidence above", what)
		case d >= timeout:
			ev.doubt("%s, but nothing else stands against it: not enough alone", what)
		default:
			ev.doubt("%s (counts at %v)", what, timeout)
		}
	}
}

// etcdHealth says how quorum should count m's member: from its own etcd probe and from whether the
// observers that judge etcd (its own agent among them) reach it. Unreachable is evidence only from a
// strict majority of the expected agents and witnesses. It also says whether the member answers (a
// strict majority of the observers that check it reach it, whatever its own probe says), and if so
// when the oldest report among those that reach it was sent.
func (a *Assessor) etcdHealth(m MachineRef, e Expected, now time.Time, own health.Report, fresh, dead bool, observers []health.Report,
	seen map[string]bool, ev *evidence) (h quorum.Health, answers bool, answeredAt time.Time) {
	if dead {
		return quorum.Unhealthy, false, time.Time{}
	}
	reach, unreach, oldest := reachability(m.Member, observers, "")
	if answers = 2*reach > reach+unreach; answers {
		answeredAt = oldest
	}
	ownOK, ownKnown := true, false
	if fresh {
		for _, p := range own.Probes {
			if p.Name == "etcd" {
				ownOK, ownKnown = p.OK, true
			}
		}
	}
	voters := reach + unreach
	switch {
	case voters > 0 && 2*unreach > voters:
		if 2*unreach <= e.Judges() {
			ev.doubt("etcd member %s unreachable from %d of the %d observers that report on it, but that is no strict majority of the %d expected agents and witnesses",
				m.Member, unreach, voters, e.Judges())
			return quorum.Unhealthy, answers, answeredAt
		}
		key := "unreachable/" + m.Member
		seen[key] = true
		first, ok := a.firstSeen[key]
		if !ok {
			first, a.firstSeen[key] = now, now
		}
		if d, _ := a.counted(now, first); d >= a.policy.EtcdUnreachableTimeout {
			ev.bad(first, "etcd member %s unreachable from %d of %d expected observers for %v", m.Member, unreach, e.Judges(), d.Round(time.Second))
		} else {
			ev.doubt("etcd member %s unreachable from %d of %d expected observers for %v (unhealthy at %v)", m.Member, unreach, e.Judges(),
				d.Round(time.Millisecond), a.policy.EtcdUnreachableTimeout)
		}
		return quorum.Unhealthy, answers, answeredAt
	case ownKnown && !ownOK:
		return quorum.Unhealthy, answers, answeredAt
	case voters > 0 && 2*reach > voters && (!ownKnown || ownOK):
		return quorum.Healthy, answers, answeredAt
	case voters == 0 && ownKnown && ownOK:
		return quorum.Healthy, answers, answeredAt // no other observer (a one-member cluster): its own word is all there is
	}
	return quorum.HealthUnknown, answers, answeredAt
}

// reachability counts the observers whose etcd view reaches member, and those whose view does not,
// and says when the oldest report among those that reach it was sent.
func reachability(member string, observers []health.Report, except string) (reach, unreach int, oldest time.Time) {
	for _, r := range observers {
		if r.Etcd == nil || r.Node == except {
			continue
		}
		for _, em := range r.Etcd.Members {
			if em.Name == member && em.Reachable != nil {
				if *em.Reachable {
					if reach == 0 || r.SentAt.Before(oldest) {
						oldest = r.SentAt
					}
					reach++
				} else {
					unreach++
				}
			}
		}
	}
	return reach, unreach, oldest
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
