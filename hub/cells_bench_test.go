package hub

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hale-dev/hale/hub/assess"
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
// After the rounds it times verdicts: one cell at a time (in turn), one of its machines dies (gone from
// its pool's gossip) and the time until that hub says it is Unhealthy is taken, then it comes back and
// is Healthy again before the next; the p50 and p99 of those times are reported. BenchmarkCells1 is the
// reference: the goal is a p99 at most 1.2 times one cell's.
// go test -run '^$' -bench Cells -benchtime 20x ./hub
func BenchmarkCells200(b *testing.B) { benchCells(b, 200) }

// BenchmarkCells1 is BenchmarkCells200 with one workload cluster: the reference for its verdicts.
func BenchmarkCells1(b *testing.B) { benchCells(b, 1) }

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
	pools, verdicts := make([]*testPool, n), make([]chan pass.Reason, n)
	for i := range n {
		pool := newTestPool(3)
		pools[i], verdicts[i] = pool, make(chan pass.Reason, 16)
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
			BMCCheckInterval: -1, AfterPass: func(p uint64) { passes[i].Store(p) }, Notify: func(no pass.Notice) {
				if no.Machine == "cp-1" {
					select {
					case verdicts[i] <- no.Reason:
					default:
					}
				}
			}})
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
	p50, p99 := verdictTimes(b, pools, verdicts, 60)
	cancel()
	for range n {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(n)/1024, "heap-KiB/cell")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(n)/wall.Seconds(), "cpu-ms/cell-s")
	b.ReportMetric(float64(slowest.Milliseconds()), "slowest-round-ms")
	b.ReportMetric(float64(p50.Microseconds())/1000, "verdict-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "verdict-p99-ms")
}

// verdictTimes kills cp-1 of one cell at a time, samples times in all (the cells in turn), and returns
// the p50 and p99 of the time from its death in its pool's view to its hub's Unhealthy verdict; each
// comes back, Healthy again, before the next, and dies at a random moment of its hub's 200 ms tick.
func verdictTimes(b *testing.B, pools []*testPool, verdicts []chan pass.Reason, samples int) (p50, p99 time.Duration) {
	await := func(i int, want pass.Reason) {
		for deadline := time.After(10 * time.Second); ; {
			select {
			case r := <-verdicts[i]:
				if r == want {
					return
				}
			case <-deadline:
				b.Fatalf("cell %d: cp-1 not %s within 10 s", i, want)
			}
		}
	}
	took := make([]time.Duration, 0, samples)
	for k := range samples {
		i, p := k%len(pools), pools[k%len(pools)]
		for len(verdicts[i]) > 0 {
			<-verdicts[i]
		}
		time.Sleep(rand.N(200 * time.Millisecond)) // anywhere in the cell's 200 ms between passes
		p.mu.Lock()
		p.dead["cp-1"] = true
		p.mu.Unlock()
		start := time.Now()
		await(i, pass.Reason(assess.VerdictUnhealthy))
		took = append(took, time.Since(start))
		p.mu.Lock()
		p.dead["cp-1"] = false
		p.mu.Unlock()
		await(i, pass.Reason(assess.VerdictHealthy))
	}
	slices.Sort(took)
	return took[len(took)/2], took[(len(took)*99-1)/100]
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
