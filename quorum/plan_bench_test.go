package quorum_test

import (
	"fmt"
	"testing"

	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/quorum/quorumtest"
)

// BenchmarkPlanPass is one planning pass over a fleet. Target: ≤ 50 ms per pass at 5,000 machines.
// The sizes show how it grows (linear in machines, n log n only in the few candidates it sorts).
func BenchmarkPlanPass(b *testing.B) {
	for _, n := range []int{500, 5000, 50000} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			in := quorumtest.Fleet(n)
			b.ReportAllocs()
			started := 0
			for b.Loop() {
				out, err := quorum.PlanPass(in)
				if err != nil {
					b.Fatal(err)
				}
				started = len(out.Started())
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/machine")
			if started == 0 {
				b.Fatal("nothing started: the fleet is not what the benchmark means to measure")
			}
		})
	}
}
