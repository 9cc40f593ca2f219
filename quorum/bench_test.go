package quorum

import (
	"fmt"
	"testing"
	"time"
)

// benchInput builds a fleet of n machines: 7 etcd voters (one dead, one sick node with a healthy
// member) and n−7 machines that are not etcd members, in 10 pools, 3 % unhealthy and 1 % in flight.
func benchInput(n int) Input {
	c := cluster("HHHHHHD")
	ms := make([]Machine, 0, n)
	for i, m := range c.Members {
		ms = append(ms, Machine{Name: fmt.Sprintf("cp-%d", i), Member: m.Name, Unhealthy: i >= 5, Since: t0, Strategy: Reboot})
	}
	for i := 7; i < n; i++ {
		ms = append(ms, Machine{Name: fmt.Sprintf("w-%05d", i), Pool: fmt.Sprintf("pool-%d", i%10),
			Unhealthy: i%33 == 0, InFlight: i%100 == 0, Since: t0.Add(time.Duration(i%17) * time.Second), Strategy: Reboot})
	}
	return Input{Cluster: c, Machines: ms, Policy: DefaultPolicy()}
}

// BenchmarkPlanPass is one planning pass over a fleet. Target: ≤ 50 ms per pass at 5,000 machines.
// The sizes show how it grows (linear in machines, n log n only in the few candidates it sorts).
func BenchmarkPlanPass(b *testing.B) {
	for _, n := range []int{500, 5000, 50000} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			in := benchInput(n)
			b.ReportAllocs()
			started := 0
			for b.Loop() {
				out, err := PlanPass(in)
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

// BenchmarkPlanReplace plans one learner-first replace in a 7-member cluster.
func BenchmarkPlanReplace(b *testing.B) {
	c := cluster("HHHHHHD")
	p := DefaultPolicy()
	opts := ReplaceOptions{NewMember: "etcd-new"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.PlanReplace(p, "etcd-7", opts); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlanPassInFlight is one pass over a 7-member cluster at its busiest: a replace in flight
// (scale up first, learner joined), three dead members being rebooted, and the last dead member a
// candidate whose reboot is checked in every order with the four remediations in flight: 5 × 3³ × 3
// states.
func BenchmarkPlanPassInFlight(b *testing.B) {
	c := cluster("HHHDDDDL")
	c.Members[7].Name = "etcd-new"
	ms := []Machine{{Name: "cp-1", Member: "etcd-1", Unhealthy: true, InFlight: true, Strategy: Replace,
		Replace: ReplaceOptions{NewMember: "etcd-new", Orders: []Order{ScaleUpFirst}}}}
	for i := 4; i <= 7; i++ {
		ms = append(ms, etcdMachine(i, true, i, Reboot))
		ms[len(ms)-1].InFlight = i < 7
	}
	in := Input{Cluster: c, Machines: ms, Policy: DefaultPolicy()}
	b.ReportAllocs()
	for b.Loop() {
		out, err := PlanPass(in)
		if err != nil {
			b.Fatal(err)
		}
		if len(out.Started()) != 1 {
			b.Fatalf("want cp-7's reboot started, got %+v", out.Decisions)
		}
	}
}
