package quorum

import "testing"

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
