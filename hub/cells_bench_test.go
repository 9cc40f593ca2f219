package hub

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// BenchmarkCells200 is a hub in a management cluster at 200 workload clusters: 200 hubs of three
// machines side by side in one process, one per cell, each with its pool of fresh reports (a
// testPool: no memberlist), its bbolt journal and its registry, every one passing every 200 ms as
// the shipped hub does. One op is a round: every hub has passed once more. It reports the heap each
// hub holds (after a collection, over the hubs), the CPU its passes take (the process's user and
// system time, per hub and second) and the slowest round. Management mode's goals: 2 MiB a cluster.
// go test -run '^$' -bench Cells -benchtime 20x ./hub
func BenchmarkCells200(b *testing.B) { benchCells(b, 200) }

// BenchmarkCells1000 is BenchmarkCells200 at 1,000 workload clusters.
func BenchmarkCells1000(b *testing.B) { benchCells(b, 1000) }

func benchCells(b *testing.B, n int) {
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	dir := b.TempDir()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	passes := make([]atomic.Uint64, n)
	done := make(chan error, n)
	for i := range n {
		pool := newTestPool(3)
		inv := pass.Inventory{Cluster: fmt.Sprintf("cluster-%d", i), Policy: testPolicy()}
		for _, m := range pool.nodes {
			inv.Machines = append(inv.Machines, pass.Machine{MachineRef: m, Strategy: quorum.Reboot, Pool: "control-plane"})
		}
		j, err := boltfile.Open(filepath.Join(dir, fmt.Sprintf("journal-%d.db", i)), 0)
		if err != nil {
			b.Fatal(err)
		}
		defer j.Close()
		h, err := New(Config{Inventory: inv, Gossip: pool, Journal: j, Marks: j, Recoveries: j, Episodes: j, Metrics: prometheus.NewRegistry(),
			BMCCheckInterval: -1, AfterPass: func(p uint64) { passes[i].Store(p) }})
		if err != nil {
			b.Fatal(err)
		}
		go func() { done <- h.Run(ctx) }()
	}
	// round waits until every hub has passed since the last round.
	seen := make([]uint64, n)
	round := func() time.Duration {
		start := time.Now()
		for i := range n {
			for passes[i].Load() <= seen[i] {
				time.Sleep(5 * time.Millisecond)
			}
			seen[i] = passes[i].Load()
		}
		return time.Since(start)
	}
	round()
	round() // every hub past its first pass (which says every verdict once)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	cpu0, wall0 := cpuTime(), time.Now()
	var slowest time.Duration
	b.ResetTimer()
	for b.Loop() {
		slowest = max(slowest, round())
	}
	cpu, wall := cpuTime()-cpu0, time.Since(wall0)
	cancel()
	for range n {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(n)/1024, "heap-KiB/cell")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(n)/wall.Seconds(), "cpu-ms/cell-s")
	b.ReportMetric(float64(slowest.Milliseconds()), "slowest-round-ms")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
