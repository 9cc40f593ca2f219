package health

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/etcdcluster"
)

type testAgent struct {
	agent  *Agent
	cancel context.CancelFunc
	done   chan error
}

// startAgents runs n agents over 127.0.0.1, agent i reading etcd member i mod 3, each with the etcd
// probe, reporting every 250 ms.
func startAgents(t *testing.T, c *etcdcluster.Cluster, n int) []*testAgent {
	t.Helper()
	eps := c.Endpoints()
	var out []*testAgent
	for i := range n {
		var ag *Agent
		poke := func() {
			if ag != nil {
				ag.Poke()
			}
		}
		g, _ := startMember(t, fmt.Sprintf("cp-%d", i), func(gc *GossipConfig) { gc.OnPeerChange = poke })
		etcd := localEtcd(t, eps[i%len(eps)])
		r, err := NewRunner([]ProbeSpec{{Probe: etcd.Probe(), Interval: 200 * time.Millisecond, Timeout: 150 * time.Millisecond}}, nil, poke)
		require.NoError(t, err)
		ag = NewAgent(g, r, etcd, 250*time.Millisecond, nil)
		if i > 0 {
			_, err := g.Join([]string{out[0].agent.Gossip().Addr()})
			require.NoError(t, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ta := &testAgent{agent: ag, cancel: cancel, done: make(chan error, 1)}
		go func() { ta.done <- ag.Run(ctx, 5*time.Second) }() // the agent's own leave timeout
		t.Cleanup(func() { ta.cancel(); <-ta.done })
		out = append(out, ta)
	}
	return out
}

// everyReport checks cond on every agent's latest report of every agent (itself included).
func everyReport(agents []*testAgent, names []string, cond func(observer string, r Report) bool) bool {
	for _, a := range agents {
		reports := a.agent.Gossip().Reports()
		for _, name := range names {
			r, ok := reports[name]
			if !ok || !cond(a.agent.Gossip().cfg.Node, r) {
				return false
			}
		}
	}
	return true
}

func TestAgentsOnRealEtcd(t *testing.T) {
	t.Parallel() // a long wait (TestGossipLossyLink says why)
	c := etcdcluster.Start(t, 3)
	agents := startAgents(t, c, 5)
	all := []string{"cp-0", "cp-1", "cp-2", "cp-3", "cp-4"}

	// Every agent has every agent's report, and every report shows the same 3-member membership.
	require.Eventually(t, func() bool {
		return everyReport(agents, all, func(_ string, r Report) bool {
			return r.Etcd != nil && len(r.Etcd.Members) == 3 && r.Etcd.Error == "" && len(r.Probes) == 1 && r.Probes[0].OK
		})
	}, 10*time.Second, 50*time.Millisecond)
	reports := agents[4].agent.Gossip().Reports()
	want := memberIDs(*reports["cp-0"].Etcd)
	for _, name := range all {
		assert.Equal(t, want, memberIDs(*reports[name].Etcd), name)
	}
	assert.Equal(t, "etcd-1", reports["cp-1"].Etcd.LocalName)
	// The agents beside the members are at the members' peer hosts (here all 127.0.0.1), at the
	// gossip port asked, and never at this agent's own address.
	assert.Equal(t, []string{"127.0.0.1:7946"}, agents[0].agent.MemberPeers(7946, ""))
	assert.Empty(t, agents[0].agent.MemberPeers(7946, "127.0.0.1:7946"))

	// One etcd member stops: within the target every agent's own view shows it unreachable, and the
	// agents on its node report their etcd probe failing.
	stopped := time.Now()
	c.Stop(2)
	require.Eventually(t, func() bool {
		return everyReport(agents, all, func(_ string, r Report) bool {
			if r.Etcd == nil || r.SentAt.Before(stopped) {
				return false
			}
			onNode := r.Node == "cp-2" // reads the stopped member itself
			for _, m := range r.Etcd.Members {
				if m.Name == "etcd-2" && !onNode && (m.Reachable == nil || *m.Reachable) {
					return false
				}
			}
			return !onNode || !r.Probes[0].OK
		})
	}, 5*time.Second, 20*time.Millisecond)
	t.Logf("stopped etcd member seen by every agent after %v", time.Since(stopped).Round(time.Millisecond))

	// One agent is killed (no goodbye): every survivor declares it dead within the target.
	killed := time.Now()
	require.NoError(t, agents[3].agent.Gossip().Shutdown())
	for _, a := range []*testAgent{agents[0], agents[1], agents[2], agents[4]} {
		require.Eventually(t, func() bool { return stateOf(a.agent.Gossip(), "cp-3") == PeerDead }, 5*time.Second, 10*time.Millisecond)
		pv, _ := peerView(a.agent.Gossip(), "cp-3")
		assert.Less(t, pv.Since.Sub(killed), 2*time.Second, "detection on a busy test machine; the benchmark measures it")
	}
	// ... and the survivors' next reports say so (corroboration for the hub).
	require.Eventually(t, func() bool {
		r := agents[0].agent.Gossip().Reports()["cp-4"]
		for _, p := range r.Peers {
			if p.Name == "cp-3" {
				return p.State == PeerDead
			}
		}
		return false
	}, 3*time.Second, 20*time.Millisecond)

	// A graceful stop is seen as "left".
	agents[4].cancel()
	require.NoError(t, <-agents[4].done)
	agents[4].done <- nil // for the cleanup
	require.Eventually(t, func() bool { return stateOf(agents[0].agent.Gossip(), "cp-4") == PeerLeft }, 5*time.Second, 10*time.Millisecond)
}

// An agent reports a change of its etcd view at once, not at its next report: a member that stops or
// comes back is in every observer's report within about a second (viewEvery), which is what the hub
// needs to stop counting the observers' views from before a member restarted. Measured: the lag from
// a member's restart, after 10 s away (its connections failing all along), to the report that reaches
// it, from the agent on another member and from a witness outside the cluster.
func TestAViewThatChangesIsPublishedAtOnce(t *testing.T) {
	t.Parallel() // a long wait (TestGossipLossyLink says why)
	c := etcdcluster.Start(t, 3)
	eps := c.Endpoints()
	witnessEtcd, err := NewEtcdOutside(eps, TLSFiles{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = witnessEtcd.Close() })
	var agents []*Agent
	for i, etcd := range []*Etcd{localEtcd(t, eps[0]), witnessEtcd} {
		g, _ := startMember(t, fmt.Sprintf("obs-%d", i))
		r, err := NewRunner(nil, nil, nil)
		require.NoError(t, err)
		ag := NewAgent(g, r, etcd, time.Minute, nil) // reports every minute, unless something changes
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ag.Run(ctx, time.Second) }()
		t.Cleanup(func() { cancel(); <-done })
		agents = append(agents, ag)
	}
	reaches := func(ag *Agent, want bool, after time.Time) bool {
		r, ok := ag.Gossip().Reports()[ag.Gossip().cfg.Node]
		if !ok || r.Etcd == nil || r.SentAt.Before(after) {
			return false
		}
		for _, m := range r.Etcd.Members {
			if m.Name == "etcd-2" {
				return m.Reachable != nil && *m.Reachable == want
			}
		}
		return false
	}
	stopped := time.Now()
	c.Stop(2)
	for i, ag := range agents {
		require.Eventually(t, func() bool { return reaches(ag, false, stopped) }, 5*time.Second, 20*time.Millisecond, "observer %d", i)
	}
	// While a member is unreachable each observer reports every second (viewEvery), not every minute:
	// the hub knows its silence only as far as their reports tell it.
	before := make([]int, len(agents))
	for i, ag := range agents {
		before[i], _ = ag.Status()
	}
	time.Sleep(10 * time.Second)
	for i, ag := range agents {
		n, _ := ag.Status()
		assert.GreaterOrEqual(t, n-before[i], 5, "observer %d's reports in 10 s of a member unreachable", i)
	}
	require.NoError(t, c.Restart(2))
	back := time.Now()
	for i, ag := range agents {
		require.Eventually(t, func() bool { return reaches(ag, true, back) }, 5*time.Second, 20*time.Millisecond, "observer %d", i)
	}
	lag := time.Since(back).Round(10 * time.Millisecond)
	t.Logf("a member back after 10 s away: in every observer's report %v after it started (reports every minute otherwise)", lag)
	fmt.Printf("etcd member restart → every observer's report reaches it: %v\n", lag)
}
