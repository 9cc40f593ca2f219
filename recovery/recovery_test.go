package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/kubeassets"
	"github.com/hale-dev/hale/test/proc"
	"github.com/hale-dev/hale/test/staticpod"
)

// member is one control-plane machine of the test: its etcd runs as a static pod, from a kubeadm-style
// manifest, under a stand-in for the kubelet that runs the real etcd binary (test/staticpod).
type member struct {
	name, dir, manifest string
	client, peer        string
	kubelet             *staticpod.Kubelet
}

type cluster struct {
	t       testing.TB
	members []*member
}

// startCluster starts n real etcd members, each as a static pod of its own node directory.
func startCluster(t testing.TB, n int) *cluster {
	etcd := filepath.Join(kubeassets.Dir(), "etcd")
	if _, err := os.Stat(etcd); err != nil {
		t.Fatalf("the etcd binary (test/kube/build-assets builds it, or set KUBEBUILDER_ASSETS): %v", err)
	}
	c := &cluster{t: t}
	var initial []string
	for i := range n {
		node := t.TempDir()
		m := &member{name: fmt.Sprintf("etcd-%d", i+1), dir: filepath.Join(node, "var-lib-etcd"), manifest: filepath.Join(node, "manifests", "etcd.yaml"),
			client: fmt.Sprintf("http://127.0.0.1:%d", proc.FreePort(t)), peer: fmt.Sprintf("http://127.0.0.1:%d", proc.FreePort(t))}
		require.NoError(t, os.MkdirAll(filepath.Dir(m.manifest), 0o755))
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peer)
	}
	for _, m := range c.members {
		m.writeManifest(t, strings.Join(initial, ","), "new")
		m.kubelet = staticpod.Run(t, etcd, m.name, m.manifest)
	}
	cli := c.client(c.members...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := cli.Put(ctx, "/registry/ready", "yes"); err == nil {
			break
		}
		require.NoError(t, ctx.Err(), "the cluster did not come up")
		time.Sleep(100 * time.Millisecond)
	}
	return c
}

// writeManifest writes m's static pod manifest.
func (m *member) writeManifest(t testing.TB, initial, state string) {
	require.NoError(t, staticpod.WriteManifest(m.manifest, staticpod.Etcd{Name: m.name, DataDir: m.dir, Client: m.client, Peer: m.peer,
		Initial: initial, State: state, Token: "test"}))
}

func (c *cluster) client(ms ...*member) *clientv3.Client {
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.client)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	require.NoError(c.t, err)
	c.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// loseForGood powers members off and destroys their data directories (dead disks).
func (c *cluster) loseForGood(ms ...*member) {
	for _, m := range ms {
		m.kubelet.PowerOff()
		require.NoError(c.t, os.RemoveAll(m.dir))
	}
}

// write puts n keys under prefix and returns the revision of the last. A put is tried again when it
// fails (a member just powered off may have been the leader: the put in flight times out).
func write(t *testing.T, cli *clientv3.Client, prefix string, n int) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rev int64
	for i := range n {
		var r *clientv3.PutResponse
		var err error
		for try := 0; try < 5; try++ {
			if r, err = cli.Put(ctx, fmt.Sprintf("%s/%04d", prefix, i), strings.Repeat("v", 100)); err == nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		require.NoError(t, err)
		rev = r.Header.Revision
	}
	return rev
}

// planFor is the plan `hub recover --yes` would hand the node: s the survivor, lost fenced.
func (c *cluster) planFor(s *member, lost ...*member) Plan {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.client(s).Status(ctx, s.client)
	require.NoError(c.t, err)
	p := Plan{Time: time.Now(), Survivor: &quorum.Survivor{Member: s.name, Machine: "cp-" + s.name, ClusterID: hexID(st.Header.ClusterId), Index: st.RaftIndex},
		BumpRevision: 10000, Token: "hale-test-" + hexID(st.Header.ClusterId)}
	for _, m := range lost {
		p.Fence = append(p.Fence, quorum.FenceStep{Machine: "cp-" + m.name, Member: m.name, Fenced: true, How: "BMC"})
	}
	return p
}

func (m *member) node(t testing.TB, out *strings.Builder) Node {
	state := filepath.Join(filepath.Dir(m.dir), "hale-recovery")
	return Node{Endpoint: m.client, Layout: StaticPod{Manifest: m.manifest, Parked: filepath.Join(state, "etcd.yaml")},
		DataDir: m.dir, StateDir: state, Out: out, StopTimeout: 30 * time.Second, StartTimeout: time.Minute}
}

// standInAPIServer runs a stand-in API server on m's node: a static pod beside its etcd manifest
// (a uniquely named process, so that it can be told apart), under a stand-in kubelet; it returns the
// manifest, the process's command line and the kubelet. One that holdsOn ignores SIGTERM, as
// kubeadm's API server outlasts the kubelet's 30-s grace period, until the stand-in kubelet kills
// it after its own 30 s.
func standInAPIServer(t *testing.T, m *member, holdsOn bool) (string, []string, *staticpod.Kubelet) {
	apiserver := filepath.Join(filepath.Dir(m.manifest), "kube-apiserver.yaml")
	argv := []string{"sleep", fmt.Sprintf("3600.%d", proc.FreePort(t))}
	if holdsOn {
		self, err := os.Executable()
		require.NoError(t, err)
		argv = []string{self, holdsOnFlag, argv[1]}
	}
	require.NoError(t, os.WriteFile(apiserver, []byte(`apiVersion: v1
kind: Pod
metadata: {name: kube-apiserver, namespace: kube-system}
spec:
  containers:
  - name: kube-apiserver
    command: ["`+strings.Join(argv, `", "`)+`"]
`), 0o600))
	k := staticpod.Run(t, "", "kube-apiserver", apiserver)
	if holdsOn {
		t.Cleanup(k.PowerOff) // before the stand-in kubelet's own stop, which would wait out its 10 s
	}
	require.Eventually(t, func() bool { return len(running(argv)) > 0 }, 10*time.Second, 50*time.Millisecond)
	return apiserver, argv, k
}

// The whole node-side recovery on real etcd members: two of three lost for good, the survivor (the
// last listed) rebuilt as a one-member cluster with every key it had, a new cluster ID, revisions
// moved forward by the bump; an old member powered on again with its old data can neither rejoin nor
// serve; the cluster grown back to three, one learner at a time.
func TestRecoverFromTheSurvivor(t *testing.T) {
	t.Parallel() // real etcd members mostly wait: the tests of the package run side by side
	c := startCluster(t, 3)
	m1, m2, m3 := c.members[0], c.members[1], c.members[2]
	cli := c.client(m1, m2, m3)
	rev := write(t, cli, "/registry/before", 300)
	require.True(t, c.holds(t.Context(), m3, 301), "the survivor has every key before the others are lost")

	// The survivor's node runs an API server too (a stand-in process): restarted once etcd is rebuilt.
	apiserver, argv, apiKubelet := standInAPIServer(t, m3, true)

	m2.kubelet.PowerOff() // fenced: its data stays, it must never come back into the cluster
	c.loseForGood(m1)     // its disk is gone
	p := c.planFor(m3, m1, m2)

	var out strings.Builder
	start := time.Now()
	n := m3.node(t, &out)
	n.KillAfter = time.Second
	n.Restart = []StaticPod{{Manifest: apiserver, Parked: filepath.Join(n.StateDir, "kube-apiserver.yaml")},
		{Manifest: filepath.Join(filepath.Dir(m3.manifest), "kube-scheduler.yaml"), Parked: filepath.Join(n.StateDir, "kube-scheduler.yaml")}} // not on this node
	r, err := Recover(context.Background(), n, p)
	require.NoError(t, err, out.String())
	t.Logf("recovered in %v:\n%s", time.Since(start).Round(time.Millisecond), out.String())
	assert.Equal(t, StepDone, r.Step)
	require.Eventually(t, func() bool { return apiKubelet.Runs() == 2 && len(running(argv)) > 0 }, 10*time.Second, 50*time.Millisecond,
		"the API server restarted once, and runs again")
	assert.Contains(t, out.String(), "its process still runs 1s after its manifest was moved out: killing it",
		"the API server holding on through its grace period is killed after KillAfter, not waited out")
	assert.NotEqual(t, p.Survivor.ClusterID, r.NewClusterID)
	assert.GreaterOrEqual(t, r.Revision, rev+int64(p.BumpRevision), "revisions move forward by the bump")
	manifest, err := os.ReadFile(apiserver)
	require.NoError(t, err)
	assert.Contains(t, string(manifest), RestartedAnnotation+": "+r.NewClusterID, "put back as a new pod to the kubelet")

	c3 := c.client(m3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := c3.Get(ctx, "/registry/before/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	assert.EqualValues(t, 300, got.Count, "every key the survivor had")
	_, err = c3.Get(ctx, "/registry/before/0000", clientv3.WithRev(rev))
	assert.Error(t, err, "the old revisions are compacted: a watcher from before must list again")
	next, err := c3.Put(ctx, "/registry/after", "x")
	require.NoError(t, err)
	assert.Greater(t, next.Header.Revision, rev+int64(p.BumpRevision))
	aside, err := os.Stat(filepath.Join(r.Aside, "member", "snap", "db"))
	require.NoError(t, err, "the old data is kept aside")
	assert.Positive(t, aside.Size())

	// The fenced member powered on again with its old data: it cannot rejoin or serve.
	m2.kubelet.PowerOn()
	c2 := c.client(m2)
	time.Sleep(3 * time.Second)
	qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = c2.Get(qctx, "/registry/after")
	qcancel()
	assert.Error(t, err, "the old member must not serve a linearizable read")
	ml, err := c3.MemberList(ctx)
	require.NoError(t, err)
	assert.Len(t, ml.Members, 1, "the old member did not rejoin")
	m2.kubelet.PowerOff()

	c.growBack(p, m3, 300, m1, m2)
}

// growBack powers ms on again (repaired: with their old data, or an empty disk, and the manifest they
// had) and rejoins each to the survivor's cluster (`agent rejoin`), one at a time; the first is
// rejoined twice (a rerun finds it done). Then every member has the survivor's keys.
func (c *cluster) growBack(p Plan, survivor *member, keys int64, ms ...*member) {
	t := c.t
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli := c.client(survivor)
	var out strings.Builder
	_, err := Rejoin(ctx, survivor.node(t, &out), p, Member{Name: survivor.name, PeerURL: survivor.peer}, []string{survivor.client})
	require.ErrorContains(t, err, "is the plan's survivor: its part is `agent recover`")
	other := p
	other.Survivor = &quorum.Survivor{Member: "etcd-9", ClusterID: p.Survivor.ClusterID}
	_, err = Rejoin(ctx, ms[0].node(t, &out), other, Member{Name: ms[0].name, PeerURL: ms[0].peer}, []string{survivor.client})
	require.ErrorContains(t, err, "has no member etcd-9, the plan's survivor: it is not the cluster rebuilt from this plan")
	_, err = os.Stat(ms[0].manifest)
	require.NoError(t, err, "nothing stopped when a check fails")
	for i, m := range ms {
		_, hadData := os.Stat(filepath.Join(m.dir, "member"))
		m.kubelet.PowerOn()
		self, err := ManifestMember(m.manifest)
		require.NoError(t, err)
		runs := 1
		if i == 0 {
			runs = 2 // the rerun finds it a voter already
		}
		for range runs {
			j, err := Rejoin(ctx, m.node(t, &out), p, self, []string{survivor.client})
			require.NoError(t, err, out.String())
			assert.Equal(t, m.name, j.Member)
			if hadData == nil {
				hadData = errors.New("moved aside by the first run")
				assert.NotEmpty(t, j.Aside, "%s's old data is kept aside", m.name)
			}
		}
	}
	t.Logf("rejoined:\n%s", out.String())
	ml, err := cli.MemberList(ctx)
	require.NoError(t, err)
	assert.Len(t, ml.Members, len(c.members))
	for _, m := range c.members {
		c.holds(ctx, m, keys)
	}
}

// holds waits until m has at least n keys under /registry/ in its own data (a serializable read),
// and says whether it came to: a put returns once a majority has it, so a member may still be an
// entry behind, and a member promoted a moment ago may still be applying what the leader sent it.
func (c *cluster) holds(ctx context.Context, m *member, n int64) bool {
	return assert.EventuallyWithT(c.t, func(ct *assert.CollectT) {
		g, err := c.client(m).Get(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())
		if assert.NoError(ct, err, m.name) {
			assert.GreaterOrEqual(ct, g.Count, n, m.name)
		}
	}, 30*time.Second, 100*time.Millisecond)
}

// Five members, three lost for good: the two that answer are etcd-3, ahead, and etcd-5, which was
// off while the others went on writing. The recovery rebuilds from etcd-3 with every key; etcd-5,
// still running as the old cluster, can neither serve nor join, and is added back like the lost ones.
func TestRecoverFiveMembersThreeLost(t *testing.T) {
	t.Parallel() // real etcd members mostly wait: the tests of the package run side by side
	c := startCluster(t, 5)
	m := c.members
	write(t, c.client(m...), "/registry/before", 200)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	behind, err := c.client(m[4]).Status(ctx, m[4].client)
	require.NoError(t, err)
	m[4].kubelet.PowerOff()
	write(t, c.client(m[:4]...), "/registry/later", 100)
	require.True(t, c.holds(ctx, m[2], 301), "etcd-3 has every key before the others are lost")
	c.loseForGood(m[0], m[1], m[3])
	// etcd-5 runs again on its old data: without a quorum to publish itself to, it serves no client,
	// but it is up, at its peer URL, as an old member not fenced.
	m[4].kubelet.PowerOn()
	require.Eventually(t, func() bool { return answers(ctx, m[4].peer) }, 30*time.Second, 50*time.Millisecond)
	p := c.planFor(m[2], m[0], m[1], m[3])
	require.Greater(t, p.Survivor.Index, behind.RaftIndex, "etcd-3 is the most advanced")

	var out strings.Builder
	_, err = Recover(ctx, m[2].node(t, &out), p)
	require.NoError(t, err, out.String())
	got, err := c.client(m[2]).Get(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	assert.EqualValues(t, 301, got.Count, "every key of etcd-3, /registry/ready included")
	qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = c.client(m[4]).Get(qctx, "/registry/later/0000")
	qcancel()
	assert.Error(t, err, "the old cluster's member that was behind must not serve")
	c.growBack(p, m[2], 301, m[0], m[1], m[3], m[4])
}

// TestMain runs the recovery as a child process when asked (HALE_RECOVERY_CHILD holds its node and
// plan): the crash test kills it with SIGKILL at each step.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == holdsOnFlag { // standInAPIServer's process that holds on
		signal.Ignore(syscall.SIGTERM)
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	if spec := os.Getenv("HALE_RECOVERY_CHILD"); spec != "" {
		var c childSpec
		if err := json.Unmarshal([]byte(spec), &c); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		n := Node{Endpoint: c.Endpoint, Layout: StaticPod{Manifest: c.Manifest, Parked: c.Parked}, DataDir: c.DataDir, StateDir: c.StateDir,
			Out: os.Stdout, StopTimeout: 30 * time.Second, StartTimeout: time.Minute, Restart: c.Restart,
			journaled: func(s Step) {
				if s == c.StopAt {
					time.Sleep(time.Hour) // until the test kills it
				}
			}}
		if _, err := Recover(context.Background(), n, c.Plan); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// holdsOnFlag makes the test binary a stand-in API server that ignores SIGTERM (standInAPIServer).
const holdsOnFlag = "-hale-stand-in-holds-on"

type childSpec struct {
	Endpoint, Manifest, Parked, DataDir, StateDir string
	Plan                                          Plan
	Restart                                       []StaticPod
	// StopAt is the step after whose journaling the child stops, to be killed.
	StopAt Step
}

// The node-side command killed (SIGKILL) just after it journaled each step (it stops there), then run again: the
// recovery completes, with every key, and never leaves two clusters or a half-restored member; the
// node's API server (a stand-in static pod, whose restart is the step after Started) runs again.
func TestRecoverKilledAtEveryStep(t *testing.T) {
	for _, at := range []Step{StepChecked, StepStopped, StepAside, StepRestored, StepStarted} {
		t.Run(string(at), func(t *testing.T) {
			t.Parallel()
			c := startCluster(t, 3)
			m1, m2, m3 := c.members[0], c.members[1], c.members[2]
			write(t, c.client(m1, m2, m3), "/registry/before", 100)
			require.True(t, c.holds(t.Context(), m3, 101), "the survivor has every key before the others are lost")
			c.loseForGood(m1, m2)
			p := c.planFor(m3, m1, m2)
			var out strings.Builder
			n := m3.node(t, &out)
			apiserver, argv, _ := standInAPIServer(t, m3, false)
			n.Restart = []StaticPod{{Manifest: apiserver, Parked: filepath.Join(n.StateDir, "kube-apiserver.yaml")}}
			spec, err := json.Marshal(childSpec{Endpoint: n.Endpoint, Manifest: m3.manifest, Parked: n.Layout.(StaticPod).Parked,
				DataDir: n.DataDir, StateDir: n.StateDir, Plan: p, Restart: n.Restart, StopAt: at})
			require.NoError(t, err)
			self, err := os.Executable()
			require.NoError(t, err)
			cmd := exec.Command(self, "-test.run", "^$")
			cmd.Env = append(os.Environ(), "HALE_RECOVERY_CHILD="+string(spec))
			child := proc.Start(t, "agent recover (killed at "+string(at)+")", cmd)
			journal := filepath.Join(n.StateDir, "recovery.json")
			require.Eventually(t, func() bool {
				b, err := os.ReadFile(journal)
				var r Record
				return err == nil && json.Unmarshal(b, &r) == nil && r.Step == at
			}, time.Minute, time.Millisecond, "the child journals %s", at)
			child.Kill()
			// The child stops just after it journaled the step (polled, a fast step was once missed under
			// load: the next one was journaled within the millisecond), and is killed there.
			b, err := os.ReadFile(journal)
			require.NoError(t, err)
			var killed Record
			require.NoError(t, json.Unmarshal(b, &killed))
			require.Equal(t, at, killed.Step)

			r, err := Recover(context.Background(), n, p)
			require.NoError(t, err, "resumed after a kill at %s:\n%s\nthe child's output:\n%s", killed.Step, out.String(), child.Logs())
			assert.Equal(t, StepDone, r.Step)
			if killed.Step != StepDone {
				assert.Contains(t, out.String(), "resuming the recovery journaled at step "+string(killed.Step))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cli := c.client(m3)
			got, err := cli.Get(ctx, "/registry/before/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			require.NoError(t, err)
			assert.EqualValues(t, 100, got.Count)
			assert.NotEqual(t, p.Survivor.ClusterID, hexID(got.Header.ClusterId))
			entries, err := os.ReadDir(m3.dir)
			require.NoError(t, err)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			assert.ElementsMatch(t, []string{"member", "hale-aside-" + p.Token}, names, "no half-restored directory left behind")
			assert.FileExists(t, apiserver, "the API server's manifest back in place")
			assert.Eventually(t, func() bool { return len(running(argv)) > 0 }, 10*time.Second, 50*time.Millisecond, "the API server runs again")
		})
	}
}

// Every precondition is checked on the node before anything changes: refused with what to do, and
// nothing journaled, stopped or moved.
func TestRecoverRefuses(t *testing.T) {
	t.Parallel() // real etcd members mostly wait: the tests of the package run side by side
	c := startCluster(t, 3)
	m1, m2, m3 := c.members[0], c.members[1], c.members[2]
	write(t, c.client(m1, m2, m3), "/registry/before", 10)
	intact := func(m *member) {
		t.Helper()
		_, err := os.Stat(m.manifest)
		assert.NoError(t, err, "the manifest is in place")
		_, err = os.Stat(filepath.Join(m.dir, "member", "snap", "db"))
		assert.NoError(t, err, "the data directory is untouched")
		_, err = os.Stat(filepath.Join(filepath.Dir(m.dir), "hale-recovery", "recovery.json"))
		assert.ErrorIs(t, err, os.ErrNotExist, "nothing journaled")
	}
	refused := func(m *member, p Plan, want string) {
		t.Helper()
		var out strings.Builder
		_, err := Recover(context.Background(), m.node(t, &out), p)
		require.Error(t, err)
		assert.Contains(t, err.Error(), want)
		intact(m)
	}
	// Quorum held.
	refused(m3, c.planFor(m3, m1, m2), "has quorum: "+m3.client+" answers a linearizable read, so there is nothing to recover")

	m1.kubelet.PowerOff()
	m2.kubelet.PowerOff()
	p := c.planFor(m3, m1, m2)
	wrong := p
	wrong.Survivor = &quorum.Survivor{Member: "etcd-2", Machine: "cp-etcd-2", ClusterID: p.Survivor.ClusterID}
	refused(m3, wrong, `the local member is "etcd-3", the plan's survivor is "etcd-2"`)
	wrong.Survivor = &quorum.Survivor{Member: "etcd-3", ClusterID: "feed"}
	refused(m3, wrong, "the local member is of etcd cluster "+p.Survivor.ClusterID+", the plan's survivor of feed")
	wrong.Survivor = &quorum.Survivor{Member: "etcd-3", ClusterID: p.Survivor.ClusterID, Index: p.Survivor.Index + 1000}
	refused(m3, wrong, "below the plan's")

	// Something answers at the peer URL of a member the plan says is fenced (its etcd would give
	// quorum back: a listener stands in for a member that serves elsewhere).
	u, err := url.Parse(m2.peer)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", u.Host)
	require.NoError(t, err)
	refused(m3, p, "cp-etcd-2 (etcd-2) answers at its peer URL "+m2.peer+" although the plan says it is fenced")
	require.NoError(t, ln.Close())

	// Another recovery journaled on this node, and one running now.
	var out strings.Builder
	n := m3.node(t, &out)
	require.NoError(t, os.MkdirAll(n.StateDir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(n.StateDir, "recovery.json"), []byte(`{"token": "hale-other", "step": "Stopped"}`), 0o600))
	_, err = Recover(context.Background(), n, p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "records another recovery (token hale-other, at step Stopped")
	require.NoError(t, os.Remove(filepath.Join(n.StateDir, "recovery.json")))
	j, err := openJournal(n.StateDir)
	require.NoError(t, err)
	_, err = Recover(context.Background(), n, p)
	j.close()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "another recovery is running on this node (pid")
	intact(m3)

	// A member that does not start again on the restored data (a kubelet that has not started its
	// static pod): the error says so, not "did not answer a read".
	out.Reset()
	n = m3.node(t, &out)
	n.Layout, n.StartTimeout = neverStarts{n.Layout.(StaticPod)}, 2*time.Second
	_, err = Recover(context.Background(), n, p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), m3.client+" accepted no connection within 2s after the start: the member did not start (static pod "+m3.manifest+")")
}

// neverStarts is a static pod whose kubelet does not start it again.
type neverStarts struct{ StaticPod }

func (neverStarts) Start(context.Context) error { return nil }

func TestPlanReady(t *testing.T) {
	ok := Plan{Survivor: &quorum.Survivor{Member: "etcd-1", ClusterID: "c1"}, Token: "t", BumpRevision: 10,
		Fence: []quorum.FenceStep{{Machine: "cp-2", Member: "etcd-2", Fenced: true}}}
	require.NoError(t, ok.Ready())
	for _, tc := range []struct {
		name   string
		change func(*Plan)
		want   string
	}{
		{"no survivor", func(p *Plan) { p.Survivor = nil }, "names no survivor"},
		{"blocked", func(p *Plan) { p.Blockers = []string{"cp-2 powered on"} }, "not ready: cp-2 powered on"},
		{"no token", func(p *Plan) { p.Token = "" }, "not made by `hub recover --yes`"},
		{"no bump", func(p *Plan) { p.BumpRevision = 0 }, "revisions would go backwards"},
		{"not fenced", func(p *Plan) { p.Fence = []quorum.FenceStep{{Machine: "cp-2", Member: "etcd-2"}} }, "cp-2 (etcd-2) is not fenced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ok
			tc.change(&p)
			err := p.Ready()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestMemberFromFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want Member
	}{
		{[]string{"etcd", "--name=cp-1", "--data-dir=/var/lib/etcd", "--initial-advertise-peer-urls=https://10.0.0.11:2380"},
			Member{Name: "cp-1", DataDir: "/var/lib/etcd", PeerURL: "https://10.0.0.11:2380"}},
		{[]string{"/usr/bin/etcd", "--name", "cp-2", "--data-dir", "/data", "--initial-advertise-peer-urls", "https://a:2380,https://b:2380"},
			Member{Name: "cp-2", DataDir: "/data", PeerURL: "https://a:2380"}},
		{[]string{"etcd", "-name=cp-3", "--data-dir=/d", "--listen-client-urls=https://127.0.0.1:2379"}, Member{Name: "cp-3", DataDir: "/d"}},
	} {
		assert.Equal(t, tc.want, memberFromFlags(tc.args), "%q", tc.args)
	}
}

// BenchmarkRecoverLargeDatabase measures `agent recover` on a survivor whose database holds
// HALE_RECOVERY_MIB MiB of values (default 1024): three real members, two lost for good, the
// survivor rebuilt. It reports the database's size and the time from the start of the recovery until
// the one-member cluster answers. Not in CI (minutes, and gigabytes of disk):
// go test -run '^$' -bench RecoverLargeDatabase -benchtime 1x ./recovery
func BenchmarkRecoverLargeDatabase(b *testing.B) {
	mib := 1024
	if v := os.Getenv("HALE_RECOVERY_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err, "HALE_RECOVERY_MIB")
		mib = n
	}
	for range b.N {
		b.StopTimer()
		c := startCluster(b, 3)
		m1, m2, m3 := c.members[0], c.members[1], c.members[2]
		cli := c.client(m1, m2, m3)
		value := strings.Repeat("v", 1<<20)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		for i := range mib {
			_, err := cli.Put(ctx, fmt.Sprintf("/registry/large/%05d", i), value)
			require.NoError(b, err)
		}
		cancel()
		c.loseForGood(m1, m2)
		p := c.planFor(m3, m1, m2)
		info, err := os.Stat(filepath.Join(m3.dir, "member", "snap", "db"))
		require.NoError(b, err)
		var out strings.Builder
		b.StartTimer()
		start := time.Now()
		_, err = Recover(context.Background(), m3.node(b, &out), p)
		took := time.Since(start)
		b.StopTimer()
		require.NoError(b, err, out.String())
		b.Logf("%d MiB database: recovered in %v\n%s", info.Size()>>20, took.Round(time.Millisecond), out.String())
		b.ReportMetric(float64(info.Size()>>20), "db-MiB")
		b.ReportMetric(took.Seconds(), "recover-s")
	}
}

// Join rewrites the parked manifest's etcd flags in either form kubeadm or a hand-written manifest
// uses, adds the ones missing, and keeps the rest of the pod.
func TestStaticPodJoin(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, command, args string
		want                []string
	}{
		{name: "kubeadm's first member", command: `["etcd", "--name=cp-1", "--initial-cluster=cp-1=https://10.0.0.11:2380", "--data-dir=/var/lib/etcd"]`,
			want: []string{"etcd", "--name=cp-1", "--initial-cluster=" + joinInitial, "--data-dir=/var/lib/etcd", "--initial-cluster-state=existing"}},
		{name: "a joined member, flags as two words", command: `["etcd", "--initial-cluster", "old", "--initial-cluster-state", "new"]`,
			want: []string{"etcd", "--initial-cluster", joinInitial, "--initial-cluster-state", "existing"}},
		{name: "flags in args", command: `["etcd"]`, args: `["--initial-cluster-state=new", "--initial-cluster=old"]`,
			want: []string{"etcd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := StaticPod{Manifest: filepath.Join(dir, "manifests", "etcd.yaml"), Parked: filepath.Join(dir, tc.name+".yaml")}
			args := ""
			if tc.args != "" {
				args = "\n    args: " + tc.args
			}
			require.NoError(t, os.WriteFile(s.Parked, []byte(`apiVersion: v1
kind: Pod
metadata: {name: etcd, namespace: kube-system}
spec:
  hostNetwork: true
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.6.5-0
    command: `+tc.command+args+`
`), 0o600))
			require.NoError(t, s.Join(joinInitial))
			b, err := os.ReadFile(s.Parked)
			require.NoError(t, err)
			var pod corev1.Pod
			require.NoError(t, yaml.UnmarshalStrict(b, &pod))
			assert.True(t, pod.Spec.HostNetwork, "the rest of the pod is kept")
			assert.Equal(t, "registry.k8s.io/etcd:3.6.5-0", pod.Spec.Containers[0].Image)
			assert.Equal(t, tc.want, pod.Spec.Containers[0].Command)
			if tc.args != "" {
				assert.Equal(t, []string{"--initial-cluster-state=existing", "--initial-cluster=" + joinInitial}, pod.Spec.Containers[0].Args)
			}
		})
	}
	err := StaticPod{Parked: filepath.Join(dir, "not-parked.yaml")}.Join(joinInitial)
	require.ErrorContains(t, err, "the member must be stopped first")
}

const joinInitial = "cp-1=https://10.0.0.11:2380,cp-3=https://10.0.0.13:2380"

// A manifest put back into the kubelet's directory appears there under its own name only: the kubelet
// reads every file there but dot files as a static pod (seen through inotify, as the kubelet sees it).
func TestManifestPutBackUnderItsOwnName(t *testing.T) {
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	require.NoError(t, os.MkdirAll(manifests, 0o755))
	s := StaticPod{Manifest: filepath.Join(manifests, "etcd.yaml"), Parked: filepath.Join(dir, "etcd.yaml")}
	require.NoError(t, os.WriteFile(s.Parked, []byte("apiVersion: v1\nkind: Pod\n"), 0o600))
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(fd)
	_, err = unix.InotifyAddWatch(fd, manifests, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE|unix.IN_MODIFY)
	require.NoError(t, err)
	require.NoError(t, s.Start(context.Background()))
	buf := make([]byte, 64<<10)
	n, err := unix.Read(fd, buf)
	require.NoError(t, err)
	var names []string
	for off := 0; off < n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
		names = append(names, name)
		off += unix.SizeofInotifyEvent + int(ev.Len)
	}
	require.Contains(t, names, "etcd.yaml")
	for _, name := range names {
		assert.True(t, name == "etcd.yaml" || strings.HasPrefix(name, "."), "the kubelet would read %q as a static pod (events: %v)", name, names)
	}
}

// A restarted static pod's manifest names the cluster it was restarted onto: a new pod to the kubelet,
// without the back-off of the old one's crash loop; the rest of the pod as it was.
func TestMarkRestarted(t *testing.T) {
	for _, tc := range []struct {
		name, manifest, want string
	}{
		{"kubeadm's: annotations kept", "apiVersion: v1\nkind: Pod\nmetadata:\n  annotations:\n    kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint: 10.0.0.1:6443\n  creationTimestamp: null\n  name: kube-apiserver\nspec:\n  containers:\n  - command: [kube-apiserver, --secure-port=6443]\n    name: kube-apiserver\n",
			"apiVersion: v1\nkind: Pod\nmetadata:\n  annotations:\n    hale.dev/restarted-onto-etcd-cluster: c0ffee\n    kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint: 10.0.0.1:6443\n  creationTimestamp: null\n  name: kube-apiserver\nspec:\n  containers:\n  - command:\n    - kube-apiserver\n    - --secure-port=6443\n    name: kube-apiserver\n"},
		{"no annotations", "metadata: {name: p}\n", "metadata:\n  annotations:\n    hale.dev/restarted-onto-etcd-cluster: c0ffee\n  name: p\n"},
		{"no metadata", "kind: Pod\n", "kind: Pod\nmetadata:\n  annotations:\n    hale.dev/restarted-onto-etcd-cluster: c0ffee\n"},
		{"an earlier cluster's replaced", "metadata:\n  annotations: {hale.dev/restarted-onto-etcd-cluster: beef}\n", "metadata:\n  annotations:\n    hale.dev/restarted-onto-etcd-cluster: c0ffee\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.manifest), 0o600))
			require.NoError(t, markRestarted(path, "c0ffee"))
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
			require.NoError(t, markRestarted(path, "c0ffee"), "a rerun")
			again, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, got, again, "a rerun changes nothing")
		})
	}
	path := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
	require.NoError(t, os.WriteFile(path, []byte("- not a pod\n"), 0o600))
	err := markRestarted(path, "c0ffee")
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)
	assert.ErrorContains(t, markRestarted(filepath.Join(t.TempDir(), "gone.yaml"), "c0ffee"), "gone.yaml")
}
