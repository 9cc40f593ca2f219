// Package hub is Hale's decision maker: it assesses machines from the agents' reports, plans with
// quorum, acts through BMCs or owners, and records every step. This file is the assess stage.
package hub

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/quorum"
)

// The etcd member's evidence: its health as the observers reach it, and whether it catches up.

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
	reach, unreach, _, oldest := reachability(m.Member, observers, "", nil)
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
// and says when the oldest report among those that reach it was sent. When unreachCounts is set, a
// "does not answer" from a report it refuses is counted apart, as stale.
func reachability(member string, observers []health.Report, except string, unreachCounts func(health.Report) bool) (reach, unreach, stale int, oldest time.Time) {
	for _, r := range observers {
		if r.Etcd == nil || r.Node == except {
			continue
		}
		for _, em := range r.Etcd.Members {
			switch {
			case em.Name != member || em.Reachable == nil:
			case *em.Reachable:
				if reach == 0 || r.SentAt.Before(oldest) {
					oldest = r.SentAt
				}
				reach++
			case unreachCounts != nil && !unreachCounts(r):
				stale++
			default:
				unreach++
			}
		}
	}
	return reach, unreach, stale, oldest
}
