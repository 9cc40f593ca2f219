package hub

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/metrics"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
)

// operator.Status, explain and the metrics say one thing at every moment. A sampler takes one status about
// every millisecond, derives every machine's explanation and every gauge from it, and holds them to
// each other while the hub goes through warm-up, a steady pool, a machine dead and healed in steps,
// pausing and paused with a remediation in flight, suspended with a would-do held, and a machine
// detached.
func TestStatusExplainAndMetricsAgree(t *testing.T) {
	pool := newTestPool(3)
	p := testPolicy()
	p.StallTolerance = pass.PerQuorum{Held: 2 * time.Second, Needed: 2 * time.Second} // a phase of its own, held MayResume, shorter than the default's
	r := newPassRig(t, pool, p, nil)
	c := metrics.NewCollector(r.hub.Status)
	ctx := t.Context()
	var samples atomic.Int64
	var mu sync.Mutex
	phases := map[string]bool{oneTruth(t, r.hub, c): true} // before the first pass: warm-up
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ph := oneTruth(t, r.hub, c)
			mu.Lock()
			phases[ph] = true
			mu.Unlock()
			samples.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	endSampling := func() {
		close(stop)
		<-stopped
	}
	defer func() {
		select {
		case <-stopped:
		default:
			endSampling()
		}
	}()
	kill := func(node string) {
		pool.mu.Lock()
		pool.dead[node] = true
		pool.mu.Unlock()
	}
	waitFor := func(what string, cond func(operator.MachineStatus) bool, machine string) {
		t.Helper()
		require.Eventually(t, func() bool { return cond(r.machine(machine)) }, 30*time.Second, 5*time.Millisecond, what)
	}
	inFlight := func(m operator.MachineStatus) bool { return m.Remediation != nil }
	idle := func(m operator.MachineStatus) bool { return m.Remediation == nil && m.Verdict == assess.VerdictHealthy }

	r.run(t)
	r.awaitPasses(t, 5)

	kill("cp-2")
	waitFor("cp-2 in flight", inFlight, "cp-2")
	require.NoError(t, r.hub.SetPaused(ctx, true, "test", "one truth"))
	require.Eventually(t, func() bool { return r.hub.PauseState() == operator.Paused }, 30*time.Second, 5*time.Millisecond)
	r.awaitPasses(t, 5)
	require.NoError(t, r.hub.SetPaused(ctx, false, "test", ""))
	pool.restart("cp-2")
	waitFor("cp-2 healed", idle, "cp-2")

	require.NoError(t, r.hub.SetSuspended(ctx, true, "test", "one truth"))
	kill("cp-1")
	require.Eventually(t, func() bool { return strings.Contains(r.hub.Status(ctx).Holding, "cp-1") }, 30*time.Second, 5*time.Millisecond, "the would-do held")
	r.awaitPasses(t, 5)
	require.NoError(t, r.hub.SetDetached(ctx, "cp-1", true, "test", "one truth"))
	require.NoError(t, r.hub.SetSuspended(ctx, false, "test", ""))
	r.awaitPasses(t, 5)
	assert.Nil(t, r.machine("cp-1").Remediation, "detached: nothing starts")
	require.NoError(t, r.hub.SetDetached(ctx, "cp-1", false, "test", ""))
	waitFor("cp-1 in flight", inFlight, "cp-1")
	pool.restart("cp-1")
	waitFor("cp-1 healed", idle, "cp-1")

	endSampling()
	t.Logf("%d samples", samples.Load())
	mu.Lock()
	defer mu.Unlock()
	for _, ph := range []string{"warm-up", "steady", "in a step", "in a step, paused", "suspended, holding", "detached"} {
		assert.True(t, phases[ph], "phase %q never sampled (sampled: %v)", ph, phases)
	}
}

// oneTruth takes one status, derives each machine's explanation and every gauge from it, fails the
// test where they disagree (with each other, or with what the status itself says), and names the
// phase it saw.
func oneTruth(t *testing.T, h *Hub, c *metrics.Collector) (phase string) {
	ctx := context.Background()
	st := h.Status(ctx)
	g := gaugesOf(t, c, st)
	at := st.Time.Format("15:04:05.000")

	stopped := st.Pause != operator.Running || st.Suspended || !st.Observers.Majority || st.NotPlanning != ""
	if stopped {
		assert.NotEqual(t, "a strict majority: acting", st.Acting(), "%s: says acting while %s, suspended %v, majority %v, not planning %q",
			at, st.Pause, st.Suspended, st.Observers.Majority, st.NotPlanning)
	} else {
		assert.Equal(t, "a strict majority: acting", st.Acting(), at)
	}
	for _, s := range []operator.PauseState{operator.Running, operator.Pausing, operator.Paused} {
		assert.Equal(t, gaugeOf(st.Pause == s), g.value("hale_hub_paused", "state", string(s)), "%s: hale_hub_paused{state=%s}", at, s)
	}
	assert.Equal(t, gaugeOf(st.Suspended), g.value("hale_hub_suspended"), "%s: hale_hub_suspended", at)
	assert.Equal(t, gaugeOf(st.NotPlanning == ""), g.value("hale_hub_planning"), "%s: hale_hub_planning", at)
	assert.Equal(t, float64(len(st.Observers.Heard)), g.value("hale_hub_observers_heard"), "%s: hale_hub_observers_heard", at)
	assert.Equal(t, gaugeOf(st.QuorumLoss != nil && st.QuorumLoss.ForGood), g.value("hale_hub_etcd_quorum_lost_for_good"), "%s: hale_hub_etcd_quorum_lost_for_good", at)
	if st.QuorumLoss != nil {
		assert.NotNil(t, st.Budget, at)
		assert.True(t, st.Budget.QuorumLost(), "%s: a quorum loss in status, with a budget of %s", at, st.Budget)
	}
	if b := st.Budget; b != nil {
		assert.Equal(t, float64(b.Voters), g.value("hale_hub_etcd_voters"), "%s: hale_hub_etcd_voters", at)
		assert.Equal(t, float64(b.Available), g.value("hale_hub_budget"), "%s: hale_hub_budget", at)
		voters := 0
		for _, m := range st.Machines {
			if m.Role == "voter" {
				voters++
			}
		}
		// Every member is an inventory machine here: the budget's voters are the rows' voters.
		assert.Equal(t, b.Voters, voters, "%s: budget %s against the rows' roles", at, b)
	} else {
		assert.False(t, g.has("hale_hub_etcd_voters"), "%s: no budget in status, yet hale_hub_etcd_voters", at)
	}

	remediating, detached := 0, 0
	for _, m := range st.Machines {
		e, err := h.explain(ctx, st, m.Name)
		if !assert.NoError(t, err) {
			continue
		}
		assert.Equal(t, m, e.Machine, "%s: explain's machine is status' row", at)
		for _, v := range []assess.Verdict{assess.VerdictHealthy, assess.VerdictSuspect, assess.VerdictUnhealthy, "Unknown"} {
			assert.Equal(t, gaugeOf(m.Verdict == v), g.value("hale_hub_machine_verdict", "machine", m.Name, "verdict", string(v)),
				"%s: hale_hub_machine_verdict{machine=%s,verdict=%s} while status says %s", at, m.Name, v, m.Verdict)
		}
		if r := m.Remediation; r != nil {
			remediating++
			assert.Equal(t, float64(r.Step), g.value("hale_hub_machine_remediation_step", "machine", m.Name, "strategy", r.Strategy, "steps", strconv.Itoa(len(r.Steps))),
				"%s: hale_hub_machine_remediation_step for %s", at, m.Name)
		} else {
			assert.False(t, g.hasFor("hale_hub_machine_remediation_step", "machine", m.Name), "%s: a step gauge for %s, with nothing in flight", at, m.Name)
		}
		if m.Detached {
			detached++
			assert.Contains(t, e.String(), m.Name+" is detached by", at)
		}
		switch {
		case st.NotPlanning != "":
			assert.Equal(t, "not planning: "+st.NotPlanning, e.Planner, at)
		case m.Verdict == assess.VerdictUnhealthy:
			assert.NotContains(t, e.Planner, "only Unhealthy machines", "%s: %s is Unhealthy", at, m.Name)
		}
		if e.Holding != "" {
			assert.Equal(t, st.Holding, e.Holding, at)
		}
		brakes := strings.Join(e.Brakes, "; ")
		if st.Pause != operator.Running {
			assert.Contains(t, brakes, "the hub is "+string(st.Pause), "%s: %s's brakes", at, m.Name)
		}
		if st.Suspended {
			assert.Contains(t, brakes, "suspended", "%s: %s's brakes", at, m.Name)
		}
		if !stopped && !m.Detached && m.BMCLogin == "" {
			assert.Empty(t, brakes, "%s: %s: brakes while the hub acts", at, m.Name)
		}
	}
	assert.Equal(t, float64(remediating), g.value("hale_hub_remediations_in_flight"), "%s: hale_hub_remediations_in_flight", at)
	assert.Equal(t, float64(detached), g.value("hale_hub_detached_machines"), "%s: hale_hub_detached_machines", at)

	switch {
	case detached > 0:
		return "detached"
	case st.Suspended && st.Holding != "":
		return "suspended, holding"
	case remediating > 0 && st.Pause == operator.Paused:
		return "in a step, paused"
	case remediating > 0:
		return "in a step"
	case st.Budget == nil || !st.Observers.Majority:
		return "warm-up"
	}
	return "steady"
}

// gauges is what CollectStatus sent, by metric name and labels.
type gauges map[string][]*dto.Metric

func gaugesOf(t *testing.T, c *metrics.Collector, st operator.Status) gauges {
	ch := make(chan prometheus.Metric, 256)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`) // the metric name a descriptor describes
	go func() { c.CollectStatus(st, ch); close(ch) }()
	g := gauges{}
	for m := range ch {
		var d dto.Metric
		assert.NoError(t, m.Write(&d))
		name := fqName.FindStringSubmatch(m.Desc().String())[1]
		g[name] = append(g[name], &d)
	}
	return g
}

// find is the gauge of d whose labels include every name=value pair given.
func (g gauges) find(d string, labels ...string) *dto.Metric {
	for _, m := range g[d] {
		if slices.ContainsFunc(pairs(labels), func(p [2]string) bool {
			return !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == p[0] && l.GetValue() == p[1] })
		}) {
			continue
		}
		return m
	}
	return nil
}

// value is the gauge's value, -1 when there is none.
func (g gauges) value(d string, labels ...string) float64 {
	if m := g.find(d, labels...); m != nil {
		return m.GetGauge().GetValue()
	}
	return -1
}

func (g gauges) has(d string) bool { return len(g[d]) > 0 }

func (g gauges) hasFor(d string, labels ...string) bool { return g.find(d, labels...) != nil }

func pairs(kv []string) [][2]string {
	var out [][2]string
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, [2]string{kv[i], kv[i+1]})
	}
	return out
}

// gaugeOf is a condition as a gauge shows it.
func gaugeOf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
