package pass

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hale-dev/hale/health/report"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/quorum"
)

// Flight is a remediation under way, as a pass sees it.
type Flight struct {
	Plan quorum.Plan
	// Next is the step under way: it and those after it are still to come.
	Next int
	// Members are the etcd members when it began (a replace's new member is the one not in it).
	Members []string
}

// MembershipOf builds the cluster the planner sees: the membership that a strict majority of the
// expected agents and witnesses that read etcd report (fresh reports from observers the hub sees alive), each
// member's health from the assessments, the members of machines with a remediation in flight
// marked. It returns why not instead when the hub does not hear a strict majority of its expected
// observers (then nothing is done: a hub on the minority side of a partition must not act), or when
// no view has such a majority.
func MembershipOf(inv Inventory, obs assess.Observations, assessments []assess.Assessment, hearing assess.Hearing, flights map[string]Flight) (quorum.Cluster, string) {
	if !hearing.Majority() {
		return quorum.Cluster{}, hearing.NoMajority()
	}
	e := hearing.Set // the expected set the hearing was judged against
	votes := map[string]int{}
	lists := map[string][]report.EtcdMember{}
	total := 0
	// Those that read no etcd at all (a witness without etcd endpoints: its fresh report carries no
	// view) can never report the membership: they are not asked to. Counted, they left three agents and
	// two such witnesses needing all three agents, and one dead control-plane machine was never healed
	// (found on a real kubeadm cluster with deploy/components/witness as it comes). Judges unheard count:
	// nobody knows whether they read etcd.
	judges := e.Judges()
	for _, node := range e.JudgeNodes {
		r, reported := obs.Reports[node]
		fresh := reported && obs.Now.Sub(r.SentAt) <= inv.Policy.Assess.StaleAfter
		if pv, ok := obs.HubPeers[node]; fresh && ok && pv.State == report.PeerAlive && r.Etcd == nil {
			judges--
		}
		if pv, ok := obs.HubPeers[node]; !fresh || !ok || pv.State != report.PeerAlive || r.Etcd == nil || len(r.Etcd.Members) == 0 {
			continue
		}
		k := viewKey(r.Etcd.Members)
		votes[k]++
		lists[k] = r.Etcd.Members
		total++
	}
	best, n := "", 0
	for k, v := range votes {
		if v > n || v == n && k < best { // ties broken by the key: the same facts, the same answer
			best, n = k, v
		}
	}
	switch {
	case total == 0:
		return quorum.Cluster{}, "no fresh etcd view from any agent"
	case 2*n <= total:
		return quorum.Cluster{}, fmt.Sprintf("agents disagree on the etcd membership (%d views, the most common held by %d)", total, n)
	case 2*n <= judges:
		return quorum.Cluster{}, fmt.Sprintf("only %d of the %d expected agents and witnesses that read etcd report the etcd membership (%d needed): "+
			"a majority of observers must agree on it before anything is planned", n, judges, judges/2+1)
	}
	type machineOf struct {
		name   string
		health quorum.Health
	}
	member := map[string]machineOf{} // etcd member → its machine
	for i := range inv.Machines {
		m := &inv.Machines[i]
		if m.Member != "" {
			member[m.Member] = machineOf{m.Name, AssessmentOf(assessments, i, m.Name).EtcdHealth}
		}
	}
	var c quorum.Cluster
	for _, em := range lists[best] {
		m := quorum.Member{Name: em.Name, Learner: em.Learner, Health: quorum.HealthUnknown}
		if mm, ok := member[em.Name]; ok {
			m.Health = mm.health
			if _, inFlight := flights[mm.name]; inFlight {
				m.Disruption = quorum.InFlight
			}
		}
		c.Members = append(c.Members, m)
	}
	return c, ""
}

// AssessmentOf is machine's assessment: the i-th, as the assessor returns them in the inventory's
// order, or found by name when they are not.
func AssessmentOf(as []assess.Assessment, i int, machine string) assess.Assessment {
	if a := assessmentAt(as, i, machine); a != nil {
		return *a
	}
	return assess.Assessment{}
}

// assessmentAt is AssessmentOf without the copy, nil when there is none: for the loops over every
// machine (an assessment is 184 bytes).
func assessmentAt(as []assess.Assessment, i int, machine string) *assess.Assessment {
	if i >= 0 && i < len(as) && as[i].Machine == machine {
		return &as[i]
	}
	for j := range as {
		if as[j].Machine == machine {
			return &as[j]
		}
	}
	return nil
}

// viewKey is an etcd membership as one comparable string: the members' names and roles, sorted.
func viewKey(members []report.EtcdMember) string {
	keys := make([]string, len(members))
	for i, m := range members {
		keys[i] = fmt.Sprintf("%s:%v", m.Name, m.Learner)
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

// StillToCome is what the remediation has left: its plan's steps from the one under way on, for the
// planner to check new starts against in every order (empty, not nil, when the machine is not an
// etcd member: nothing of it touches the membership); for a replace whose new member has joined,
// the steps with that member (replacementSteps).
func (fl Flight) StillToCome(c quorum.Cluster) []quorum.Step {
	if steps, ok := fl.replacementSteps(c); ok {
		return steps
	}
	return slices.Clone(fl.Plan.Steps[min(fl.Next, len(fl.Plan.Steps)):])
}

// replacementSteps rebuilds a replace's steps once its new member has joined: the plan names it with
// a placeholder, but the member that appeared since the replace began (exactly one) is the one the
// owner's steps will promote and keep, and a start beside the replace must be checked against those.
// It joined as a learner or a voter, whatever the plan assumed: the steps follow what it is. The
// planner skips the steps the membership shows done.
func (fl Flight) replacementSteps(c quorum.Cluster) ([]quorum.Step, bool) {
	if fl.Plan.Strategy != quorum.Replace || len(fl.Members) == 0 || len(fl.Plan.Steps) == 0 {
		return nil, false
	}
	// The order and the old member from the steps themselves (a plan rebuilt from the journal after a
	// restart has no shape): delete-first starts with the remove.
	i := slices.IndexFunc(fl.Plan.Steps, func(s quorum.Step) bool { return s.Op == quorum.OpRemove })
	if i < 0 {
		return nil, false
	}
	shape := quorum.Shape{Order: quorum.ScaleUpFirst, Join: quorum.JoinAsVoter}
	if i == 0 {
		shape.Order = quorum.ScaleDownFirst
	}
	var fresh []quorum.Member
	for _, m := range c.Members {
		if !slices.Contains(fl.Members, m.Name) {
			fresh = append(fresh, m)
		}
	}
	if len(fresh) != 1 {
		return nil, false // not joined yet, or not one to tell: the placeholder steps stand
	}
	if fresh[0].Learner {
		shape.Join = quorum.JoinAsLearner
	}
	return shape.Steps(fl.Plan.Steps[i].Member, fresh[0].Name), true
}
