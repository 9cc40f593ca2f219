package assess

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/health/report"
)

// Whether a machine runs: its last sign of life, and whether the hub and a strict majority of the
// expected observers see it dead (its agent gone and its member silent), or only its agent.

// lifeAt is the newest sign at now that m runs (Assessment.LifeAt): own is its latest report (if
// reported), heard whether the hub's gossip hears it alive.
func (a *Assessor) lifeAt(m MachineRef, now time.Time, own *report.Report, reported, heard bool) time.Time {
	at := a.aliveAt[m.Node]
	if m.Member != "" && a.reachedAt[m.Member].After(at) {
		at = a.reachedAt[m.Member]
	}
	if reported && own.SentAt.After(at) {
		at = own.SentAt
	}
	if heard || at.After(now) {
		at = now // (a report from a clock ahead of the hub's says no more than now)
	}
	return at
}

// rejoinSettle: a death that began while the hub heard no majority must still stand this long after
// the hub hears one again. The observers' views from a partition take a report or two to catch up when
// it heals (test/chaos seed 3: a machine cut off with the hub, seen dead by the others, its agent
// killed a second after the heal, was power-cycled on those views though its member was healthy).
const rejoinSettle = 5 * time.Second

// liveness weighs the hub's and the observers' views of m; it reports whether m counts as dead: the
// hub and enough others to make a strict majority of the expected observers see it dead.
func (a *Assessor) liveness(m MachineRef, e *Expected, obs *Observations, hub *report.PeerView, known bool, observers []report.Report, life time.Time, ev *evidence) bool {
	if !known || hub.State == report.PeerAlive {
		return false
	}
	if hub.State == report.PeerLeft {
		ev.doubt("%s left the gossip pool on purpose (agent stopped) at %s", m.Node, hub.Since.Format(time.RFC3339))
		return false
	}
	agree, earliest := 0, hub.Since
	if v := a.deadVotesOf(m.Node); v != nil && v.n > 0 {
		agree, earliest = v.n, minTime(earliest, v.earliest)
	}
	votes, need := 1+agree, e.Size()/2+1 // the hub's own among them
	if votes < need {
		// m is no observer the hub hears (it does not hear m alive): every observer heard is another.
		ev.doubt("the hub lost sight of %s, but only %d of %d expected observers see it dead (the hub and %d of the %d others it hears; "+
			"a strict majority is %d): not corroborated", m.Node, votes, e.Size(), agree, len(observers), need)
		return false
	}
	// The views that would tell a dead machine from a dead agent may be older than the hub's return to
	// a majority (or etcd's quorum's): a hang its BMC logged since its last sign of life tells it now.
	// A machine that panics as etcd's leader makes the others lose their leader for a moment, and
	// quorum's return would otherwise keep its reboot waiting for a report or two more (a loaded
	// stall matrix, 2026-12-03).
	if life.IsZero() {
		life = earliest
	}
	hang, proved := bmcval.HangSince(obs.Hangs[m.Name], life)
	// An agent that dies (crashes, is OOM-killed, stops) takes its gossip member with it, and its
	// machine looks dead; but a dead machine's etcd member does not answer. When most of the observers
	// that check it reach m's member, the agent is what is down, not the machine: rebooting it would
	// take down a healthy voter (found by test/chaos: an agent stopped beside a dead member, and the
	// reboot cost quorum).
	var onlyOld int // the views of its member that say it does not answer, when all are from before the floor
	if m.Member != "" {
		v := reachability(m.Member, observers, m.Node, a.newerFor(m.Member))
		reach, unreach := v.reach, v.unreach
		if 2*reach > reach+unreach {
			ev.doubt("%s's agent is gone per %d of %d expected observers, but its etcd member %s answers %d of the %d observers that check it: "+
				"the agent is down, not the machine", m.Node, votes, e.Size(), m.Member, reach, reach+unreach)
			return false
		}
		if reach+unreach == 0 {
			onlyOld = v.stale
		}
	}
	ev.gone = true
	if onlyOld > 0 && !proved {
		_, why := a.floor(m.Member)
		ev.doubt("%s's agent is gone per %d of %d expected observers; whether its etcd member %s answers, only reports from before %s say "+
			"(%d: it does not): waiting for newer ones", m.Node, votes, e.Size(), m.Member, why, onlyOld)
		return false
	}
	wait := a.policy.DeadTimeout
	if a.lostOnce && a.heardSince.After(earliest) && wait < rejoinSettle && !proved {
		wait = rejoinSettle
	}
	if d, _, _ := a.countedFor(m.Member, obs.Now, earliest); d < wait {
		ev.doubt("%s dead for %v per %d of %d expected observers (unhealthy at %v)", m.Node, d.Round(time.Millisecond), votes, e.Size(), wait)
		return false
	}
	var by string
	if proved {
		by = fmt.Sprintf("; its BMC's event log has %s at %s, since its last sign of life: the machine is down, not only its agent", hang.Kind,
			hang.At.UTC().Format("15:04:05Z07:00"))
	}
	ev.bad(earliest, "%s dead since %s per %d of %d expected observers (the hub and %d others)%s", m.Node,
		earliest.UTC().Format("15:04:05.000Z07:00"), votes, e.Size(), agree, by)
	return true
}

// deadVotes are the observers that see one node dead: how many, and since when at the earliest.
type deadVotes struct {
	n        int
	earliest time.Time
}

// deadSlot is a node and the index of its votes in deadBy.
type deadSlot struct {
	node string
	i    int32
}

// deadVotesOf is node's votes in this pass (nil: none).
func (a *Assessor) deadVotesOf(node string) *deadVotes {
	if i, ok := a.deadAt[node]; ok {
		return &a.deadBy[i]
	}
	return nil
}

// deadVoteAt is the votes of node, seen dead at position j of a report's peers (added if new).
func (a *Assessor) deadVoteAt(j int, node string) *deadVotes {
	if j < len(a.deadMemo) && a.deadMemo[j].node == node {
		return &a.deadBy[a.deadMemo[j].i]
	}
	i, ok := a.deadAt[node]
	if !ok {
		i = int32(len(a.deadBy))
		a.deadAt[node] = i
		a.deadBy = append(a.deadBy, deadVotes{})
	}
	for len(a.deadMemo) <= j { // every slot holds a true pair
		a.deadMemo = append(a.deadMemo, deadSlot{node, i})
	}
	a.deadMemo[j] = deadSlot{node, i}
	return &a.deadBy[i]
}
