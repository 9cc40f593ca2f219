package gossipmux_test

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/health/gossipmux"
)

// The gossip side of a management hub's cells (docs/sizing.md), not in test/run (minutes; a figure,
// not a target): n pools on one port, each a cell's hub member with its cluster's three agents (real
// memberlist members on ports of their own, in this process). Reported: the hub side's heap per pool
// (measured before the agents start), how long a pool's hub takes to hear an agent's new report
// (p50, p99, worst; every pool's agent publishes once a round), and the CPU of the whole process per
// pool-second between reports (agents included: an upper bound for the hub's share).
//
//	go test -run '^$' -bench Pools -benchtime 20x ./health/gossipmux
func BenchmarkPools200(b *testing.B) { benchPools(b, 200) }

// BenchmarkPools1 and BenchmarkPools50 are the baselines: one cluster, and as many as this process
// holds, with its agents, without running out of cores (200 clusters' 600 agents take both of a
// 2-core machine's, and their hearing waits for the CPU, not for the hub).
func BenchmarkPools1(b *testing.B)  { benchPools(b, 1) }
func BenchmarkPools50(b *testing.B) { benchPools(b, 50) }

func benchPools(b *testing.B, n int) {
	base, err := health.NewTransport("127.0.0.1", 0, nil)
	if err != nil {
		b.Fatal(err)
	}
	mux := gossipmux.New(base, nil)
	defer func() { _ = mux.Shutdown() }()
	start := func(node, cluster, role string, key []byte, pool *gossipmux.Pool) *health.Gossip {
		cfg := health.GossipConfig{Node: node, Cluster: cluster, Role: role, BindAddr: "127.0.0.1", Keys: [][]byte{key},
			Timing: health.DefaultTiming(), Logger: slog.New(slog.DiscardHandler)}
		if pool != nil {
			cfg.Transport = pool
		}
		g, err := health.StartGossip(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = g.Shutdown() })
		return g
	}
	runtime.GC()
	var before, afterPools runtime.MemStats
	runtime.ReadMemStats(&before)
	hubs := make([]*health.Gossip, n)
	keys := make([][]byte, n)
	for i := range n {
		keys[i] = fmt.Appendf(nil, "%032d", i)
		pool, err := mux.Pool(fmt.Sprintf("fleet/w%d", i))
		if err != nil {
			b.Fatal(err)
		}
		hubs[i] = start("management-hub", fmt.Sprintf("fleet/w%d", i), "hub", keys[i], pool)
	}
	runtime.GC()
	runtime.ReadMemStats(&afterPools)
	port := fmt.Sprintf("127.0.0.1:%d", base.Port())
	agents := make([][]*health.Gossip, n)
	for i := range n {
		for j := range 3 {
			g := start(fmt.Sprintf("cp-%d", j), fmt.Sprintf("fleet/w%d", i), "agent", keys[i], nil)
			if _, err := g.Join([]string{port}); err != nil {
				b.Fatal(err)
			}
			agents[i] = append(agents[i], g)
		}
	}
	// round has one agent of every pool publish a new report and returns how long each pool's hub
	// took to hear it.
	// Each look at every pool's hub takes CPU from the gossip it measures: 200 pools looked at every
	// millisecond lost packets at the shared port (the pools starved); every 5 ms, none.
	poll := time.Duration(max(1, n/40)) * time.Millisecond
	var turn int
	round := func() []time.Duration {
		turn++
		sent := make([]time.Time, n)
		want := make([]uint64, n)
		for i := range n {
			g := agents[i][turn%3]
			if err := g.Publish(health.Report{}); err != nil {
				b.Fatal(err)
			}
			sent[i], want[i] = time.Now(), g.Reports()[fmt.Sprintf("cp-%d", turn%3)].Version
		}
		took := make([]time.Duration, n)
		left := n
		for deadline := time.Now().Add(30 * time.Second); left > 0; time.Sleep(poll) {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d pools did not hear their agent's report in 30 s", left, n)
			}
			for i := range n {
				if took[i] == 0 && hubs[i].Reports()[fmt.Sprintf("cp-%d", turn%3)].Version >= want[i] {
					took[i], left = time.Since(sent[i]), left-1
				}
			}
		}
		return took
	}
	round()
	// The gossip's own cost, between reports: probes, acks and push/pull, for 5 s.
	cpu0, wall0 := cpuTime(), time.Now()
	time.Sleep(5 * time.Second)
	cpu, wall := cpuTime()-cpu0, time.Since(wall0)
	var all []time.Duration
	dropped0, rcvbuf0 := muxDropped(mux), udpReceiveErrors()
	b.ResetTimer()
	for b.Loop() {
		all = append(all, round()...)
	}
	dropped, rcvbuf := muxDropped(mux)-dropped0, udpReceiveErrors()-rcvbuf0
	slices.Sort(all)
	at := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))].Microseconds()) / 1000 }
	b.ReportMetric(max(0, float64(afterPools.HeapInuse)-float64(before.HeapInuse))/float64(n)/1024, "hub-heap-KiB/pool")
	b.ReportMetric(at(0.5), "hear-p50-ms")
	b.ReportMetric(at(0.99), "hear-p99-ms")
	b.ReportMetric(at(1), "hear-max-ms")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(n)/wall.Seconds(), "cpu-ms/pool-s")
	// A report lost on the way is heard at the next push/pull (every 5 s): where they were lost.
	b.ReportMetric(float64(dropped), "mux-dropped")
	b.Logf("dropped by the mux: %v", mux.Dropped())
	b.ReportMetric(float64(rcvbuf), "udp-rcvbuf-errors")
}

// muxDropped counts what the mux dropped so far, every reason.
func muxDropped(m *gossipmux.Mux) uint64 {
	var n uint64
	for _, v := range m.Dropped() {
		n += v
	}
	return n
}

// udpReceiveErrors is the kernel's count of UDP datagrams dropped for a full receive buffer (every
// socket: the agents' too), from /proc/net/snmp.
func udpReceiveErrors() uint64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	var header []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if header == nil {
			header = f
			continue
		}
		for i, name := range header {
			if name == "RcvbufErrors" && i < len(f) {
				n, _ := strconv.ParseUint(f[i], 10, 64)
				return n
			}
		}
	}
	return 0
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
