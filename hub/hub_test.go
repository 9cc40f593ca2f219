package hub

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/etcdcluster"
)

var gossipKey = []byte("0123456789abcdef0123456789abcdef")

// testbed is the demo topology on real components: a 3-member embedded etcd, one agent per machine
// (real probes, real gossip), a simulated Redfish BMC whose power starts and stops that machine's etcd
// member and agent, and a hub.
type testbed struct {
	t      *testing.T
	etcd   *etcdcluster.Cluster
	sim    *bmcsim.Server
	seed   string // gossip address to join
	mu     sync.Mutex
	agents map[int]context.CancelFunc
	gossip map[int]*health.Gossip
	ports  map[int]int // each machine's gossip port: a rebooted machine comes back on the same one
	hub    *Hub
	logs   *capture.Buffer
}

func newTestbed(t *testing.T) *testbed {
	t.Helper()
	tb := &testbed{t: t, etcd: etcdcluster.Start(t, 3), agents: map[int]context.CancelFunc{}, gossip: map[int]*health.Gossip{},
		ports: map[int]int{}, logs: &capture.Buffer{}}
	var systems []bmcsim.SystemConfig
	for i := range 3 {
		systems = append(systems, bmcsim.SystemConfig{ID: fmt.Sprintf("cp-%d", i), ShutdownDelay: 50 * time.Millisecond,
			CycleOffDuration: 100 * time.Millisecond})
	}
	sim, err := bmcsim.Start(bmcsim.Config{Username: "admin", Password: "pw", PlainHTTP: true, Systems: systems,
		OnPower: func(id string, running bool) {
			var i int
			_, _ = fmt.Sscanf(id, "cp-%d", &i)
			if running {
				go tb.powerOn(i)
			} else {
				tb.powerOff(i)
			}
		}})
	require.NoError(t, err)
	tb.sim = sim
	t.Cleanup(func() { _ = sim.Close() })
	for i := range 3 {
		tb.startAgent(i)
	}
	return tb
}

func (tb *testbed) startAgent(i int) {
	t := tb.t
	name := fmt.Sprintf("cp-%d", i)
	var ag *health.Agent
	poke := func() {
		if ag != nil {
			ag.Poke()
		}
	}
	tb.mu.Lock()
	port := tb.ports[i]
	tb.mu.Unlock()
	g, err := health.StartGossip(health.GossipConfig{Node: name, Cluster: "testbed", Role: "agent", BindAddr: "127.0.0.1", BindPort: port,
		Keys: [][]byte{gossipKey}, OnPeerChange: poke})
	require.NoError(t, err)
	_, portText, _ := strings.Cut(g.Addr(), "127.0.0.1:")
	_, _ = fmt.Sscan(portText, &port)
	etcd, err := health.NewEtcd(health.EtcdConfig{Endpoint: tb.etcd.Endpoints()[i]})
	require.NoError(t, err)
	r, err := health.NewRunner([]health.ProbeSpec{{Probe: etcd.Probe(), Interval: 200 * time.Millisecond, Timeout: 150 * time.Millisecond}}, nil, poke)
	require.NoError(t, err)
	ag = health.NewAgent(g, r, etcd, 250*time.Millisecond, nil)
	tb.mu.Lock()
	if tb.seed == "" {
		tb.seed = g.Addr()
	} else if _, err := g.Join([]string{tb.seed}); err != nil {
		// The seed may be the machine that is down: join anyone alive.
		for _, other := range tb.gossip {
			if _, err = g.Join([]string{other.Addr()}); err == nil {
				break
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb.agents[i], tb.gossip[i], tb.ports[i] = cancel, g, port
	tb.mu.Unlock()
	go func() { _ = ag.Run(ctx, time.Second); _ = etcd.Close() }()
	t.Cleanup(func() { cancel(); _ = g.Shutdown() })
}

// hang makes machine i stop answering: its agent and its etcd member die, its power stays on.
func (tb *testbed) hang(i int) {
	tb.powerOff(i)
}

func (tb *testbed) powerOff(i int) {
	tb.mu.Lock()
	cancel, g := tb.agents[i], tb.gossip[i]
	delete(tb.agents, i)
	delete(tb.gossip, i)
	tb.mu.Unlock()
	if g != nil {
		_ = g.Shutdown() // a dead machine says no goodbye
		cancel()
	}
	tb.etcd.Stop(i)
}

func (tb *testbed) powerOn(i int) {
	if err := tb.etcd.Restart(i); err != nil {
		tb.t.Logf("restarting etcd member %d: %v", i, err)
	}
	tb.startAgent(i)
}

func (tb *testbed) startHub(ctx context.Context, journal string) {
	t := tb.t
	g, err := health.StartGossip(health.GossipConfig{Node: "hub", Cluster: "testbed", Role: "hub", BindAddr: "127.0.0.1", Keys: [][]byte{gossipKey}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Shutdown() })
	_, err = g.Join([]string{tb.seed})
	require.NoError(t, err)
	j, err := OpenJournal(journal, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	inv := Inventory{Cluster: "testbed", Policy: Policy{Quorum: quorum.DefaultPolicy(), Assess: DefaultAssessPolicy(), RateMax: 10,
		RatePer: time.Minute, Cooldown: time.Second, MaxAttempts: 3}}
	inv.Policy.Assess.EtcdUnreachableTimeout = time.Second
	for i := range 3 {
		ep, err := bmc.ParseEndpoint(fmt.Sprintf("%s/systems/cp-%d", tb.sim.Endpoint(), i))
		require.NoError(t, err)
		inv.Machines = append(inv.Machines, Machine{MachineRef: MachineRef{Name: fmt.Sprintf("m%d", i), Node: fmt.Sprintf("cp-%d", i),
			Member: fmt.Sprintf("etcd-%d", i)}, Class: "cp", Strategy: quorum.Reboot, Pool: "cp", Endpoint: ep,
			Credentials: bmc.NewCredentials("admin", "pw")})
	}
	log := slog.New(slog.NewTextHandler(tb.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h, err := New(Config{Inventory: inv, Gossip: g, Journal: j, Log: log, Tick: 100 * time.Millisecond, RecoveryTimeout: 30 * time.Second,
		PowerFor: func(m Machine) (Power, error) {
			return bmc.New(m.Endpoint, m.Credentials, bmc.Options{PollInterval: 20 * time.Millisecond, VerifyTimeout: 10 * time.Second,
				GracefulTimeout: 2 * time.Second, Logger: log})
		}})
	require.NoError(t, err)
	tb.hub = h
	go func() { _ = h.Run(ctx) }()
}

func (tb *testbed) waitHealthy(timeout time.Duration, machines ...string) {
	tb.t.Helper()
	tb.waitFor(timeout, func() bool {
		for _, m := range machines {
			if a, ok := tb.hub.Assessment(m); !ok || a.Verdict != Healthy || a.EtcdHealth != quorum.Healthy {
				return false
			}
		}
		return true
	})
}

// waitFor polls cond; on timeout it fails with the hub's events and the journal as they are then.
func (tb *testbed) waitFor(timeout time.Duration, cond func() bool) {
	tb.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			var journal []string
			for _, m := range []string{"m0", "m1", "m2"} {
				h, _ := tb.hub.cfg.Journal.History(m)
				for _, r := range h {
					journal = append(journal, fmt.Sprintf("%s %s", r.ID, r.State))
					for _, ev := range r.History {
						journal = append(journal, fmt.Sprintf("  %s step %d %s: %s", ev.At.Format("15:04:05.000"), ev.Step, ev.Kind, ev.Detail))
					}
				}
			}
			tb.t.Fatalf("timed out after %v\nevents:\n%s\njournal:\n%s", timeout, strings.Join(tb.hub.Events(), "\n"), strings.Join(journal, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Scenario 1 of the demo: one machine hangs → detected → power-cycled → rejoins.
func TestHubHealsAHungMachine(t *testing.T) {
	tb := newTestbed(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tb.startHub(ctx, filepath.Join(t.TempDir(), "journal.db"))
	tb.waitHealthy(20*time.Second, "m0", "m1", "m2")

	hung := time.Now()
	tb.hang(2)
	tb.waitFor(60*time.Second, func() bool {
		h, err := tb.hub.cfg.Journal.History("m2")
		return err == nil && len(h) == 1 && h[0].State == Succeeded
	})
	t.Logf("hung → healed in %v; events:\n%s", time.Since(hung).Round(time.Millisecond), strings.Join(tb.hub.Events(), "\n"))
	assert.Equal(t, []string{"GracefulRestart"}, tb.sim.Resets("cp-2"), "one power action")
	assert.Empty(t, tb.sim.Resets("cp-0"))
	assert.Empty(t, tb.sim.Resets("cp-1"))
	tb.waitHealthy(20*time.Second, "m2")
	assert.True(t, tb.etcd.Running(2))
}

// Scenario 2 of the demo: two of three machines hang, quorum is lost; both dead members are
// power-cycled at once (free: neither is a healthy voter) and quorum comes back. The survivor, whose
// etcd probe fails while quorum is lost, is not rebooted: its probe recovers before its timeout.
func TestHubRestoresALostQuorum(t *testing.T) {
	tb := newTestbed(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tb.startHub(ctx, filepath.Join(t.TempDir(), "journal.db"))
	tb.waitHealthy(20*time.Second, "m0", "m1", "m2")

	lost := time.Now()
	go tb.hang(1)
	tb.hang(2)
	tb.waitFor(60*time.Second, func() bool {
		for _, m := range []string{"m1", "m2"} {
			h, err := tb.hub.cfg.Journal.History(m)
			if err != nil || len(h) != 1 || h[0].State != Succeeded {
				return false
			}
		}
		return true
	})
	tb.waitHealthy(30*time.Second, "m0", "m1", "m2")
	t.Logf("quorum lost → restored in %v; events:\n%s", time.Since(lost).Round(time.Millisecond), strings.Join(tb.hub.Events(), "\n"))
	assert.Len(t, tb.sim.Resets("cp-1"), 1)
	assert.Len(t, tb.sim.Resets("cp-2"), 1)
	assert.Empty(t, tb.sim.Resets("cp-0"), "the survivor is never power-cycled")
	h, err := tb.hub.cfg.Journal.History("m0")
	require.NoError(t, err)
	assert.Empty(t, h)
}

func (tb *testbed) succeeded(machine string, n int) func() bool {
	return func() bool {
		h, err := tb.hub.cfg.Journal.History(machine)
		if err != nil || len(h) < n {
			return false
		}
		return h[n-1].State == Succeeded
	}
}

func hasEvent(h *Hub, substr string) bool {
	for _, e := range h.Events() {
		if strings.Contains(e, substr) {
			return true
		}
	}
	return false
}

// Suspend, detach and pause: no BMC call while they hold, the would-do is said, and healing resumes
// when they are lifted. Then a pause during a remediation is Pausing until its BMC step is done, then
// Paused (scenario 4 of the demo).
func TestHubOperatorBrakes(t *testing.T) {
	tb := newTestbed(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tb.startHub(ctx, filepath.Join(t.TempDir(), "journal.db"))
	tb.waitHealthy(20*time.Second, "m0", "m1", "m2")
	h := tb.hub

	// Suspended: everything computed, nothing executed.
	h.SetSuspended(true)
	tb.hang(2)
	tb.waitFor(10*time.Second, func() bool { return hasEvent(h, "suspended: would start reboot of m2") })
	time.Sleep(time.Second)
	assert.Empty(t, tb.sim.Resets("cp-2"), "suspended: no BMC call")
	h.SetSuspended(false)
	tb.waitFor(30*time.Second, tb.succeeded("m2", 1))
	tb.waitHealthy(20*time.Second, "m0", "m1", "m2")

	// Detached: no action for that machine.
	require.NoError(t, h.SetDetached("m1", true))
	require.ErrorContains(t, h.SetDetached("m9", true), `no machine "m9" in the inventory`)
	tb.hang(1)
	tb.waitFor(10*time.Second, func() bool { a, _ := h.Assessment("m1"); return a.Verdict == Unhealthy })
	time.Sleep(time.Second)
	assert.Empty(t, tb.sim.Resets("cp-1"), "detached: no BMC call")
	require.NoError(t, h.SetDetached("m1", false))
	tb.waitFor(30*time.Second, tb.succeeded("m1", 1))
	tb.waitHealthy(20*time.Second, "m0", "m1", "m2")

	// Paused with nothing in flight: acknowledged at once; no new step starts.
	h.SetPaused(true)
	assert.Equal(t, Paused, h.PauseState())
	time.Sleep(1100 * time.Millisecond) // past m2's cooldown
	tb.hang(2)
	tb.waitFor(10*time.Second, func() bool { a, _ := h.Assessment("m2"); return a.Verdict == Unhealthy })
	time.Sleep(time.Second)
	assert.Len(t, tb.sim.Resets("cp-2"), 1, "paused: no new BMC call")
	h.SetPaused(false)
	tb.waitFor(30*time.Second, tb.succeeded("m2", 2))
	tb.waitHealthy(20*time.Second, "m0", "m1", "m2")

	// Paused while a remediation is inside its BMC step (a slow BMC): Pausing until the step's outcome
	// is written, then Paused, with the remediation waiting for the machine to come back.
	tb.sim.SetFaults(bmcsim.Faults{Latency: 150 * time.Millisecond})
	time.Sleep(1100 * time.Millisecond) // past m2's cooldown
	tb.hang(2)
	tb.waitFor(10*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		r := h.running["m2"]
		return r != nil && r.busy
	})
	h.SetPaused(true)
	assert.Equal(t, Pausing, h.PauseState(), "a BMC step is in progress")
	tb.waitFor(20*time.Second, func() bool { return h.PauseState() == Paused })
	tb.sim.SetFaults(bmcsim.Faults{})
	h.SetPaused(false)
	tb.waitFor(30*time.Second, tb.succeeded("m2", 3))
	assert.Len(t, tb.sim.Resets("cp-2"), 3)
}
