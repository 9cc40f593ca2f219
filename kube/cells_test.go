package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/kube/cells"
	"github.com/hale-dev/hale/kube/lists"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/silent"
)

// cellRuns records what the cells' runs did: which ran, how many at once per Cluster, and when each
// first read its workload cluster.
type cellRuns struct {
	mu      sync.Mutex
	now     map[string]int // runs going on, per Cluster
	most    map[string]int // the most at once
	started map[string]int
	reached map[string]time.Time
}

func (r *cellRuns) enter(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now[name]++
	r.started[name]++
	r.most[name] = max(r.most[name], r.now[name])
}

func (r *cellRuns) leave(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now[name]--
}

func (r *cellRuns) get(name string) (running, started, most int, reached time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.now[name], r.started[name], r.most[name], r.reached[name]
}

// A hub in a management cluster heals each Cluster labelled hale.dev/heal=true, through the
// kubeconfig Secret Cluster API keeps for it: a cell per Cluster, started, restarted and stopped as
// Clusters opt in, out, are deleted or get a new kubeconfig, each on its own (a workload API server
// that hangs, a cell that panics, holds up no other). The shared API server is the management
// cluster, and also cluster "self"'s workload cluster (a self-hosted Cluster's Secret points at
// itself, as after clusterctl move).
func TestManagementCells(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	dir := t.TempDir()
	hung := silent.Listen(t) // a hung API server
	hungCfg := rest.CopyConfig(cfg)
	hungCfg.Host = "https://" + hung.Addr()

	cluster := func(name string, optIn bool) {
		cl := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: clusterv1.ClusterSpec{Paused: new(false)}}
		if optIn {
			cl.Labels = map[string]string{cells.OptInLabel: "true"}
		}
		require.NoError(t, c.Create(ctx, cl))
	}
	secret := func(name string, value []byte) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-kubeconfig",
			Labels: map[string]string{clusterv1.ClusterNameLabel: name}}, Type: "cluster.x-k8s.io/secret",
			Data: map[string][]byte{"value": value}}
		require.NoError(t, client.IgnoreAlreadyExists(c.Create(ctx, s)))
		s.Data = map[string][]byte{"value": value}
		require.NoError(t, c.Update(ctx, s))
	}
	kubeconfig := func(cfg *rest.Config, user string) []byte {
		b, err := os.ReadFile(kubeenv.Kubeconfig(t, cfg, dir, user))
		require.NoError(t, err)
		return b
	}
	require.NoError(t, c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"}}))

	cluster("self", true)
	secret("self", kubeconfig(cfg, ""))
	cluster("frozen", true)
	secret("frozen", kubeconfig(hungCfg, ""))
	cluster("young", true) // no Secret yet: its control plane is not initialized
	cluster("garbled", true)
	secret("garbled", []byte("token: s3cr3t-token\n{{{ not yaml"))
	cluster("panics", true)
	secret("panics", kubeconfig(cfg, "panicky"))
	cluster("other", false) // not opted in
	secret("other", kubeconfig(cfg, ""))

	runs := &cellRuns{now: map[string]int{}, most: map[string]int{}, started: map[string]int{}, reached: map[string]time.Time{}}
	logs := &capture.Buffer{}
	set := &cells.Set{Client: c, Namespace: ns, Retry: 300 * time.Millisecond, Log: slog.New(slog.NewTextHandler(logs, nil)),
		Run: func(ctx context.Context, cell cells.Cell) error {
			name := cell.Cluster.Name
			runs.enter(name)
			defer func() {
				time.Sleep(100 * time.Millisecond) // a hub takes a while to stop (its steps in flight)
				runs.leave(name)
			}()
			if name == "panics" {
				panic("a cell's bug")
			}
			wc, err := kubernetes.NewForConfig(cell.Workload) // no discovery: each call ends with ctx
			if err != nil {
				return err
			}
			for ctx.Err() == nil {
				if _, err := wc.CoreV1().ConfigMaps(ns).Get(ctx, "probe", metav1.GetOptions{}); err == nil {
					runs.mu.Lock()
					if runs.reached[name].IsZero() {
						runs.reached[name] = time.Now()
					}
					runs.mu.Unlock()
				}
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
			return nil
		}}
	status := func() map[string]cells.Status {
		out := map[string]cells.Status{}
		for _, s := range set.Status() {
			out[s.Cluster.Name] = s
		}
		return out
	}

	began := time.Now()
	require.NoError(t, set.Sync(ctx))
	assert.Less(t, time.Since(began), 2*time.Second, "a Sync reads only the management cluster")
	require.Eventually(t, func() bool { _, _, _, at := runs.get("self"); return !at.IsZero() }, 5*time.Second, 20*time.Millisecond)
	_, _, _, at := runs.get("self")
	t.Logf("the cell of Cluster self read its workload cluster %v after the Sync, beside a cell whose API server hangs", at.Sub(began))
	assert.Less(t, at.Sub(began), 2*time.Second)
	running, _, _, _ := runs.get("frozen")
	assert.Equal(t, 1, running, "the frozen Cluster's cell runs (and waits on its API server)")

	st := status()
	assert.NotContains(t, st, "other")
	assert.True(t, st["self"].Running)
	assert.Contains(t, st["young"].Problem, "no Secret "+ns+"/young-kubeconfig: Cluster API writes it once the control plane is initialized")
	assert.False(t, st["young"].Running)
	assert.Contains(t, st["garbled"].Problem, `kubeconfig Secret `+ns+`/garbled-kubeconfig: key "value" does not parse as a kubeconfig`)
	for _, s := range st {
		assert.NotContains(t, s.Problem, "s3cr3t", "a Secret's content is never repeated")
	}
	assert.Contains(t, logs.String(), "garbled-kubeconfig")
	assert.NotContains(t, logs.String(), "s3cr3t")
	require.Eventually(t, func() bool {
		return regexp.MustCompile(`^its cell ended at \d\d:\d\d:\d\dZ: panic: a cell's bug$`).MatchString(status()["panics"].Problem)
	}, 5*time.Second, 20*time.Millisecond)

	// A cell that panicked is started again after Retry, and only then; the others go on meanwhile.
	_, before, _, _ := runs.get("panics")
	require.NoError(t, set.Sync(ctx))
	_, again, _, _ := runs.get("panics")
	assert.Equal(t, before, again, "not at once again")
	time.Sleep(400 * time.Millisecond)
	require.NoError(t, set.Sync(ctx))
	require.Eventually(t, func() bool { _, n, _, _ := runs.get("panics"); return n == before+1 }, 5*time.Second, 20*time.Millisecond)
	assert.Contains(t, status()["panics"].Problem, "panic: a cell's bug", "a cell that keeps failing says so while it is tried again")
	running, started, _, _ := runs.get("self")
	assert.Equal(t, []int{1, 1}, []int{running, started}, "the panics of another cell left self's alone")

	// The young Cluster's Secret appears: its cell starts at the next Sync.
	secret("young", kubeconfig(cfg, ""))
	require.NoError(t, set.Sync(ctx))
	require.Eventually(t, func() bool { _, _, _, at := runs.get("young"); return !at.IsZero() }, 5*time.Second, 20*time.Millisecond)
	assert.Empty(t, status()["young"].Problem)

	// A new kubeconfig: the old run stops before the new one starts, never two at once.
	secret("self", kubeconfig(cfg, "system:admin"))
	require.NoError(t, set.Sync(ctx))
	require.Eventually(t, func() bool {
		require.NoError(t, set.Sync(ctx))
		running, started, _, _ := runs.get("self")
		return running == 1 && started == 2
	}, 5*time.Second, 50*time.Millisecond)
	_, _, most, _ := runs.get("self")
	assert.Equal(t, 1, most, "one run of a cell at a time")

	// An unreadable Secret leaves a running cell alone (it goes on with what it has), and says so.
	secret("young", []byte("nonsense"))
	require.NoError(t, set.Sync(ctx))
	running, _, _, _ = runs.get("young")
	assert.Equal(t, 1, running)
	assert.True(t, status()["young"].Running)
	assert.Contains(t, status()["young"].Problem, "does not parse")

	// Opting out and deleting stop the cells (the frozen one mid-request), and they leave the status.
	var self clusterv1.Cluster
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "self"}, &self))
	delete(self.Labels, cells.OptInLabel)
	require.NoError(t, c.Update(ctx, &self))
	require.NoError(t, c.Delete(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "frozen"}}))
	require.NoError(t, set.Sync(ctx))
	require.Eventually(t, func() bool {
		a, _, _, _ := runs.get("self")
		b, _, _, _ := runs.get("frozen")
		return a == 0 && b == 0
	}, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, set.Sync(ctx))
	st = status()
	assert.NotContains(t, st, "self")
	assert.NotContains(t, st, "frozen")
	assert.True(t, st["young"].Running)

	// The loop's end stops every cell.
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { set.Loop(lctx, time.Hour); close(done) }()
	stop()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Loop did not return")
	}
	for _, s := range set.Status() {
		assert.False(t, s.Running, s.Cluster.String())
	}
}

// asked is a Rebooter that records what it is asked, for machines of inv.
type asked struct {
	mu  sync.Mutex
	by  []string
	inv pass.Inventory
}

func (a *asked) Reboot(_ context.Context, req operator.RebootRequest) (operator.RebootResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.by = append(a.by, req.Machine+" by "+req.By)
	return operator.RebootResult{Remediation: "r-" + req.Machine}, nil
}
func (a *asked) Assessment(string) (assess.Assessment, bool) { return assess.Assessment{}, false }
func (a *asked) Inventory() pass.Inventory                   { return a.inv }
func (a *asked) History(context.Context, string) ([]journal.Remediation, error) {
	return nil, nil
}

// Two Clusters' cells in one namespace of the management cluster (as Cluster API users often keep
// them), each with a machine cp-0: each cell's journal holds its own remediations only (labelled
// with its Cluster), and each cell takes only its own requests: Remediations labelled with its
// Cluster (or unlabelled, naming one of its machines), its MachineHealthChecks' HaleRemediations
// and its Machines' remediate-machine annotations; another cell's are left untouched.
func TestTwoClustersInOneNamespace(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	ja, jb := NewJournal(c, ns, 1, 5).ForCluster("a"), NewJournal(c, ns, 1, 5).ForCluster("b")
	ra, err := ja.Begin(ctx, journal.Remediation{Machine: "cp-0", Strategy: "reboot", Reason: "a's cp-0 hung"})
	require.NoError(t, err)
	rb, err := jb.Begin(ctx, journal.Remediation{Machine: "cp-0", Strategy: "reboot", Reason: "b's cp-0 hung"})
	require.NoError(t, err, "b's cp-0 is not a's: no remediation of it is in progress")
	for _, tc := range []struct {
		j    *Journal
		want string
	}{{ja, ra.ID}, {jb, rb.ID}} {
		active, err := tc.j.Active(ctx)
		require.NoError(t, err)
		require.Len(t, active, 1)
		assert.Equal(t, tc.want, active[0].ID)
		history, err := tc.j.History(ctx, "cp-0")
		require.NoError(t, err)
		require.Len(t, history, 1)
		assert.Equal(t, tc.want, history[0].ID)
	}
	var obj v1alpha1.Remediation
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: ra.ID}, &obj))
	assert.Equal(t, "a", obj.Labels[clusterv1.ClusterNameLabel])

	request := func(name, machine, cluster string) {
		r := &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.RemediationSpec{Machine: machine, Strategy: "reboot", RequestedBy: "alice"}}
		if cluster != "" {
			r.Labels = map[string]string{clusterv1.ClusterNameLabel: cluster}
		}
		require.NoError(t, c.Create(ctx, r))
	}
	request("for-a", "cp-0", "a")
	request("for-b", "cp-0", "b")
	request("unlabelled-a", "a-1", "")
	request("unlabelled-b", "b-9", "")
	_, err = ja.Begin(ctx, journal.Remediation{ID: "for-b", Machine: "a-1", Strategy: "reboot"})
	assert.ErrorContains(t, err, "remediation "+ns+"/for-b is labelled cluster.x-k8s.io/cluster-name=b: not this hub's cluster (\"a\")")
	for _, m := range []struct{ name, cluster string }{{"a-2", "a"}, {"b-2", "b"}} {
		require.NoError(t, c.Create(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: m.name,
			Annotations: map[string]string{clusterv1.RemediateMachineAnnotation: ""}},
			Spec: clusterv1.MachineSpec{ClusterName: m.cluster, Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr("bootstrap")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine", Name: m.name}}}))
	}
	var machineB clusterv1.Machine
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b-2"}, &machineB))
	require.NoError(t, c.Create(ctx, &v1alpha1.HaleRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b-2",
		Labels:          map[string]string{clusterv1.ClusterNameLabel: "b"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: "b-2", UID: machineB.UID}}}}))

	hub := &asked{inv: pass.Inventory{Machines: []pass.Machine{{MachineRef: assess.MachineRef{Name: "cp-0"}}, {MachineRef: assess.MachineRef{Name: "a-1"}}, {MachineRef: assess.MachineRef{Name: "a-2"}}}}}
	s := &RequestSync{Client: c, Namespace: ns, Hub: hub, Epoch: 1, Machines: true, MachineNamespace: ns, Cluster: "a", Log: slog.New(slog.DiscardHandler)}
	require.NoError(t, s.Sync(ctx))
	assert.ElementsMatch(t, []string{
		"cp-0 by alice (kubernetes: Remediation " + ns + "/for-a)",
		"a-1 by alice (kubernetes: Remediation " + ns + "/unlabelled-a)",
		"a-2 by cluster.x-k8s.io/remediate-machine on Machine " + ns + "/a-2",
	}, hub.by, "a's requests only")
	for _, name := range []string{"for-b", "unlabelled-b"} {
		require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &obj))
		assert.Empty(t, obj.Status.Phase, "%s: another cell's, not refused by this one", name)
	}
	var hr v1alpha1.HaleRemediation
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b-2"}, &hr))
	assert.Empty(t, hr.Status.Phase, "b's MachineHealthCheck's request: untouched by a's cell")
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b-2"}, &machineB))
	assert.Contains(t, machineB.Annotations, clusterv1.RemediateMachineAnnotation)
}

// adopting is asked that also adopts a Remediation request into its journal, as the hub does.
type adopting struct {
	*asked
	j *Journal
}

func (a adopting) Reboot(ctx context.Context, req operator.RebootRequest) (operator.RebootResult, error) {
	if req.Adopt != "" {
		if _, err := a.j.Begin(ctx, journal.Remediation{ID: req.Adopt, Machine: req.Machine, Strategy: "reboot", RequestedBy: req.By}); err != nil {
			return operator.RebootResult{}, err
		}
	}
	return a.asked.Reboot(ctx, req)
}

// staleLists lists what the API server held at its first list of each kind, for ever: a shared
// cache that has not seen a single write since.
type staleLists struct {
	c     client.Client
	first map[string]client.ObjectList
}

func (s *staleLists) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	key := fmt.Sprintf("%T", list)
	if s.first[key] == nil {
		if err := s.c.List(ctx, list, opts...); err != nil {
			return err
		}
		s.first[key] = list.DeepCopyObject().(client.ObjectList)
	}
	return s.c.Scheme().Convert(s.first[key].DeepCopyObject(), list, nil)
}

// A management-mode hub's cells poll their requests from one shared cache of the management cluster
// (lists.Shared), which may not have seen the write that took a request yet: each candidate is read
// again live before it is acted on, so a Remediation, a remediate-machine annotation and a
// HaleRemediation are each taken once however stale the list.
func TestRequestsFromAStaleCacheAreTakenOnce(t *testing.T) {
	c, _, ns := shared.Namespace(t)
	ctx := t.Context()
	require.NoError(t, c.Create(ctx, &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "req"},
		Spec: v1alpha1.RemediationSpec{Machine: "cp-0", Strategy: "reboot", RequestedBy: "alice"}}))
	machine := func(name string, annotated bool) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: clusterv1.MachineSpec{ClusterName: "a", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr("bootstrap")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Machine", Name: name}}}
		if annotated {
			m.Annotations = map[string]string{clusterv1.RemediateMachineAnnotation: ""}
		}
		require.NoError(t, c.Create(ctx, m))
		return m
	}
	machine("cp-1", true)
	m2 := machine("cp-2", false)
	require.NoError(t, c.Create(ctx, &v1alpha1.HaleRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cp-2",
		Labels:          map[string]string{clusterv1.ClusterNameLabel: "a"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: "cp-2", UID: m2.UID}}}}))
	inv := pass.Inventory{}
	for _, name := range []string{"cp-0", "cp-1", "cp-2"} {
		inv.Machines = append(inv.Machines, pass.Machine{MachineRef: assess.MachineRef{Name: name}})
	}
	hub := adopting{asked: &asked{inv: inv}, j: NewJournal(c, ns, 1, 5)}
	s := &RequestSync{Client: c, Lists: &staleLists{c: c, first: map[string]client.ObjectList{}}, Namespace: ns, Hub: hub, Epoch: 1,
		Machines: true, MachineNamespace: ns, Cluster: "a", Log: slog.New(slog.DiscardHandler)}
	for range 3 {
		require.NoError(t, s.Sync(ctx))
	}
	assert.ElementsMatch(t, []string{
		"cp-0 by alice (kubernetes: Remediation " + ns + "/req)",
		"cp-1 by cluster.x-k8s.io/remediate-machine on Machine " + ns + "/cp-1",
		"cp-2 by MachineHealthCheck (HaleRemediation " + ns + "/cp-2)",
	}, hub.by, "each request taken once, in three polls of a list that still shows them all untaken")
}

// lists.Shared serves lists from its informer cache once the kind's informer has synced; a kind whose
// informer does not sync in time is listed live from then on, said once.
func TestSharedLists(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	require.NoError(t, c.Create(ctx, &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "req"},
		Spec: v1alpha1.RemediationSpec{Machine: "cp-0", Strategy: "reboot"}}))
	names := func(s Lister) []string {
		var list v1alpha1.RemediationList
		require.NoError(t, s.List(ctx, &list, client.InNamespace(ns)))
		var out []string
		for _, r := range list.Items {
			out = append(out, r.Name)
		}
		return out
	}
	var logs strings.Builder
	cached, err := lists.New(ctx, cfg, c.Scheme(), c, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	assert.Equal(t, []string{"req"}, names(cached), "the informer synced: what the API server holds")
	require.NoError(t, c.Create(ctx, &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "later"},
		Spec: v1alpha1.RemediationSpec{Machine: "cp-1", Strategy: "reboot"}}))
	assert.Eventually(t, func() bool { return len(names(cached)) == 2 }, 10*time.Second, 50*time.Millisecond, "a write reaches the cache by its watch")
	assert.Empty(t, logs.String())

	unsynced, err := lists.New(ctx, cfg, c.Scheme(), c, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	unsynced.SyncWait = time.Nanosecond
	assert.ElementsMatch(t, []string{"req", "later"}, names(unsynced), "listed live")
	assert.ElementsMatch(t, []string{"req", "later"}, names(unsynced), "listed live again")
	var r v1alpha1.Remediation
	require.NoError(t, unsynced.Get(ctx, client.ObjectKey{Namespace: ns, Name: "later"}, &r), "read live")
	assert.Equal(t, "cp-1", r.Spec.Machine)
	assert.Equal(t, 1, strings.Count(logs.String(), "the shared cache cannot serve this kind"), "said once: %s", logs.String())
	assert.Contains(t, logs.String(), "kind=Remediation")
}

// Of two Clusters that name one gossip pool, the older is healed and the newer is told why, however
// their cells were started: a newer one running on it when the older opts in is stopped.
func TestTwoClustersNamingOnePool(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	kubeconfig, err := os.ReadFile(kubeenv.Kubeconfig(t, cfg, t.TempDir(), ""))
	require.NoError(t, err)
	cluster := func(name string, optIn bool) *clusterv1.Cluster {
		cl := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{cells.GossipNameAnnotation: "shared"}},
			Spec: clusterv1.ClusterSpec{Paused: new(false)}}
		if optIn {
			cl.Labels = map[string]string{cells.OptInLabel: "true"}
		}
		require.NoError(t, c.Create(ctx, cl))
		require.NoError(t, c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-kubeconfig"},
			Type: "cluster.x-k8s.io/secret", Data: map[string][]byte{"value": kubeconfig}}))
		return cl
	}
	older := cluster("zeta", false)     // older, and last by name: age decides
	time.Sleep(1100 * time.Millisecond) // creation times are whole seconds
	cluster("alpha", true)
	runs := &cellRuns{now: map[string]int{}, most: map[string]int{}, started: map[string]int{}, reached: map[string]time.Time{}}
	set := &cells.Set{Client: c, Namespace: ns, Retry: time.Hour, Log: slog.New(slog.DiscardHandler),
		Run: func(ctx context.Context, cell cells.Cell) error {
			runs.enter(cell.Cluster.Name)
			defer runs.leave(cell.Cluster.Name)
			<-ctx.Done()
			return nil
		}}
	running := func(name string) bool { n, _, _, _ := runs.get(name); return n > 0 }
	require.NoError(t, set.Sync(ctx))
	require.Eventually(t, func() bool { return running("alpha") }, 5*time.Second, 20*time.Millisecond, "alone on its pool")

	older.Labels = map[string]string{cells.OptInLabel: "true"}
	require.NoError(t, c.Update(ctx, older))
	require.NoError(t, set.Sync(ctx))
	require.Eventually(t, func() bool { return !running("alpha") && running("zeta") }, 5*time.Second, 20*time.Millisecond, "the older Cluster's pool")
	for _, st := range set.Status() {
		if st.Cluster.Name == "alpha" {
			assert.Equal(t, `its gossip pool "shared" is older Cluster API Cluster `+ns+`/zeta's: each cluster's pool needs a name of its own (annotation hale.dev/gossip-cluster)`, st.Problem)
		}
	}
	require.NoError(t, set.Sync(ctx))
	assert.False(t, running("alpha"), "not started again")
}
