package hub

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/quorum"
)

var t0 = time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)

var machines = []MachineRef{
	{Name: "m0", Node: "cp-0", Member: "etcd-0"},
	{Name: "m1", Node: "cp-1", Member: "etcd-1"},
	{Name: "m2", Node: "cp-2", Member: "etcd-2"},
}

// world builds observations: every node alive and reporting fresh, every probe passing, every member
// reachable from everyone; edit lets a case change it.
type world struct {
	obs Observations
}

func newWorld(now time.Time) *world {
	w := &world{obs: Observations{Now: now, Reports: map[string]health.Report{}, HubPeers: map[string]health.PeerView{}}}
	for _, m := range machines {
		w.obs.HubPeers[m.Node] = health.PeerView{Name: m.Node, State: health.PeerAlive, Since: t0}
		r := health.Report{Node: m.Node, SentAt: now.Add(-time.Second), Etcd: &health.EtcdView{LocalName: m.Member},
			Probes: []health.ProbeResult{{Name: "kubelet", OK: true, Since: t0}, {Name: "etcd", OK: true, Since: t0}}}
		for _, o := range machines {
			yes := true
			r.Etcd.Members = append(r.Etcd.Members, health.EtcdMember{Name: o.Member, Reachable: &yes})
			if o.Node != m.Node {
				r.Peers = append(r.Peers, health.PeerView{Name: o.Node, State: health.PeerAlive, Since: t0})
			}
		}
		w.obs.Reports[m.Node] = r
	}
	return w
}

// dead marks node dead since since in the hub's view and in the listed observers' reports.
func (w *world) dead(node string, since time.Time, by ...string) *world {
	w.obs.HubPeers[node] = health.PeerView{Name: node, State: health.PeerDead, Since: since}
	for _, o := range by {
		r := w.obs.Reports[o]
		for i := range r.Peers {
			if r.Peers[i].Name == node {
				r.Peers[i] = health.PeerView{Name: node, State: health.PeerDead, Since: since}
			}
		}
		w.obs.Reports[o] = r
	}
	return w
}

// unreachable marks member unreachable in the listed observers' etcd views.
func (w *world) unreachable(member string, by ...string) *world {
	for _, o := range by {
		r := w.obs.Reports[o]
		for i := range r.Etcd.Members {
			if r.Etcd.Members[i].Name == member {
				no := false
				r.Etcd.Members[i].Reachable = &no
			}
		}
		w.obs.Reports[o] = r
	}
	return w
}

func (w *world) probe(node, name string, ok bool, since time.Time) *world {
	r := w.obs.Reports[node]
	r.Probes = append([]health.ProbeResult(nil), r.Probes...)
	for i := range r.Probes {
		if r.Probes[i].Name == name {
			r.Probes[i] = health.ProbeResult{Name: name, OK: ok, Since: since, Detail: "connection refused"}
		}
	}
	w.obs.Reports[node] = r
	return w
}

func byName(as []Assessment) map[string]Assessment {
	out := map[string]Assessment{}
	for _, a := range as {
		out[a.Machine] = a
	}
	return out
}

func TestAssess(t *testing.T) {
	now := t0.Add(time.Hour)
	tests := []struct {
		name       string
		world      *world
		policy     func(*AssessPolicy)
		machine    string
		verdict    Verdict
		etcd       quorum.Health
		reason     string
		wantSince  time.Time
		allHealthy bool
	}{
		{name: "all well", world: newWorld(now), machine: "m1", verdict: Healthy, etcd: quorum.Healthy},
		{name: "dead per the hub and every observer", world: newWorld(now).dead("cp-2", now.Add(-2*time.Second), "cp-0", "cp-1"),
			machine: "m2", verdict: Unhealthy, etcd: quorum.Unhealthy, reason: "cp-2 dead since", wantSince: now.Add(-2 * time.Second)},
		{name: "the hub alone lost sight: never enough", world: newWorld(now).dead("cp-2", now.Add(-time.Minute)),
			machine: "m2", verdict: Suspect, etcd: quorum.Healthy, reason: "the hub lost sight of cp-2, but only 0 of 2 live observers see it dead: not corroborated"},
		{name: "one observer of two agreeing is no majority", world: newWorld(now).dead("cp-2", now.Add(-time.Minute), "cp-0"),
			machine: "m2", verdict: Suspect, reason: "only 1 of 2"},
		{name: "two of three dead: the survivor corroborates", world: newWorld(now).dead("cp-1", now.Add(-time.Second), "cp-0").dead("cp-2", now.Add(-time.Second), "cp-0"),
			machine: "m2", verdict: Unhealthy, etcd: quorum.Unhealthy, reason: "per the hub and 1 of 1 live observers"},
		{name: "dead for less than DeadTimeout", world: newWorld(now).dead("cp-2", now.Add(-time.Second), "cp-0", "cp-1"),
			policy: func(p *AssessPolicy) { p.DeadTimeout = 5 * time.Second }, machine: "m2", verdict: Suspect, reason: "unhealthy at 5s"},
		{name: "kubelet failing short of its timeout", world: newWorld(now).probe("cp-1", "kubelet", false, now.Add(-3*time.Second)),
			machine: "m1", verdict: Suspect, etcd: quorum.Healthy, reason: "kubelet failing for 3s (unhealthy at 10s): connection refused"},
		{name: "kubelet failing past its timeout", world: newWorld(now).probe("cp-1", "kubelet", false, now.Add(-12*time.Second)),
			machine: "m1", verdict: Unhealthy, etcd: quorum.Healthy, reason: "kubelet failing for 12s (unhealthy at 10s)", wantSince: now.Add(-12 * time.Second)},
		{name: "a probe without a timeout never makes a machine unhealthy", world: newWorld(now).probe("cp-1", "kubelet", false, now.Add(-time.Hour)),
			policy: func(p *AssessPolicy) { delete(p.ProbeTimeouts, "kubelet") }, machine: "m1", verdict: Healthy, etcd: quorum.Healthy},
		{name: "own etcd probe failing: member unhealthy for quorum", world: newWorld(now).probe("cp-1", "etcd", false, now.Add(-2*time.Second)),
			machine: "m1", verdict: Suspect, etcd: quorum.Unhealthy, reason: "etcd failing for 2s"},
		{name: "a stale report is no evidence", world: func() *world {
			w := newWorld(now)
			r := w.obs.Reports["cp-1"]
			r.SentAt = now.Add(-time.Minute)
			w.obs.Reports["cp-1"] = r
			return w
		}(), machine: "m1", verdict: Suspect, reason: "no fresh report from cp-1"},
		{name: "left on purpose", world: func() *world {
			w := newWorld(now)
			w.obs.HubPeers["cp-1"] = health.PeerView{Name: "cp-1", State: health.PeerLeft, Since: now}
			return w
		}(), machine: "m1", verdict: Suspect, reason: "left the gossip pool on purpose"},
		{name: "member unreachable from a majority starts a timer", world: newWorld(now).unreachable("etcd-2", "cp-0", "cp-1"),
			machine: "m2", verdict: Suspect, etcd: quorum.Unhealthy, reason: "etcd member etcd-2 unreachable from 2 of 2 observers for 0s (unhealthy at 5s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultAssessPolicy()
			if tt.policy != nil {
				tt.policy(&p)
			}
			got := byName(NewAssessor(p).Assess(machines, tt.world.obs))[tt.machine]
			assert.Equal(t, tt.verdict, got.Verdict, "%+v", got)
			if tt.etcd != 0 || tt.verdict == Healthy {
				assert.Equal(t, tt.etcd, got.EtcdHealth, "%+v", got)
			}
			if tt.reason != "" {
				assert.Contains(t, joinLines(got.Reasons), tt.reason)
			}
			if !tt.wantSince.IsZero() {
				assert.Equal(t, tt.wantSince, got.Since)
			}
		})
	}
}

func joinLines(rs []string) string {
	out := ""
	for _, r := range rs {
		out += r + "\n"
	}
	return out
}

// A condition without a since of its own is timed by the assessor across passes, and forgotten when
// it clears.
func TestAssessTimesUnreachableMembers(t *testing.T) {
	a := NewAssessor(DefaultAssessPolicy())
	now := t0.Add(time.Hour)
	got := byName(a.Assess(machines, newWorld(now).unreachable("etcd-2", "cp-0", "cp-1").obs))["m2"]
	require.Equal(t, Suspect, got.Verdict)
	got = byName(a.Assess(machines, newWorld(now.Add(6*time.Second)).unreachable("etcd-2", "cp-0", "cp-1").obs))["m2"]
	require.Equal(t, Unhealthy, got.Verdict, "%+v", got)
	assert.Equal(t, now, got.Since)
	assert.Contains(t, got.Reasons[0], "etcd member etcd-2 unreachable from 2 of 2 observers for 6s")

	// Reachable again: healthy, and the timer starts afresh next time.
	got = byName(a.Assess(machines, newWorld(now.Add(7*time.Second)).obs))["m2"]
	assert.Equal(t, Healthy, got.Verdict)
	got = byName(a.Assess(machines, newWorld(now.Add(8*time.Second)).unreachable("etcd-2", "cp-0", "cp-1").obs))["m2"]
	assert.Equal(t, Suspect, got.Verdict)
}

func TestAssessWorkerWithoutMember(t *testing.T) {
	now := t0.Add(time.Hour)
	w := newWorld(now)
	w.obs.HubPeers["w-1"] = health.PeerView{Name: "w-1", State: health.PeerAlive}
	w.obs.Reports["w-1"] = health.Report{Node: "w-1", SentAt: now, Probes: []health.ProbeResult{{Name: "kubelet", OK: false, Since: now.Add(-time.Minute)}}}
	got := byName(NewAssessor(DefaultAssessPolicy()).Assess([]MachineRef{{Name: "w1", Node: "w-1"}}, w.obs))["w1"]
	assert.Equal(t, Unhealthy, got.Verdict)
	assert.Equal(t, quorum.HealthUnknown, got.EtcdHealth)
}

// A Node condition is evidence, never enough alone: Ready=Unknown past its timeout makes a machine
// Unhealthy only with something else against it.
func TestAssessNodeConditions(t *testing.T) {
	now := t0.Add(time.Hour)
	notReady := func(for_ time.Duration) []NodeCondition {
		return []NodeCondition{{Type: "Ready", Status: "Unknown", Reason: "NodeStatusUnknown", Since: now.Add(-for_)}}
	}
	for _, tc := range []struct {
		name       string
		conditions []NodeCondition
		kubelet    bool // the agent's kubelet probe failing for 2 s (under its 10 s timeout)
		want       Verdict
		reason     string
	}{
		{"Ready=True", []NodeCondition{{Type: "Ready", Status: "True", Since: t0}}, false, Healthy, ""},
		{"not Ready long, nothing else", notReady(time.Minute), false, Suspect, "node cp-2 Ready=Unknown (NodeStatusUnknown) for 1m0s, but nothing else stands against it: not enough alone"},
		{"not Ready long, kubelet probe failing", notReady(time.Minute), true, Unhealthy, "node cp-2 Ready=Unknown (NodeStatusUnknown) for 1m0s, with the evidence above"},
		{"not Ready briefly, kubelet probe failing", notReady(5 * time.Second), true, Suspect, "node cp-2 Ready=Unknown (NodeStatusUnknown) for 5s (counts at 30s)"},
		{"a pressure condition not listed", []NodeCondition{{Type: "DiskPressure", Status: "True", Since: t0}}, true, Suspect, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(now)
			if tc.kubelet {
				r := w.obs.Reports["cp-2"]
				r.Probes[0] = health.ProbeResult{Name: "kubelet", OK: false, Since: now.Add(-2 * time.Second), Detail: "connection refused"}
				w.obs.Reports["cp-2"] = r
			}
			ms := slices.Clone(machines)
			ms[2].Conditions = tc.conditions
			got := NewAssessor(DefaultAssessPolicy()).Assess(ms, w.obs)[2]
			assert.Equal(t, tc.want, got.Verdict, got.Reasons)
			if tc.reason != "" {
				assert.Contains(t, got.Reasons, tc.reason)
			}
		})
	}
}
