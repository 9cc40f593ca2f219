package kube

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// fakeLock is a Lease in memory whose reads can fail, as an API server without etcd's quorum.
type fakeLock struct {
	identity string
	rec      resourcelock.LeaderElectionRecord
	down     bool
}

func (f *fakeLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	if f.down {
		return nil, nil, errors.New("etcdserver: request timed out")
	}
	raw, _ := json.Marshal(f.rec)
	rec := f.rec
	return &rec, raw, nil
}

func (f *fakeLock) Create(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	f.rec = r
	return nil
}

func (f *fakeLock) Update(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	if f.down {
		return errors.New("etcdserver: request timed out")
	}
	f.rec = r
	return nil
}

func (f *fakeLock) RecordEvent(string) {}
func (f *fakeLock) Identity() string   { return f.identity }
func (f *fakeLock) Describe() string   { return "hale-system/hale-hub" }
func (f *fakeLock) holder() string     { return f.rec.HolderIdentity }
func (f *fakeLock) set(holder string)  { f.rec.HolderIdentity = holder }
func (f *fakeLock) renew(t time.Time)  { f.rec.RenewTime.Time = t }
func (f *fakeLock) outage(on bool)     { f.down = on }
func (f *fakeLock) takeover() resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{HolderIdentity: f.identity, LeaderTransitions: f.rec.LeaderTransitions + 1}
}

// patientLock takes another holder's Lease only after the API server has answered with it unchanged
// for a lease duration; its own renewals, a release and a Lease nobody holds are never held back.
func TestPatientLockWaitsAfterAnOutage(t *testing.T) {
	const wait = 6 * time.Second
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	newLock := func(identity, holder string) (*fakeLock, *patientLock) {
		f := &fakeLock{identity: identity}
		f.set(holder)
		return f, &patientLock{Interface: f, wait: wait, now: clock}
	}
	ctx := t.Context()
	get := func(l *patientLock) {
		_, _, _ = l.Get(ctx)
	}

	t.Run("after an outage, a full lease duration of answers", func(t *testing.T) {
		f, l := newLock("hub-b", "hub-a")
		get(l) // hub-b sees hub-a's Lease
		now = now.Add(wait)
		f.outage(true) // etcd loses quorum
		get(l)
		now = now.Add(time.Minute)
		f.outage(false) // back: the record is the one seen a minute ago
		get(l)
		err := l.Update(ctx, f.takeover())
		require.Error(t, err, "client-go would take it now: it last saw the record change a minute ago")
		assert.Contains(t, err.Error(), `held by "hub-a"`)
		assert.Contains(t, err.Error(), "unchanged for 6s")
		assert.Equal(t, "hub-a", f.holder())
		now = now.Add(wait - time.Millisecond)
		get(l)
		require.Error(t, l.Update(ctx, f.takeover()))
		now = now.Add(time.Millisecond)
		get(l)
		require.NoError(t, l.Update(ctx, f.takeover()), "a lease duration of answers with the Lease unchanged")
		assert.Equal(t, "hub-b", f.holder())
	})

	t.Run("the holder renews in the meantime: the wait starts again", func(t *testing.T) {
		f, l := newLock("hub-b", "hub-a")
		get(l)
		now = now.Add(wait - time.Second)
		f.renew(now) // hub-a, back from degraded mode, renews
		get(l)
		now = now.Add(wait - time.Second)
		require.Error(t, l.Update(ctx, f.takeover()))
	})

	t.Run("no outage: as client-go, a lease duration after the last change", func(t *testing.T) {
		f, l := newLock("hub-b", "hub-a")
		get(l)
		now = now.Add(wait)
		get(l)
		require.NoError(t, l.Update(ctx, f.takeover()))
	})

	t.Run("its own renewal, a release, an unheld Lease", func(t *testing.T) {
		f, l := newLock("hub-a", "hub-a")
		f.outage(true)
		get(l)
		f.outage(false)
		require.NoError(t, l.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "hub-a"}), "the holder renews at once")
		assert.Equal(t, now, l.renewed())
		require.NoError(t, l.Update(ctx, resourcelock.LeaderElectionRecord{}), "a release")

		f, l = newLock("hub-b", "")
		get(l)
		require.NoError(t, l.Update(ctx, f.takeover()), "nobody holds it")
		require.NoError(t, l.Create(ctx, f.takeover()))
	})
}
