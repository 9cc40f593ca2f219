package kube

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hale-dev/hale/hub/journal"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// LeaseTiming is client-go's leader-election timing (defaults: 15 s lease, 10 s renew deadline, 2 s
// retry, as controller-runtime's).
type LeaseTiming struct {
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Leader is this hub's leadership of the Lease: its epoch (the Lease's leader transitions + 1, so
// every new leader's is higher than all before it) and a fence that says whether it still holds.
type Leader struct {
	c                  client.Client
	ns, name, identity string
	epoch              uint64
}

// Identity is the identity this leader holds the Lease as.
func (l *Leader) Identity() string { return l.identity }

// Epoch is this leader's epoch, for the journal.
func (l *Leader) Epoch() uint64 { return l.epoch }

// Check returns hub.ErrStaleEpoch unless the Lease is still this leader's: the journal calls it before
// every write, so a deposed leader that has not noticed yet cannot write objects the new leader has
// not touched either.
func (l *Leader) Check(ctx context.Context) error {
	var lease coordinationv1.Lease
	if err := l.c.Get(ctx, client.ObjectKey{Namespace: l.ns, Name: l.name}, &lease); err != nil {
		return fmt.Errorf("reading lease %s/%s: %w", l.ns, l.name, err)
	}
	holder, transitions := LeaseHolder(&lease), int32(0)
	if lease.Spec.LeaseTransitions != nil {
		transitions = *lease.Spec.LeaseTransitions
	}
	if holder != l.identity || uint64(transitions)+1 != l.epoch {
		return fmt.Errorf("lease %s/%s: %w (held by %q at epoch %d; this hub is %q at epoch %d)", l.ns, l.name, journal.ErrStaleEpoch,
			holder, transitions+1, l.identity, l.epoch)
	}
	return nil
}

// LeaseHolder is lease's holder, "" for none.
func LeaseHolder(lease *coordinationv1.Lease) string {
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// Elect campaigns for the Lease ns/name as identity (unique per process) until ctx ends; each time it
// leads it calls lead with a context that is cancelled when the leadership is lost. When lead returns
// while this replica still leads (its pipeline stopped: a discovery or resume error), the Lease is
// released at once, so that a standby takes over instead of a leader that renews while nothing runs;
// this replica campaigns again one lease duration later. It returns when ctx ends.
//
// When the leadership was lost without being given up (renewals failed for the renew deadline: the
// API server did not answer), lost, when set, is called at once with the leader that was, the time of
// its last renewal and a channel closed once lead has returned (its pipeline has stopped: lost decides
// at once, while the lease is still its own by its clock, and starts anything only after that), and
// Elect campaigns again once it returns, as the same identity: a Lease nobody took meanwhile is renewed
// at the same epoch (degraded mode, cmd/hub). Without lost, Elect campaigns again once lead has
// returned: two terms of one replica never run at once.
//
// A Lease held by another replica is taken over only once the API server has answered with it
// unchanged for a lease duration (patientLock): client-go counts from the last time it saw the record
// change, so after an outage it would take a Lease at once whose holder had no chance to renew it.
func Elect(ctx context.Context, cfg *rest.Config, c client.Client, ns, name, identity string, t LeaseTiming,
	lead func(context.Context, *Leader), lost func(ctx context.Context, leader *Leader, renewed time.Time, stopped <-chan struct{})) error {
	if t.LeaseDuration == 0 {
		t = LeaseTiming{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
	}
	// Each request of the lock ends after a quarter of the renew deadline: one held by an API server
	// that hangs would otherwise use the whole deadline, and the renewal gets no second try.
	lc := rest.CopyConfig(cfg)
	lc.Timeout = t.RenewDeadline / 4
	cs, err := kubernetes.NewForConfig(lc)
	if err != nil {
		return err
	}
	lock := &patientLock{Interface: &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Client: cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity}}, wait: t.LeaseDuration, now: time.Now}
	for ctx.Err() == nil {
		term, endTerm := context.WithCancel(ctx)
		var stopped atomic.Bool // lead returned on its own: its pipeline stopped (set in the elector's goroutine)
		var led atomic.Pointer[Leader]
		leadDone := make(chan struct{}) // closed when lead has returned (client-go does not wait for it)
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{Lock: lock, Name: name,
			LeaseDuration: t.LeaseDuration, RenewDeadline: t.RenewDeadline, RetryPeriod: t.RetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					// The epoch is the Lease's transitions, read again until the API server answers or the
					// term ends: a replica that gave up at one failed read held the Lease, renewing it, and
					// never led (a full run: the API server restarted on an etcd survivor just after the
					// Lease was taken; for two minutes no replica healed anything).
					var lease coordinationv1.Lease
					for c.Get(lctx, client.ObjectKey{Namespace: ns, Name: name}, &lease) != nil {
						select {
						case <-lctx.Done():
							return // the term ended: lead is not called without an epoch
						case <-time.After(t.RetryPeriod):
						}
					}
					transitions := int32(0)
					if lease.Spec.LeaseTransitions != nil {
						transitions = *lease.Spec.LeaseTransitions
					}
					leader := &Leader{c: c, ns: ns, name: name, identity: identity, epoch: uint64(transitions) + 1}
					led.Store(leader)
					defer close(leadDone)
					lead(lctx, leader)
					if lctx.Err() == nil {
						stopped.Store(true)
						endTerm() // stop renewing
					}
				},
				OnStoppedLeading: func() {},
			}})
		if err != nil {
			endTerm()
			return err
		}
		le.Run(term) // returns when the leadership is lost, the term ends or ctx ends
		endTerm()
		switch leader := led.Load(); {
		case stopped.Load():
			release(ctx, lock, identity)
			select { // give a standby the Lease before campaigning again
			case <-ctx.Done():
			case <-time.After(t.LeaseDuration):
			}
		case leader != nil && ctx.Err() == nil && lost != nil:
			lost(ctx, leader, lock.renewed(), leadDone)
			<-leadDone
		case leader != nil:
			<-leadDone // its pipeline has stopped before another term can start one
		}
	}
	return nil
}

// patientLock is the Lease lock with one rule more than client-go's: the Lease of another holder is
// taken over only once the API server has answered with it unchanged for wait (the lease duration).
// client-go waits a lease duration from the moment it last saw the record change, which after an
// outage is long past: it would take the Lease at the first answer, before a holder that kept going
// without the API server (degraded mode) could renew it. It also keeps the time of this holder's
// last renewal.
type patientLock struct {
	resourcelock.Interface
	wait time.Duration
	now  func() time.Time

	mu        sync.Mutex
	raw       []byte
	holder    string
	since     time.Time // since when the API server has answered with raw unchanged (zero: unknown)
	renewedAt time.Time
}

func (l *patientLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.Interface.Get(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil:
		l.since = time.Time{} // blind: whatever is read next may have been renewed meanwhile
	case l.since.IsZero() || !bytes.Equal(raw, l.raw):
		l.raw, l.holder, l.since = raw, rec.HolderIdentity, l.now()
	}
	return rec, raw, err
}

func (l *patientLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, rec, l.Interface.Create)
}

func (l *patientLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, rec, l.Interface.Update)
}

func (l *patientLock) write(ctx context.Context, rec resourcelock.LeaderElectionRecord,
	write func(context.Context, resourcelock.LeaderElectionRecord) error) error {
	mine := rec.HolderIdentity != "" && rec.HolderIdentity == l.Identity()
	l.mu.Lock()
	holder, since := l.holder, l.since
	l.mu.Unlock()
	if mine && holder != "" && holder != rec.HolderIdentity {
		if answered := l.now().Sub(since); since.IsZero() || answered < l.wait {
			return fmt.Errorf("lease %s held by %q: not taken over until the API server has answered with it unchanged for %v (it did for %v; its holder may have gone on without the API server and renews it when it can)",
				l.Describe(), holder, l.wait, answered.Round(time.Millisecond))
		}
	}
	if err := write(ctx, rec); err != nil {
		return err
	}
	if mine {
		l.mu.Lock()
		l.renewedAt, l.holder = l.now(), rec.HolderIdentity
		l.mu.Unlock()
	}
	return nil
}

// renewed is when this replica last wrote the Lease as its holder.
func (l *patientLock) renewed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewedAt
}

// release gives the Lease up at once, as client-go does on a graceful stop: still held by identity, it
// is rewritten with no holder and a 1 s duration, so that a standby takes it at its next try.
func release(ctx context.Context, lock resourcelock.Interface, identity string) {
	rec, _, err := lock.Get(ctx)
	if err != nil || rec.HolderIdentity != identity {
		return
	}
	now := metav1.NewTime(time.Now())
	_ = lock.Update(ctx, resourcelock.LeaderElectionRecord{LeaderTransitions: rec.LeaderTransitions, LeaseDurationSeconds: 1,
		RenewTime: now, AcquireTime: now})
}
