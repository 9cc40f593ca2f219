package assess

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/health/report"
	"github.com/hale-dev/hale/quorum"
)

// The etcd member's evidence: its health as the observers reach it, and whether it catches up.

// catchingUp says why a member whose etcd probe fails is catching up rather than failing ("" when it
// is not): its own status (a serializable call, answered without the leader) says it follows the
// leader that the other members follow, whatever the term of the last entry it applied. (etcd's
// Status gives the term of the last entry applied, not raft's current term: a member that follows the
// new leader of a later term but has not applied that leader's first entry yet reports the older
// term; requiring the same term judged exactly the member catching up as failing, and test/chaos's
// minority-hub power-cycled it 11 s after a 50 s partition healed.) A member that rejoins after a partition
// or a restart gets the entries it missed (or a snapshot) from that leader, and until it has applied
// up to the leader's commit index, or while its streams to the leader are still being dialled again,
// it cannot serve a linearizable read: etcd answers "request timed out" after its request timeout (5 s
// + 2 election timeouts: 7 s by default) and the probe fails again. Found on real processes: a member
// of the minority side of a 60 s partition made with silent drops followed the new leader at its term
// 1 s after the heal, and answered no linearizable read for 12 s ("waiting for ReadIndex response took
// too long"), its raft index not moving (nothing was written). EtcdCatchUp bounds the extra time: a
// member that never catches up is judged as usual.
// When it is not, whyNot says what is missing (so that an Unhealthy verdict on the etcd probe shows why
// the allowance did not apply).
func (a *Assessor) catchingUp(own *report.Report) (why, whyNot string) {
	v := own.Etcd
	// Its own word is not enough: another member must follow that leader too.
	switch {
	case v == nil || v.LocalID == "":
		return "", "not catching up: its own status did not answer in its last report"
	case a.leader == "" || a.leaderVotes < 2:
		return "", "not catching up: no leader that a majority of the members that name one follow"
	case v.LeaderID == "" || v.LeaderID == "0":
		return "", "not catching up: it follows no leader, the others " + a.leader
	case v.LeaderID != a.leader:
		return "", fmt.Sprintf("not catching up: it follows leader %s, the others %s", v.LeaderID, a.leader)
	}
	return fmt.Sprintf("it follows leader %s, as %d other members do (its last entry applied of raft term %d, theirs of %d; its commit index %d)",
		v.LeaderID, a.leaderVotes-1, v.RaftTerm, a.leaderTerm, v.RaftIndex), ""
}

// majorityLeader is the etcd leader a strict majority of the observers that name one follow, the
// highest raft term they name it at, and how many name it ("" when none: quorum lost, or views that
// disagree).
func majorityLeader(observers []report.Report) (string, uint64, int) {
	counts, total := map[string]int{}, 0
	for i := range observers { // by index: a report is 192 bytes, and there is one per machine
		if r := &observers[i]; r.Etcd != nil && r.Etcd.LeaderID != "" && r.Etcd.LeaderID != "0" {
			counts[r.Etcd.LeaderID]++
			total++
		}
	}
	for id, n := range counts {
		if 2*n > total {
			var term uint64
			for i := range observers {
				if r := &observers[i]; r.Etcd != nil && r.Etcd.LeaderID == id {
					term = max(term, r.Etcd.RaftTerm)
				}
			}
			return id, term, n
		}
	}
	return "", 0, 0
}

// etcdHealth says how quorum should count m's member: from its own etcd probe and from whether the
// observers that judge etcd (its own agent among them) reach it. Unreachable is evidence only from a
// strict majority of the expected agents and witnesses, in reports sent since the member's epoch and
// since the hub last began to hear a majority (newerFor); Healthy asks more (see below). It also says
// whether the member answers (a strict majority of the observers that check it reach it, whatever its
// own probe says), how many observers reach it in such recent reports, and, when it answers, when the
// oldest report among those that reach it was sent.
func (a *Assessor) etcdHealth(m MachineRef, e *Expected, now time.Time, own *report.Report, fresh, dead bool, observers []report.Report,
	seen map[string]bool, ev *evidence) (h quorum.Health, answers bool, reachedSince int, answeredAt time.Time) {
	if dead {
		return quorum.Unhealthy, false, 0, time.Time{}
	}
	v := reachability(m.Member, observers, "", a.newerFor(m.Member))
	reach, unreach := v.reach, v.unreach
	if answers = 2*reach > reach+unreach; answers {
		answeredAt = v.oldest
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
			// Unknown, not Unhealthy: it is not counted healthy, and nobody has shown it down either
			// (an operator's reboot of it is checked as a healthy member's: pass.AdmitOperator).
			return quorum.HealthUnknown, answers, v.newReach, answeredAt
		}
		key := "unreachable/" + m.Member
		seen[key] = true
		first, ok := a.firstSeen[key]
		if !ok {
			first, a.firstSeen[key] = now, now
		}
		if d, start, from := a.countedFor(m.Member, now, first); d >= a.policy.EtcdUnreachableTimeout {
			ev.bad(start, "etcd member %s unreachable from %d of %d expected observers for %v%s", m.Member, unreach, e.Judges(), d.Round(time.Second), from)
		} else {
			ev.doubt("etcd member %s unreachable from %d of %d expected observers for %v%s (unhealthy at %v)", m.Member, unreach, e.Judges(),
				d.Round(time.Millisecond), from, a.policy.EtcdUnreachableTimeout)
		}
		return quorum.Unhealthy, answers, v.newReach, answeredAt
	case v.stale > 0 && 2*(unreach+v.stale) > voters+v.stale:
		_, why := a.floor(m.Member)
		ev.doubt("etcd member %s: %d observers' reports from before %s say it does not answer; they say nothing of it now: waiting for newer ones",
			m.Member, v.stale, why)
	}
	// Healthy is what quorum counts on for a disruption of another member, so it needs positive evidence
	// that nothing newer contradicts: the views set aside as older than the floor still count against
	// it here. Right after quorum came back, a hung member's observers' views were all from before the
	// return and its own last report, sent before it hung, still fresh by age: counted healthy on that,
	// it let an operator's reboot of another voter through, and quorum was lost (test/lab under load:
	// cp-2 stopped, cp-0 power-cycled 0.6 s after the return).
	switch {
	case ownKnown && !ownOK:
		return quorum.Unhealthy, answers, v.newReach, answeredAt
	case 2*reach > voters+v.stale: // a strict majority of every view, the older ones included
		return quorum.Healthy, answers, v.newReach, answeredAt
	// Its own word, and no newer view against it: when no observer says anything of it (a one-member
	// cluster), or when that word is as new as the floor (a member that answers again after a restart).
	case ownKnown && ownOK && unreach == 0 && (voters+v.stale == 0 || a.ownNewer(m.Member, own)):
		return quorum.Healthy, answers, v.newReach, answeredAt
	}
	return quorum.HealthUnknown, answers, v.newReach, answeredAt
}

// votes are the observers' etcd views of one member: how many reach it, how many do not (counted), how
// many do not in reports the caller's filter refuses (stale), and how many reach it in reports the
// filter takes (newReach); oldest is when the oldest report among those that reach it was sent.
type votes struct {
	reach, unreach, stale, newReach int
	oldest                          time.Time
}

// reachability counts the observers' views of member (but except's). When newer is set, a "does not
// answer" from a report it refuses is counted apart, as stale, and a "reaches it" from one it takes
// counts in newReach too.
func reachability(member string, observers []report.Report, except string, newer func(report.Report) bool) votes {
	var v votes
	for i := range observers { // by index: a report is 192 bytes, and there is one per machine
		r := &observers[i]
		if r.Etcd == nil || r.Node == except {
			continue
		}
		for _, em := range r.Etcd.Members {
			switch {
			case em.Name != member || em.Reachable == nil:
			case *em.Reachable:
				if v.reach == 0 || r.SentAt.Before(v.oldest) {
					v.oldest = r.SentAt
				}
				v.reach++
				if newer == nil || newer(*r) {
					v.newReach++
				}
			case newer != nil && !newer(*r):
				v.stale++
			default:
				v.unreach++
			}
		}
	}
	return v
}
