package assess

import (
	"fmt"
	"time"

	"github.com/hale-dev/hale/health/report"
)

// Evidence newer than what it judges (DESIGN.md rule 12). A member that restarts, or answers as a
// member of another etcd cluster (a rebuild), is not the member the observers' earlier reports were
// about: their "does not answer" from before says nothing of it, and neither does a failure of its
// own probe from before. Each such change starts an epoch of the member: its time on the hub's clock
// and each observer's report version at that moment. Only reports newer than those count for or
// against the member (never the agents' clocks: they may be skewed), and a timed failure counts from
// the epoch at the earliest. Found on real processes: after `agent recover`, the rebuilt cluster's
// only member was power-cycled 5 s after it answered, on its observers' reports from before (their
// etcd clients still reconnecting), the quorum of one it "lacked" making the cycle look free.

// epoch is a member's latest (re)start or change of cluster, as the hub saw it.
type epoch struct {
	at  time.Time
	why string
	// versions is each observer's report version at that moment: a report no newer is from before.
	versions map[string]uint64
}

// ownView is what a member's own agent said of it in the latest report the assessor looked at: that
// the member answered its status (a serializable call the member answers with or without a leader),
// as which member of which cluster, and when the agent started.
type ownView struct {
	version          uint64
	started          time.Time
	answers          bool
	cluster, localID string
}

// ownViewOf reads what r, the report of member's own agent, says of member.
func ownViewOf(r report.Report, member string) ownView {
	v := ownView{version: r.Version, started: r.Started}
	if e := r.Etcd; e != nil && e.LocalID != "" && (e.LocalName == "" || e.LocalName == member) {
		v.answers, v.cluster, v.localID = true, e.ClusterID, e.LocalID
	}
	return v
}

// noteRestarts starts an epoch for every member whose own agent's new report shows it answering
// again after it did not, as another member ID or in another cluster, or from an agent that started
// again (the machine rebooted).
func (a *Assessor) noteRestarts(machines []MachineRef, obs Observations) {
	if a.own == nil {
		a.own, a.epochs = map[string]ownView{}, map[string]epoch{}
	}
	for _, m := range machines {
		if m.Member == "" {
			continue
		}
		r, ok := obs.Reports[m.Node]
		if !ok {
			continue
		}
		was, known := a.own[m.Member]
		if known && was.version == r.Version {
			continue
		}
		now := ownViewOf(r, m.Member)
		a.own[m.Member] = now
		if !known || !now.answers {
			continue
		}
		var why string
		switch {
		case !was.answers:
			why = fmt.Sprintf("%s answered again", m.Member)
		case was.cluster != now.cluster:
			why = fmt.Sprintf("%s answered as a member of etcd cluster %s", m.Member, now.cluster)
		case was.localID != now.localID:
			why = fmt.Sprintf("%s answered as member %s", m.Member, now.localID)
		case !was.started.Equal(now.started):
			why = fmt.Sprintf("%s's agent started again", m.Node)
		default:
			continue
		}
		versions := make(map[string]uint64, len(obs.Reports))
		for node, r := range obs.Reports {
			versions[node] = r.Version
		}
		a.epochs[m.Member] = epoch{at: obs.Now, why: why, versions: versions}
	}
}

// ownNewer says whether own, the report of member's own agent, is as new as the floor: newer than the
// one it had sent when the hub last began to hear a majority (or quorum came back), and no older than
// the one that began member's epoch (that report is the epoch's own evidence: it answers again).
func (a *Assessor) ownNewer(member string, own *report.Report) bool {
	e, ok := a.epochs[member]
	return a.newerThanHeard(*own) && (!ok || own.Version >= e.versions[own.Node])
}

// floor is from when evidence about member counts, and why: the later of the hub's last return to a
// majority of its observers (or of etcd's quorum, or of its resume) and the member's own epoch.
func (a *Assessor) floor(member string) (time.Time, string) {
	at, why := a.heardSince, a.heardWhy
	if e, ok := a.epochs[member]; ok && e.at.After(at) {
		at, why = e.at, e.why
	}
	return at, why
}

// countedFor is how long a condition about member (or its machine) that began at since counts as
// evidence at now: time while the hub did not hear a majority of its observers does not count, so
// after a partition heals (or the hub starts, or is resumed) a failure must last its whole timeout
// again before it leads to action. A member on the minority side of a partition fails its own etcd
// probe ("no leader") for as long as the partition lasts, and is fine a second after it heals: that is
// no reason to reboot it. Nor does time before the member's epoch count. The string says from when,
// when it applies; from is the moment the count began, the evidence's since for the verdict (from which
// the component grace counts: a component failing through a partition has had no grace yet). While
// the hub hears no majority (heardSince zero) nothing counts at all: with no floor, a pass that missed
// a majority for a moment after a heal would count from before the partition.
func (a *Assessor) countedFor(member string, now, since time.Time) (d time.Duration, from time.Time, said string) {
	if a.heardSince.IsZero() {
		return 0, now, ", not counted while the hub hears no majority of its observers"
	}
	at, why := a.floor(member)
	if at.After(since) {
		return now.Sub(at), at, fmt.Sprintf(", counted from %s when %s", at.UTC().Format("15:04:05.000Z07:00"), why)
	}
	return now.Sub(since), since, ""
}

// newerFor says whether observer report r is newer than both the report its observer had sent when the
// hub last began to hear a majority (newerThanHeard) and the one it had sent at member's epoch.
func (a *Assessor) newerFor(member string) func(report.Report) bool {
	e, ok := a.epochs[member]
	return func(r report.Report) bool {
		return a.newerThanHeard(r) && (!ok || r.Version > e.versions[r.Node])
	}
}
