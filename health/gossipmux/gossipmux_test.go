package gossipmux_test

import (
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/health/gossipmux"
)

// member starts a gossip member of cluster on its own port, or on pool when given.
func member(t *testing.T, node, cluster string, key []byte, pool memberlist.Transport) *health.Gossip {
	t.Helper()
	cfg := health.GossipConfig{Node: node, Cluster: cluster, Role: "agent", BindAddr: "127.0.0.1", Keys: [][]byte{key},
		Timing: health.DefaultTiming(), Logger: slog.New(slog.DiscardHandler)}
	if pool != nil {
		cfg.Role, cfg.Transport = "hub", pool
	}
	g, err := health.StartGossip(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Shutdown() })
	return g
}

func heard(g *health.Gossip) []string { return slices.Sorted(maps.Keys(g.Reports())) }

// sendUDP sends one packet to addr.
func sendUDP(t *testing.T, addr string, b []byte) {
	t.Helper()
	c, err := net.Dial("udp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(b)
	require.NoError(t, err)
}

// Two clusters' pools on one port of the hub, each with its own key: each cell's hub member hears
// its own cluster's agents and none of the other's; a cluster with no pool here cannot join; what
// carries no label is dropped; a pool that never reads loses its own packets and delays no other;
// a pool taken off the port frees its name and leaves the others running.
func TestPoolsShareOnePort(t *testing.T) {
	base, err := health.NewTransport("127.0.0.1", 0, nil)
	require.NoError(t, err)
	mux := gossipmux.New(base, nil)
	keys := map[string][]byte{"prod/a": []byte("0123456789abcdef0123456789abcdef"), "prod/b": []byte("fedcba9876543210fedcba9876543210")}
	hubs := map[string]*health.Gossip{}
	for _, cluster := range []string{"prod/a", "prod/b"} {
		pool, err := mux.Pool(cluster)
		require.NoError(t, err)
		hubs[cluster] = member(t, "hub-"+cluster[5:], cluster, keys[cluster], pool)
	}
	port := fmt.Sprintf("127.0.0.1:%d", base.Port())
	assert.Equal(t, port, hubs["prod/a"].Addr())
	assert.Equal(t, port, hubs["prod/b"].Addr(), "one port for both")
	_, err = mux.Pool("prod/a")
	assert.EqualError(t, err, `gossip pool "prod/a" is served on this port already: each cluster's pool needs a name of its own`)
	_, err = mux.Pool("")
	assert.Error(t, err)

	agents := map[string][]*health.Gossip{}
	for _, cluster := range []string{"prod/a", "prod/b"} {
		for i := range 2 {
			g := member(t, fmt.Sprintf("%s-cp-%d", cluster[5:], i), cluster, keys[cluster], nil)
			_, err := g.Join([]string{port})
			require.NoError(t, err)
			require.NoError(t, g.Publish(health.Report{}))
			agents[cluster] = append(agents[cluster], g)
		}
	}
	require.NoError(t, hubs["prod/a"].Publish(health.Report{}))
	require.NoError(t, hubs["prod/b"].Publish(health.Report{}))
	require.Eventually(t, func() bool {
		return slices.Equal(heard(hubs["prod/a"]), []string{"a-cp-0", "a-cp-1", "hub-a"}) &&
			slices.Equal(heard(hubs["prod/b"]), []string{"b-cp-0", "b-cp-1", "hub-b"}) &&
			slices.Equal(heard(agents["prod/a"][0]), []string{"a-cp-0", "a-cp-1", "hub-a"})
	}, 10*time.Second, 20*time.Millisecond, "a: %v, b: %v", heard(hubs["prod/a"]), heard(hubs["prod/b"]))

	stranger := member(t, "c-cp-0", "prod/c", keys["prod/a"], nil)
	_, err = stranger.Join([]string{port})
	assert.Error(t, err, "no pool is labelled prod/c here")
	sendUDP(t, port, []byte("no label"))
	require.Eventually(t, func() bool {
		d := mux.Dropped()
		return d[gossipmux.DropUnknown] > 0 && d[gossipmux.DropUnlabelled] > 0
	}, 5*time.Second, 10*time.Millisecond, "%v", mux.Dropped())

	// A pool whose memberlist never reads: its packets are dropped once its queue is full, and the
	// others go on (a's hub hears a's agent's next report at once).
	_, err = mux.Pool("prod/stuck")
	require.NoError(t, err)
	flood, _ := memberlist.AddLabelHeaderToPacket([]byte("noise"), "prod/stuck")
	for range 2000 {
		sendUDP(t, port, flood)
	}
	require.Eventually(t, func() bool { return mux.Dropped()[gossipmux.DropBusy] > 0 }, 5*time.Second, 10*time.Millisecond)
	sent := time.Now()
	require.NoError(t, agents["prod/a"][1].Publish(health.Report{Probes: []health.ProbeResult{{Name: "after-the-flood", OK: true}}}))
	require.Eventually(t, func() bool {
		r := hubs["prod/a"].Reports()["a-cp-1"]
		return len(r.Probes) == 1 && r.Probes[0].Name == "after-the-flood"
	}, 5*time.Second, 10*time.Millisecond)
	t.Logf("a's hub heard a's agent %v after the report, beside a stuck pool flooded with 2,000 packets", time.Since(sent).Round(time.Millisecond))

	// b's hub stops: its pool leaves the port, a's stays, and b's name can be served again.
	require.NoError(t, hubs["prod/b"].Shutdown())
	_, err = mux.Pool("prod/b")
	require.NoError(t, err)
	require.NoError(t, agents["prod/a"][0].Publish(health.Report{Probes: []health.ProbeResult{{Name: "after-b-left", OK: true}}}))
	require.Eventually(t, func() bool {
		r := hubs["prod/a"].Reports()["a-cp-0"]
		return len(r.Probes) == 1 && r.Probes[0].Name == "after-b-left"
	}, 5*time.Second, 10*time.Millisecond)

	require.NoError(t, hubs["prod/a"].Shutdown())
	done := make(chan error, 1)
	go func() { done <- mux.Shutdown() }()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the mux did not shut down")
	}
}
