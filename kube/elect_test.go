package kube

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/quorum"
)

// Two hubs campaign for one Lease; the leader dies (no release, as a crash) with a remediation's
// intent written; the other takes over within the lease duration, with a higher epoch, resumes and
// finishes the same remediation; every later write of the deposed leader is refused.
func TestLeaderTakeoverAndStaleWrites(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	timing := LeaseTiming{LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond}
	campaign := func(ctx context.Context, identity string) <-chan *Leader {
		leaders := make(chan *Leader, 1)
		go func() {
			_ = Elect(ctx, cfg, c, ns, "hale-hub", identity, timing, func(lctx context.Context, l *Leader) {
				leaders <- l
				<-lctx.Done()
			}, nil)
		}()
		return leaders
	}

	ctxA, killA := context.WithCancel(ctx)
	defer killA()
	a := <-campaign(ctxA, "hub-a")
	jA := NewJournal(c, ns, a.Epoch(), 5).WithFence(a.Check)
	rem, err := jA.Begin(ctx, journal.Remediation{Machine: "cp-1", Strategy: "reboot", RequestedBy: "hub", Reason: "cp-1 dead",
		Steps: []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-1"}, {Op: quorum.OpAwaitHealthy, Member: "etcd-1"}}})
	require.NoError(t, err)
	require.NoError(t, jA.Intent(ctx, rem.ID, 0, "reboot etcd-1 (graceful, then hard)"))

	bLeads := campaign(ctx, "hub-b")
	select {
	case <-bLeads:
		t.Fatal("hub-b led while hub-a held the lease")
	case <-time.After(3 * timing.LeaseDuration / 2):
	}
	killA() // a crash: the lease is not released, it expires
	killed := time.Now()
	var b *Leader
	select {
	case b = <-bLeads:
	case <-time.After(4 * timing.LeaseDuration):
		t.Fatal("hub-b did not take over")
	}
	took := time.Since(killed)
	t.Logf("hub-b took over %v after hub-a died (lease duration %v), epoch %d → %d", took.Round(time.Millisecond), timing.LeaseDuration, a.Epoch(), b.Epoch())
	// A standby takes over once the record it last saw change is a lease duration old: that change came
	// up to a retry period after hub-a's last renewal, and its own try up to one more after: 1.8-2.4 s
	// here. A takeover that waited for a second lease duration takes 4 s at the least; below that, the
	// bound leaves the API server's latency on a loaded machine room (full runs beside the real cluster
	// missed bounds of 2.8 and 3 s).
	assert.Less(t, took, 2*timing.LeaseDuration, "within the lease duration (plus two retry periods and the API server's latency)")
	require.Greater(t, b.Epoch(), a.Epoch())

	jB := NewJournal(c, ns, b.Epoch(), 5).WithFence(b.Check)
	active, err := jB.Active(ctx)
	require.NoError(t, err)
	require.Len(t, active, 1)
	_, pending := active[0].Pending()
	require.True(t, pending)
	require.NoError(t, jB.Outcome(ctx, rem.ID, 0, journal.ResultNotRepeated, "after a hub restart: the BMC shows the reset; not repeated"))
	require.NoError(t, jB.Finish(ctx, rem.ID, journal.Succeeded, "every step done"))

	// The deposed leader, still running somewhere, writes nothing: not to the remediation its
	// successor took over, nor anything new.
	require.ErrorIs(t, jA.Note(ctx, rem.ID, "late"), journal.ErrStaleEpoch)
	_, err = jA.Begin(ctx, journal.Remediation{Machine: "cp-2", Strategy: "reboot", Reason: "from a zombie"})
	require.ErrorIs(t, err, journal.ErrStaleEpoch)
	assert.Contains(t, err.Error(), `held by "hub-b"`)
	h, err := jB.History(ctx, "cp-2")
	require.NoError(t, err)
	assert.Empty(t, h)
}

// A leader whose pipeline stops (lead returns: a discovery error, a resume that cannot read a BMC) does
// not keep the Lease while nothing runs: it gives it up at once, and the standby leads.
func TestLeaderWhosePipelineStopsGivesUpTheLease(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	timing := LeaseTiming{LeaseDuration: 5 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 200 * time.Millisecond}
	aLeads := make(chan *Leader, 1)
	go func() {
		_ = Elect(ctx, cfg, c, ns, "hale-hub", "hub-a", timing, func(_ context.Context, l *Leader) {
			aLeads <- l // and return at once: the pipeline stopped
		}, nil)
	}()
	a := <-aLeads
	stopped := time.Now()
	bLeads := make(chan *Leader, 1)
	go func() {
		_ = Elect(ctx, cfg, c, ns, "hale-hub", "hub-b", timing, func(lctx context.Context, l *Leader) {
			bLeads <- l
			<-lctx.Done()
		}, nil)
	}()
	select {
	case b := <-bLeads:
		took := time.Since(stopped)
		t.Logf("hub-a's pipeline stopped; hub-b led %v later (lease duration %v)", took.Round(time.Millisecond), timing.LeaseDuration)
		assert.Less(t, took, timing.LeaseDuration, "released, not left to expire")
		assert.Greater(t, b.Epoch(), a.Epoch())
	case <-time.After(3 * timing.LeaseDuration):
		t.Fatal("hub-b never led: hub-a kept the Lease with nothing running")
	}
}

// failingGets is a client whose first reads fail, as an API server restarting just then.
type failingGets struct {
	client.Client
	left atomic.Int32
}

func (f *failingGets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if f.left.Add(-1) >= 0 {
		return errors.New("test: the API server restarts")
	}
	return f.Client.Get(ctx, key, obj, opts...)
}

// A replica that takes the Lease while the API server does not answer its read of the epoch reads it
// again and leads: it does not hold the Lease while nothing runs.
func TestLeaderReadsItsEpochAgain(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	timing := LeaseTiming{LeaseDuration: 5 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 200 * time.Millisecond}
	restarting := &failingGets{Client: c}
	restarting.left.Store(3)
	leads := make(chan *Leader, 1)
	go func() {
		_ = Elect(t.Context(), cfg, restarting, ns, "hale-hub", "hub-a", timing, func(lctx context.Context, l *Leader) {
			leads <- l
			<-lctx.Done()
		}, nil)
	}()
	select {
	case l := <-leads:
		assert.Equal(t, uint64(1), l.Epoch())
	case <-time.After(3 * timing.LeaseDuration):
		t.Fatal("hub-a holds the Lease and never leads")
	}
}

// outage is a switch in a client's transport: while it is on, every request fails as an API server
// that does not answer.
type outage struct{ on atomic.Bool }

func (o *outage) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if o.on.Load() {
			return nil, errors.New("test outage: no answer")
		}
		return rt.RoundTrip(r)
	})
}

// A leader whose renewals fail loses its term; when the API server answers again, the same identity
// may take its own Lease back at once, but its next term starts only once the last one's pipeline has
// stopped (here it takes 2 s to reach a checkpoint): two terms of one replica never run at once, even
// without a lost callback (management mode's election has none).
func TestNextTermWaitsForTheLastOnesPipeline(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	timing := LeaseTiming{LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond}
	var down outage
	ecfg := rest.CopyConfig(cfg)
	ecfg.WrapTransport = down.wrap
	var running, overlaps atomic.Int32
	terms, lost := make(chan time.Time, 4), make(chan struct{}, 4)
	go func() {
		_ = Elect(ctx, ecfg, c, ns, "hale-hub", "hub-a", timing, func(lctx context.Context, _ *Leader) {
			if running.Add(1) > 1 {
				overlaps.Add(1)
			}
			terms <- time.Now()
			<-lctx.Done()
			lost <- struct{}{}
			time.Sleep(2 * time.Second) // a step that runs to its checkpoint
			running.Add(-1)
		}, nil)
	}()
	select {
	case <-terms:
	case <-time.After(30 * time.Second):
		t.Fatal("hub-a never led")
	}
	down.on.Store(true)
	select {
	case <-lost: // its renewals failed for the renew deadline
	case <-time.After(30 * time.Second):
		t.Fatal("hub-a's term never ended with the API server unanswering")
	}
	down.on.Store(false)
	back := time.Now()
	select {
	case second := <-terms:
		t.Logf("the second term began %v after the API server answered again", second.Sub(back).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("hub-a never led again")
	}
	assert.Zero(t, overlaps.Load(), "a term began while the last one's pipeline still ran")
}
