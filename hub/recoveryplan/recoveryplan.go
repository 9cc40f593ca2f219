// Package recoveryplan plans `hub recover`: how etcd would be rebuilt now from its most advanced
// survivor after a permanent loss of quorum, from the hub's status, the inventory, the gossip's
// observations and what the operator confirmed. It decides; the hub carries the plan out.
package recoveryplan

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// Bump bounds: without a mark, a billion (as etcd's recovery guide suggests for an unknown gap);
// otherwise the gap to the mark plus a fifth of the highest index known, at least MinBump.
const (
	bumpWithoutMark = 1_000_000_000
	MinBump         = 10_000
)

// Of is the recovery plan (Hub.RecoveryPlan's pure core): the plan from a status, the inventory, the gossip's
// observations and what the operator confirmed (req).
func Of(st operator.Status, inv pass.Inventory, obs assess.Observations, req operator.RecoverRequest) pass.RecoveryPlan {
	p := pass.RecoveryPlan{Rebuild: quorum.Rebuild{Time: st.Time}, Loss: st.QuorumLoss}
	block := func(format string, a ...any) { p.Blockers = append(p.Blockers, fmt.Sprintf(format, a...)) }
	lost := map[string]bool{}
	switch {
	case st.NotPlanning != "" && len(inv.Witnesses) == 0:
		block("the hub does not plan (%s): it cannot tell which voters are lost; with three members and no witness, two members lost leave it too few observers (add a witness)", st.NotPlanning)
	case st.NotPlanning != "":
		block("the hub does not plan (%s): it cannot tell which voters are lost, nor whether they hold quorum out of its sight", st.NotPlanning)
	case p.Loss == nil:
		block("etcd's quorum is not lost: there is nothing to recover (hub status)")
	}
	if p.Loss != nil {
		for _, v := range p.Loss.Lost {
			lost[v.Member] = true
			confirmed := req.Confirms(v.Machine, v.Member)
			fs := quorum.FenceStep{Machine: v.Machine, Member: v.Member}
			m, ok := inv.Machine(v.Machine)
			cannot := ""
			switch {
			case !ok:
				cannot = "not in the inventory"
			case m.Endpoint.Driver == "":
				cannot = "no BMC"
			case v.BMCProblem != "":
				cannot = fmt.Sprintf("its BMC (%s) does not answer", m.Endpoint)
			}
			fs.How, fs.ByHand = fmt.Sprintf("power off through its BMC (%s) and read back Off", m.Endpoint), cannot != ""
			if fs.ByHand {
				fs.How = cannot + ": make sure by hand that it is off, and confirm it by name"
			}
			p.Fence = append(p.Fence, fs)
			switch {
			case confirmed:
			case v.PoweredOn:
				block("%s (%s): its BMC reads the host powered on; it may be serving on the far side of a partition, with quorum there: "+
					"recovering here would throw away what it committed. Find out; only if it is truly lost, confirm it by name (--confirm-lost %s)", v.Machine, v.Member, v.Machine)
			case fs.ByHand:
				block("%s (%s): the hub cannot fence it (%s): make sure it is off, then confirm it by name (--confirm-lost %s)", v.Machine, v.Member, cannot, v.Machine)
			case !v.ForGood:
				block("%s (%s): nothing says it will not come back (%s): wait for the hub's power-cycles, or find out and confirm it by name (--confirm-lost %s)",
					v.Machine, v.Member, cmp.Or(v.Evidence, "no evidence"), v.Machine)
			}
		}
	}
	for _, r := range obs.Reports {
		e := r.Etcd
		if e == nil || e.LocalName == "" || e.RaftIndex == 0 || lost[e.LocalName] || !assess.Live(r, obs, inv.Policy.Assess.StaleAfter) {
			continue
		}
		s := quorum.Survivor{Member: e.LocalName, ClusterID: e.ClusterID, Term: e.RaftTerm, Index: e.RaftIndex, Observed: e.ObservedAt}
		if m, ok := inv.MachineOfMember(e.LocalName); ok {
			s.Machine = m.Name
		}
		p.Candidates = append(p.Candidates, s)
	}
	slices.SortFunc(p.Candidates, func(a, b quorum.Survivor) int {
		return cmp.Or(cmp.Compare(b.Index, a.Index), cmp.Compare(b.Term, a.Term), strings.Compare(a.Member, b.Member))
	})
	if p.Loss != nil {
		blockUnaccounted(st, lost, p.Candidates, p.Loss.Quorum, block)
	}
	if len(p.Candidates) == 0 {
		block("no member answers: there is no survivor to recover from (restore from a backup: etcd's disaster recovery guide)")
		p.BumpRevision, p.BumpWhy = bumpWithoutMark, "no survivor"
		p.Steps = recoverySteps(p)
		return p
	}
	s := p.Candidates[0]
	p.Survivor = &s
	highest := s.Index
	switch m := st.RaftMark; {
	case m == nil:
		p.BumpRevision, p.BumpWhy = bumpWithoutMark, "no raft mark journaled: a billion, as etcd's guide suggests for an unknown gap"
	case m.ClusterID != s.ClusterID:
		p.BumpRevision, p.BumpWhy = bumpWithoutMark, fmt.Sprintf("the raft mark is of etcd cluster %s, the survivor's is %s: a billion", m.ClusterID, s.ClusterID)
	default:
		p.Mark = m
		if m.Index > s.Index {
			p.DataAtRisk, highest = m.Index-s.Index, m.Index
			if req.AcceptDataLoss != p.DataAtRisk {
				block("%s is at raft index %d, %d entries behind the journaled mark %d (%s at %s): recovering from it loses them; "+
					"no member that answers is further ahead. To recover anyway, accept the loss by its size: --accept-data-loss %d",
					s.Member, s.Index, p.DataAtRisk, m.Index, m.Member, m.At.UTC().Format(time.RFC3339), p.DataAtRisk)
			}
		}
		p.BumpRevision = max(p.DataAtRisk+highest/5, MinBump)
		p.BumpWhy = fmt.Sprintf("the %d entries at risk plus a fifth of the highest raft index known (%d), at least %d: revisions never go backwards for the API server's watchers",
			p.DataAtRisk, highest, MinBump)
	}
	p.Steps = recoverySteps(p)
	return p
}

// blockUnaccounted blocks a recovery that would leave old members running unseen, or while the
// members that answer could bring the old cluster back by themselves: every voter must be lost (and
// fenced) or answer (a candidate), and the candidates, survivor included, must be short of the old
// quorum. Were they a quorum, they could elect a leader again with no recovery at all (a voter that has
// stopped counting but still answers, seen on real processes a second before it went silent), and
// those other than the survivor, which keep running the old cluster until `agent rejoin`, could go
// on as a second cluster once the survivor has left it. (Also found on real processes: a hub restarted
// just before `hub recover --yes` had no view yet of the two dead voters, neither lost nor answering,
// and planned a recovery fencing none.)
func blockUnaccounted(st operator.Status, lost map[string]bool, candidates []quorum.Survivor, quorum int, block func(string, ...any)) {
	answering := map[string]bool{}
	for _, c := range candidates {
		answering[c.Member] = true
	}
	var unseen []string
	for _, m := range st.Machines {
		if m.Role == "voter" && m.Member != "" && !lost[m.Member] && !answering[m.Member] {
			unseen = append(unseen, fmt.Sprintf("%s (%s)", m.Name, m.Member))
		}
	}
	if len(unseen) > 0 {
		block("%s: neither lost nor answering in the hub's view (a hub that has just started hears its observers first): wait, then run it again",
			strings.Join(unseen, ", "))
	}
	if quorum > 0 && len(candidates) >= quorum {
		var names []string
		for _, c := range candidates {
			names = append(names, c.Member)
		}
		block("%s answer: %d of the old cluster's members, its quorum (%d): quorum is not lost for good while they answer (they may elect a leader again by themselves, "+
			"and those left running beside the rebuilt one would be a second cluster): find out why they have no leader (the network between them?), "+
			"or wait for the hub to see which of them are lost", strings.Join(names, ", "), len(candidates), quorum)
	}
}

func recoverySteps(p pass.RecoveryPlan) []string {
	survivor, machine := "the survivor", "its machine"
	if s := p.Survivor; s != nil {
		survivor, machine = s.Member, cmp.Or(s.Machine, s.Member)
	}
	return []string{"`hub recover --yes`: the hub pauses itself (nothing else happens meanwhile), journals the recovery and fences every lost member (fence, below)",
		fmt.Sprintf("on %s: `agent recover --plan FILE` (FILE from `hub recover -o json` once fenced) checks the plan again there, stops %s, and moves its data directory's member/ aside (never deleted)", machine, survivor),
		fmt.Sprintf("it restores %s's own database with etcd's restore: revision bump %d, the latest revision marked compacted, "+
			"a new cluster token (a new cluster ID: no old member can rejoin)", survivor, p.BumpRevision),
		fmt.Sprintf("it starts %s as a one-member cluster on the restored data, and waits until it answers", survivor),
		"add the other members back one at a time: as a learner, started on an empty data directory, promoted once etcd allows it",
		"restart every kube-apiserver (none may serve from the old data), then the controller-managers and schedulers",
		"resume the hub (`hub resume`)"}
}

// CheckConfirmations refuses a confirmation that names no lost voter of the plan (a typo must not
// read as a confirmation given).
func CheckConfirmations(p pass.RecoveryPlan, req operator.RecoverRequest) error {
	var names []string
	for _, f := range p.Fence {
		names = append(names, f.Machine)
	}
	for _, c := range req.ConfirmLost {
		if !slices.ContainsFunc(p.Fence, func(f quorum.FenceStep) bool { return f.Machine == c || f.Member == c }) {
			return fmt.Errorf("%w: --confirm-lost %s: not a lost voter of the plan (lost: %s)", pass.ErrRefused, c, cmp.Or(strings.Join(names, ", "), "none"))
		}
	}
	return nil
}

// PauseReason is the reason of the pause an etcd recovery holds the hub with (PauseToken reads
// it back).
func PauseReason(token string) string { return "etcd recovery " + token }

// PauseToken says which etcd recovery a pause is held for (its token), if any: in Kubernetes mode,
// Hale pauses the Cluster API Cluster for as long as that pause holds.
func PauseToken(pause *pass.Brake) (token string, ok bool) {
	if pause == nil {
		return "", false
	}
	rest, ok := strings.CutPrefix(pause.Reason, PauseReason(""))
	if token, _, _ = strings.Cut(rest, " "); !ok || token == "" {
		return "", false
	}
	return token, true
}
