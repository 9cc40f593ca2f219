package kube_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/kube"
	"github.com/hale-dev/hale/kube/claim"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/capture"
)

// checkpoint is a hub as HandBack sees it: a pause is acknowledged (Paused) only once the step in
// flight when it came has reached its checkpoint, after busy.
type checkpoint struct {
	mu       sync.Mutex
	busy     time.Duration
	pausedAt time.Time // when the pause was set; zero: none
	pauses   int
}

func (p *checkpoint) SetPause(_ string, on bool, _ string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pausedAt = time.Time{}
	if on {
		p.pausedAt = time.Now()
		p.pauses++
	}
}

func (p *checkpoint) PauseState() operator.PauseState {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.pausedAt.IsZero():
		return operator.Running
	case time.Since(p.pausedAt) < p.busy:
		return operator.Pausing
	}
	return operator.Paused
}

// The claim on a real API server, both ways: the management cell holds it and copies its work into
// the workload cluster's journal (named by the Node); the cell dies, a fallback takes the claim once
// nobody renews it, resumes that work there and begins its own, while the dead cell's writes are
// refused; the cell comes back and marks the claim wanted, the fallback pauses and gives the claim up
// only once its step in flight has reached its checkpoint, and the cell brings back what the fallback
// carried on and began.
func TestClaimHandsWorkOverBothWays(t *testing.T) {
	c, cfg, mgmt := kube.Shared.Namespace(t)
	_, _, workloadNS := kube.Shared.Namespace(t)
	ctx := t.Context()
	timing := kube.LeaseTiming{LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond}
	lease := client.ObjectKey{Namespace: workloadNS, Name: "hale-hub"}
	node := func(machine string) string { return machine[len("w1-"):] }
	machine := func(node string) string { return "w1-" + node }
	// campaign runs Elect as identity until ctx ends; each term's lead is sent on the channel and runs
	// until its context ends or lead returns.
	campaign := func(ctx context.Context, identity string, lead func(context.Context, *kube.Leader)) {
		go func() { _ = kube.Elect(ctx, cfg, c, lease.Namespace, lease.Name, identity, timing, lead, nil) }()
	}
	holds := func(ctx context.Context, identity string) <-chan *kube.Leader {
		leaders := make(chan *kube.Leader, 1)
		campaign(ctx, identity, func(lctx context.Context, l *kube.Leader) {
			leaders <- l
			<-lctx.Done()
		})
		return leaders
	}
	mirror := func(cell *kube.Leader) (*kube.Journal, *kube.Journal, journal.Store) {
		primary := kube.NewJournal(c, mgmt, 1, 20).WithFence(cell.Check)
		workload := kube.NewJournal(c, workloadNS, cell.Epoch(), 20).WithFence(cell.Check)
		return primary, workload, &claim.Mirror{Store: primary, Workload: workload, Node: node}
	}
	steps := []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-1"}, {Op: quorum.OpAwaitHealthy, Member: "etcd-1"}}

	// The cell holds the claim; its remediation of w1-cp-1 is copied as cp-1's at every write.
	cellCtx, killCell := context.WithCancel(ctx)
	cell := <-holds(cellCtx, "cell")
	_, workload, store := mirror(cell)
	rem, err := store.Begin(ctx, journal.Remediation{Machine: "w1-cp-1", Strategy: "reboot", RequestedBy: "hub", Reason: "w1-cp-1 dead", Steps: steps})
	require.NoError(t, err)
	require.NoError(t, store.Intent(ctx, rem.ID, 0, "power-cycle etcd-1"))
	require.NoError(t, store.Outcome(ctx, rem.ID, 0, journal.ResultDone, "Off then On"))
	copied, err := workload.Get(ctx, rem.ID)
	require.NoError(t, err)
	assert.Equal(t, "cp-1", copied.Machine)
	assert.Equal(t, journal.InProgress, copied.State)
	assert.Len(t, copied.History, 3)

	// A mark left from long ago (a cell that stopped asking), there when the fallback takes over.
	_, err = claim.Want(ctx, c, lease, "an-old-cell")
	require.NoError(t, err)

	// The cell dies without giving the claim up: the fallback takes it once nobody has renewed it,
	// resumes the cell's remediation from the copy, and begins one of its own.
	killCell()
	type fallbackTerm struct {
		leader   *kube.Leader
		handedAt time.Time
	}
	hub := &checkpoint{busy: time.Second}
	logs := &capture.Buffer{}
	terms := make(chan fallbackTerm, 2)
	fbCtx, stopFallback := context.WithCancel(ctx)
	defer stopFallback()
	var fallbackLeading atomic.Bool
	campaign(fbCtx, "fallback", func(lctx context.Context, l *kube.Leader) {
		fallbackLeading.Store(true)
		defer fallbackLeading.Store(false)
		terms <- fallbackTerm{leader: l}
		b := &claim.HandBack{Client: c, Lease: lease, Hub: hub, Every: timing.RetryPeriod, Fresh: timing.LeaseDuration, Log: slog.New(slog.NewTextHandler(logs, nil))}
		if b.Run(lctx) {
			terms <- fallbackTerm{leader: l, handedAt: time.Now()}
		}
	})
	var fb fallbackTerm
	select {
	case fb = <-terms:
	case <-time.After(30 * time.Second): // a lease duration of unchanged answers, from an API server that may be loaded
		t.Fatal("the fallback never took the claim")
	}
	require.Greater(t, fb.leader.Epoch(), cell.Epoch())
	fj := kube.NewJournal(c, workloadNS, fb.leader.Epoch(), 20).WithFence(fb.leader.Check)
	active, err := fj.Active(ctx)
	require.NoError(t, err)
	require.Len(t, active, 1, "the cell's remediation, where the fallback resumes it")
	last := active[0].History[len(active[0].History)-1]
	assert.Equal(t, journal.EntryOutcome, last.Kind)
	assert.Equal(t, 0, last.Step, "resumed after the step the cell finished")
	require.NoError(t, fj.Intent(ctx, rem.ID, 1, "await-healthy etcd-1"))
	require.NoError(t, fj.Outcome(ctx, rem.ID, 1, journal.ResultDone, "back"))
	require.NoError(t, fj.Finish(ctx, rem.ID, journal.Succeeded, "every step done"))
	own, err := fj.Begin(ctx, journal.Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Reason: "cp-2 dead", Steps: steps})
	require.NoError(t, err)
	require.NoError(t, fj.Intent(ctx, own.ID, 0, "power-cycle etcd-2"))
	require.NoError(t, fj.Outcome(ctx, own.ID, 0, journal.ResultDone, "Off then On"))
	// The dead cell, still running somewhere, writes nothing: the claim fences its journal.
	require.ErrorIs(t, store.Note(ctx, rem.ID, "late"), journal.ErrStaleEpoch)

	// The mark left from long ago is not heeded: it does not change.
	var l coordinationv1.Lease
	require.NoError(t, c.Get(ctx, lease, &l))
	require.Contains(t, l.Annotations[claim.WantedAnnotation], "an-old-cell ")
	time.Sleep(3 * timing.RetryPeriod)
	assert.Zero(t, hub.pauses, "paused for a mark that never changed")

	// The cell is back: it marks the claim wanted while it campaigns; the fallback pauses, and gives
	// the claim up once its step in flight has reached its checkpoint (a second later).
	cell2Ctx, stopCell2 := context.WithCancel(ctx)
	defer stopCell2()
	go func() {
		for cell2Ctx.Err() == nil {
			_, _ = claim.Want(cell2Ctx, c, lease, "cell")
			time.Sleep(timing.LeaseDuration / 3)
		}
	}()
	var overlap atomic.Bool
	cellLeads := make(chan *kube.Leader, 1)
	campaign(cell2Ctx, "cell", func(lctx context.Context, l *kube.Leader) {
		overlap.Store(fallbackLeading.Load())
		cellLeads <- l
		<-lctx.Done()
	})
	var handed fallbackTerm
	select {
	case handed = <-terms:
	case <-time.After(30 * time.Second):
		t.Fatalf("the fallback never handed the claim back:\n%s", logs)
	}
	var cell2 *kube.Leader
	select {
	case cell2 = <-cellLeads:
	case <-time.After(30 * time.Second):
		t.Fatal("the cell never took the claim back")
	}
	assert.Equal(t, 1, hub.pauses)
	assert.GreaterOrEqual(t, handed.handedAt.Sub(hub.pausedAt), hub.busy, "handed back before the step in flight reached its checkpoint")
	assert.False(t, overlap.Load(), "the cell led while the fallback did")
	require.Greater(t, cell2.Epoch(), fb.leader.Epoch())

	// The cell brings back what the fallback carried on (its own remediation, now ended) and began
	// (cp-2's, to resume), named by the cell's machines.
	primary2, workload2, store2 := mirror(cell2)
	n, err := claim.Pull(ctx, primary2, workload2, machine)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	ended, err := primary2.Get(ctx, rem.ID)
	require.NoError(t, err)
	assert.Equal(t, journal.Succeeded, ended.State)
	assert.Equal(t, "w1-cp-1", ended.Machine)
	active, err = primary2.Active(ctx)
	require.NoError(t, err)
	require.Len(t, active, 1)
	assert.Equal(t, own.ID, active[0].ID)
	assert.Equal(t, "w1-cp-2", active[0].Machine)
	// It goes on with it, each write copied back.
	require.NoError(t, store2.Intent(ctx, own.ID, 1, "await-healthy etcd-2"))
	back, err := workload2.Get(ctx, own.ID)
	require.NoError(t, err)
	assert.Equal(t, "cp-2", back.Machine)
	assert.Len(t, back.History, len(active[0].History)+1)
	// A second Pull brings nothing: both journals agree.
	n, err = claim.Pull(ctx, primary2, workload2, machine)
	require.NoError(t, err)
	assert.Zero(t, n)
}
