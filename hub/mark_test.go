package hub

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
)

func etcdReport(node, cluster string, term, index uint64) health.Report {
	return health.Report{Node: node, Etcd: &health.EtcdView{ClusterID: cluster, LocalName: "etcd-" + node, RaftTerm: term, RaftIndex: index}}
}

func reportsOf(rs ...health.Report) map[string]health.Report {
	out := map[string]health.Report{}
	for _, r := range rs {
		out[r.Node] = r
	}
	return out
}

// membersOf is an inventory with a member machine for each report's node (but w-*: witnesses).
func membersOf(reports map[string]health.Report) pass.Inventory {
	var inv pass.Inventory
	for node := range reports {
		if !strings.HasPrefix(node, "w-") {
			inv.Machines = append(inv.Machines, pass.Machine{MachineRef: assess.MachineRef{Name: node, Node: node, Member: "etcd-" + node}})
		}
	}
	return inv
}

func TestReportedMark(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reports map[string]health.Report
		stale   []string      // nodes whose reports are not live
		want    pass.RaftMark // zero: none
	}{
		{"no reports", nil, nil, pass.RaftMark{}},
		{"no etcd view, no cluster ID (an older agent), index 0", reportsOf(health.Report{Node: "a"}, etcdReport("b", "", 3, 90), etcdReport("c", "c1", 3, 0)), nil, pass.RaftMark{}},
		{"the highest index", reportsOf(etcdReport("a", "c1", 3, 90), etcdReport("b", "c1", 4, 120), etcdReport("c", "c1", 4, 110)), nil,
			pass.RaftMark{ClusterID: "c1", Term: 4, Index: 120, Member: "etcd-b"}},
		{"the cluster most members report, even with lower indexes", reportsOf(etcdReport("a", "old", 9, 5000), etcdReport("b", "new", 2, 30), etcdReport("c", "new", 2, 31)), nil,
			pass.RaftMark{ClusterID: "new", Term: 2, Index: 31, Member: "etcd-c"}},
		{"the cluster the live reports give: the last reports of dead members do not outvote them",
			reportsOf(etcdReport("a", "old", 9, 5000), etcdReport("b", "old", 9, 4990), etcdReport("c", "new", 2, 31)), []string{"a", "b"},
			pass.RaftMark{ClusterID: "new", Term: 2, Index: 31, Member: "etcd-c"}},
		{"none live: all count", reportsOf(etcdReport("a", "old", 9, 5000), etcdReport("b", "old", 9, 4990), etcdReport("c", "new", 2, 31)), []string{"a", "b", "c"},
			pass.RaftMark{ClusterID: "old", Term: 9, Index: 5000, Member: "etcd-a"}},
		{"a node that is no member (a witness) counts for none", reportsOf(etcdReport("a", "c1", 3, 90), etcdReport("w-1", "c1", 3, 500)), nil,
			pass.RaftMark{ClusterID: "c1", Term: 3, Index: 90, Member: "etcd-a"}},
		{"a tie of clusters goes to the lower ID, a tie of indexes to the lower member", reportsOf(etcdReport("b", "c2", 1, 10), etcdReport("a", "c1", 1, 7), etcdReport("z", "c1", 1, 7)), nil,
			pass.RaftMark{ClusterID: "c1", Term: 1, Index: 7, Member: "etcd-a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := pass.ReportedMark(membersOf(tc.reports), tc.reports, func(r health.Report) bool { return !slices.Contains(tc.stale, r.Node) }, "")
			assert.Equal(t, tc.want.Index > 0, ok)
			assert.Equal(t, tc.want, got)
		})
	}
	// A tie of clusters goes to the mark's so far, before the lower ID: a member of the old cluster back
	// beside one of the new, before its rejoin, does not turn the mark back.
	tie := reportsOf(etcdReport("b", "c2", 1, 10), etcdReport("a", "c1", 1, 7))
	got, _ := pass.ReportedMark(membersOf(tie), tie, func(health.Report) bool { return true }, "c2")
	assert.Equal(t, pass.RaftMark{ClusterID: "c2", Term: 1, Index: 10, Member: "etcd-b"}, got)
}

// The mark rises with the reports and never falls; it is written at most every markEvery, at once
// when quorum is lost, again after a failed write (said once), and starts again for a new cluster ID.
func TestMarkIsRecordedAsPassesGo(t *testing.T) {
	s := pass.NewState()
	t0 := time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)
	var rd pass.Ready
	passAt := func(at time.Duration, urgent bool, rs ...health.Report) *pass.RaftMark {
		rd = pass.Ready{}
		s.RaiseMark(&rd, membersOf(reportsOf(rs...)), reportsOf(rs...), func(health.Report) bool { return true })
		return s.ToRecord(t0.Add(at), urgent)
	}
	m := passAt(0, false, etcdReport("a", "c1", 2, 100))
	require.NotNil(t, m, "the first mark is written at once")
	assert.Equal(t, uint64(100), m.Index)
	_, _ = s.MarkWritten(*m, nil)

	assert.Nil(t, passAt(time.Second, false, etcdReport("a", "c1", 2, 150)), "within markEvery: kept in memory")
	assert.Equal(t, uint64(150), s.Mark.Index)
	assert.Nil(t, passAt(2*time.Second, false, etcdReport("a", "c1", 2, 140)), "a lower report (a member behind) lowers nothing")
	assert.Equal(t, uint64(150), s.Mark.Index)
	m = passAt(3*time.Second, true, etcdReport("a", "c1", 2, 160))
	require.NotNil(t, m, "quorum lost: written at once")
	assert.Equal(t, uint64(160), m.Index)

	n, say := s.MarkWritten(*m, errors.New("disk full"))
	assert.True(t, say)
	assert.Contains(t, n.Message, "cannot journal the raft mark (raft index 160")
	assert.Nil(t, passAt(4*time.Second, false, etcdReport("a", "c1", 2, 160)), "a failed write is tried again after markEvery")
	m = passAt(3*time.Second+pass.MarkEvery, false, etcdReport("a", "c1", 2, 160))
	require.NotNil(t, m)
	_, say = s.MarkWritten(*m, errors.New("disk full"))
	assert.False(t, say, "the same failure is said once")
	m = passAt(3*time.Second+2*pass.MarkEvery, false, etcdReport("a", "c1", 2, 160))
	require.NotNil(t, m)
	_, _ = s.MarkWritten(*m, nil)
	assert.Nil(t, passAt(4*time.Second+3*pass.MarkEvery, false, etcdReport("a", "c1", 2, 160)), "nothing new: nothing written")

	m = passAt(5*time.Second+3*pass.MarkEvery, false, etcdReport("a", "c2", 1, 8), etcdReport("b", "c2", 1, 9))
	require.NotNil(t, m, "a new cluster: its mark written at once")
	assert.Equal(t, pass.RaftMark{ClusterID: "c2", Term: 1, Index: 9, Member: "etcd-b"}, *m)
	require.Len(t, rd.Notices, 1)
	assert.Equal(t, pass.ReasonEtcdClusterChanged, rd.Notices[0].Reason)
	assert.Contains(t, rd.Notices[0].Message, "from c1 to c2")
}

// A management cluster's cell writes a rising mark once a minute (CellMarkEvery), and a quorum loss
// at once as ever.
func TestCellMarkEvery(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration // State.MarkEvery
		want  time.Duration // how long a rising mark waits for its write
	}{
		{"a hub of its own cluster", 0, pass.MarkEvery},
		{"a management cluster's cell", pass.CellMarkEvery, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := pass.NewState()
			s.MarkEvery = tc.every
			t0 := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
			at := func(d time.Duration, urgent bool, index uint64) *pass.RaftMark {
				rs := reportsOf(etcdReport("a", "c1", 2, index))
				s.RaiseMark(&pass.Ready{}, membersOf(rs), rs, func(health.Report) bool { return true })
				return s.ToRecord(t0.Add(d), urgent)
			}
			m := at(0, false, 100)
			require.NotNil(t, m, "the first mark is written at once")
			_, _ = s.MarkWritten(*m, nil)
			assert.Nil(t, at(tc.want-time.Second, false, 200), "a second before the interval: kept in memory")
			m = at(tc.want, false, 300)
			require.NotNil(t, m, "at the interval: written")
			assert.Equal(t, uint64(300), m.Index)
			_, _ = s.MarkWritten(*m, nil)
			m = at(tc.want+time.Second, true, 400)
			require.NotNil(t, m, "quorum lost: written at once, whatever the interval")
			assert.Equal(t, uint64(400), m.Index)
		})
	}
}

// The bbolt journal keeps the mark across a reopen.
func TestJournalKeepsTheRaftMark(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal.db")
	j, err := boltfile.Open(path, 0)
	require.NoError(t, err)
	m, err := j.RaftMark(ctx)
	require.NoError(t, err)
	assert.Equal(t, pass.RaftMark{}, m, "none in a new journal")
	want := pass.RaftMark{ClusterID: "c1", Term: 3, Index: 4242, Member: "etcd-2", At: time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)}
	require.NoError(t, j.RecordRaftMark(ctx, want))
	require.NoError(t, j.Close())

	j, err = boltfile.Open(path, 0)
	require.NoError(t, err)
	defer j.Close()
	m, err = j.RaftMark(ctx)
	require.NoError(t, err)
	assert.Equal(t, want, m)
}

// A running hub journals the mark as the reports raise it, shows it in status, and journals it at
// once when it stops planning (two of three members gone).
func TestHubJournalsTheRaftMark(t *testing.T) {
	pool := newTestPool(3)
	r := newPassRig(t, pool, testPolicy(), nil)
	ctx := t.Context()
	r.run(t)
	r.awaitPasses(t, 3)
	st := r.hub.Status(ctx)
	require.NotNil(t, st.RaftMark)
	assert.Equal(t, testClusterID, st.RaftMark.ClusterID)
	journaled := func() pass.RaftMark {
		m, err := r.hub.cfg.Marks.RaftMark(ctx)
		require.NoError(t, err)
		return m
	}
	require.Eventually(t, func() bool { return journaled().Index > 0 }, 10*time.Second, 10*time.Millisecond, "the first mark is journaled at once")
	first := journaled()
	r.awaitPasses(t, 10)
	assert.Equal(t, first, journaled(), "within markEvery the journal is not written again")
	assert.Greater(t, r.hub.Status(ctx).RaftMark.Index, first.Index, "status shows the highest seen")

	pool.mu.Lock()
	pool.dead["cp-1"], pool.dead["cp-2"] = true, true
	pool.mu.Unlock()
	require.Eventually(t, func() bool { return journaled().Index > first.Index }, 10*time.Second, 10*time.Millisecond,
		"two of three members gone (the hub then hears too few observers to plan): the mark journaled at once, not after markEvery")
}

// stuckMarks is a mark store whose writes wait until release is closed, then fail: the API server of a
// cluster whose etcd just lost quorum, which answers a write only at the client's timeout.
type stuckMarks struct {
	MarkStore
	release chan struct{}
	writes  atomic.Int32
}

func (s *stuckMarks) RecordRaftMark(ctx context.Context, _ pass.RaftMark) error {
	s.writes.Add(1)
	select {
	case <-s.release:
		return errors.New("the server was unable to return a response in the time allotted")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A write of the mark that hangs holds no pass: the passes go on (the degraded-mode decision reads a
// recent one), and how the write went is said by a later pass.
func TestMarkWriteHoldsNoPass(t *testing.T) {
	r := newPassRig(t, newTestPool(3), testPolicy(), nil)
	stuck := &stuckMarks{MarkStore: r.hub.cfg.Marks, release: make(chan struct{})}
	r.hub.cfg.Marks = stuck
	r.run(t)
	require.Eventually(t, func() bool { return stuck.writes.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the first mark handed to the writer")
	r.awaitPasses(t, 20)
	assert.EqualValues(t, 1, stuck.writes.Load(), "one write at a time")
	close(stuck.release)
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(r.hub.Timeline(), func(l string) bool { return strings.Contains(l, "cannot journal the raft mark") })
	}, 10*time.Second, 5*time.Millisecond, "the failed write said by a later pass")
}
