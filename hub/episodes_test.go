package hub

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
)

// Through the hub, with the shipped stall tolerance: a machine that stops answering and comes back
// within it is left alone, its BMC read for proof of a hang while it waits; its episode is said,
// counted, journaled and explained. A machine that panics (its BMC logs an OS critical stop) is
// power-cycled at once, its remediation's reason saying why.
func TestStallsThroughTheHub(t *testing.T) {
	pool := newTestPool(3)
	r := newPassRig(t, pool, testPolicy(), nil)
	r.run(t)
	r.awaitPasses(t, 5)
	ctx := t.Context()
	setDead := func(node string, dead bool) {
		pool.mu.Lock()
		pool.dead[node] = dead
		pool.mu.Unlock()
	}

	stopped := time.Now()
	setDead("cp-2", true)
	require.Eventually(t, func() bool {
		m := r.machine("cp-2")
		return strings.Contains(m.Decision, "cp-2 has shown no sign of life since") && m.BMC != nil && m.BMC.Checked.After(stopped)
	}, 10*time.Second, 10*time.Millisecond, "held MayResume, its BMC read for proof")
	m := r.machine("cp-2")
	assert.Contains(t, m.Decision, "(stallTolerance 30s: etcd keeps quorum without it), at once if its BMC proves a hang")
	assert.Equal(t, "OK", m.BMC.Health, "the evidence read: its health")
	setDead("cp-2", false)
	require.Eventually(t, func() bool { return r.machine("cp-2").Verdict == "Healthy" }, 10*time.Second, 10*time.Millisecond)
	assert.Empty(t, r.sim.Resets("cp-2"), "no power action")
	var e pass.Episode
	require.Eventually(t, func() bool {
		eps := r.hub.Episodes("cp-2")
		if len(eps) == 0 {
			return false
		}
		e = eps[len(eps)-1]
		return true
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, pass.EpisodeDead, e.Kind)
	assert.Equal(t, pass.EpisodeResumed, e.Outcome)
	assert.Less(t, e.Length(), 10*time.Second)
	ex, err := r.hub.Explain(ctx, "cp-2")
	require.NoError(t, err)
	assert.Contains(t, ex.String(), "episode: dead resumed for ")
	reg, ok := r.hub.cfg.Metrics.(*prometheus.Registry)
	require.True(t, ok)
	n, err := testutil.GatherAndCount(reg, "hale_hub_episodes_total")
	require.NoError(t, err)
	assert.Equal(t, 6, n, "every kind and outcome, from the start")
	assert.Equal(t, 1.0, counterOf(t, reg, "hale_hub_episodes_total", "kind", pass.EpisodeDead, "outcome", string(pass.EpisodeResumed)))
	require.Eventually(t, func() bool {
		l, err := r.journal.Store.(*boltfile.File).Episodes(ctx)
		return err == nil && len(l["cp-2"]) == 1 && l["cp-2"][0].Outcome == pass.EpisodeResumed
	}, 5*time.Second, 10*time.Millisecond, "journaled")

	// A panic: proved by its BMC's event log, cycled at once.
	logged := r.sim.LogEvent("cp-1", bmcsim.Event{SensorType: "OS Stop/Shutdown", Message: "Run-time critical stop"})
	setDead("cp-1", true)
	require.Eventually(t, func() bool { return len(r.sim.Resets("cp-1")) > 0 }, 10*time.Second, 10*time.Millisecond, "cp-1 power-cycled")
	took := time.Since(logged)
	assert.Less(t, took, pass.DefaultStallTolerance/2, "on the proof, not after the tolerance")
	hist, err := r.hub.History(ctx, "cp-1")
	require.NoError(t, err)
	require.NotEmpty(t, hist)
	assert.Contains(t, hist[len(hist)-1].Reason, "its BMC proves a hang: its event log has "+bmc.HangOSCriticalStop)
	assert.False(t, hist[len(hist)-1].WhileDead, "the BMC's proof stands, whatever a lagging view says after it")
	t.Logf("cp-1's panic: power-cycled %v after its BMC logged it", took.Round(10*time.Millisecond))
}

// A remediation begun while its machine was dead is withdrawn when the machine shows a sign of life
// since it began, before its request goes out; one begun on the BMC's proof (or an operator's) is not,
// nor one whose machine an observer's lagging view shows alive while the majority sees it dead. It began
// when its flight did, if that is earlier than its journal entry (a pass's begin is journaled beside
// the passes, through an API server in Kubernetes mode: a sign of life meanwhile counts).
func TestWantedWithdrawsWhenTheMachineResumes(t *testing.T) {
	began := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	dead := assess.Assessment{Machine: "cp-0", Verdict: assess.VerdictUnhealthy, Dead: true, LifeAt: began.Add(-30 * time.Second)}
	resumed := assess.Assessment{Machine: "cp-0", Verdict: assess.VerdictSuspect, Alive: true, LifeAt: began.Add(time.Second)}
	lagging := dead
	lagging.LifeAt = began.Add(time.Second) // a minority observer's report still holds it alive
	meanwhile := resumed
	meanwhile.LifeAt = began.Add(-time.Second) // after the flight began, before the journal had it
	for _, tc := range []struct {
		name      string
		whileDead bool
		by        string
		a         assess.Assessment
		wanted    bool
		since     time.Time // the flight's beginning
	}{
		{"begun while dead, resumed between its flight's beginning and its journal entry: withdrawn", true, "hub", meanwhile, false, began.Add(-3 * time.Second)},
		{"begun while dead, resumed before its flight began: still wanted", true, "hub", meanwhile, true, began.Add(-500 * time.Millisecond)},
		{"resumed by a restarted hub (its flight newer than its entry), resumed since the entry: withdrawn", true, "hub", resumed, false, began.Add(time.Hour)},
		{"begun while dead, still dead", true, "hub", dead, true, began},
		{"begun while dead, resumed since: withdrawn", true, "hub", resumed, false, began},
		{"begun while dead, one observer's view lags: still wanted", true, "hub", lagging, true, began},
		{"begun on its BMC's proof, resumed since: still wanted (the proof stands)", false, "hub", resumed, true, began},
		{"an operator's, Healthy again: still wanted", false, "alice", assess.Assessment{Machine: "cp-0", Verdict: assess.VerdictHealthy, Alive: true, LifeAt: began.Add(time.Second)}, true, began},
		{"the hub's, Healthy again: withdrawn", false, "hub", assess.Assessment{Machine: "cp-0", Verdict: assess.VerdictHealthy, Alive: true, LifeAt: began.Add(time.Second)}, false, began},
	} {
		err := wanted(journal.Remediation{Created: began, WhileDead: tc.whileDead, RequestedBy: tc.by}, tc.since, tc.a)
		assert.Equal(t, tc.wanted, err == nil, "%s: %v", tc.name, err)
	}
}

// An episodes' log the journal cannot read (a hand-edited file) is said and started afresh: the hub
// runs, and new episodes are journaled over it.
func TestAnUnreadableEpisodesLogStartsAfresh(t *testing.T) {
	pool := newTestPool(3)
	r := newPassRig(t, pool, testPolicy(), nil)
	j := r.journal.Store.(*boltfile.File)
	require.NoError(t, j.SetMeta("episodes", "not a log")) // the key boltfile keeps the log under
	r.run(t)
	r.awaitPasses(t, 5)
	assert.Empty(t, r.hub.Episodes("cp-0"))
	pool.mu.Lock()
	pool.dead["cp-0"] = true
	pool.mu.Unlock()
	require.Eventually(t, func() bool { return r.machine("cp-0").Verdict == "Unhealthy" }, 10*time.Second, 10*time.Millisecond)
	pool.mu.Lock()
	pool.dead["cp-0"] = false
	pool.mu.Unlock()
	require.Eventually(t, func() bool {
		l, err := j.Episodes(t.Context())
		return err == nil && len(l["cp-0"]) == 1
	}, 10*time.Second, 10*time.Millisecond, "the next episode journaled over the unreadable log")
}

// counterOf is the value of the counter name with the labels given (name, value, …) in reg.
func counterOf(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s%v in the registry", name, labels)
	return 0
}

// A machine whose agent is gone while quorum's return has the hub judge it again (the views of its
// member must settle, 5 s) is still cycled at once on its BMC's proof of a hang: its BMC is read while
// it is Suspect and gone, and the hang logged settles that the machine is down, not only its agent. A
// machine that panics as etcd's leader makes the others lose their leader for a moment, and its reboot
// waited for the observers' next reports (a loaded stall matrix, on real processes).
func TestAProofEndsTheWaitAfterQuorumsReturn(t *testing.T) {
	pool := newTestPool(3)
	r := newPassRig(t, pool, testPolicy(), nil)
	r.run(t)
	r.awaitPasses(t, 5)
	set := func(f func()) {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		f()
	}
	quorum := func() pass.EtcdQuorum { q, _ := r.hub.EtcdQuorum(time.Now().Add(-maxPassGap)); return q }

	set(func() { pool.dead["cp-1"] = true })
	require.Eventually(t, func() bool { return r.machine("cp-1").Verdict == assess.VerdictUnhealthy }, 10*time.Second, 10*time.Millisecond)
	set(func() { pool.noLeader = true }) // the others lose their leader: quorum lost
	require.Eventually(t, func() bool { return quorum() == pass.QuorumLost }, 10*time.Second, 10*time.Millisecond)
	set(func() { pool.noLeader = false })
	require.Eventually(t, func() bool {
		m := r.machine("cp-1")
		return quorum() != pass.QuorumLost && m.Verdict == assess.VerdictSuspect && strings.Contains(strings.Join(m.Reasons, "\n"), "(unhealthy at 5s)")
	}, 10*time.Second, 10*time.Millisecond, "judged again after quorum's return: %+v", r.machine("cp-1"))

	logged := r.sim.LogEvent("cp-1", bmcsim.Event{SensorType: "OS Stop/Shutdown", Message: "Run-time critical stop"})
	var said string
	require.Eventually(t, func() bool {
		if m := r.machine("cp-1"); m.Verdict == assess.VerdictUnhealthy {
			said = strings.Join(m.Reasons, "\n")
		}
		return len(r.sim.Resets("cp-1")) > 0
	}, 10*time.Second, 5*time.Millisecond, "cp-1 power-cycled")
	took := time.Since(logged)
	assert.Less(t, took, 3*time.Second, "on the proof (read every second), not once the views settled (5 s after the return)")
	assert.Contains(t, said, "since its last sign of life: the machine is down, not only its agent")
	assert.Empty(t, r.sim.Resets("cp-0"))
	assert.Empty(t, r.sim.Resets("cp-2"))
	t.Logf("cp-1 power-cycled %v after its BMC logged the panic, within the settling after quorum's return", took.Round(10*time.Millisecond))
}
