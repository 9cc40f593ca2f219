package pass

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// decide is the part of a pass's compute (compute.go) that decides what to begin and why each other machine
// waits. It reads no clock, no journal, no gossip and no lock: the same facts give the same decision,
// which is what its table tests rely on.

// Facts are what one pass decides from.
type Facts struct {
	Now          time.Time
	Inventory    Inventory
	Observations assess.Observations
	Assessments  []assess.Assessment
	Hearing      assess.Hearing
	// Flights are the remediations under way, by machine.
	Flights map[string]Flight
	// Paused says who paused the hub ("" when nothing pauses it); suspended whether it is
	// observe-only.
	Paused    string
	Suspended bool
	Detached  map[string]Brake
	// healthyAt is when each machine was last seen Healthy; startFailed the machines whose last
	// remediation could not begin.
	healthyAt   map[string]time.Time
	beginFailed map[string]BeginFailure
	// seenAt is when each machine was last in view, where an earlier pass saw it later than this pass's
	// assessment does (State.seenAt: read through newest).
	seenAt map[string]time.Time
	// LoginWait says, for a machine whose BMC account refused the credentials and is in its wait
	// (logins), why no login is made now.
	LoginWait map[string]string
	// History is the ledger's record of each Unhealthy machine without a remediation in flight (the
	// only ones hold reads).
	History map[string][]Past
	// RecentStarts counts the hub's own starts within the rate-limit window.
	RecentStarts int
	// quorumLost: the latest pass that planned saw etcd's quorum lost, in lostIn (its membership).
	quorumLost bool
	lostIn     quorum.Cluster
	// lostSince: when the passes that planned began to see etcd's quorum lost (this pass, should it be
	// the first). The shorter waits of a member needed for quorum count from then (stallOf).
	lostSince time.Time
	// heard: heardThrough, worked out once a pass (decide), shared by the copies of these facts.
	heard *heardMemo
	// BMCs: what the last readiness check of each machine's BMC found (evidence of a permanent loss).
	BMCs map[string]BMCReadiness
	// lifeAt: when each machine last showed a sign of life, where an earlier pass saw one later than
	// this pass's assessment does (State.lifeAt: read through newest).
	lifeAt map[string]time.Time
	// Retired: the old cluster the last etcd recovery replaced (its members are held until they rejoin).
	Retired Retirement
	// rebuilt: the etcd cluster's ID changed and the old members the new cluster left out are not
	// known yet (nil: nothing to tell).
	rebuilt *clusterChange
	// scratch: the state's reusable memory (nil: decide allocates).
	scratch *scratch
	// Listen, when set, says why the pass only listens (the hub stands by, or warms up): it decides
	// nothing.
	Listen string
	// MarkWritten: how the raft mark's latest write went, when it ended since the previous pass; begun
	// how the begins queued by earlier passes went (Hub.beginQueued), those that ended since.
	MarkWritten *MarkResult
	Begun       []BeginResult
}

// decision is what a pass decided.
type decision struct {
	// notPlanning says why nothing was planned ("" when the pass planned).
	notPlanning string
	cluster     quorum.Cluster
	outcome     quorum.Outcome
	// begin are the remediations to begin now, in order.
	begin []ToBegin
	// holds say why each machine the planner considered is not started now: the hub's own holds (the
	// machine's history, its brakes, the rate limit) and the planner's waits.
	holds map[string]Hold
	// needs are the Unhealthy machines the hub will not heal again by itself, by why: given up,
	// flapping, fenced (what an on-call engineer is paged for).
	needs map[string]OperatorNeed
	// silent are, while etcd's quorum is lost, the voters of the inventory's machines whose members
	// answer no majority of the observers (SilentVoters).
	silent []string
	// quorumBack: etcd's quorum, lost in the latest pass that planned, is back, or (rebuilt) the
	// cluster that lost it was replaced by another membership (a recovery from a survivor: etcd
	// changes no membership without quorum). Nothing else is decided: the evidence gathered while it
	// was lost is judged again first (assess.Assessor.quorumBack).
	quorumBack, rebuilt bool
	// retire: etcd was rebuilt without a recovery of Hale's (rebuiltOutside); this pass held its old
	// members already.
	retire *RecoveryRecord
	// survivorSeen: this pass is the first to see the rebuilt cluster healthy on the last recovery's
	// survivor (retirement.survivorSeenNow).
	survivorSeen bool
	// watch: the machines whose BMCs the hub reads for proof of a hang while it waits (stall.go), or
	// while the assessor does (Suspect and Gone: assess.Observations.Hangs).
	watch []string
}

// OperatorNeed says why an Unhealthy machine waits for an operator: the hub will not start another
// remediation of it by itself.
type OperatorNeed string

// Operator needs.
const (
	NeedGaveUp   OperatorNeed = "GaveUp"   // maxAttempts remediations failed since it was last healthy
	NeedFlapping OperatorNeed = "Flapping" // maxAttempts remediations within the flap window
	NeedFenced   OperatorNeed = "Fenced"   // fenced on purpose: it stays off until an operator acts
	NeedUnseen   OperatorNeed = "Unseen"   // power-cycled, and nobody has seen it since: a partition, or a host that does not boot
	NeedRetired  OperatorNeed = "Retired"  // a member of the old cluster an etcd recovery replaced, not yet back in the new one (`agent rejoin`)
)

// ToBegin is a remediation to begin.
type ToBegin struct {
	Machine     Machine
	Plan        quorum.Plan
	Remediation journal.Remediation
	// Detected: when the machine last turned Unhealthy (step sets it).
	Detected time.Time
	// grounds: why the hub acts now (stall.go); proved: on its BMC's proof of a hang.
	grounds string
	proved  bool
}

// decide is the pass's pure core: membership, holds, the plan, then the hub's brakes and rate limit
// over what the planner admitted.
func decide(f Facts) decision {
	f.heard = &heardMemo{}
	cluster, why := MembershipOf(f.Inventory, f.Observations, f.Assessments, f.Hearing, f.Flights)
	if why != "" {
		return decision{notPlanning: why + f.Retired.RunningOld(f.Observations, f.Inventory.Policy.Assess.StaleAfter)}
	}
	var retire *RecoveryRecord
	if c := f.rebuilt; c != nil && f.Retired.Cluster != c.from {
		if retire = rebuiltOutside(f, cluster, *c); retire != nil {
			f.Retired = RetirementOf(retire)
		}
	}
	d := decideIn(f, cluster)
	d.retire = retire
	return d
}

// decideIn is decide once the observers agree on the etcd membership (cluster).
func decideIn(f Facts, cluster quorum.Cluster) decision {
	p := f.Inventory.Policy
	if f.quorumLost && !cluster.Budget(p.Quorum).QuorumLost() {
		return decision{cluster: cluster, quorumBack: true}
	}
	if f.quorumLost && len(f.lostIn.Members) > 0 && !sameVoters(f.lostIn, cluster) {
		// The new cluster's only voter failed "no leader" in the old one until the recovery: that
		// evidence is stale, and a member healed on it would take the rebuilt cluster down.
		return decision{cluster: cluster, quorumBack: true, rebuilt: true}
	}
	in := quorum.Input{Cluster: cluster, Policy: p.Quorum}
	if f.scratch != nil {
		in.Machines = f.scratch.planned[:0]
		defer func() { f.scratch.planned = in.Machines[:0] }() // the outcome keeps none of it
	}
	failed, needs, holds := map[string]int{}, map[string]OperatorNeed{}, map[string]Hold{}
	var watch []string
	ad := Admission{Lost: cluster.Budget(p.Quorum).QuorumLost(), Silent: SilentVoters(f, cluster), common: commonCauses(f, cluster)}
	var none assess.Assessment
	for i := range f.Inventory.Machines { // by pointer: a machine is 328 bytes, an assessment 184
		m, a := &f.Inventory.Machines[i], cmp.Or(assessmentAt(f.Assessments, i, f.Inventory.Machines[i].Name), &none)
		qm := quorum.Machine{Name: m.Name, Member: m.Member, Pool: m.Pool, Strategy: m.Strategy,
			Unhealthy: a.Verdict == assess.VerdictUnhealthy, Since: a.Since, Replace: m.Replace}
		if m.Strategy == quorum.Replace && m.Member != "" {
			qm.Replace.NewMember = m.Member + NewMemberSuffix
		}
		if fl, ok := f.Flights[m.Name]; ok {
			qm.InFlight, qm.Strategy, qm.Remaining = true, fl.Plan.Strategy, fl.StillToCome(cluster)
		} else if hs := MachineHolds(&f, m, a, ad, byHub); len(hs) > 0 {
			h := hs[0]
			if h.Reason == ReasonMayResume && m.Endpoint.Driver != "" {
				watch = append(watch, m.Name)
			}
			if failed[m.Name] = h.failed; h.Why != "" {
				holds[m.Name], qm.Held = h, h.Why
			}
			if h.Need != "" {
				needs[m.Name] = h.Need
			}
		} else if a.Verdict == assess.VerdictSuspect && a.Gone && m.Endpoint.Driver != "" {
			watch = append(watch, m.Name) // a hang its BMC proves ends the assessor's wait for newer views
		}
		in.Machines = append(in.Machines, qm)
	}
	out, err := quorum.PlanPass(in)
	if err != nil {
		return decision{notPlanning: err.Error()}
	}
	d := decision{cluster: cluster, outcome: out, needs: needs, holds: holds, silent: ad.Silent, survivorSeen: f.Retired.survivorSeenNow(f), watch: watch}
	for _, qd := range out.Decisions {
		if _, held := holds[qd.Machine]; !held && !qd.Start && !qd.InFlight {
			holds[qd.Machine] = Hold{Reason: ReasonWaiting, Why: qd.Reason}
		}
	}
	slots := p.RateMax - f.RecentStarts
	started := out.Started()
	at := inventoryIndex(f.Inventory, started)
	for _, qd := range started {
		i, ok := at[qd.Machine]
		if !ok {
			continue
		}
		m := f.Inventory.Machines[i]
		switch {
		case f.Paused != "":
			holds[m.Name] = Hold{Reason: ReasonPaused, Why: fmt.Sprintf("paused (%s): %s of %s waits for the pause to be lifted", f.Paused, qd.Strategy, m.Name)}
		case f.Suspended:
			holds[m.Name] = Hold{Reason: ReasonSuspended, Why: fmt.Sprintf("suspended: would start %s of %s (%s): %s", qd.Strategy, m.Name, qd.Reason, qd.Plan.StepList())}
		case slots <= 0:
			holds[m.Name] = Hold{Reason: ReasonRateLimited, Why: fmt.Sprintf("rate limit: %d remediations started in the last %v (max %d): %s waits, to stop a remediation storm",
				p.RateMax-slots, p.RatePer, p.RateMax, m.Name)}
		default:
			slots--
			d.begin = append(d.begin, toBeginOf(f, cluster, m, qd, failed[m.Name], stallOf(f, m, AssessmentOf(f.Assessments, i, m.Name), ad.Lost)))
		}
	}
	return d
}

// inventoryIndex is where each machine of ds is in inv.Machines (one walk of the inventory, however
// many machines start: a search each was quadratic at scale).
func inventoryIndex(inv Inventory, ds []quorum.Decision) map[string]int {
	at := make(map[string]int, len(ds))
	if len(ds) == 0 {
		return at
	}
	for _, d := range ds {
		at[d.Machine] = -1
	}
	for i := range inv.Machines {
		m := &inv.Machines[i]
		if j, ok := at[m.Name]; ok && j < 0 {
			at[m.Name] = i
		}
	}
	maps.DeleteFunc(at, func(_ string, i int) bool { return i < 0 })
	return at
}

// answersHold is the hold on a machine whose etcd member runs while etcd has lost quorum (lost): its own
// agent says it answers its status, or a strict majority of the observers that check it reach it. With
// quorum lost every member fails its own probe ("no leader") and every API server its own, so a
// running member turns Unhealthy too once that has lasted its timeout, and the planner would count its
// reboot free (it is no healthy voter). It is not (DESIGN.md rule 13): it takes down a running member,
// perhaps the only one left with the data, and lengthens the outage (test/quorumlost: two members
// killed, the BMCs slow, the survivor's reboot begun 10 s in; on real processes after `agent recover`:
// the rebuilt cluster's only member, its observers still catching up, cycled as free). While other
// voters are silent (SilentVoters) they are healed first; when every voter runs, a cycle heals nothing
// that a running member can be healed of, and an operator decides. ok false: not held.
func answersHold(f Facts, m Machine, a assess.Assessment, lost bool, silent []string) (Hold, bool) {
	if !lost || !(a.EtcdAnswers || a.OwnAnswers) {
		return Hold{}, false
	}
	how := "answers a strict majority of the observers that check it"
	if a.OwnAnswers {
		how = "answers its status on its own machine"
	}
	others := slices.DeleteFunc(slices.Clone(silent), func(s string) bool { return s == m.Member })
	if len(others) > 0 {
		return Hold{Reason: ReasonSilentVotersFirst, Why: fmt.Sprintf("etcd has lost quorum and %s do not answer: %s's member %s, and its failures follow from the lost quorum "+
			"(`hub explain %s`): the members that do not answer are healed first, as rebooting one that answers only lengthens the outage",
			strings.Join(others, ", "), m.Name, how, m.Name)}, true
	}
	return Hold{Reason: ReasonMemberAnswers, Why: fmt.Sprintf("etcd has lost quorum, and %s's member %s: it runs, and its failures follow from the lost quorum "+
		"(`hub explain %s`). A power-cycle of a running member is no free action: the hub does not take it (`hub reboot %s --force` if it must be)",
		m.Name, how, m.Name, m.Name)}, true
}

// commonCauses holds the Unhealthy machines that fail a probe alike with a strict majority of the
// voters' machines, every one of them with a healthy member: the API server probe failing on every
// control-plane machine at once (an expired or wrong certificate, a bad flag rolled out everywhere, a
// webhook or a dependency down) is one cause they share, not one fault each, and a power-cycle of each
// in turn takes the control plane down member by member for nothing (found on a real kubeadm cluster:
// the agents' API server probe failed on all three machines, and the hub power-cycled each in turn,
// the budget allowing one at a time). A probe failing still within its timeout counts, so that
// machines turning Unhealthy a few hundred milliseconds apart are seen together. The etcd probe is
// not among them: a member failing its own probe is not healthy. An operator's `hub reboot` still
// cycles a machine held so.
func commonCauses(f Facts, cluster quorum.Cluster) map[string]Hold {
	var voters int
	alike := map[string][]string{} // probe → the voters' machines failing it with a healthy member
	for i := range f.Inventory.Machines {
		m := &f.Inventory.Machines[i]
		j := cluster.Index(m.Member)
		if m.Member == "" || j < 0 || cluster.Members[j].Learner {
			continue
		}
		voters++
		a := AssessmentOf(f.Assessments, i, m.Name)
		if a.EtcdHealth != quorum.Healthy {
			continue
		}
		for _, p := range a.Failing {
			if !slices.Contains(alike[p], m.Name) {
				alike[p] = append(alike[p], m.Name)
			}
		}
	}
	holds := map[string]Hold{}
	for _, p := range slices.Sorted(maps.Keys(alike)) {
		names := alike[p]
		if 2*len(names) <= voters {
			continue
		}
		for _, n := range names {
			if _, ok := holds[n]; ok {
				continue
			}
			holds[n] = Hold{Reason: ReasonCommonCause, Why: fmt.Sprintf("%s fails on %s, %d of the %d voters' machines, while their etcd members are healthy: "+
				"a cause they share (a certificate, a configuration, a dependency) that power-cycling them one by one does not fix. "+
				"The hub holds them: fix the cause (`hub explain %s`), or `hub reboot %s` to cycle one anyway",
				p, strings.Join(names, ", "), len(names), voters, n, n)}
		}
	}
	return holds
}

// SilentVoters are, when etcd has lost quorum, the voters whose members answer no majority of the
// observers, nor their own agents, whatever their verdict (nil while quorum holds). A silent voter need
// not be Unhealthy yet: at the heal of a partition whose far side held the quorum, its members come
// back into view Suspect for a pass or two (test/chaos far-side: cp-0's reboot begun 0.4 s after the
// heal, while etcd-1 was still Suspect and unreachable in the observers' last reports from the
// partition).
func SilentVoters(f Facts, cluster quorum.Cluster) []string {
	if !cluster.Budget(f.Inventory.Policy.Quorum).QuorumLost() {
		return nil
	}
	var out []string
	for i := range f.Inventory.Machines {
		m := &f.Inventory.Machines[i]
		a := AssessmentOf(f.Assessments, i, m.Name)
		if j := cluster.Index(m.Member); m.Member != "" && j >= 0 && !cluster.Members[j].Learner && !a.EtcdAnswers && !a.OwnAnswers {
			out = append(out, m.Member)
		}
	}
	return out
}

// toBeginOf is the remediation the hub begins for a planner's decision: a machine whose last
// remediation failed is escalated to a hard power cycle. Its reason says the planner's word and why
// the hub acts now (st: past the stall tolerance or the component grace, or on its BMC's proof); one
// begun while the machine was dead is withdrawn if it shows a sign of life before its power request.
func toBeginOf(f Facts, cluster quorum.Cluster, m Machine, qd quorum.Decision, failed int, st stall) ToBegin {
	plan := qd.Plan
	if len(plan.Steps) == 0 { // not an etcd member: the machine-level steps
		plan = MachinePlan(qd.Strategy, m)
	}
	reason := qd.Reason
	if st.grounds != "" {
		reason += "; " + st.grounds
	}
	rem := journal.Remediation{Machine: m.Name, Strategy: qd.Strategy.String(), RequestedBy: "hub", Reason: reason,
		Steps: plan.Steps, Attempt: failed + 1, Hard: failed > 0 && qd.Strategy == quorum.Reboot, WhileDead: st.dead}
	if rem.Hard {
		rem.Reason += fmt.Sprintf("; attempt %d of %d, escalated to a hard power cycle after %d failed", failed+1, f.Inventory.Policy.MaxAttempts, failed)
	}
	if r, ok := f.Observations.Reports[m.Node]; ok {
		rem.AgentStarted = r.Started
	}
	for _, mb := range cluster.Members {
		rem.Members = append(rem.Members, mb.Name)
	}
	return ToBegin{Machine: m, Plan: plan, Remediation: rem, grounds: st.grounds, proved: st.proved}
}

// Hold says why the hub does not start a machine's remediation now: under which one reason it is said,
// why in words (empty: not held), and, for holdOf, how many of its remediations failed and whether
// only an operator can go on.
type Hold struct {
	Reason Reason
	Why    string
	failed int
	Need   OperatorNeed
}

// Brake: the hold is one of the hub's brakes over what the planner admitted (`hub status` shows them
// as holding).
func (h Hold) Brake() bool {
	return h.Reason == ReasonPaused || h.Reason == ReasonSuspended || h.Reason == ReasonRateLimited
}

// sameVoters says whether a and b have the same voters.
func sameVoters(a, b quorum.Cluster) bool { return slices.Equal(voters(a), voters(b)) }

// voters are c's voters' names, sorted.
func voters(c quorum.Cluster) []string {
	var out []string
	for _, m := range c.Members {
		if !m.Learner {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return out
}
