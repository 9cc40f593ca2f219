package health

import (
	"context"
	"maps"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/hale-dev/hale/test/etcdcluster"
)

func localEtcd(t *testing.T, endpoint string) *Etcd {
	t.Helper()
	e, err := NewEtcd(EtcdConfig{Endpoint: endpoint})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func check(t *testing.T, p Probe, timeout time.Duration) (bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return p.Check(ctx)
}

// TestEtcdViewAndProbe reads membership and health from each member of a real 3-member cluster,
// then stops members one by one.
func TestEtcdViewAndProbe(t *testing.T) {
	t.Parallel() // a long wait (TestGossipLossyLink says why)
	c := etcdcluster.Start(t, 3)
	eps := c.Endpoints()
	e0, e2 := localEtcd(t, eps[0]), localEtcd(t, eps[2])
	ctx := context.Background()

	ok, detail := check(t, e0.Probe(), 2*time.Second)
	assert.True(t, ok, detail)
	assert.Contains(t, detail, "leader")

	v := e0.View(ctx)
	assert.Empty(t, v.Error)
	assert.Equal(t, "etcd-0", v.LocalName)
	require.Len(t, v.Members, 3)
	assert.NotEmpty(t, v.LeaderID)
	assert.Positive(t, v.RaftTerm)
	for i, m := range v.Members {
		assert.Equal(t, c.Name(i), m.Name)
		require.NotNil(t, m.Reachable)
		assert.True(t, *m.Reachable, m.Name)
		assert.False(t, m.Learner)
	}
	// Every member reports the same membership.
	v2 := e2.View(ctx)
	assert.Equal(t, "etcd-2", v2.LocalName)
	assert.Equal(t, memberIDs(v), memberIDs(v2))

	// A witness whose endpoints reach two hung members (their TCP connections stay open, nothing
	// answers: a frozen machine) and one live member reads the membership from the live one at every
	// view, within the agent's report interval.
	frozen := []*freezer{newFreezer(t, eps[0]), newFreezer(t, eps[1]), newFreezer(t, eps[2])}
	witness, err := NewEtcdOutside([]string{frozen[0].url(), frozen[1].url(), frozen[2].url()}, TLSFiles{})
	require.NoError(t, err)
	defer witness.Close()
	require.Len(t, witness.View(ctx).Members, 3) // every connection up, as before a hang
	frozen[0].freeze()
	frozen[2].freeze()
	for range 6 {
		vctx, cancel := context.WithTimeout(ctx, time.Second)
		wv := witness.View(vctx)
		cancel()
		assert.Len(t, wv.Members, 3, wv.Error)
	}
	frozen[0].thaw()
	frozen[2].thaw()

	// An alarm (raised here by hand, as etcd raises NOSPACE): the probe fails on it, and the view lists
	// it, from a member and from outside, without a raft request (it comes with Status).
	cli := e0.cli
	raise := func(action pb.AlarmRequest_AlarmAction) {
		_, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{Action: action, Alarm: pb.AlarmType_NOSPACE, MemberID: 1})
		require.NoError(t, err)
	}
	raise(pb.AlarmRequest_ACTIVATE)
	outside, err := NewEtcdOutside(eps, TLSFiles{})
	require.NoError(t, err)
	defer outside.Close()
	require.Eventually(t, func() bool { return len(e2.View(ctx).Alarms) == 1 }, 5*time.Second, 50*time.Millisecond)
	assert.Contains(t, e2.View(ctx).Alarms[0], "alarm:NOSPACE")
	assert.Equal(t, e2.View(ctx).Alarms, outside.View(ctx).Alarms)
	ok, detail = check(t, e0.Probe(), 2*time.Second)
	assert.False(t, ok)
	assert.Contains(t, detail, "alarm:NOSPACE")
	raise(pb.AlarmRequest_DEACTIVATE)
	require.Eventually(t, func() bool { ok, _ := check(t, e0.Probe(), time.Second); return ok }, 5*time.Second, 50*time.Millisecond)
	assert.Empty(t, e0.View(ctx).Alarms)

	// One member down: the others still have quorum and see it unreachable.
	c.Stop(2)
	ok, detail = check(t, e2.Probe(), time.Second)
	assert.False(t, ok)
	assert.Contains(t, detail, "status of "+eps[2])
	ok, detail = check(t, e0.Probe(), 2*time.Second)
	assert.True(t, ok, detail)
	v = e0.View(ctx)
	assert.False(t, *v.Members[2].Reachable)
	assert.True(t, *v.Members[1].Reachable)

	// Two down: quorum lost; the last one answers Status but cannot serve a linearizable read.
	c.Stop(1)
	ok, detail = check(t, e0.Probe(), 3*time.Second)
	assert.False(t, ok)
	assert.Contains(t, detail, "linearizable read")

	// Power restored: it heals.
	require.NoError(t, c.Restart(1))
	require.Eventually(t, func() bool { ok, _ := check(t, e0.Probe(), time.Second); return ok }, 15*time.Second, 100*time.Millisecond)

	// A member back after 10 s away is reachable again within about a second of answering (gRPC's own
	// reconnect backoff would be several seconds by then, two minutes at worst), over the connection
	// the view keeps to each other member: none is dialled afresh per view.
	kept := maps.Clone(e0.members)
	require.Len(t, kept, 2)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); { // the agent keeps looking meanwhile
		assert.False(t, *e0.View(ctx).Members[2].Reachable)
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, c.Restart(2))
	back := time.Now()
	require.Eventually(t, func() bool { return *e0.View(ctx).Members[2].Reachable }, 5*time.Second, 50*time.Millisecond)
	t.Logf("member 2 reachable again %v after it answered", time.Since(back).Round(10*time.Millisecond))
	assert.Equal(t, kept, e0.members)
}

// freezer forwards TCP to an etcd member until frozen: then its connections stay open and carry
// nothing either way, as a machine does when its processes are frozen.
type freezer struct {
	ln     net.Listener
	mu     sync.Mutex
	thawed *sync.Cond
	frozen bool
}

func newFreezer(t *testing.T, endpoint string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &freezer{ln: ln}
	f.thawed = sync.NewCond(&f.mu)
	t.Cleanup(func() { f.thaw(); _ = ln.Close() })
	target := strings.TrimPrefix(endpoint, "http://")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			m, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go f.pipe(c, m)
			go f.pipe(m, c)
		}
	}()
	return f
}

func (f *freezer) url() string { return "http://" + f.ln.Addr().String() }

func (f *freezer) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		f.mu.Lock()
		for f.frozen {
			f.thawed.Wait()
		}
		f.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) freeze() { f.mu.Lock(); f.frozen = true; f.mu.Unlock() }

func (f *freezer) thaw() { f.mu.Lock(); f.frozen = false; f.thawed.Broadcast(); f.mu.Unlock() }

func memberIDs(v EtcdView) []string {
	var out []string
	for _, m := range v.Members {
		out = append(out, m.ID)
	}
	return out
}
