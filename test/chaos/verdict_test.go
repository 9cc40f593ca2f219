package main

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/lab"
)

// The checker's own logic, on made-up timelines: each property fires on the case it exists for and
// stays quiet on its neighbour. (The end-to-end runs in chaos_test.go check it on real processes.)
func TestEvaluate(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	machines := []string{"cp-0", "cp-1", "cp-2"}
	voter := func(id uint64) memberSample {
		return memberSample{Up: true, AgentUp: true, OK: true, ID: id, Leader: 1, Term: 5}
	}
	down := memberSample{}
	// samples: every 200 ms from 0 to 60 s, members as given by state(t).
	samples := func(state func(time.Time) []memberSample, heard func(time.Time) int) []sample {
		var out []sample
		for ms := 0; ms <= 60000; ms += 200 {
			ts := t0.Add(time.Duration(ms) * time.Millisecond)
			out = append(out, sample{At: ts, Members: state(ts), Voters: 3, Heard: heard(ts), Expected: 6, HubUp: true})
		}
		return out
	}
	allWell := func(time.Time) []memberSample { return []memberSample{voter(1), voter(2), voter(3)} }
	cp2Down := func(time.Time) []memberSample { return []memberSample{voter(1), voter(2), down} }
	cp1cp2Down := func(time.Time) []memberSample { return []memberSample{voter(1), down, down} }
	six := func(time.Time) int { return 6 }
	power := func(s float64, m string) event { return event{At: at(s), Kind: "power-off", Target: m} }
	// forGood has the hub read every second and say "lost for good" from s seconds to e (< e).
	forGood := func(ss []sample, s, e float64) []sample {
		for i := range ss {
			if ms := ss[i].At.Sub(t0).Milliseconds(); ms%1000 == 0 {
				ss[i].HubRead, ss[i].ForGood = true, !ss[i].At.Before(at(s)) && ss[i].At.Before(at(e))
			}
		}
		return ss
	}
	tests := []struct {
		name    string
		samples []sample
		events  []event
		reqs    []request
		want    [7]int
		spare   []string
	}{
		{name: "a dead member power-cycled: fine", samples: samples(cp2Down, six), events: []event{power(30, "cp-2")}},
		{name: "a hung member that came back within the lag before the action: a race, not counted", samples: samples(func(t time.Time) []memberSample {
			if t.Before(at(29)) {
				return cp2Down(t)
			}
			return allWell(t)
		}, six), events: []event{power(30, "cp-2")}},
		{name: "one that had been back longer: property 2", samples: samples(func(t time.Time) []memberSample {
			if t.Before(at(27)) {
				return cp2Down(t)
			}
			return allWell(t)
		}, six), events: []event{power(30, "cp-2")}, want: [7]int{0, 1}},
		{name: "a healthy voter of a working quorum power-cycled: property 2", samples: samples(allWell, six), events: []event{power(30, "cp-1")},
			want: [7]int{0, 1}},
		{name: "the last healthy voters: properties 1 and 2", samples: samples(cp2Down, six), events: []event{power(30, "cp-1")},
			want: [7]int{1, 1}},
		{name: "quorum lost, a healthy one reduced: property 1", samples: samples(cp1cp2Down, six), events: []event{power(30, "cp-0")},
			want: [7]int{1}},
		{name: "a forced manual reboot is the operator's", samples: samples(allWell, six), events: []event{
			{At: at(29), Kind: "op-start", Target: "cp-1", Detail: "reboot cp-1 --wait --force --yes"}, power(30, "cp-1"),
			{At: at(31), Kind: "op-end", Target: "cp-1", Detail: "reboot: ok"}}},
		{name: "a quorum-checked manual reboot that cost quorum: property 1", samples: samples(cp2Down, six), events: []event{
			{At: at(29), Kind: "op-start", Target: "cp-1", Detail: "reboot cp-1 --wait"}, power(30, "cp-1"),
			{At: at(31), Kind: "op-end", Target: "cp-1", Detail: "reboot: ok"}}, want: [7]int{1}},
		{name: "acting on a dead member while the hub heard 3 of 6 for longer than the grace: property 2",
			samples: samples(cp2Down, func(time.Time) int { return 3 }), events: []event{power(30, "cp-2")}, want: [7]int{0, 1}},
		{name: "3 of 6 for less than the grace: no violation", samples: samples(cp2Down, func(ts time.Time) int {
			if ts.After(at(25)) {
				return 3
			}
			return 6
		}), events: []event{power(30, "cp-2")}},
		{name: "twice within the cooldown: property 3", samples: samples(cp2Down, six), events: []event{power(10, "cp-2"), power(20, "cp-2")},
			want: [7]int{0, 0, 1}},
		{name: "twice, further apart than the cooldown: fine", samples: samples(cp2Down, six), events: []event{power(10, "cp-2"), power(35, "cp-2")}},
		{name: "a request while detached: property 4", samples: samples(allWell, six), events: []event{
			{At: at(10), Kind: "brake-on", Target: "cp-2", Detail: opDetach}, {At: at(20), Kind: "brake-off", Target: "cp-2", Detail: opDetach}},
			reqs: []request{{At: at(15), Machine: "cp-2", Detail: "IPMI power 0"}, {At: at(15), Machine: "cp-1", Detail: "a Redfish reset"}}, want: [7]int{0, 0, 0, 1}},
		{name: "the power-on ending a cycle whose power-off went out before a suspend: fine", samples: samples(allWell, six), events: []event{
			{At: at(10), Kind: "brake-on", Detail: opSuspend}, {At: at(20), Kind: "brake-off", Detail: opSuspend}},
			reqs: []request{{At: at(9.9), Machine: "cp-2", Detail: "IPMI power 0"}, {At: at(10.8), Machine: "cp-2", Detail: "IPMI power 1"}}},
		{name: "a power-on under a suspend without a power-off before it: property 4", samples: samples(allWell, six), events: []event{
			{At: at(10), Kind: "brake-on", Detail: opSuspend}, {At: at(20), Kind: "brake-off", Detail: opSuspend}},
			reqs: []request{{At: at(11), Machine: "cp-2", Detail: "IPMI power 1"}}, want: [7]int{0, 0, 0, 1}},
		{name: "a power-off and -on both under a suspend: property 4, twice", samples: samples(allWell, six), events: []event{
			{At: at(10), Kind: "brake-on", Detail: opSuspend}, {At: at(20), Kind: "brake-off", Detail: opSuspend}},
			reqs: []request{{At: at(11), Machine: "cp-2", Detail: "IPMI power 0"}, {At: at(12), Machine: "cp-2", Detail: "IPMI power 1"}}, want: [7]int{0, 0, 0, 2}},
		{name: "a request while paused, and one after the resume", samples: samples(allWell, six), events: []event{
			{At: at(10), Kind: "brake-on", Detail: opPause}, {At: at(20), Kind: "brake-off", Detail: opPause}},
			reqs: []request{{At: at(15), Machine: "cp-1", Detail: "a Redfish reset"}, {At: at(21), Machine: "cp-1", Detail: "a Redfish reset"}},
			want: [7]int{0, 0, 0, 1}},
		{name: "the hub says lost for good while the far side holds quorum: property 6", samples: forGood(samples(allWell, six), 20, 40),
			want: [7]int{0, 0, 0, 0, 0, 20}},
		{name: "the hub says lost for good while quorum is lost: fine", samples: forGood(samples(cp1cp2Down, six), 20, 40)},
		{name: "the hub still says lost for good just after quorum came back (within the lag): fine", samples: forGood(samples(func(t time.Time) []memberSample {
			if t.Before(at(39)) {
				return cp1cp2Down(t)
			}
			return allWell(t)
		}, six), 20, 40)},
		{name: "hub recover --yes carried out while quorum holds: property 6", samples: samples(allWell, six),
			events: []event{{At: at(30), Kind: "op-end", Detail: opRecover + ": ok"}}, want: [7]int{0, 0, 0, 0, 0, 1}},
		{name: "hub recover --yes refused while quorum holds: fine", samples: samples(allWell, six),
			events: []event{{At: at(30), Kind: "op-end", Detail: opRecover + ": failed: hub: the recovery plan is not ready: …"}}},
		{name: "hub recover --yes carried out while quorum is lost: fine", samples: samples(cp1cp2Down, six),
			events: []event{{At: at(30), Kind: "op-end", Detail: opRecover + ": ok"}}},
		{name: "two etcd clusters serve at once: property 7", samples: samples(func(t time.Time) []memberSample {
			if t.Before(at(20)) || !t.Before(at(21)) {
				return allWell(t)
			}
			old := memberSample{Up: true, AgentUp: true, OK: true, ID: 9, Leader: 9, Term: 1, Cluster: 7}
			return []memberSample{voter(1), old, voter(3)}
		}, six), want: [7]int{6: 5}},
		{name: "a rebuilt cluster, one at a time: fine", samples: samples(func(t time.Time) []memberSample {
			if t.Before(at(20)) {
				return allWell(t)
			}
			rebuilt := func(id uint64) memberSample {
				return memberSample{Up: true, AgentUp: true, OK: true, ID: id, Leader: 11, Term: 2, Cluster: 7}
			}
			return []memberSample{rebuilt(11), down, rebuilt(13)}
		}, six)},
		{name: "a machine lost for good is no power action", samples: samples(allWell, six),
			events: []event{{At: at(30), Kind: "power-off", Target: "cp-1", Detail: lab.LostForGood}}},
		{name: "the membership changed: property 1", samples: samples(allWell, six),
			events: []event{{At: at(30), Kind: "membership", Detail: "1 voters (were 3)"}}, want: [7]int{1}},
		{name: "the membership changed during the operator's recovery: fine", samples: samples(allWell, six), events: []event{
			{At: at(20), Kind: "op-start", Detail: opRecoverAll}, {At: at(30), Kind: "membership", Detail: "1 voters (were 3)"},
			{At: at(40), Kind: "op-end", Detail: opRecoverAll + ": ok"}, {At: at(41), Kind: "membership", Detail: "3 voters (were 2)"}}},
		{name: "the membership changed well after the operator's recovery: property 1", samples: samples(allWell, six), events: []event{
			{At: at(20), Kind: "op-start", Detail: opRecoverAll}, {At: at(40), Kind: "op-end", Detail: opRecoverAll + ": ok"},
			{At: at(45), Kind: "membership", Detail: "2 voters (were 3)"}}, want: [7]int{1}},
		{name: "a machine the schedule spares, sick (stale evidence at a heal): property 2", events: []event{power(30, "cp-0")}, spare: []string{"cp-0"},
			samples: samples(func(time.Time) []memberSample { return []memberSample{down, voter(2), voter(3)} }, six), want: [7]int{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tl := &timeline{start: t0, log: io.Discard, events: tt.events}
			res := result{Schedule: schedule{Spare: tt.spare}}
			evaluate(&res, tl, tt.samples, machines, tt.reqs)
			var got [7]int
			for i, v := range res.Violations {
				got[i] = len(v)
			}
			assert.Equal(t, tt.want, got, "%q", res.Violations)
		})
	}
}

// A healthy voter cut off from the hub while the hub hears a majority of its observers: the trade-off
// the README documents (where the witnesses are decides), counted apart and not failed; the same
// action with the hub hearing no majority stays a violation.
func TestEvaluateFarSide(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	build := func(heard int) []sample {
		var out []sample
		for ms := 0; ms <= 30000; ms += 200 {
			m := func(id uint64) memberSample {
				return memberSample{Up: true, AgentUp: true, OK: true, ID: id, Leader: 1, Term: 5}
			}
			out = append(out, sample{At: t0.Add(time.Duration(ms) * time.Millisecond), Members: []memberSample{m(1), m(2), {}},
				Voters: 3, Heard: heard, Expected: 6, HubUp: true, CutFromHub: []bool{true, true, false}})
		}
		return out
	}
	events := []event{{At: t0.Add(20 * time.Second), Kind: "power-off", Target: "cp-0"}}
	var res result
	evaluate(&res, &timeline{start: t0, log: io.Discard, events: events}, build(4), []string{"cp-0", "cp-1", "cp-2"}, nil)
	assert.True(t, res.passed(), "%q", res.Violations)
	assert.Len(t, res.TradeOffs, 1)
	res = result{}
	evaluate(&res, &timeline{start: t0, log: io.Discard, events: events}, build(2), []string{"cp-0", "cp-1", "cp-2"}, nil)
	assert.Len(t, res.Violations[0], 1, "quorum")
	assert.Len(t, res.Violations[1], 2, "a healthy voter, and no majority heard")
	// The hub's majority lost 0.4 s or 3 s before it acted (another partition): still the first one's
	// trade-off, its view of its observers lagging; lost longer than the Grace before: the
	// violations; and so when cp-0 was back in the hub's view in between.
	for _, lost := range []struct {
		before time.Duration
		inView bool
		ok     bool
	}{{400 * time.Millisecond, false, true}, {3 * time.Second, false, true}, {Grace + time.Second, false, false}, {3 * time.Second, true, false}} {
		samples := build(4)
		for i := range samples {
			if !samples[i].At.Before(t0.Add(20*time.Second - lost.before)) {
				samples[i].Heard = 2
				samples[i].CutFromHub = []bool{!lost.inView, true, false}
			}
		}
		res = result{}
		evaluate(&res, &timeline{start: t0, log: io.Discard, events: events}, samples, []string{"cp-0", "cp-1", "cp-2"}, nil)
		assert.Equal(t, lost.ok, res.passed(), "majority lost %v before (cp-0 in view: %v): %q", lost.before, lost.inView, res.Violations)
	}

	// Twice while it stays on the far side: the second is property 2 (DESIGN rule 9).
	twice := []event{{At: t0.Add(2 * time.Second), Kind: "power-off", Target: "cp-0"}, {At: t0.Add(28 * time.Second), Kind: "power-off", Target: "cp-0"}}
	res = result{}
	evaluate(&res, &timeline{start: t0, log: io.Discard, events: twice}, build(4), []string{"cp-0", "cp-1", "cp-2"}, nil)
	require.Len(t, res.Violations[1], 1, "%q", res.Violations)
	assert.Contains(t, res.Violations[1][0], "cp-0 powered off by Hale again, on the far side of a partition since its last power-off at 2.0s")
	// Back in view in between (the partition healed, then another): a new far side, not a repeat.
	samples := build(4)
	for i := range samples {
		if at := samples[i].At.Sub(t0); at > 23*time.Second && at < 25*time.Second {
			samples[i].CutFromHub = []bool{false, false, false}
		}
	}
	res = result{}
	evaluate(&res, &timeline{start: t0, log: io.Discard, events: twice}, samples, []string{"cp-0", "cp-1", "cp-2"}, nil)
	assert.True(t, res.passed(), "%q", res.Violations)
	assert.Len(t, res.TradeOffs, 2)
}

// The quiet period ends early on a rate-limit hold only when its window is read from the hub's words
// (a decision copied from a full run's status); any other decision, or words it cannot read, waits.
func TestRateLimitWindow(t *testing.T) {
	for _, tc := range []struct {
		decision, window string
	}{
		{"rate limit: 3 remediations started in the last 10m0s (max 3): cp-0 waits, to stop a remediation storm", "10m0s"},
		{"rate limit: 1 remediations started in the last 1h0m0s (max 1): cp-2 waits, to stop a remediation storm", "1h0m0s"},
		{"cooling down: cp-0 was remediated 20s ago (cooldown 5m0s)", ""},
		{"", ""},
	} {
		got := ""
		if m := rateLimitWindow.FindStringSubmatch(tc.decision); m != nil {
			got = m[1]
		}
		assert.Equal(t, tc.window, got, tc.decision)
	}
}
