package pass

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/health/report"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/quorum"
)

// RecoveryRecord is a recovery the hub began, journaled before its first BMC request.
type RecoveryRecord struct {
	// Plan is the plan as begun (its survivor, bump and token are kept), each fence step marked as done.
	Plan  RecoveryPlan `json:"plan"`
	By    string       `json:"by"`
	Began time.Time    `json:"began"`
	// Done is when the survivor was seen answering as a new etcd cluster (NewClusterID).
	Done         *time.Time `json:"done,omitempty"`
	NewClusterID string     `json:"newClusterID,omitempty"`
	// SurvivorSeen is when a strict majority of the expected observers first reached the survivor's
	// member of the rebuilt cluster, in reports sent since the rebuild. Until then the hub never
	// power-cycles, resets or fences the survivor by itself (DESIGN.md rule 13).
	SurvivorSeen *time.Time `json:"survivorSeen,omitempty"`
	// Rejoined is when each old member (by name) was first seen back in the new cluster (Where): from
	// then it is retired no more, and a later death of its machine is healed as any other's. Seen
	// only live, a rejoined machine that hung later was held again as retired (its reports gone, its
	// member unreachable) and never healed.
	Rejoined map[string]time.Time `json:"rejoined,omitempty"`
}

// Seen is what a pass saw of recovery Token's rebuilt cluster: its survivor healthy, old members back
// in it (Rejoined).
type Seen struct {
	Token    string
	Survivor bool
	Rejoined []Retiree
}

// Retiree is a member of the old cluster a recovery replaced (one it fenced, or one that answered and
// was behind the survivor), on its machine.
type Retiree struct{ Machine, Member string }

// Retirement is the old cluster the last recovery replaced: its ID, its quorum, and its members other
// than the survivor (the zero value: no recovery); and the survivor, and whether the rebuilt cluster
// has been seen healthy since (survivorSeen).
type Retirement struct {
	Token, Cluster string
	Began          time.Time
	Quorum         int
	Members        []Retiree
	survivor       Retiree
	SurvivorSeen   bool
}

func RetirementOf(rec *RecoveryRecord) Retirement {
	if rec == nil || rec.Plan.Survivor == nil {
		return Retirement{}
	}
	p := rec.Plan
	r := Retirement{Token: p.Token, Cluster: p.Survivor.ClusterID, Began: rec.Began,
		survivor: Retiree{p.Survivor.Machine, p.Survivor.Member}, SurvivorSeen: rec.SurvivorSeen != nil}
	if p.Loss != nil {
		r.Quorum = p.Loss.Quorum
	}
	for _, f := range p.Fence {
		if _, back := rec.Rejoined[f.Member]; f.Machine != "" && !back {
			r.Members = append(r.Members, Retiree{f.Machine, f.Member})
		}
	}
	for _, c := range p.Candidates {
		if _, back := rec.Rejoined[c.Member]; c.Member != p.Survivor.Member && c.Machine != "" && !back {
			r.Members = append(r.Members, Retiree{c.Machine, c.Member})
		}
	}
	return r
}

// rebuiltOutside is the recovery record of an etcd rebuild that no recovery of Hale's journaled (by
// hand: etcdutl snapshot restore, --force-new-cluster), seen as the cluster's ID changing (c). Its old
// members are the inventory's members the new cluster (its membership now) left out: each keeps the
// old data, and a quorum of them running would bring the old cluster back, so they are retired as a
// recovery's are. The old cluster's size is not known: the inventory's members are taken for it. Nil
// when the new cluster has every member of the inventory.
func rebuiltOutside(f Facts, cluster quorum.Cluster, c clusterChange) *RecoveryRecord {
	var left []quorum.FenceStep
	members := 0
	for i := range f.Inventory.Machines {
		m := &f.Inventory.Machines[i]
		if m.Member == "" {
			continue
		}
		members++
		if cluster.Index(m.Member) < 0 {
			left = append(left, quorum.FenceStep{Machine: m.Name, Member: m.Member, How: "not fenced by Hale: etcd was rebuilt without `hub recover`"})
		}
	}
	if len(left) == 0 {
		return nil
	}
	now := f.Now.UTC()
	return &RecoveryRecord{By: "etcd (rebuilt without `hub recover`)", Began: now, Done: &now, NewClusterID: c.to,
		Plan: RecoveryPlan{Rebuild: quorum.Rebuild{Time: now, Token: "rebuilt-" + c.to, Survivor: &quorum.Survivor{ClusterID: c.from}, Fence: left},
			Loss: &QuorumLoss{Voters: members, Quorum: quorum.Quorum(members)}}}
}

// rebuiltOutsideMessage says what a rebuild outside Hale (rebuiltOutside) means for its old members.
func (rec *RecoveryRecord) rebuiltOutsideMessage() string {
	var left []string
	for _, f := range rec.Plan.Fence {
		left = append(left, fmt.Sprintf("%s (%s)", f.Machine, f.Member))
	}
	return fmt.Sprintf("etcd cluster %s was rebuilt as %s without `hub recover` (by hand?), and %s are not in it: they are retired members of %s, "+
		"held until `agent rejoin` brings each into %s (the hub never powers one on, and `hub reboot` refuses while they could reach %s's quorum of %d)",
		rec.Plan.Survivor.ClusterID, rec.NewClusterID, strings.Join(left, ", "), rec.Plan.Survivor.ClusterID, rec.NewClusterID,
		rec.Plan.Survivor.ClusterID, rec.Plan.Loss.Quorum)
}

// Where says where a retired member stands in the fresh reports: back in a cluster other than the
// old one (rejoined: no longer retired), or answering as a member of the old one (from a sender alive
// in the hub's gossip). Rejoined needs one of: a fresh report of the new cluster from the member's own
// agent, alive in the gossip or not yet (`agent rejoin` moved the old member's data aside before it
// joined, so the machine runs the old cluster no more; requiring it alive held the next machine's
// power-on for ~20 s after each rejoin on the real kubeadm cluster: the rejoined agent restarts under
// its name with a new key, and the hub's gossip sees it dead until memberlist settles its
// incarnation); or a fresh report of another member of the new cluster that reached the member, as
// itself and of the new cluster, at its client URL (health: Reachable checks the answer's member and
// cluster IDs), which is the etcd on the machine: the rejoined agent's first report waits on its new
// key's enrolment, another 20–30 s on the real cluster.
func (r Retirement) Where(x Retiree, obs assess.Observations, staleAfter time.Duration) (rejoined, runsOld bool) {
	for _, rep := range obs.Reports {
		e := rep.Etcd
		if e == nil || e.ClusterID == "" || obs.Now.Sub(rep.SentAt) > staleAfter {
			continue
		}
		if e.LocalName != x.Member {
			if e.ClusterID != r.Cluster && slices.ContainsFunc(e.Members, func(m report.EtcdMember) bool {
				return m.Name == x.Member && m.Reachable != nil && *m.Reachable
			}) {
				return true, false
			}
			continue
		}
		if e.ClusterID != r.Cluster {
			return true, false
		}
		runsOld = runsOld || assess.Live(rep, obs, staleAfter)
	}
	return false, runsOld
}

// Hold is the hold on a retired machine not yet back in the new cluster (ok false: not retired, or
// rejoined).
func (r Retirement) Hold(machine string, obs assess.Observations, staleAfter time.Duration) (Hold, bool) {
	for _, x := range r.Members {
		if x.Machine != machine {
			continue
		}
		rejoined, runsOld := r.Where(x, obs, staleAfter)
		switch {
		case rejoined:
			return Hold{}, false
		case runsOld:
			return Hold{Reason: ReasonRetired, Need: NeedRetired, Why: fmt.Sprintf("%s still runs %s, a member of the old etcd cluster %s that recovery %s replaced: "+
				"run `agent rejoin` on %s (it stops that member, keeps its data aside and adds it to the new cluster); the hub does not act on it meanwhile",
				machine, x.Member, r.Cluster, r.Token, machine)}, true
		default:
			return Hold{Reason: ReasonRetired, Need: NeedRetired, Why: fmt.Sprintf("retired by etcd recovery %s: its disk may still hold %s of the old cluster %s, "+
				"which starts when the machine runs; the hub does not power it on. Bring it back one machine at a time: power it on "+
				"(`hub reboot %s --force`: it is in no membership the quorum check knows), then run `agent rejoin` on it",
				r.Token, x.Member, r.Cluster, machine)}, true
		}
	}
	return Hold{}, false
}

// survivorHold is the hold on the survivor of the last recovery until a strict majority of the
// observers has seen the rebuilt cluster healthy (DESIGN.md rule 13): it holds the only copy of the
// data, and while its observers still catch up with it (their clients dialling it again, their
// reports from before the rebuild) it can look unhealthy, and the quorum of one it lacks makes a cycle
// look free. ok false: not the survivor, or seen.
func (r Retirement) survivorHold(machine string) (Hold, bool) {
	if r.survivor.Machine != machine || machine == "" || r.SurvivorSeen {
		return Hold{}, false
	}
	return Hold{Reason: ReasonSurvivor, Why: fmt.Sprintf("%s is the survivor etcd recovery %s rebuilt the cluster from (%s holds the only copy of its data), and a "+
		"strict majority of the observers has not yet reached the rebuilt cluster's member since the rebuild: the hub does not power-cycle, reset or fence it "+
		"meanwhile (`hub explain %s`; `hub reboot %s --force` if it must be, knowing that a failed boot loses the cluster)",
		machine, r.Token, r.survivor.Member, machine, machine)}, true
}

// survivorSeenNow says whether this pass sees the rebuilt cluster healthy on the survivor for the first
// time: its member healthy, in a cluster other than the old one, and reached by a strict majority of
// the expected judges of etcd in reports sent since it changed cluster.
func (r Retirement) survivorSeenNow(f Facts) bool {
	if r.survivor.Machine == "" || r.SurvivorSeen {
		return false
	}
	i := slices.IndexFunc(f.Inventory.Machines, func(m Machine) bool { return m.Name == r.survivor.Machine })
	if i < 0 {
		return false
	}
	m, a := f.Inventory.Machines[i], AssessmentOf(f.Assessments, i, r.survivor.Machine)
	rep, ok := f.Observations.Reports[m.Node]
	return ok && rep.Etcd != nil && rep.Etcd.ClusterID != "" && rep.Etcd.ClusterID != r.Cluster && a.Verdict == assess.VerdictHealthy &&
		a.EtcdHealth == quorum.Healthy && 2*a.EtcdReachedSince > f.Hearing.Set.Judges()
}

// RunningOld says which retired members still answer as members of the old cluster, for a pass that
// cannot agree on a membership: their agents report the old cluster's ("": none).
func (r Retirement) RunningOld(obs assess.Observations, staleAfter time.Duration) string {
	var old []string
	for _, x := range r.Members {
		if _, runsOld := r.Where(x, obs, staleAfter); runsOld {
			old = append(old, fmt.Sprintf("%s (%s)", x.Machine, x.Member))
		}
	}
	if len(old) == 0 {
		return ""
	}
	return fmt.Sprintf("; %s still run the old etcd cluster %s that recovery %s replaced, and report its membership: run `agent rejoin` on them",
		strings.Join(old, ", "), r.Cluster, r.Token)
}

// RejoinedNow is the retired members this pass sees back in the new cluster (Where); the hub journals
// them, and they are retired no more.
func (r Retirement) RejoinedNow(obs assess.Observations, staleAfter time.Duration) []Retiree {
	var back []Retiree
	for _, x := range r.Members {
		if rejoined, _ := r.Where(x, obs, staleAfter); rejoined {
			back = append(back, x)
		}
	}
	return back
}

func (r Retirement) MemberOf(machine string) string {
	for _, x := range r.Members {
		if x.Machine == machine {
			return x.Member
		}
	}
	return ""
}

// RecoveryPlan is how etcd would be rebuilt from its most advanced survivor after a permanent loss of
// quorum (`hub recover`): who survives and why, what is at risk, whom to fence, the revision bump and
// each step. Blockers say what keeps it from going ahead as it stands, each with what to do. The hub
// computes it from what it sees now; it changes nothing.
type RecoveryPlan struct {
	// Rebuild is what the node that carries it out reads (`agent recover`): the survivor, the
	// revision bump, the fence, the blockers, the token.
	quorum.Rebuild
	// Loss is the quorum loss as status shows it (nil: the hub does not see quorum lost).
	Loss *QuorumLoss `json:"quorumLoss,omitempty"`
	// Candidates are the members that answer now, best first (Survivor is the first).
	Candidates []quorum.Survivor `json:"candidates,omitempty"`
	// Mark is the journaled raft mark of the survivor's cluster; DataAtRisk the raft entries the
	// survivor lacks against it (0: none, or no mark).
	Mark       *RaftMark `json:"raftMark,omitempty"`
	DataAtRisk uint64    `json:"dataAtRisk"`
	// BumpWhy says how Rebuild.BumpRevision was chosen.
	BumpWhy string   `json:"bumpWhy"`
	Steps   []string `json:"steps"`
}

// fenced says whether every lost member is fenced.
func (p RecoveryPlan) fenced() bool {
	return !slices.ContainsFunc(p.Fence, func(f quorum.FenceStep) bool { return !f.Fenced })
}

// String is the plan as `hub recover` prints it.
func (p RecoveryPlan) String() string {
	var b strings.Builder
	if p.Loss != nil {
		fmt.Fprintf(&b, "%s\n", p.Loss)
	}
	if s := p.Survivor; s != nil {
		why := fmt.Sprintf("the highest of the %d members that answer", len(p.Candidates))
		if len(p.Candidates) == 1 {
			why = "the only member that answers"
		}
		fmt.Fprintf(&b, "survivor: %s (%s): raft index %d, term %d, etcd cluster %s; %s\n",
			s.Member, cmp.Or(s.Machine, "no machine"), s.Index, s.Term, s.ClusterID, why)
		for _, c := range p.Candidates[1:] {
			fmt.Fprintf(&b, "  also answers: %s at raft index %d, term %d\n", c.Member, c.Index, c.Term)
		}
	}
	if p.Mark != nil {
		fmt.Fprintf(&b, "raft mark: %s; data at risk: %d entries\n", p.Mark, p.DataAtRisk)
	}
	fmt.Fprintf(&b, "revision bump: %d (%s)\n", p.BumpRevision, p.BumpWhy)
	b.WriteString("steps:\n")
	for i, s := range p.Steps {
		fmt.Fprintf(&b, "  %d. %s\n", i+1, s)
	}
	if len(p.Fence) > 0 {
		b.WriteString("fence:\n")
	}
	for _, f := range p.Fence {
		done := "to do"
		if f.Fenced {
			done = "done"
		}
		fmt.Fprintf(&b, "  %s (%s), %s: %s\n", f.Machine, f.Member, done, f.How)
	}
	if len(p.Blockers) > 0 {
		b.WriteString("NOT READY:\n")
		for _, x := range p.Blockers {
			fmt.Fprintf(&b, "  - %s\n", x)
		}
	}
	switch {
	case p.Token != "" && !p.fenced():
		fmt.Fprintf(&b, "under way (token %s), but not every lost member is fenced yet: run `hub recover --yes` again\n", p.Token)
	case p.Token != "":
		fmt.Fprintf(&b, "under way (token %s): every lost member is fenced; go on on the survivor with `agent recover --plan FILE`, FILE from `hub recover -o json` (docs/operating.md#permanent-quorum-loss)\n", p.Token)
	default:
		b.WriteString("nothing was changed: `hub recover --yes` carries the plan out, fencing first (docs/operating.md#permanent-quorum-loss)\n")
	}
	return b.String()
}
