package quorumlost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/quorum"
)

// rvWatch follows an informer on the test's ConfigMaps across the recovery: each object's resource
// version as handed to it, and the informer's list/watch resource version (sampled), none of which may
// go backwards.
type rvWatch struct {
	mu        sync.Mutex
	objects   map[string]int64
	synced    int64
	backwards []string
}

func (w *rvWatch) add(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	rv, err := strconv.ParseInt(cm.ResourceVersion, 10, 64)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if was := w.objects[cm.Name]; rv < was {
		w.backwards = append(w.backwards, fmt.Sprintf("%s: %d after %d", cm.Name, rv, was))
	}
	w.objects[cm.Name] = rv
}

// sample records the informer's last synced resource version.
func (w *rvWatch) sample(inf cache.SharedIndexInformer) {
	rv, err := strconv.ParseInt(inf.LastSyncResourceVersion(), 10, 64)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if rv < w.synced {
		w.backwards = append(w.backwards, fmt.Sprintf("the informer's resource version: %d after %d", rv, w.synced))
	}
	w.synced = max(w.synced, rv)
}

func (w *rvWatch) state() (synced int64, seen int, backwards []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced, len(w.objects), append([]string(nil), w.backwards...)
}

// The worst day, end to end on real processes: a kube-apiserver on three etcd members (static pods),
// agents, witnesses, the hub and Redfish BMCs. Two machines die for good: their disks are gone and
// their boards dead (the BMC powers them on, nothing boots, so the hub cannot tell them from the far
// side of a partition). `hub recover` refuses until the operator confirms them by name; `hub recover
// --yes --confirm-lost` fences them through their BMCs, read back Off; `agent recover` on the survivor
// (cp-2, the last listed) rebuilds etcd there; the API server, restarted, serves every object, and an
// informer that ran across it all saw resource versions only move forward. Then the cluster grows back
// to three members, one learner at a time, and the hub, resumed, sees every machine healthy.
func TestPermanentLossRecovered(t *testing.T) {
	l := startLab(t)
	l.standalone()
	l.startHub()
	l.waitStatus(90*time.Second, "every machine healthy", allHealthy)
	ctx := t.Context()

	const objects = 50
	for i := range objects {
		require.NoError(t, l.c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("before-%02d", i)},
			Data: map[string]string{"i": strconv.Itoa(i)}}))
	}
	cs, err := kubernetes.NewForConfig(l.cfg)
	require.NoError(t, err)
	watch := &rvWatch{objects: map[string]int64{}}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().ConfigMaps().Informer()
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: watch.add, UpdateFunc: func(_, o any) { watch.add(o) }})
	require.NoError(t, err)
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	require.True(t, cache.WaitForCacheSync(ctx.Done(), inf.HasSynced))
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				watch.sample(inf)
			}
		}
	}()
	require.Eventually(t, func() bool { synced, _, _ := watch.state(); return synced > 0 }, 10*time.Second, 20*time.Millisecond)
	before, _, _ := watch.state()

	// cp-0 and cp-1 die for good.
	for _, m := range l.machines[:2] {
		l.deadForGood(m)
	}
	// The survivor's own probe fails too, without a leader: it stops counting toward quorum but still
	// answers, so it is no lost voter (a plan made before its probe failed would not show that).
	l.waitStatus(2*time.Minute, "quorum lost, two voters, the survivor's own member unhealthy", func(st hub.Status) bool {
		return st.QuorumLoss != nil && len(st.QuorumLoss.Lost) == 2 && st.Machines[2].EtcdHealth == quorum.Unhealthy.String()
	})

	// The plan alone, then --yes without the operator's word: refused, nothing fenced.
	out, err := l.hubCLI(ctx, "recover")
	require.Error(t, err, "%s", out)
	assert.Equal(t, 2, exitCode(err), "%s", out)
	assert.Contains(t, string(out), "survivor: etcd-2 (cp-2)")
	out, err = l.hubCLI(ctx, "recover", "--yes")
	require.Error(t, err, "%s", out)
	assert.Equal(t, 2, exitCode(err), "%v", err)
	assert.Contains(t, err.Error(), "--confirm-lost cp-0")
	out, err = l.hubCLI(ctx, "recover", "-o", "json")
	require.Error(t, err)
	var refused hub.RecoveryPlan
	require.NoError(t, json.Unmarshal(out, &refused))
	assert.Empty(t, refused.Token, "nothing begun")

	// The hub killed (SIGKILL) in the middle of the fence: its BMC answers slowly, and the kill comes
	// as the first lost machine reads Off. The restarted hub is paused, and shows the recovery it
	// journaled; the rerun resumes it (the same token) and fences the rest.
	l.redfish.SetFaults(bmcsim.Faults{Latency: time.Second})
	first := exec.CommandContext(ctx, bins.Hub, "recover", "--yes", "--confirm-lost", "cp-0,cp-1", "--socket", l.socket)
	require.NoError(t, first.Start())
	require.Eventually(t, func() bool { return l.redfish.PowerState("cp-0") == "Off" }, time.Minute, 10*time.Millisecond, "cp-0 fenced")
	l.killHub()
	require.Error(t, first.Wait(), "the hub died under `hub recover --yes`")
	l.redfish.SetFaults(bmcsim.Faults{})
	l.startHub()
	st := l.waitStatus(time.Minute, "the restarted hub paused", func(st hub.Status) bool { return st.Pause == hub.Paused })
	assert.Contains(t, hub.DescribeBrakes(st.PausedBy), "etcd recovery hale-")
	out, err = l.hubCLI(ctx, "recover", "-o", "json")
	var underway hub.RecoveryPlan
	require.NoError(t, json.Unmarshal(out, &underway), "%s (%v)", out, err)
	require.NotEmpty(t, underway.Token, "the journaled recovery, under way")

	// The restarted hub stands by until the gossip has declared the killed one dead: it says so, and
	// the operator runs the command again.
	var began time.Time
	for {
		began = time.Now()
		if out, err = l.hubCLI(ctx, "recover", "--yes", "--confirm-lost", "cp-0,cp-1", "-o", "json"); err == nil || !strings.Contains(err.Error(), "standing by") {
			break
		}
		require.Less(t, time.Since(st.Time), time.Minute, "still standing by: %v", err)
		time.Sleep(time.Second)
	}
	require.NoError(t, err, "%s", out)
	fenced := time.Since(began)
	var plan hub.RecoveryPlan
	require.NoError(t, json.Unmarshal(out, &plan))
	require.Equal(t, underway.Token, plan.Token, "the recovery begun before the kill, resumed")
	assert.Equal(t, "etcd-2", plan.Survivor.Member)
	for _, m := range []string{"cp-0", "cp-1"} {
		assert.Equal(t, "Off", l.redfish.PowerState(m), "%s fenced through its BMC", m)
	}
	planFile := l.write("plan.json", string(out))

	survivor := l.machines[2]
	agentOut, err := exec.CommandContext(ctx, bins.Agent, "recover", "--plan", planFile, "--manifest", survivor.manifest,
		"--state-dir", filepath.Join(l.dir, survivor.name, "recovery"), "--etcd-endpoint", fmt.Sprintf("http://127.0.0.1:%d", survivor.client)).CombinedOutput()
	require.NoError(t, err, "agent recover:\n%s", agentOut)
	rebuilt := time.Since(began)
	t.Logf("agent recover:\n%s", agentOut)

	require.NoError(t, l.env.ControlPlane.APIServer.Stop())
	require.NoError(t, l.env.ControlPlane.APIServer.Start())
	for !l.apiAnswers(ctx) {
		if time.Since(began) > 3*time.Minute {
			var n corev1.Namespace
			t.Fatalf("the API server does not answer again: %v", l.c.Get(ctx, client.ObjectKey{Name: ns}, &n))
		}
		time.Sleep(100 * time.Millisecond)
	}
	answering := time.Since(began)
	var cms corev1.ConfigMapList
	require.NoError(t, l.c.List(ctx, &cms, client.InNamespace(ns)))
	assert.Len(t, cms.Items, objects, "every object the survivor had")
	require.NoError(t, l.c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "after"}}))
	require.Eventually(t, func() bool {
		synced, seen, _ := watch.state()
		return seen == objects+1 && synced > before+int64(plan.BumpRevision)
	},
		time.Minute, 100*time.Millisecond, "the informer sees the object written after the recovery")
	_, _, backwards := watch.state()
	assert.Empty(t, backwards, "resource versions went backwards for the informer")

	// Grow back: each dead machine replaced (powered on by hand, its manifest as it was, an empty
	// disk), then `agent rejoin` on it, one at a time.
	for _, m := range l.machines[:2] {
		l.replaced(m)
		out, err := exec.CommandContext(ctx, bins.Agent, "rejoin", "--plan", planFile, "--cluster", fmt.Sprintf("http://127.0.0.1:%d", survivor.client),
			"--manifest", m.manifest, "--state-dir", filepath.Join(l.dir, m.name, "recovery"), "--etcd-endpoint", fmt.Sprintf("http://127.0.0.1:%d", m.client)).CombinedOutput()
		require.NoError(t, err, "agent rejoin on %s:\n%s", m.name, out)
		t.Logf("agent rejoin on %s:\n%s", m.name, out)
	}
	full := time.Since(began)
	out, err = l.hubCLI(ctx, "resume")
	require.NoError(t, err, "%s", out)
	l.waitStatus(2*time.Minute, "every machine healthy after the recovery", allHealthy)
	t.Logf("permanent loss: fenced %v, etcd rebuilt %v, API server answering %v, three members %v after `hub recover --yes`",
		fenced.Round(time.Millisecond), rebuilt.Round(time.Millisecond), answering.Round(time.Millisecond), full.Round(time.Millisecond))
	fmt.Printf("permanent loss (2 of 3 members): hub recover --yes → etcd rebuilt %v, API server answering %v, three members %v\n",
		rebuilt.Round(time.Millisecond), answering.Round(time.Millisecond), full.Round(time.Millisecond))
}

// deadForGood kills a machine for good: its disk is gone, and its board dead (its BMC still powers it
// on and reads it On, and nothing boots).
func (l *lab) deadForGood(m *machine) {
	l.powerOff(m)
	m.mu.Lock()
	m.dead = true
	m.mu.Unlock()
	require.NoError(l.t, os.RemoveAll(filepath.Join(l.dir, m.member)))
}

// replaced is a dead machine replaced by a new one in its place (same name, BMC and addresses), powered on.
func (l *lab) replaced(m *machine) {
	m.mu.Lock()
	m.dead = false
	m.mu.Unlock()
	l.redfish.SetPowerState(m.name, "On")
	l.powerOn(m)
}

// hubCLI runs a hub operator command against the running hub: its standard output, and an error
// that carries its standard error.
func (l *lab) hubCLI(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bins.Hub, append(args, "--socket", l.socket)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("hub %v: %w: %s", args, err, stderr.String())
	}
	return out, nil
}

func exitCode(err error) int {
	var e *exec.ExitError
	if errors.As(err, &e) {
		return e.ExitCode()
	}
	return -1
}
