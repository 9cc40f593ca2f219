package hub

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/inventory"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/capture"
)

// testPool is the gossip pool as the hub reads it, for tests of the hub's passes: every node alive,
// reporting now and seeing every etcd member, except the dead ones (gone from gossip, their members
// unreachable, since a minute ago).
type testPool struct {
	mu      sync.Mutex
	nodes   []assess.MachineRef
	dead    map[string]bool
	started map[string]time.Time // when a node's agent started (default: an hour ago)
	// version is the reports' version: each read of the reports is a new round of them, unless
	// frozen (a partition just began: the hub holds the last reports, still fresh).
	version uint64
	frozen  bool
	// witnesses are witness agents (never dead): they report the members' reachability from outside.
	witnesses []string
	// behind lowers a node's reported raft index by that much.
	behind map[string]uint64
	// clusterID, when set, is the etcd cluster ID the nodes report (default testClusterID); clusters
	// sets it for one node. members, when set, is the membership the nodes report (default: every node's).
	clusterID string
	clusters  map[string]string
	members   []string
	// noLeader: the live members' own etcd probe fails ("no leader": quorum lost); they answer their
	// status and their observers.
	noLeader bool
}

// testClusterID is the etcd cluster ID in a testPool's reports; their raft index rises with every read.
const testClusterID = "c0ffee"

func newTestPool(n int, dead ...string) *testPool {
	p := &testPool{dead: map[string]bool{}, started: map[string]time.Time{}, behind: map[string]uint64{}}
	for i := range n {
		p.nodes = append(p.nodes, assess.MachineRef{Name: fmt.Sprintf("cp-%d", i), Node: fmt.Sprintf("cp-%d", i), Member: fmt.Sprintf("etcd-%d", i)})
	}
	for _, d := range dead {
		p.dead[d] = true
	}
	return p
}

func (p *testPool) view(node string, now time.Time) health.PeerView {
	if p.dead[node] {
		return health.PeerView{Name: node, State: health.PeerDead, Since: now.Add(-time.Minute)}
	}
	return health.PeerView{Name: node, State: health.PeerAlive, Since: now.Add(-time.Hour)}
}

func (p *testPool) Reports() map[string]health.Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if !p.frozen {
		p.version++
	}
	out := map[string]health.Report{}
	for _, m := range p.nodes {
		if p.dead[m.Node] {
			continue
		}
		started, ok := p.started[m.Node]
		if !ok {
			started = now.Add(-time.Hour)
		}
		r := health.Report{Node: m.Node, SentAt: now, Version: p.version, Started: started,
			Etcd: &health.EtcdView{ClusterID: cmp.Or(p.clusters[m.Node], p.clusterID, testClusterID), LocalName: m.Member, RaftTerm: 2,
				RaftIndex: 1000 + p.version - p.behind[m.Node]},
			Probes: []health.ProbeResult{{Name: "kubelet", OK: true, Since: now.Add(-time.Hour), CheckedAt: now}, {Name: "etcd", OK: !p.noLeader, Since: now.Add(-time.Hour), CheckedAt: now}}}
		for _, o := range p.nodes {
			reachable := !p.dead[o.Node]
			if p.members == nil || slices.Contains(p.members, o.Member) {
				r.Etcd.Members = append(r.Etcd.Members, health.EtcdMember{Name: o.Member, Reachable: &reachable})
			}
			if o.Node != m.Node {
				r.Peers = append(r.Peers, p.view(o.Node, now))
			}
		}
		out[m.Node] = r
	}
	for _, w := range p.witnesses {
		r := health.Report{Node: w, SentAt: now, Version: p.version, Started: now.Add(-time.Hour), Etcd: &health.EtcdView{}}
		for _, o := range p.nodes {
			reachable := !p.dead[o.Node]
			if p.members == nil || slices.Contains(p.members, o.Member) {
				r.Etcd.Members = append(r.Etcd.Members, health.EtcdMember{Name: o.Member, Reachable: &reachable})
			}
		}
		for _, o := range p.nodes {
			r.Peers = append(r.Peers, p.view(o.Node, now))
		}
		out[w] = r
	}
	return out
}

func (p *testPool) Peers() []health.PeerView {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []health.PeerView
	for _, m := range p.nodes {
		out = append(out, p.view(m.Node, time.Now()))
	}
	for _, w := range p.witnesses {
		out = append(out, p.view(w, time.Now()))
	}
	return out
}

func (p *testPool) KeepJoined([]string) {}

// restart brings a dead node back with a newly started agent.
func (p *testPool) restart(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.dead, node)
	p.started[node] = time.Now()
}

// countingStore counts the journal's reads and writes.
type countingStore struct {
	journal.Store
	reads, writes atomic.Int64
	// hold, when set before the hub runs, holds every Begin until it is closed, then refuses it: the
	// API server of a cluster whose etcd has lost quorum.
	hold chan struct{}
	// late, when set before the hub runs, holds every Begin until it is closed, then writes it: a
	// begin journaled late.
	late chan struct{}
	// wentThrough: that many Begins write the remediation and then fail, as a write the client gave up
	// on while the API server went on with it.
	wentThrough atomic.Int32
}

func (s *countingStore) Begin(ctx context.Context, r journal.Remediation) (journal.Remediation, error) {
	s.writes.Add(1)
	if s.hold != nil {
		select {
		case <-s.hold:
			return r, errors.New("the server was unable to return a response in the time allotted")
		case <-ctx.Done():
			return r, ctx.Err()
		}
	}
	if s.late != nil {
		select {
		case <-s.late:
		case <-ctx.Done():
			return r, ctx.Err()
		}
	}
	if s.wentThrough.Add(-1) >= 0 {
		if _, err := s.Store.Begin(ctx, r); err != nil {
			return r, err
		}
		return r, errors.New("context deadline exceeded (Client.Timeout exceeded while awaiting headers)")
	}
	return s.Store.Begin(ctx, r)
}

func (s *countingStore) Get(ctx context.Context, id string) (journal.Remediation, error) {
	s.reads.Add(1)
	return s.Store.Get(ctx, id)
}

func (s *countingStore) Active(ctx context.Context) ([]journal.Remediation, error) {
	s.reads.Add(1)
	return s.Store.Active(ctx)
}

func (s *countingStore) History(ctx context.Context, machine string) ([]journal.Remediation, error) {
	s.reads.Add(1)
	return s.Store.History(ctx, machine)
}

// passRig is a hub over a testPool, a real bbolt journal and a real Redfish simulator (a system per
// machine), whose passes a test counts.
type passRig struct {
	hub     *Hub
	pool    *testPool
	sim     *bmcsim.Server
	journal *countingStore
	passes  atomic.Uint64
	cancel  context.CancelFunc
	done    chan error
}

func newPassRig(t testing.TB, pool *testPool, p pass.Policy, powerFails map[string]error) *passRig {
	t.Helper()
	var systems []bmcsim.SystemConfig
	for _, m := range pool.nodes {
		systems = append(systems, bmcsim.SystemConfig{ID: m.Name, ShutdownDelay: 30 * time.Millisecond, CycleOffDuration: 30 * time.Millisecond})
	}
	sim, err := bmcsim.Start(bmcsim.Config{Username: "admin", Password: "pw", PlainHTTP: true, Systems: systems})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sim.Close() })
	ep, err := bmc.ParseEndpoint(sim.Endpoint())
	require.NoError(t, err)
	inv := pass.Inventory{Cluster: "test", Policy: p, Witnesses: pool.witnesses}
	for _, m := range pool.nodes {
		e := ep
		e.SystemID = m.Name
		inv.Machines = append(inv.Machines, pass.Machine{MachineRef: m, Strategy: quorum.Reboot, Pool: "control-plane", Endpoint: e,
			Credentials: bmc.NewCredentials("admin", "pw")})
	}
	j, err := boltfile.Open(filepath.Join(t.TempDir(), "journal.db"), 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	r := &passRig{pool: pool, sim: sim, journal: &countingStore{Store: j}, done: make(chan error, 1)}
	cfg := Config{Inventory: inv, Gossip: pool, Journal: r.journal, Marks: j, Recoveries: j, Episodes: j, Tick: 20 * time.Millisecond, Metrics: prometheus.NewRegistry(),
		BMC:       bmc.Options{PollInterval: 10 * time.Millisecond, VerifyTimeout: 5 * time.Second, GracefulTimeout: time.Second},
		AfterPass: func(n uint64) { r.passes.Store(n) }}
	cfg.PowerFor = func(m pass.Machine) (execute.Power, error) {
		if err := powerFails[m.Name]; err != nil {
			return nil, err
		}
		return cfg.BMCPower(m)
	}
	r.hub, err = New(cfg)
	require.NoError(t, err)
	return r
}

func (r *passRig) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	r.cancel = cancel
	go func() { r.done <- r.hub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err != nil {
			t.Errorf("hub.Run: %v", err)
		}
	})
}

// awaitPasses waits until n more passes have ended.
func (r *passRig) awaitPasses(t *testing.T, n uint64) {
	t.Helper()
	target := r.passes.Load() + n
	require.Eventually(t, func() bool { return r.passes.Load() >= target }, 30*time.Second, 5*time.Millisecond, "%d passes", n)
}

func (r *passRig) machine(name string) operator.MachineStatus {
	for _, m := range r.hub.Status(context.Background()).Machines {
		if m.Name == name {
			return m
		}
	}
	return operator.MachineStatus{}
}

func testPolicy() pass.Policy {
	p, err := inventory.PolicyFile{}.Validate()
	if err != nil {
		panic(err)
	}
	return p
}

// A remediation that cannot begin (its BMC client cannot be made: ipmitool missing, a CA file
// unreadable) takes no slot of the rate limit: the next machine starts, and the first is held with
// the reason and tried again later, said once.
func TestAFailedStartTakesNoSlotOfTheRateLimit(t *testing.T) {
	p := testPolicy()
	p.RateMax = 1
	pool := newTestPool(5, "cp-3", "cp-4")
	r := newPassRig(t, pool, p, map[string]error{"cp-3": errors.New(`ipmitool: executable file not found in $PATH`)})
	var events []string
	r.hub.cfg.OnNotice = func(_ time.Time, msg string) { events = append(events, msg) }
	r.run(t)
	require.Eventually(t, func() bool { return r.machine("cp-4").Remediation != nil }, 10*time.Second, 10*time.Millisecond,
		"cp-4 starts though cp-3's remediation could not begin: %v", r.hub.Status(context.Background()))
	r.awaitPasses(t, 10)
	assert.Contains(t, r.machine("cp-3").Decision+r.hub.Status(context.Background()).NotPlanning, "could not begin its remediation: ipmitool: executable file not found")
	assert.Equal(t, 1, r.hub.ledger.StartsWithin(time.Now(), p.RatePer), "only the journaled remediation took a slot")
	hist, err := r.journal.History(t.Context(), "cp-3")
	require.NoError(t, err)
	assert.Empty(t, hist, "nothing journaled for cp-3")
	n := 0
	for _, e := range events {
		if e == "cannot remediate cp-3: ipmitool: executable file not found in $PATH (trying again in 2s)" {
			n++
		}
	}
	assert.Equal(t, 1, n, "said once, not every pass: %q", events)
}

// A remediation that could not begin is tried again soon after a first failure (a journal write that
// timed out on the API server of the machine being healed: the next goes to another), then less and
// less often, up to beginRetry.
func TestBeginRetryBacksOff(t *testing.T) {
	for inARow, want := range map[int]time.Duration{1: 2 * time.Second, 2: 4 * time.Second, 3: 8 * time.Second, 4: 16 * time.Second, 5: pass.BeginRetry, 50: pass.BeginRetry} {
		assert.Equal(t, want, pass.BeginFailure{InARow: inARow}.Wait(), "failure %d in a row", inARow)
	}
}

// In steady state a pass reads nothing from the journal (in Kubernetes mode each read is a List
// against the API server), even for a machine the hub gave up on, and neither does a scrape of
// /metrics: what the brakes count lives in memory, loaded once.
func TestNoJournalReadsInThePass(t *testing.T) {
	p := testPolicy()
	p.Cooldown = time.Millisecond
	pool := newTestPool(5, "cp-4")
	r := newPassRig(t, pool, p, nil)
	// cp-4 failed maxAttempts times before this hub started: it is given up on.
	for range p.MaxAttempts {
		rem, err := r.journal.Begin(t.Context(), journal.Remediation{Machine: "cp-4", Strategy: "reboot", RequestedBy: "hub", Reason: "test"})
		require.NoError(t, err)
		require.NoError(t, r.journal.Intent(t.Context(), rem.ID, 0, "PowerCycle"))
		require.NoError(t, r.journal.Finish(t.Context(), rem.ID, journal.Failed, "not recovered"))
	}
	r.run(t)
	require.Eventually(t, func() bool { return r.passes.Load() > 0 }, 10*time.Second, 5*time.Millisecond)
	r.awaitPasses(t, 3)
	assert.Contains(t, r.machine("cp-4").Decision, "gave up after 3 failed remediations")
	reads, writes := r.journal.reads.Load(), r.journal.writes.Load()
	r.awaitPasses(t, 50)
	_, err := r.hub.cfg.Metrics.(*prometheus.Registry).Gather()
	require.NoError(t, err)
	r.hub.Status(t.Context())
	assert.Zero(t, r.journal.reads.Load()-reads, "journal reads in 50 passes, a scrape and a status")
	assert.Zero(t, r.journal.writes.Load()-writes, "journal writes in 50 passes")
	assert.Contains(t, r.machine("cp-4").Decision, "gave up after 3 failed remediations", "still held, from memory")
	assert.Nil(t, r.machine("cp-4").Remediation)
}

// `GET /v1/remediations/{id}` is a remediation's journal record, what `hub reboot --wait` follows to
// its end; an unknown one is a 404 that names it.
func TestRemediationEndpoint(t *testing.T) {
	pool := newTestPool(3, "cp-2")
	r := newPassRig(t, pool, testPolicy(), nil)
	r.run(t)
	require.Eventually(t, func() bool { return r.machine("cp-2").Remediation != nil }, 10*time.Second, 10*time.Millisecond)
	id := r.machine("cp-2").Remediation.ID
	api := httptest.NewServer(r.hub.APIHandler(""))
	defer api.Close()
	get := func(path string) (int, journal.Remediation) {
		resp, err := http.Get(api.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		var rem journal.Remediation
		if resp.StatusCode == http.StatusOK {
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&rem))
		}
		return resp.StatusCode, rem
	}
	code, rem := get("/v1/remediations/" + id)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, journal.InProgress, rem.State)
	assert.Equal(t, []quorum.Step{{Op: quorum.OpPowerCycle, Member: "etcd-2"}, {Op: quorum.OpAwaitHealthy, Member: "etcd-2"}}, rem.Steps)

	require.Eventually(t, func() bool { return len(r.sim.Resets("cp-2")) > 0 }, 10*time.Second, 10*time.Millisecond)
	pool.restart("cp-2")
	require.Eventually(t, func() bool { _, rem := get("/v1/remediations/" + id); return rem.State == journal.Succeeded }, 10*time.Second, 20*time.Millisecond)
	_, rem = get("/v1/remediations/" + id)
	var results []journal.Result
	for _, ev := range rem.History {
		if ev.Kind == journal.EntryOutcome {
			results = append(results, ev.Result)
		}
	}
	assert.Equal(t, []journal.Result{journal.ResultDone, journal.ResultDone}, results, "typed outcomes: the cycle, the recovery")

	resp, err := http.Get(api.URL + "/v1/remediations/cp-9/20260101T000000Z")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, string(body), "cp-9/20260101T000000Z: no such remediation")

	resp, err = http.Get(api.URL + "/clusters/fleet/w1/v1/status") // an operator command's --cluster
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(body), "this hub heals one cluster (it does not run in a management cluster): drop --cluster")
}

// A remediation found in progress after a restart whose BMC cannot be read yet (here it fails every
// request; one that refuses the credentials is TestOneFailedLoginPerBMCAccountAcrossPasses's) holds its machine and says why, and does not hold up the passes: another machine's
// remediation starts meanwhile. Once the BMC answers, it resumes from what the BMC shows (no reset
// since the intent: the step is taken again, once).
func TestResumeWaitsForItsBMCWithoutHoldingUpThePasses(t *testing.T) {
	pool := newTestPool(5, "cp-2", "cp-3")
	r := newPassRig(t, pool, testPolicy(), nil)
	rem, err := r.journal.Begin(t.Context(), journal.Remediation{Machine: "cp-2", Strategy: "reboot", RequestedBy: "hub", Reason: "before the restart",
		Steps: quorum.MustParseSteps("power-cycle etcd-2", "await-healthy etcd-2")})
	require.NoError(t, err)
	require.NoError(t, r.journal.Intent(t.Context(), rem.ID, 0, "reboot etcd-2 (graceful, then hard)"))
	r.sim.SetFaults(bmcsim.Faults{Fail500: 1 << 30})
	r.run(t)

	// (cp-3's BMC fails too: its remediation begins, and fails.)
	require.Eventually(t, func() bool {
		hist, err := r.journal.History(t.Context(), "cp-3")
		return err == nil && len(hist) > 0
	}, 10*time.Second, 10*time.Millisecond, "cp-3's remediation begins while cp-2's waits for its BMC")
	require.Eventually(t, func() bool {
		st := r.machine("cp-2").Remediation
		return st != nil && st.ID == rem.ID && strings.Contains(st.Stalled, "cannot resume yet")
	}, 10*time.Second, 10*time.Millisecond)
	assert.Empty(t, r.sim.Resets("cp-2"))

	r.sim.SetFaults(bmcsim.Faults{})
	require.Eventually(t, func() bool { return len(r.sim.Resets("cp-2")) > 0 }, 15*time.Second, 10*time.Millisecond)
	pool.restart("cp-2")
	require.Eventually(t, func() bool {
		got, err := r.journal.Get(t.Context(), rem.ID)
		return err == nil && got.State == journal.Succeeded
	}, 15*time.Second, 20*time.Millisecond)
	got, err := r.journal.Get(t.Context(), rem.ID)
	require.NoError(t, err)
	assert.True(t, got.Has(journal.ResultRetaken), "the BMC showed no reset since the intent: taken again")
	assert.Len(t, r.sim.Resets("cp-2"), 1, "once")
}

// A remediation found in progress for a machine no longer in the inventory ends Aborted at start, and
// is said and counted as any end is.
func TestResumeEndsARemediationOfAMachineNoLongerThere(t *testing.T) {
	r := newPassRig(t, newTestPool(3), testPolicy(), nil)
	rem, err := r.journal.Begin(t.Context(), journal.Remediation{Machine: "cp-9", Strategy: "reboot", RequestedBy: "hub", Reason: "before the restart",
		Steps: quorum.MustParseSteps("power-cycle etcd-9", "await-healthy etcd-9")})
	require.NoError(t, err)
	var mu sync.Mutex
	var said []string
	r.hub.cfg.OnNotice = func(_ time.Time, msg string) { mu.Lock(); said = append(said, msg); mu.Unlock() }
	r.run(t)
	r.awaitPasses(t, 2)
	got, err := r.journal.Get(t.Context(), rem.ID)
	require.NoError(t, err)
	assert.Equal(t, journal.Aborted, got.State)
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, said, "cp-9: remediation "+rem.ID+" ended Aborted, found in progress with nobody to carry it out: the machine is no longer in the inventory")
}

// One event path: a notice is the log line (machine, reason and remediation as attributes), the
// timeline, the Kubernetes Event (Notify) and the metric, with one wording.
func TestOneEventPath(t *testing.T) {
	r := newPassRig(t, newTestPool(3, "cp-2"), testPolicy(), nil)
	var logs capture.Buffer
	r.hub.log = slog.New(slog.NewJSONHandler(&logs, nil))
	var mu sync.Mutex
	var timeline []string
	var notices []pass.Notice
	r.hub.cfg.OnNotice = func(_ time.Time, msg string) { mu.Lock(); timeline = append(timeline, msg); mu.Unlock() }
	r.hub.cfg.Notify = func(n pass.Notice) { mu.Lock(); notices = append(notices, n); mu.Unlock() }
	// said waits for the notice of reason the Notify sink got, and checks the timeline, the log line and
	// the metric say it too.
	said := func(reason pass.Reason) pass.Notice {
		t.Helper()
		var got pass.Notice
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, n := range notices {
				if n.Reason == reason {
					got = n
					return true
				}
			}
			return false
		}, 10*time.Second, 10*time.Millisecond)
		mu.Lock()
		assert.Contains(t, timeline, got.Message, "the timeline says it in the same words")
		mu.Unlock()
		var line map[string]any
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, `"reason":"`+string(reason)+`"`) {
				require.NoError(t, json.Unmarshal([]byte(l), &line))
			}
		}
		require.NotNil(t, line, "the log line: %s", logs.String())
		assert.Equal(t, got.Message, line["msg"])
		if got.Machine != "" {
			assert.Equal(t, got.Machine, line["machine"])
		}
		if got.Remediation != "" {
			assert.Equal(t, got.Remediation, line["remediation"])
		}
		mfs, err := r.hub.cfg.Metrics.(*prometheus.Registry).Gather()
		require.NoError(t, err)
		found := false
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == "hale_hub_notices_total" && len(m.GetLabel()) == 2 && m.GetLabel()[0].GetValue() == string(reason) {
					found = m.GetCounter().GetValue() == 1
				}
			}
		}
		assert.True(t, found, "hale_hub_notices_total{reason=%s} 1", reason)
		return got
	}
	r.run(t)
	started := said(pass.ReasonRemediationStarted)
	assert.Equal(t, "cp-2", started.Machine)
	assert.NotEmpty(t, started.Remediation)

	// From outside the pass (a degraded term's import), the same door.
	r.hub.Say(pass.Notice{Reason: pass.ReasonDegradedMode, Warning: true, Message: "the degraded term of hub-a at epoch 3: 1 remediations recorded (cp-2 Succeeded), imported"})
	assert.Equal(t, "the degraded term of hub-a at epoch 3: 1 remediations recorded (cp-2 Succeeded), imported", said(pass.ReasonDegradedMode).Message)
}

// A remediation says each step as its outcome is journaled, the await for the machine included, and
// its end as the journal records it: Remediated only when the journal says Succeeded.
func TestARemediationSaysEachStepAndEndsAsTheJournalSays(t *testing.T) {
	pool := newTestPool(3, "cp-2")
	r := newPassRig(t, pool, testPolicy(), nil)
	var mu sync.Mutex
	var said []string
	r.hub.cfg.Notify = func(n pass.Notice) {
		if n.Machine == "cp-2" && n.Remediation != "" {
			mu.Lock()
			said = append(said, string(n.Reason)+": "+n.Message)
			mu.Unlock()
		}
	}
	r.run(t)
	require.Eventually(t, func() bool { return len(r.sim.Resets("cp-2")) == 1 }, 10*time.Second, 10*time.Millisecond)
	pool.restart("cp-2")
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(said) == 4 }, 10*time.Second, 10*time.Millisecond, "%q", said)
	hist, err := r.journal.History(t.Context(), "cp-2")
	require.NoError(t, err)
	require.Len(t, hist, 1)
	assert.Equal(t, journal.Succeeded, hist[0].State)
	mu.Lock()
	defer mu.Unlock()
	for i, want := range []string{"RemediationStarted: ", "StepDone: cp-2: remediation " + hist[0].ID + ": power-cycle etcd-2: On",
		"StepDone: cp-2: remediation " + hist[0].ID + ": await-healthy etcd-2: back", "Remediated: "} {
		assert.True(t, strings.HasPrefix(said[i], want), "notice %d: %q, want %q…", i, said[i], want)
	}
}

// Degraded mode's test that etcd has quorum again counts only etcd probes checked after the loss: a
// hub that starts at the loss holds reports from before it that say every member is fine.
func TestEtcdQuorumSinceCountsOnlyChecksAfterIt(t *testing.T) {
	r := newPassRig(t, newTestPool(3), testPolicy(), nil)
	r.run(t)
	require.Eventually(t, func() bool { q, _ := r.hub.EtcdQuorum(time.Now().Add(-maxPassGap)); return q == pass.QuorumHeld }, 30*time.Second, 10*time.Millisecond)
	q, why := r.hub.EtcdQuorumSince(time.Now(), time.Now().Add(-time.Minute))
	assert.Equal(t, pass.QuorumHeld, q, why)
	assert.Contains(t, why, "the etcd probe passed since")
	q, why = r.hub.EtcdQuorumSince(time.Now(), time.Now().Add(time.Hour))
	assert.Equal(t, pass.QuorumUnknown, q, why)
	assert.Contains(t, why, "on 0 of the 3 voters' machines (), quorum needs 2")
}

func TestVotersBackSince(t *testing.T) {
	since := time.Date(2026, 11, 27, 19, 29, 15, 0, time.UTC)
	inv := pass.Inventory{}
	for i := range 3 {
		inv.Machines = append(inv.Machines, pass.Machine{MachineRef: assess.MachineRef{Name: fmt.Sprintf("cp-%d", i), Node: fmt.Sprintf("node-%d", i), Member: fmt.Sprintf("etcd-%d", i)}})
	}
	cluster := quorum.Cluster{Members: []quorum.Member{{Name: "etcd-0"}, {Name: "etcd-1"}, {Name: "etcd-2"}, {Name: "etcd-3", Learner: true}, {Name: "etcd-9"}}}
	probe := func(ok bool, at time.Time) []health.ProbeResult {
		return []health.ProbeResult{{Name: "kubelet", OK: true, CheckedAt: since.Add(time.Second)}, {Name: "etcd", OK: ok, CheckedAt: at}}
	}
	for _, tc := range []struct {
		name    string
		reports map[string]health.Report
		back    []string
	}{
		{"none reported", nil, nil},
		{"every probe checked after the loss", map[string]health.Report{
			"node-0": {Probes: probe(true, since.Add(time.Second))}, "node-1": {Probes: probe(true, since.Add(2*time.Second))}, "node-2": {Probes: probe(true, since.Add(time.Millisecond))},
		}, []string{"cp-0", "cp-1", "cp-2"}},
		{"two hung just before the loss: their last reports say fine", map[string]health.Report{
			"node-0": {Probes: probe(false, since.Add(time.Second))}, "node-1": {Probes: probe(true, since.Add(-12*time.Second))}, "node-2": {Probes: probe(true, since)},
		}, nil},
		{"one back after a power-cycle, one running", map[string]health.Report{
			"node-0": {Probes: probe(true, since.Add(20*time.Second))}, "node-1": {Probes: probe(true, since.Add(21*time.Second))}, "node-2": {Probes: probe(true, since.Add(-time.Second))},
		}, []string{"cp-0", "cp-1"}},
		{"no etcd probe", map[string]health.Report{"node-0": {Probes: probe(true, since.Add(time.Second))[:1]}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			back, voters := votersBackSince(cluster, inv, tc.reports, since)
			assert.Equal(t, tc.back, back)
			assert.Equal(t, 4, voters, "the learner is no voter; a member of no machine is one")
		})
	}
}

// An operator's reboot of a machine whose member runs while etcd has lost quorum is held as the pass
// holds it: refused without --force (the pass's hold says `hub reboot --force` if it must be). It went
// through as free: the member fails its own probe ("no leader"), so the quorum check counted it down.
func TestRebootOfARunningMemberWhileQuorumIsLost(t *testing.T) {
	pool := newTestPool(3, "cp-1", "cp-2")
	pool.witnesses, pool.noLeader = []string{"w-0", "w-1"}, true
	p := testPolicy()
	p.Assess.ProbeTimeouts = map[string]time.Duration{"etcd": time.Second}
	r := newPassRig(t, pool, p, nil)
	r.run(t)
	require.Eventually(t, func() bool { q, _ := r.hub.EtcdQuorum(time.Now().Add(-maxPassGap)); return q == pass.QuorumLost }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return r.machine("cp-0").Verdict == assess.VerdictUnhealthy }, 30*time.Second, 10*time.Millisecond)
	ctx := t.Context()
	_, err := r.hub.Reboot(ctx, operator.RebootRequest{Machine: "cp-0", DryRun: true})
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "etcd has lost quorum and etcd-1, etcd-2 do not answer: cp-0's member")
	assert.Contains(t, err.Error(), "--force overrides this")
	res, err := r.hub.Reboot(ctx, operator.RebootRequest{Machine: "cp-0", DryRun: true, Force: true})
	require.NoError(t, err)
	assert.Contains(t, res.Overrides, "etcd has lost quorum")
	// The pass holds it in the same words.
	require.Eventually(t, func() bool {
		return strings.Contains(r.machine("cp-0").Decision, "etcd has lost quorum and etcd-1, etcd-2 do not answer: cp-0's member")
	}, 10*time.Second, 10*time.Millisecond, "the pass: %s", r.machine("cp-0").Decision)
}

// A begin the hub saw fail while its journal write went through (an API server answering after the
// client's timeout) leaves a remediation in progress that nothing runs, and every later begin of the
// machine refused for it: the next begin picks it up as a restarted hub would (the machine is
// power-cycled once, and that remediation, the only one, ends Succeeded). It was a hung node on the
// real kubeadm cluster, never power-cycled.
func TestABeginSeenFailedThatWentThroughIsPickedUp(t *testing.T) {
	pool := newTestPool(3, "cp-2")
	r := newPassRig(t, pool, testPolicy(), nil)
	r.journal.wentThrough.Store(1)
	r.run(t)
	require.Eventually(t, func() bool { return len(r.sim.Resets("cp-2")) > 0 }, 30*time.Second, 10*time.Millisecond)
	pool.restart("cp-2")
	var hist []journal.Remediation
	require.Eventually(t, func() bool {
		hist, _ = r.journal.History(t.Context(), "cp-2")
		return len(hist) == 1 && hist[0].State == journal.Succeeded
	}, 30*time.Second, 20*time.Millisecond, "%+v", hist)
	assert.Len(t, r.sim.Resets("cp-2"), 1, "once")
	assert.True(t, slices.ContainsFunc(r.hub.Timeline(), func(l string) bool {
		return strings.Contains(l, "cp-2: resuming remediation "+hist[0].ID)
	}), "picked up as after a restart: %v", r.hub.Timeline())
}

// A begin whose journal write hangs holds no pass, and its machine is in flight for the planner
// meanwhile (not begun twice); status shows it once journaled. When the journal refuses it, a later
// pass says so, and the machine waits before it is tried again.
func TestQueuedBeginHoldsNoPass(t *testing.T) {
	r := newPassRig(t, newTestPool(3, "cp-2"), testPolicy(), nil)
	r.journal.hold = make(chan struct{})
	r.run(t)
	require.Eventually(t, func() bool { return r.journal.writes.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "cp-2's begin queued")
	r.awaitPasses(t, 20)
	assert.EqualValues(t, 1, r.journal.writes.Load(), "in flight while it is journaled: not begun twice")
	assert.Nil(t, r.machine("cp-2").Remediation, "not shown before it is journaled")
	close(r.journal.hold)
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(r.hub.Timeline(), func(l string) bool { return strings.Contains(l, "cannot remediate cp-2: the journal refused it") })
	}, 10*time.Second, 5*time.Millisecond, "the refusal said by a later pass")
	r.awaitPasses(t, 10)
	assert.EqualValues(t, 1, r.journal.writes.Load(), "then cp-2 waits before it is tried again")
}
