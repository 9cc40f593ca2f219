package pass

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hale-dev/hale/bmc/bmcval"
)

// QuorumLoss is what the hub knows of a loss of etcd's quorum: each voter that does not count, and
// whether evidence from outside etcd and the gossip says it will not come back.
//
// Unseen is not dead. A hub cut off from two healthy members that still hold quorum between them sees
// what a permanent loss looks like from inside: no reports, no etcd answers, power-cycles that "did
// not bring them back". Recovering from a member on the hub's side would throw away what the far side
// committed meanwhile. So a voter whose BMC answers and reads the host powered on is never lost for
// good on silence alone, and a voter without evidence is not either.
type QuorumLoss struct {
	Voters        int `json:"voters"`
	HealthyVoters int `json:"healthyVoters"`
	Quorum        int `json:"quorum"`
	// Lost are the voters that neither count toward quorum nor answer, in the membership's order. A
	// voter whose member still answers is no lost voter: with quorum gone it fails its own probe (no
	// leader) and stops counting, but it is what a recovery starts from (a survivor).
	Lost []LostVoter `json:"lost"`
	// ForGood: there are lost voters, every one has evidence that it will not come back, and the
	// voters not lost are fewer than a quorum. Quorum cannot come back by itself then: only a recovery
	// from a survivor brings the cluster back. The hub never acts on it alone.
	ForGood bool `json:"forGood"`
}

// LostVoter is one voter of a lost quorum.
type LostVoter struct {
	Member  string `json:"member"`
	Machine string `json:"machine,omitempty"`
	// Evidence says why it will not come back by itself ("": no evidence).
	Evidence string `json:"evidence,omitempty"`
	// BMCProblem: its BMC does not answer, or has no such system (Unreachable, NoSuchSystem).
	BMCProblem bmcval.Problem `json:"bmcProblem,omitempty"`
	// PoweredOn: its BMC answers and reads the host on: it may be serving on the far side of a
	// partition, whatever else is said of it.
	PoweredOn bool `json:"poweredOn,omitempty"`
	// ForGood: evidence, and not powered on (nor a BMC the hub has not read yet).
	ForGood bool `json:"forGood"`
}

func (l *QuorumLoss) String() string {
	var lost []string
	for _, v := range l.Lost {
		switch {
		case v.ForGood:
			lost = append(lost, fmt.Sprintf("%s lost for good (%s)", v.Member, v.Evidence))
		case v.PoweredOn:
			lost = append(lost, fmt.Sprintf("%s silent, but its BMC reads it powered on: it may serve on the far side of a partition", v.Member))
		default:
			lost = append(lost, fmt.Sprintf("%s lost, no evidence it will not come back", v.Member))
		}
	}
	counts := fmt.Sprintf("%d of %d voters healthy, quorum needs %d", l.HealthyVoters, l.Voters, l.Quorum)
	if l.ForGood {
		return fmt.Sprintf("quorum lost FOR GOOD: no lost voter will come back by itself; a recovery from a survivor is the way back (%s): %s",
			counts, strings.Join(lost, "; "))
	}
	if len(lost) == 0 { // every voter answers, and none counts (no leader yet, or evidence judged again)
		return fmt.Sprintf("quorum lost (%s)", counts)
	}
	return fmt.Sprintf("quorum lost (%s): %s", counts, strings.Join(lost, "; "))
}

// assessLoss is the quorum loss of a pass that planned (nil when quorum holds): the lost voters, and
// for each the evidence the hub has that it will not come back: what the last check of its BMC found
// (no answer, no such system, the power read Off) and the hub's own remediations (maxAttempts power-
// cycles that did not bring it back, or one after which nobody has seen it).
func assessLoss(d decision, inv Inventory, bmcs map[string]BMCReadiness) *QuorumLoss {
	b := d.outcome.Budget
	if !b.QuorumLost() {
		return nil
	}
	l := &QuorumLoss{Voters: b.Voters, HealthyVoters: b.HealthyVoters, Quorum: b.Quorum}
	for _, m := range d.cluster.Members {
		if _, known := inv.MachineOfMember(m.Name); m.Learner || m.CountsHealthy() || known && !slices.Contains(d.silent, m.Name) {
			continue
		}
		v := LostVoter{Member: m.Name}
		var evidence []string
		unchecked := false // a BMC Hale has not read: it may read the host on
		if mach, ok := inv.MachineOfMember(m.Name); ok {
			v.Machine = mach.Name
			r, checked := bmcs[mach.Name]
			unchecked = mach.Endpoint.Driver != "" && !checked
			if checked {
				switch {
				case r.Ready && r.Power == bmcval.PowerOn:
					v.PoweredOn = true
				case r.Ready && r.Power == bmcval.PowerOff:
					evidence = append(evidence, "its BMC read the power Off at "+r.Checked.UTC().Format("15:04:05Z"))
				case r.Problem == bmcval.ProblemUnreachable || r.Problem == bmcval.ProblemNoSystem:
					v.BMCProblem = r.Problem
					evidence = append(evidence, fmt.Sprintf("its BMC: %s at %s", r.Problem, r.Checked.UTC().Format("15:04:05Z")))
				}
			}
			switch need := d.needs[mach.Name]; need {
			case NeedGaveUp, NeedFlapping:
				evidence = append(evidence, "maxAttempts power-cycles did not bring it back")
			case NeedUnseen:
				evidence = append(evidence, "power-cycled, and nobody has seen it since")
			case NeedFenced:
				evidence = append(evidence, "fenced (kept off on purpose)")
			}
		}
		v.Evidence = strings.Join(evidence, "; ")
		v.ForGood = v.Evidence != "" && !v.PoweredOn && !unchecked
		l.Lost = append(l.Lost, v)
	}
	// Every lost voter for good is not enough while the voters not lost could still make a quorum: one
	// that stopped counting but is not silent yet (a machine powered off a moment ago, heard by some
	// observers still) may answer again, and quorum with it, without any lost voter.
	l.ForGood = len(l.Lost) > 0 && l.Voters-len(l.Lost) < l.Quorum && !slices.ContainsFunc(l.Lost, func(v LostVoter) bool { return !v.ForGood })
	return l
}

// queueLoss queues the notices of when quorum is lost for good and when it no longer is, and asks for
// fresh BMC evidence when quorum is lost or its lost voters change.
func queueLoss(rd *Ready, before, now *QuorumLoss) {
	if now != nil && (before == nil || !sameEvidence(before.Lost, now.Lost)) {
		rd.CheckBMCs = true
	}
	wasForGood, forGood := before != nil && before.ForGood, now != nil && now.ForGood
	switch {
	case forGood && !wasForGood:
		rd.queue(Notice{Reason: ReasonQuorumLostForGood, Warning: true, Message: now.String() +
			"; the hub will not act on this by itself: `hub recover` shows the recovery plan"})
	case wasForGood && !forGood:
		what := "quorum is back"
		if now != nil {
			what = now.String()
		}
		rd.queue(Notice{Reason: ReasonQuorumLostForGood, Message: "quorum no longer lost for good: " + what})
	}
}

// sameEvidence: the same voters lost, with the same evidence (a new finding asks for a fresh check of
// the BMCs: a voter given up while its BMC was in use has no reading since).
func sameEvidence(a, b []LostVoter) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Member != b[i].Member || a[i].Evidence != b[i].Evidence {
			return false
		}
	}
	return true
}

// EtcdQuorum is etcd's quorum as the hub's latest pass saw it.
type EtcdQuorum int

const (
	// QuorumUnknown: no recent pass, no majority of the expected observers, or no plan.
	QuorumUnknown EtcdQuorum = iota
	// QuorumLost: a majority heard, a plan made, fewer healthy voters than the quorum.
	QuorumLost
	// QuorumHeld: a majority heard, a plan made, the quorum held.
	QuorumHeld
)

// EtcdQuorum says how the pass of v saw etcd's quorum, and what it saw, if that pass gathered its
// facts after after: only a pass that heard a strict majority of the expected observers and planned
// knows. It is Kubernetes mode's test for degraded mode: a leader that loses the API server acts alone
// only when the majority shows that etcd cannot serve it (a pass since its last renewal of the Lease:
// one blocked in apply, by a remediation's begin through an API server without quorum, still counts),
// and stops starting anything once it shows quorum again. A loss seen by the latest pass that planned,
// after after, stands though a pass since did not plan: a majority of observers not heard for a
// moment unsays nothing (on the real kubeadm cluster, two of three nodes frozen, one witness missed
// a probe as the Lease was lost, and no replica went on alone).
func (v View) EtcdQuorum(after time.Time) (EtcdQuorum, string) {
	switch b := v.Outcome.Budget; {
	case v.quorumLost && v.planned.After(after) && v.planned.Before(v.at):
		return QuorumLost, fmt.Sprintf("etcd: %s (at %s; since then: %s)", b, v.planned.UTC().Format("15:04:05.000Z07:00"), cmp.Or(v.NotPlanning, v.Hearing.String()))
	case !v.at.After(after):
		return QuorumUnknown, "no pass of the hub since " + after.UTC().Format("15:04:05.000Z07:00")
	case !v.Hearing.Majority():
		return QuorumUnknown, v.Hearing.String()
	case v.NotPlanning != "" || b.Voters == 0:
		return QuorumUnknown, "not planning: " + v.NotPlanning
	case b.QuorumLost():
		return QuorumLost, fmt.Sprintf("etcd: %s (%s)", b, v.Hearing)
	default:
		return QuorumHeld, "etcd: " + b.String()
	}
}
