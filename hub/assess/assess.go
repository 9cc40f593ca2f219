// Package assess judges each machine from the agents' and witnesses' reports and the hub's own
// gossip view: a verdict (Healthy, Suspect, Unhealthy) with its evidence, its etcd member's health for
// the quorum planner, and which expected observers the hub hears. It is pure: no clock but the one
// its observations carry, no lock, no I/O (docs/hub-internals.md).
package assess

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/health/report"
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

// Policy holds the timeouts that turn observations into verdicts, like a MachineHealthCheck's
// unhealthyConditions.
type Policy struct {
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
	// the other members follow: it is catching up (see catchingUp).
	EtcdCatchUp time.Duration
	// NodeConditionTimeouts: how long a Node condition must be bad (Ready not True; another, True)
	// before it counts; conditions not listed are ignored. A Node condition is never enough alone: it
	// makes a machine Unhealthy only with other evidence against it (a probe failing, the hub and
	// observers losing it, etcd unreachable), and Suspect otherwise.
	NodeConditionTimeouts map[string]time.Duration
}

// DefaultPolicy: each judged probe failing for its kind's Judged (kubelet, apiserver and etcd:
// 10 s; etcd 30 s more while it catches up); dead at once; etcd unreachable from a majority for 5 s; reports stale after 20 s (four missed 5 s
// reports); a Node not Ready for 30 s (with other evidence).
func DefaultPolicy() Policy {
	return Policy{
		ProbeTimeouts:          report.JudgedTimeouts(),
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
	// EtcdHealth is the member's health as quorum counts it: Healthy only when a strict majority of the
	// live observers' views reach it (views older than the evidence floor count against it here), or
	// its own word is as new as the floor and no newer view contradicts it; and its own etcd probe
	// (when reported) passes.
	EtcdHealth quorum.Health
	// EtcdAnswers: the machine is not dead and its member answers a strict majority of the observers
	// that check it (it may still fail its own probe: "no leader" when quorum is lost).
	EtcdAnswers bool
	// SeenAt is when the newest evidence that the machine is in view was sent: a fresh report of its
	// own agent, or (its member answering) the oldest report among the observers that reach its
	// member. Zero: nobody sees it now.
	SeenAt time.Time
	// OwnAnswers: its own agent's fresh report says its member answers its status (a serializable call,
	// answered with or without a leader): the member runs.
	OwnAnswers bool
	// EtcdReachedSince counts the observers whose reports, all sent since the member's latest (re)start
	// or change of cluster and since the hub last began to hear a majority, reach its member.
	EtcdReachedSince int
	// Failing are the judged probes its own fresh report says fail (by name), past their timeout or
	// not yet: what several machines failing alike share (commonCauses).
	Failing []string
	// Dead: a strict majority of the expected observers see it dead, its agent gone and its member
	// silent (Unhealthy for that, not for a component failing on a machine that runs). Alive: its own
	// agent reports, fresh, and the hub's gossip holds it alive (a machine that runs, whatever fails on it).
	Dead, Alive bool
	// Gone: a strict majority of the expected observers see its agent gone, and nothing says its member
	// answers: Dead, or Suspect while the hub waits for views of its member newer than a return of its
	// hearing or of etcd's quorum. Its BMC is read meanwhile (hub/pass: watch): a hang its event log
	// records since its last sign of life ends the wait (Observations.Hangs).
	Gone bool
	// LifeAt is the newest sign in these observations that the machine runs: a report of its own
	// agent (when it was sent), the hub's gossip holding it alive (now), an observer's report that
	// holds it alive or reaches its etcd member (when that report was sent). Zero: none. Any such
	// sign restarts the count of a dead machine's stall tolerance (hub/pass: stallOf).
	LifeAt time.Time
	// UpgradeAt is when a kubeadm upgrade began on it, as its agent's latest report says; zero: none
	// (hub/pass reads what planned work that is from the report).
	UpgradeAt time.Time
}

// Assessor turns reports into verdicts. It remembers when conditions without a since of their own
// (a member unreachable from a majority) were first seen.
type Assessor struct {
	policy    Policy
	firstSeen map[string]time.Time
	// resumedSeen: the latest resume of the hub's brakes already told (Judge).
	resumedSeen time.Time
	// heardSince is when the hub's view last changed: it began to hear a strict majority of its
	// expected observers (zero while it does not), or etcd's quorum came back (QuorumBack). Timed
	// evidence counts from there at the earliest (see countedFor); heardWhy says which.
	heardSince time.Time
	heardWhy   string
	// lostOnce: the hub has heard no majority (or etcd had no quorum) at some point since it started,
	// so a heardSince marks a return, not the hub's first pass.
	lostOnce bool
	// heardVersions is each observer's report version when heardSince was last set (snapVersions: to
	// be taken at the next look at the observations): a report no newer holds views from before it,
	// which say nothing of now (see newerThanHeard).
	heardVersions map[string]uint64
	snapVersions  bool
	// deadBy counts, per node, the live observers that see it dead (this pass's; kept to be reused):
	// deadAt indexes deadBy by node (values in one slice: a node's votes are read once per peer in
	// every report, and pointers scattered over the heap cost a cache miss each).
	deadAt map[string]int32
	deadBy []deadVotes
	// deadMemo is, by position in a report's peers, the last node seen dead there and its index in
	// deadBy: the observers' reports mostly list the same dead peers in the same order, and comparing
	// a name is cheaper than hashing it (at 5,000 machines, ten dead: half the map lookups of a pass).
	deadMemo []deadSlot
	// aliveAt is, per node, when the newest live observer's report that holds it alive was sent;
	// reachedAt, per etcd member, when the newest that reaches it was (this pass's: signs of life).
	aliveAt, reachedAt map[string]time.Time
	// expected is the expected set of the latest pass; observers its live observers (a buffer the
	// next pass reuses: nothing keeps them).
	expected  Expected
	observers []report.Report
	sightings []sighting // this pass's, of each machine's node (a buffer, as observers)
	sent      []int64    // when the observers' reports were sent (a buffer, for their Hearing)
	// leader is the etcd leader that a strict majority of the members' agents that name one follow
	// (this pass's; "" when none), at raft term leaderTerm (the highest its followers name), and
	// leaderVotes how many name it.
	leader      string
	leaderTerm  uint64
	leaderVotes int
	// own is what each member's own agent said of it last, and epochs each member's latest (re)start
	// or change of cluster (assess_epoch.go).
	own    map[string]ownView
	epochs map[string]epoch
}

// NewAssessor returns an assessor with policy p.
func NewAssessor(p Policy) *Assessor {
	return &Assessor{policy: p, firstSeen: map[string]time.Time{}}
}

// Observations is what the hub sees at one moment.
type Observations struct {
	Now time.Time
	// Reports are the agents' latest reports, by node.
	Reports map[string]report.Report
	// HubPeers is the hub's own gossip view of each node.
	HubPeers map[string]report.PeerView
	// Hangs are, by machine, the entries of its BMC's event log that record a hang, as the hub last
	// read them (machines with none are absent). A hang logged since a machine's last sign of life
	// proves that the machine is down, not only its agent: the views of its member from before a
	// return of the hub's hearing (or of etcd's quorum) need not be waited for (liveness).
	Hangs map[string][]bmcval.LogEntry
}

// Round is everything the hub tells the assessor in one pass: the policy in force (an inventory
// reload replaces the timeouts; what was first seen is kept), when its brakes were last lifted, whether
// it heard nothing for a while, and the machines, witnesses and observations to judge.
type Round struct {
	Policy    Policy
	Machines  []MachineRef
	Witnesses []string
	Obs       Observations
	// ResumedAt is when the hub's brakes were last lifted (a resume, an unsuspend); zero: never. A
	// resume later than the last one told counts as Resumed.
	ResumedAt time.Time
	// HeardNothing: the hub's passes were too far apart for it to have been running (HeardNothing).
	HeardNothing bool
	// QuorumBack is when etcd's quorum, lost in an earlier pass, came back (QuorumBack); zero: it did
	// not since the last round.
	QuorumBack time.Time
}

// Judge is a pass's assessment: it takes in what the round says happened to the hub, then judges
// every machine (AssessHearing).
func (a *Assessor) Judge(r Round) ([]Assessment, Hearing) {
	a.policy = r.Policy
	if !r.QuorumBack.IsZero() {
		a.QuorumBack(r.QuorumBack)
	}
	if r.ResumedAt.After(a.resumedSeen) {
		// Evidence gathered while the hub was paused or suspended counts from the resume at the
		// earliest (DESIGN.md rule 12): an operator resumes as soon as the work it paused for is done
		// (an etcd recovery: the rebuilt member answers), before its observers have caught up.
		a.Resumed(r.ResumedAt)
		a.resumedSeen = r.ResumedAt
	}
	if r.HeardNothing {
		a.HeardNothing()
	}
	return a.AssessHearing(r.Machines, r.Witnesses, r.Obs)
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
	a.sightings = a.sightings[:0]
	a.observers = appendLiveObservers(a.observers[:0], &a.sightings, e, obs, a.policy.StaleAfter)
	observers := a.observers
	hearing := hearingOf(e, observers, &a.sent)
	switch {
	case !hearing.Majority():
		a.heardSince, a.lostOnce = time.Time{}, true
	case a.heardSince.IsZero():
		a.heardSince, a.heardWhy, a.snapVersions = obs.Now, "the hub last began to hear a majority of its observers", a.lostOnce
	}
	if a.snapVersions && !a.heardSince.IsZero() {
		a.heardVersions, a.snapVersions = map[string]uint64{}, false
		for node, r := range obs.Reports {
			a.heardVersions[node] = r.Version
		}
	}
	a.leader, a.leaderTerm, a.leaderVotes = majorityLeader(observers)
	a.noteRestarts(machines, obs)
	// Who sees whom dead, counted once a pass (per machine it would be quadratic).
	if a.deadAt == nil {
		a.deadAt = map[string]int32{}
	}
	clear(a.deadBy)
	if a.aliveAt == nil {
		a.aliveAt, a.reachedAt = map[string]time.Time{}, map[string]time.Time{}
	}
	clear(a.aliveAt)
	clear(a.reachedAt)
	for i := range observers { // by index: a report is 192 bytes, and there is one per machine
		r := &observers[i]
		if r.Etcd != nil {
			for _, em := range r.Etcd.Members {
				if em.Reachable != nil && *em.Reachable && r.SentAt.After(a.reachedAt[em.Name]) {
					a.reachedAt[em.Name] = r.SentAt
				}
			}
		}
		for j := range r.Peers { // by pointer, as the reports
			p := &r.Peers[j]
			switch {
			case p.State == report.PeerAlive && p.Name != r.Node && r.SentAt.After(a.aliveAt[p.Name]):
				a.aliveAt[p.Name] = r.SentAt
			case p.State == report.PeerDead && p.Name != r.Node:
				v := a.deadVoteAt(j, p.Name)
				if v.n == 0 || p.Since.Before(v.earliest) {
					v.earliest = p.Since
				}
				v.n++
			}
		}
	}
	seen := map[string]bool{}
	out := make([]Assessment, len(machines))
	for i, m := range machines {
		a.assessOne(&out[i], m, &a.sightings[i], &e, obs, observers, seen)
	}
	for k := range a.firstSeen {
		if !seen[k] {
			delete(a.firstSeen, k) // the condition cleared
		}
	}
	return out, hearing
}

type evidence struct {
	unhealthy, suspect []string
	since              time.Time
	failing            []string // the machine's own judged probes failing (by name)
	gone               bool     // Assessment.Gone
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

// assessOne judges m into res; s is what the observations hold of its node. (By pointer: it runs for
// every machine, and each of these is a hundred bytes or more.)
func (a *Assessor) assessOne(res *Assessment, m MachineRef, s *sighting, e *Expected, obs Observations, observers []report.Report, seen map[string]bool) {
	var ev evidence
	// own is its latest report: a live observer's, or looked up again (a stale one), or none (zero).
	var stale report.Report
	own := &stale
	reported, heard := s.reported, s.heard()
	if s.observer >= 0 {
		own = &observers[s.observer]
	} else if reported {
		stale = obs.Reports[m.Node]
	}
	life := a.lifeAt(m, obs.Now, own, reported, heard)
	dead := a.liveness(m, e, &obs, &s.hub, s.known, observers, life, &ev)
	fresh := reported && obs.Now.Sub(own.SentAt) <= a.policy.StaleAfter && !dead
	if fresh {
		a.probes(m, own, obs.Now, &ev)
	} else if !dead {
		ev.doubt("no fresh report from %s (stale after %v)", m.Node, a.policy.StaleAfter)
	}
	*res = Assessment{Machine: m.Name, Verdict: VerdictHealthy, EtcdHealth: quorum.HealthUnknown}
	if fresh {
		res.SeenAt = own.SentAt
	}
	if m.Member != "" {
		var answeredAt time.Time
		res.EtcdHealth, res.EtcdAnswers, res.EtcdReachedSince, answeredAt = a.etcdHealth(m, e, obs.Now, own, fresh, dead, observers, seen, &ev)
		if answeredAt.After(res.SeenAt) {
			res.SeenAt = answeredAt
		}
		// Only from a member alive in the hub's gossip: a hub that just started holds the last reports of
		// members that died before it did, fresh by age, from peers that kept them.
		res.OwnAnswers = fresh && heard && ownViewOf(*own, m.Member).answers
	}
	a.nodeConditions(m, obs.Now, &ev)
	res.Failing, res.Dead, res.Gone, res.LifeAt, res.UpgradeAt = ev.failing, dead, ev.gone, life, own.KubeadmUpgrade
	res.Alive = fresh && heard
	switch {
	case len(ev.unhealthy) > 0:
		res.Verdict, res.Since, res.Reasons = VerdictUnhealthy, ev.since, append(ev.unhealthy, ev.suspect...)
	case len(ev.suspect) > 0:
		res.Verdict, res.Reasons = VerdictSuspect, ev.suspect
	}
}

// HeardNothing tells the assessor that the hub heard nothing for a while (it was not running: stopped,
// frozen, starved of CPU): what it holds is as old as that gap. As after a partition, timed evidence
// counts again from the next pass that hears a majority, and a death from before must stand
// rejoinSettle more.
func (a *Assessor) HeardNothing() { a.heardSince, a.lostOnce = time.Time{}, true }

// newerThanHeard says whether r is newer than the report its observer had sent when the hub last
// began to hear a majority (or quorum came back). In the check that tells a dead machine from a dead
// agent, an observer's "does not answer" counts only from such a report: views from a partition say a
// member on its far side does not answer, and an agent that dies right after the heal would otherwise
// make its healthy member's machine look dead (test/chaos seed 1, on a cold machine: cp-1's agent
// stopped 0.2 s after quorum came back, and the observers' reports from the partition took its
// healthy voter down).
func (a *Assessor) newerThanHeard(r report.Report) bool {
	return a.heardVersions == nil || r.Version > a.heardVersions[r.Node]
}

// HeardFrom tells the assessor that the hub has heard a majority of its observers since at, for why
// (a hub learns it from its passes; a test's history starts there).
func (a *Assessor) HeardFrom(at time.Time, why string) {
	a.heardSince, a.heardWhy = at, why
}

// Resumed tells the assessor that the hub's brakes were lifted at at (a resume, an unsuspend): as
// after a partition, timed evidence counts again from there, and observers' views only from reports
// sent after it.
func (a *Assessor) Resumed(at time.Time) {
	a.heardSince, a.heardWhy, a.lostOnce, a.snapVersions = at, "the hub was resumed", true, true
}

// QuorumBack tells the assessor that etcd's quorum, lost in the hub's previous pass, is back at now.
// What was gathered while it was lost is no evidence now: every member fails its own probe ("no
// leader") and every API server its own while quorum is lost, and the survivors recover within a
// report or two of its return. So timed evidence counts again from now, as after a partition (issue
// found in a far-side partition: cp-0, on the hub's side, had failed "no leader" for 16 minutes; 0.4 s
// after the heal its stale report made it Unhealthy while etcd-1 and etcd-2 were healthy again, and
// it was power-cycled). The caller assesses again before it decides anything.
func (a *Assessor) QuorumBack(now time.Time) {
	a.heardSince, a.heardWhy, a.lostOnce, a.snapVersions = now, "etcd's quorum came back", true, true
}
