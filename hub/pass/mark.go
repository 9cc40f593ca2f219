package pass

import (
	"cmp"
	"fmt"
	"time"

	"github.com/hale-dev/hale/health/report"
)

// RaftMark is the highest raft index any member of the etcd cluster has reported to the hub: after a
// permanent loss of quorum, a survivor whose own index is below it lacks entries the cluster had, and
// recovering from it loses them. The hub journals it as passes go (MarkStore), so that it outlives the
// hub and the members that reported it.
type RaftMark struct {
	// ClusterID is the etcd cluster's (hex): a mark says nothing about a cluster rebuilt since, whose
	// indexes start again.
	ClusterID string `json:"clusterID"`
	Term      uint64 `json:"term"`
	Index     uint64 `json:"index"`
	// Member is the member that reported it, At when its agent observed it.
	Member string    `json:"member"`
	At     time.Time `json:"at"`
}

func (m RaftMark) String() string {
	if m.Index == 0 {
		return "none"
	}
	return fmt.Sprintf("raft index %d (term %d) of etcd cluster %s, from %s at %s", m.Index, m.Term, m.ClusterID, m.Member,
		m.At.UTC().Format(time.RFC3339))
}

// MarkEvery is how often a rising mark is written, at most: the journal's mark lags the highest index
// seen by at most this long's writes, except when a pass finds quorum lost or stops planning (then it
// is written at once: what was seen last may be what a recovery is checked against, and a hub that
// hears too few observers to plan may be seeing the start of the loss).
const MarkEvery = 10 * time.Second

// CellMarkEvery is MarkEvery for a cell of a hub in a management cluster: the mark goes to the
// management cluster's API server (the HealthPolicy), and on a busy etcd it rises at every pass, so at
// 10 s a hub of 1,000 cells would write it up to 100 times a second. The write that matters is the urgent one (quorum
// lost, planning stopped), made at once whatever this says; between them the journal's mark may lag the
// highest index seen by a minute's writes, and `hub recover` checks a survivor against that.
const CellMarkEvery = time.Minute

// markEvery is the interval in force.
func (s *State) markEvery() time.Duration { return cmp.Or(s.MarkEvery, MarkEvery) }

// ReportedMark is the highest raft index in the reports of the inventory's etcd members, for the
// cluster most of them report (a report without a cluster ID, from an agent older than the field,
// counts for none); ok is false when no report has one. The cluster is the one most live reports give
// when any is live: the last reports of members that died in the old cluster, still gossiped, must not
// outvote the members of a rebuilt one. A tie goes to the cluster of the mark so far (prefer: a member
// of the old cluster back beside one of the new, before its rejoin, must not turn the mark back and
// forth), then to the lower ID. It walks the members, not the reports: a pool of thousands of machines
// has a handful of members.
func ReportedMark(inv Inventory, reports map[string]report.Report, live func(report.Report) bool, prefer string) (RaftMark, bool) {
	count, alive, best := map[string]int{}, map[string]int{}, map[string]RaftMark{}
	for i := range inv.Machines {
		m := &inv.Machines[i]
		if m.Member == "" {
			continue
		}
		r, ok := reports[m.Node]
		if !ok {
			continue
		}
		e := r.Etcd
		if e == nil || e.ClusterID == "" || e.RaftIndex == 0 {
			continue
		}
		count[e.ClusterID]++
		if live(r) {
			alive[e.ClusterID]++
		}
		member := cmp.Or(e.LocalName, r.Node)
		if b := best[e.ClusterID]; e.RaftIndex > b.Index || e.RaftIndex == b.Index && member < b.Member {
			best[e.ClusterID] = RaftMark{ClusterID: e.ClusterID, Term: e.RaftTerm, Index: e.RaftIndex, Member: member, At: e.ObservedAt}
		}
	}
	if len(alive) > 0 {
		count = alive
	}
	var out RaftMark
	for id, n := range count {
		if n > count[out.ClusterID] || n == count[out.ClusterID] && out.ClusterID != prefer && (id == prefer || id < out.ClusterID) {
			out = best[id]
		}
	}
	return out, out.Index > 0
}

// RaiseMark raises the mark to what the reports show (or starts it again for a cluster with another ID),
// and says when the cluster ID changed.
func (s *State) RaiseMark(rd *Ready, inv Inventory, reports map[string]report.Report, live func(report.Report) bool) {
	m, ok := ReportedMark(inv, reports, live, s.Mark.ClusterID)
	switch {
	case !ok:
	case s.Mark.ClusterID != "" && m.ClusterID != s.Mark.ClusterID:
		rd.queue(Notice{Reason: ReasonEtcdClusterChanged, Warning: true, Message: fmt.Sprintf(
			"the etcd cluster's ID changed from %s to %s (rebuilt from a snapshot?): the raft mark starts again, from %s", s.Mark.ClusterID, m.ClusterID, m)})
		s.rebuilt = &clusterChange{from: s.Mark.ClusterID, to: m.ClusterID}
		s.Mark = m
	case m.Index > s.Mark.Index:
		s.Mark = m
	}
}

// ToRecord says whether this pass writes the mark: when it differs from the journal's and either
// markEvery has passed since the last write or the pass is urgent (quorum lost, or planning stopped,
// in this pass).
func (s *State) ToRecord(now time.Time, urgent bool) *RaftMark {
	if s.Mark.Index == 0 || s.Mark == s.Recorded || !urgent && now.Sub(s.recordedAt) < s.markEvery() {
		return nil
	}
	s.recordedAt = now
	m := s.Mark
	return &m
}

// MarkWritten records how the write of m went; it returns what to say: a failure, once per cause.
func (s *State) MarkWritten(m RaftMark, err error) (Notice, bool) {
	prev := s.markErr
	if err == nil {
		s.Recorded, s.markErr = m, ""
		return Notice{}, false
	}
	s.markErr = err.Error()
	return Notice{Reason: ReasonRaftMarkNotRecorded, Warning: true, Message: fmt.Sprintf("cannot journal the raft mark (%s): %v (trying again in %v)",
		m, err, s.markEvery())}, prev != s.markErr
}

type MarkResult struct {
	Mark RaftMark
	Err  error
}
