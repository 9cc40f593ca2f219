package lab

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
)

// TestStallMatrix: machines that stall and come back by themselves are never power-cycled, and machines
// that really hang still are, on real processes (etcd and agent binaries in network namespaces, the
// `hub run` binary with the shipped policy: stall tolerance 30 s, 10 s when the member is needed for
// quorum; component grace 3 min). Four labs side by side, each a sequence of cases:
//   - freezes of one machine whole (processes stopped, every packet in and out dropped: a VM stun, a
//     storage hang) of 1, 2, 5 and 10 s, then 20 and 28 s: no power action, each an episode that
//     resumed; then a kernel panic its BMC logs, power-cycled within 2 s of the entry, and a real hang,
//     power-cycled within the tolerance + 5 s (and not before it);
//   - two of three frozen at once for 2, 5 and 8 s (quorum lost meanwhile): no power action; then two
//     of three really hung: both cycled, quorum back within the shorter tolerance + boot + 10 s;
//   - a machine's etcd and agent starved to 5 % of a core for 60 s; its etcd member alone hung for
//     60 s (its agent reporting it); 30 % of its packets dropped, both ways, for 60 s: no power action.
//
// Six labs side by side (each case's waits are mostly the machines' own pauses), beside the package's
// other tests: the minority-side partition of more than a minute is TestPartitionLongerThanAMinuteHeals.
func TestStallMatrix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, l *stallLab)
	}{
		{"short-freezes-then-a-panic", shortFreezesThenAPanic},
		{"long-freezes-then-a-hang", longFreezesThenAHang},
		{"two-at-once", twoAtOnce},
		{"starved", starved},
		{"etcd-hung", etcdHung},
		{"lossy", lossy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, startStallLab(t))
		})
	}
}

// stallLab is a lab of three machines and two witnesses with the shipped policy (the lab's cooldown
// aside), that keeps every BMC reset request with its time.
type stallLab struct {
	c        *Cluster
	mu       sync.Mutex
	requests []bmcRequest
}

type bmcRequest struct {
	machine string
	at      time.Time
}

func startStallLab(t *testing.T) *stallLab {
	l := &stallLab{}
	l.c = Start(t, bins, Shape{Machines: 3, Witnesses: 2}, Options{OnEvent: func(kind, target, _ string) {
		if kind == "bmc-request" {
			l.mu.Lock()
			l.requests = append(l.requests, bmcRequest{machine: strings.SplitN(target, "/", 2)[0], at: time.Now()})
			l.mu.Unlock()
		}
	}})
	waitHealthy(t, l.c, 90*time.Second, "at start")
	return l
}

// since are the BMC reset requests since at.
func (l *stallLab) since(at time.Time) []bmcRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []bmcRequest
	for _, r := range l.requests {
		if !r.at.Before(at) {
			out = append(out, r)
		}
	}
	return out
}

// noPowerAction checks that no BMC request went out since at, and says the case passed with what the
// hub saw of it.
func (l *stallLab) noPowerAction(t *testing.T, at time.Time, what string, machines ...*Machine) {
	t.Helper()
	took := waitHealthy(t, l.c, 3*time.Minute, "after "+what)
	require.Empty(t, l.since(at), "%s: power actions\n%s", what, l.hubLog())
	var eps []string
	for _, m := range machines {
		if e, ok := l.lastEpisode(t, m, at); ok {
			eps = append(eps, fmt.Sprintf("%s %s %s for %v", m.Name, e.Kind, e.Outcome, e.Length().Round(100*time.Millisecond)))
			require.Equal(t, pass.EpisodeResumed, e.Outcome, "%s: %s's episode", what, m.Name)
		}
	}
	stallLine(t, "%s: 0 power actions; every machine Healthy %v after%s", what, took.Round(100*time.Millisecond), episodes(eps))
}

func episodes(eps []string) string {
	if len(eps) == 0 {
		return " (no episode: never Unhealthy)"
	}
	return " (episodes: " + strings.Join(eps, ", ") + ")"
}

// lastEpisode is m's last episode that began since at, from `hub explain -o json`.
func (l *stallLab) lastEpisode(t *testing.T, m *Machine, at time.Time) (pass.Episode, bool) {
	t.Helper()
	eps := l.episodesSince(t, m, at)
	if len(eps) == 0 {
		return pass.Episode{}, false
	}
	return eps[len(eps)-1], true
}

// episodesSince are m's episodes that began since at (5 s before it at the earliest: an episode begins
// at the machine's last sign of life), oldest first, from `hub explain -o json`.
func (l *stallLab) episodesSince(t *testing.T, m *Machine, at time.Time) []pass.Episode {
	t.Helper()
	e, _ := explain(t, l.c, m.Name)
	var out []pass.Episode
	for _, ep := range e.Episodes {
		if !ep.Began.Before(at.Add(-5 * time.Second)) {
			out = append(out, ep)
		}
	}
	return out
}

// hubLog is the hub's lines about verdicts, holds and remediations, for a failure.
func (l *stallLab) hubLog() string {
	return hubLines(l.c, "Unhealthy", "Resumed", "MayResume", "RestartFirst", "emediation", "Quorum")
}

// stallLine logs a result of the matrix and prints it for test/run's output (docs/testing.md keeps
// them).
func stallLine(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	fmt.Printf("stall matrix: %s\n", line)
}

func sleepCtx(t *testing.T, d time.Duration) {
	select {
	case <-t.Context().Done():
	case <-time.After(d):
	}
}

// freezes freezes m whole for each of ds in turn, each time checking that nothing was done.
func (l *stallLab) freezes(t *testing.T, m *Machine, ds ...time.Duration) {
	for _, d := range ds {
		at := time.Now()
		m.Freeze()
		sleepCtx(t, d)
		m.Thaw()
		l.noPowerAction(t, at, fmt.Sprintf("%s frozen %v", m.Name, d), m)
		sleepCtx(t, 2*time.Second) // its etcd member catches up
	}
}

// shortFreezesThenAPanic: cp-2 frozen whole for 1, 2, 5 and 10 s; then cp-1 panics, its BMC logging it:
// proof of a hang, acted on at once.
func shortFreezesThenAPanic(t *testing.T, l *stallLab) {
	l.freezes(t, l.c.Machines[2], time.Second, 2*time.Second, 5*time.Second, 10*time.Second)
	p := l.c.Machines[1]
	logged := p.Panic()
	l.awaitProof(t, p, logged)
	reset := l.since(logged)[0].at.Sub(logged)
	took := waitHealthy(t, l.c, 2*time.Minute, "after "+p.Name+"'s power-cycle")
	// Acted on the proof; as it reboots it may come into view and go again, an episode the remediation
	// in flight makes acted: none came back by itself.
	eps := l.episodesSince(t, p, logged)
	require.True(t, slices.ContainsFunc(eps, func(e pass.Episode) bool { return e.Outcome == pass.EpisodeProved }), "%s's episodes: %+v, want one acted on its BMC's proof", p.Name, eps)
	require.False(t, slices.ContainsFunc(eps, func(e pass.Episode) bool { return e.Outcome == pass.EpisodeResumed }), "%s's episodes: %+v, none resumed", p.Name, eps)
	stallLine(t, "%s panicked, its BMC's event log an OS critical stop: power-cycled %v after the entry, every machine Healthy %v later", p.Name,
		reset.Round(10*time.Millisecond), took.Round(100*time.Millisecond))
}

// longFreezesThenAHang: cp-2 frozen whole for 20 and 28 s; then hung for good: power-cycled once the
// tolerance has passed without a sign of life, not before.
func longFreezesThenAHang(t *testing.T, l *stallLab) {
	m := l.c.Machines[2]
	l.freezes(t, m, 20*time.Second, 28*time.Second)
	// The freeze isolates the machine's network namespace (two iptables calls, seconds on a loaded
	// machine) before it stops its processes: its silence begins somewhere in between. So the
	// tolerance is checked from the start (it cannot have been silent longer) and the bound from the
	// end (it has been silent at least that long).
	at := time.Now()
	m.Freeze()
	stopped := time.Now()
	tol := pass.DefaultStallTolerance
	l.awaitRequest(t, m, stopped, tol+5*time.Second, "the real hang of "+m.Name)
	reset := l.since(at)[0].at.Sub(at)
	require.GreaterOrEqual(t, reset, tol-time.Second, "power-cycled before its stall tolerance of %v", tol)
	took := waitHealthy(t, l.c, 2*time.Minute, "after "+m.Name+"'s power-cycle")
	stallLine(t, "%s hung for good: power-cycled %v after the hang (tolerance %v; the freeze took %v), every machine Healthy %v later", m.Name,
		reset.Round(100*time.Millisecond), tol, stopped.Sub(at).Round(10*time.Millisecond), took.Round(100*time.Millisecond))
}

// awaitRequest waits within d of at for a BMC reset request for m; it fails the test, with the hub's
// lines, when none came.
func (l *stallLab) awaitRequest(t *testing.T, m *Machine, at time.Time, d time.Duration, what string) {
	t.Helper()
	deadline := at.Add(d)
	for time.Now().Before(deadline) {
		if slices.ContainsFunc(l.since(at), func(r bmcRequest) bool { return r.machine == m.Name }) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: no BMC request for %s within %v\n%s", what, m.Name, d, l.hubLog())
}

// awaitProof waits for m's power-cycle on its BMC's proof of the hang logged at logged: within 2 s of
// the entry, or, when the hub called m Unhealthy later than that (its gossip slow on a loaded
// machine: the proof is read once the machine is seen dead), within 2 s of that verdict.
func (l *stallLab) awaitProof(t *testing.T, m *Machine, logged time.Time) {
	t.Helper()
	deadline, seen := logged.Add(2*time.Second), false
	for !slices.ContainsFunc(l.since(logged), func(r bmcRequest) bool { return r.machine == m.Name }) {
		if !seen {
			if st, err := status(t.Context(), l.c); err == nil && slices.ContainsFunc(st.Machines, func(s operator.MachineStatus) bool {
				return s.Name == m.Name && (s.Verdict == assess.VerdictUnhealthy || s.Remediation != nil)
			}) {
				seen = true
				if at := time.Now().Add(2 * time.Second); at.After(deadline) {
					t.Logf("the hub called %s Unhealthy %v after the entry: its proof is read from then", m.Name, time.Since(logged).Round(100*time.Millisecond))
					deadline = at
				}
			}
		}
		if time.Now().After(deadline) && (seen || time.Since(logged) > 20*time.Second) {
			t.Fatalf("the panic of %s: no BMC request within 2 s of the entry (or of its verdict)\n%s", m.Name, l.hubLog())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// twoAtOnce: cp-1 and cp-2 frozen together for 2, 5 and 8 s; then both hung for good.
func twoAtOnce(t *testing.T, l *stallLab) {
	a, b := l.c.Machines[1], l.c.Machines[2]
	for _, d := range []time.Duration{2, 5, 8} {
		d *= time.Second
		at := time.Now()
		both(a, b, (*Machine).Freeze)
		sleepCtx(t, d)
		both(a, b, (*Machine).Thaw)
		l.noPowerAction(t, at, fmt.Sprintf("%s and %s frozen %v (quorum lost)", a.Name, b.Name, d), a, b)
		sleepCtx(t, 2*time.Second)
	}

	at := time.Now()
	both(a, b, (*Machine).Freeze)
	tol := pass.DefaultStallToleranceNeeded
	for _, m := range []*Machine{a, b} {
		l.awaitRequest(t, m, at, tol+10*time.Second, "two of three hung")
	}
	back := l.awaitQuorum(t, at, tol+30*time.Second)
	var cycled []string
	for _, r := range l.since(at) {
		cycled = append(cycled, fmt.Sprintf("%s at %v", r.machine, r.at.Sub(at).Round(100*time.Millisecond)))
	}
	require.LessOrEqual(t, back, tol+10*time.Second+l.boot(t), "quorum back within the tolerance + boot + 10 s")
	took := waitHealthy(t, l.c, 2*time.Minute, "after the two power-cycles")
	stallLine(t, "%s and %s hung for good: power-cycled (%s; tolerance %v), etcd's quorum back %v after the hang, every machine Healthy %v later",
		a.Name, b.Name, strings.Join(cycled, ", "), tol, back.Round(100*time.Millisecond), took.Round(100*time.Millisecond))
}

func both(a, b *Machine, f func(*Machine)) {
	done := make(chan struct{})
	go func() { f(a); close(done) }()
	f(b)
	<-done
}

// boot is how long the lab's machines take to boot: the BMC's power-on and etcd's start.
func (l *stallLab) boot(*testing.T) time.Duration { return 5 * time.Second }

// awaitQuorum waits until etcd serves a linearizable read on cp-0 (quorum back), within d of at, and
// returns how long after at that was.
func (l *stallLab) awaitQuorum(t *testing.T, at time.Time, d time.Duration) time.Duration {
	t.Helper()
	cli, err := l.c.EtcdClient(l.c.Machines[0])
	require.NoError(t, err)
	defer cli.Close()
	for time.Since(at) < d {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := cli.Get(ctx, "hale-stall-matrix")
		cancel()
		if err == nil && time.Since(at) > 2*time.Second {
			return time.Since(at)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("etcd's quorum not back within %v\n%s", d, l.hubLog())
	return 0
}

// starved: cp-0's etcd member and agent at 5 % of a core for 60 s.
func starved(t *testing.T, l *stallLab) {
	m := l.c.Machines[0]
	at := time.Now()
	undo := m.Starve(0.05)
	sleepCtx(t, 60*time.Second)
	throttled := undo()
	l.noPowerAction(t, at, fmt.Sprintf("%s's etcd and agent starved to 5 %% of a core for 60s (throttled in %d periods of 100 ms)", m.Name, throttled), m)
	require.Positive(t, throttled, "the quota never throttled them")
}

// etcdHung: cp-0's etcd member alone hung for 60 s, its agent reporting it: the kubelet's restart of it
// comes first.
func etcdHung(t *testing.T, l *stallLab) {
	m := l.c.Machines[0]
	at := time.Now()
	m.SignalEtcd(syscall.SIGSTOP)
	var said []string // what the hub said it decided about it, every 2 s
	for time.Since(at) < 60*time.Second {
		said = append(said, explainDecision(t, l.c, m.Name))
		sleepCtx(t, 2*time.Second)
	}
	m.SignalEtcd(syscall.SIGCONT)
	l.noPowerAction(t, at, m.Name+"'s etcd member alone hung for 60s, its agent reporting", m)
	require.True(t, slices.ContainsFunc(said, func(d string) bool { return strings.Contains(d, "waiting for the kubelet's restart of etcd") }),
		"the hold the hub said while it waited: %q", said)
}

// lossy: 30 % of cp-1's packets dropped, both ways, for 60 s.
func lossy(t *testing.T, l *stallLab) {
	m := l.c.Machines[1]
	at := time.Now()
	undo := m.Lossy(0.30)
	sleepCtx(t, 60*time.Second)
	undo()
	l.noPowerAction(t, at, "30 % of "+m.Name+"'s packets dropped both ways for 60s", m)
}

// explain is `hub explain NAME -o json` (ok false: it failed).
func explain(t *testing.T, c *Cluster, name string) (operator.Explanation, bool) {
	var e operator.Explanation
	out, err := c.HubOutput(t.Context(), "explain", name, "-o", "json")
	return e, err == nil && jsonInto(out, &e) == nil
}

// explainDecision is what the hub says it decided about name (its hold), from `hub explain`.
func explainDecision(t *testing.T, c *Cluster, name string) string {
	e, _ := explain(t, c, name)
	return e.Machine.Decision
}
