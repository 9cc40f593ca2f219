package quorum

import (
	"testing"
)

// byteSource turns a fuzzer's bytes into small choices; past the end it answers 0.
type byteSource struct{ b []byte }

func (s *byteSource) IntN(n int) int {
	if len(s.b) == 0 || n <= 0 {
		return 0
	}
	v := int(s.b[0]) % n
	s.b = s.b[1:]
	return v
}

// FuzzPlanFor drives one request (cluster of 1..7 voters and 0..1 learner, any member states, any
// target, strategy, owner options and policy) through the package and the reference of model_test.go:
// a plan must keep the invariant at every step and be the first safe shape; a refusal must name a
// real violation.
func FuzzPlanFor(f *testing.F) {
	for _, seed := range [][]byte{
		{2, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0},    // 3 healthy voters, reboot one
		{2, 0, 1, 1, 7, 2, 0, 0, 0, 0, 1},    // 1 dead of 3, reboot it
		{4, 0, 1, 1, 1, 7, 7, 3, 2, 0, 1, 0}, // 2 dead of 5, replace a dead one
		{2, 1, 1, 1, 1, 7, 0, 2, 0, 0, 1, 1}, // a learner already present, replace
		{2, 0, 1, 7, 7, 1, 2, 3, 1, 0, 1, 0}, // quorum lost, replace
		{0, 0, 1, 0, 2, 3, 0, 0, 0, 0},       // a single voter
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &byteSource{b: data}
		voters, learners := 1+src.IntN(7), src.IntN(2)
		var states []refMember
		for _, h := range []Health{HealthUnknown, Healthy, Unhealthy} {
			for _, d := range []Disruption{NotDisrupted, InFlight, Fenced} {
				states = append(states, refMember{health: h, disruption: d})
			}
		}
		var ms refCluster
		for i := range voters + learners {
			ms.m[i] = states[src.IntN(len(states))]
			ms.m[i].name = string(rune('a' + i))
			ms.m[i].learner = i >= voters
			ms.n++
		}
		target := ms.m[src.IntN(ms.n)].name
		strategy := Strategy(1 + src.IntN(3))
		orders := [][]Order{{ScaleUpFirst, ScaleDownFirst}, {ScaleDownFirst, ScaleUpFirst}, {ScaleUpFirst}, {ScaleDownFirst}}[src.IntN(4)]
		join := Join(1 + src.IntN(2))
		p := Policy{MinFaultTolerance: src.IntN(3), MaxLearners: src.IntN(3)}
		c := modelCase{ms: ms, cl: Cluster{Members: make([]Member, ms.n)}, target: target, strategy: strategy}
		for i, m := range ms.list() {
			c.cl.Members[i] = Member{Name: m.name, Learner: m.learner, Health: m.health, Disruption: m.disruption}
		}
		if strategy == Replace {
			c.opts = ReplaceOptions{NewMember: "new", Orders: orders, Join: join}
		}
		c.shapes = refShapes(strategy, target, c.opts.NewMember, orders, join)
		var tally modelCounts
		if msg := checkCase(&c, p, &tally); msg != "" {
			t.Fatalf("%s %s on %v (policy %+v, options %+v): %s", strategy, target, ms, p, c.opts, msg)
		}
	})
}

// FuzzPlanPass drives whole planning passes built from the fuzzer's bytes and checks the pass-level
// invariants of planner_test.go and passmodel_test.go.
func FuzzPlanPass(f *testing.F) {
	f.Add([]byte{2, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0})
	f.Add([]byte{4, 1, 1, 0, 1, 0, 2, 2, 0, 1, 1, 2, 5, 3, 1, 0, 0, 7, 1, 1})
	f.Add([]byte{6, 0, 2, 1, 0, 0, 2, 0, 2, 1, 0, 0, 1, 1, 2, 0, 1, 1, 9, 0, 1, 0, 1, 2, 3, 4, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := randomInput(&byteSource{b: data})
		out, err := PlanPass(in)
		if err != nil {
			t.Fatalf("PlanPass(%+v): %v", in, err)
		}
		if msg := checkPass(in, out); msg != "" {
			t.Fatalf("%s\ninput: %+v\noutcome: %+v", msg, in, out)
		}
		if msg := checkPassOrders(in, out, &passCounts{}); msg != "" {
			t.Fatalf("%s\ninput: %+v\noutcome: %+v", msg, in, out)
		}
	})
}
