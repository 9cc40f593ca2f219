package quorumlost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/lab"
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
// informer that ran across it all saw resource versions only move forward. The hub, resumed, holds the
// machines the recovery retired. Then the cluster grows back to three members, one machine at a time
// (`hub reboot`, which refuses the second while the first runs outside the new cluster, then `agent
// rejoin`), and the hub sees every machine healthy.
func TestPermanentLossRecovered(t *testing.T) {
	l := startLab(t)
	l.standalone()
	l.StartHub()
	l.waitStatus(90*time.Second, "every machine healthy", allHealthy)
	ctx := t.Context()

	const objects = 50
	l.configMaps(ctx, "before", objects)
	cs, err := kubernetes.NewForConfig(l.Config)
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
	for _, m := range l.Machines[:2] {
		m.BreakForGood()
	}
	// The survivor's own probe fails too, without a leader: it stops counting toward quorum but still
	// answers, so it is no lost voter (a plan made before its probe failed would not show that).
	l.waitStatus(2*time.Minute, "quorum lost, two voters, the survivor's own member unhealthy", func(st operator.Status) bool {
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
	var refused pass.RecoveryPlan
	require.NoError(t, json.Unmarshal(out, &refused))
	assert.Empty(t, refused.Token, "nothing begun")

	// The hub killed (SIGKILL) in the middle of the fence: its BMC answers slowly, and the kill comes
	// as the first lost machine reads Off. The restarted hub is paused, and shows the recovery it
	// journaled; the rerun resumes it (the same token) and fences the rest.
	l.Redfish.SetFaults(bmcsim.Faults{Latency: time.Second})
	// As documented, with its default timeouts, the command works the first time: a remediation of a dead
	// machine may be inside its BMC operation (each request 1 s late), and the hub waits for it, saying so.
	first := exec.CommandContext(ctx, bins.Hub, "recover", "--yes", "--confirm-lost", "cp-0,cp-1", "--socket", l.Socket)
	var firstOut capture.Buffer
	first.Stdout, first.Stderr = &firstOut, &firstOut
	require.NoError(t, first.Start())
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Wait() }()
	// Killed mid-fence: once the recovery is journaled (the hub logs it; before that, cp-0 may read Off
	// inside a power-cycle of its own remediation, which the recovery waits for), as cp-0 reads Off.
	journaled := false
	begun := func() bool {
		journaled = journaled || strings.Contains(l.HubProc().Logs(), "etcd recovery begun")
		return journaled
	}
	for deadline := time.Now().Add(3 * time.Minute); !begun() || l.Redfish.PowerState("cp-0") != "Off"; time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-firstDone:
			require.Failf(t, "`hub recover --yes` returned before cp-0 was fenced", "%v:\n%s", err, firstOut.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "cp-0 not fenced 3 minutes after `hub recover --yes`:\n%s", firstOut.String())
	}
	t.Logf("`hub recover --yes` said, before the fence:\n%s", firstOut.String())
	l.killHub()
	require.Error(t, <-firstDone, "the hub died under `hub recover --yes`")
	l.Redfish.SetFaults(bmcsim.Faults{})
	l.StartHub()
	st := l.waitStatus(time.Minute, "the restarted hub paused", func(st operator.Status) bool { return st.Pause == operator.Paused })
	assert.Contains(t, hub.DescribeBrakes(st.PausedBy), "etcd recovery hale-")
	// The plan under way, as the restarted hub reads it from the journal.
	out, err = l.hubCLI(ctx, "recover", "-o", "json")
	var underway pass.RecoveryPlan
	require.NoError(t, json.Unmarshal(out, &underway), "%s (%v)", out, err)
	require.NotEmpty(t, underway.Token, "the journaled recovery, under way: %s", out)

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
	var plan pass.RecoveryPlan
	require.NoError(t, json.Unmarshal(out, &plan))
	require.Equal(t, underway.Token, plan.Token, "the recovery begun before the kill, resumed")
	assert.Equal(t, "etcd-2", plan.Survivor.Member)
	for _, m := range []string{"cp-0", "cp-1"} {
		assert.Equal(t, "Off", l.Redfish.PowerState(m), "%s fenced through its BMC", m)
	}
	planFile := l.Write("plan.json", string(out))

	survivor := l.Machines[2]
	l.agentRecover(planFile, survivor)
	rebuilt := time.Since(began)
	l.restartAPIServerOn(ctx, survivor)
	answering := time.Since(began)
	var cms corev1.ConfigMapList
	require.NoError(t, l.Client.List(ctx, &cms, client.InNamespace(ns)))
	assert.Len(t, cms.Items, objects, "every object the survivor had")
	require.NoError(t, l.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "after"}}))
	require.Eventually(t, func() bool {
		synced, seen, _ := watch.state()
		return seen == objects+1 && synced > before+int64(plan.BumpRevision)
	},
		time.Minute, 100*time.Millisecond, "the informer sees the object written after the recovery")
	_, _, backwards := watch.state()
	assert.Empty(t, backwards, "resource versions went backwards for the informer")

	// The hub resumed before the grow-back holds the machines the recovery retired: it powers neither on
	// (a disk that still held the old data would start the old cluster's member).
	out, err = l.hubCLI(ctx, "resume")
	require.NoError(t, err, "%s", out)
	l.waitStatus(time.Minute, "cp-0 and cp-1 held, retired by the recovery", func(st operator.Status) bool {
		return st.Machines[0].NeedsOperator == pass.NeedRetired && st.Machines[1].NeedsOperator == pass.NeedRetired
	})

	// Grow back: each dead machine replaced (a new board, an empty disk, its manifest as it was),
	// powered on with `hub reboot`, then `agent rejoin` on it, one at a time. While the first runs
	// outside the new cluster, the second is refused: two old members would be the old quorum (a
	// member started on an empty disk with its manifest as it was joins its old cluster).
	l.powerOnRetired(ctx, l.Machines[0])
	l.refusedPowerOn(ctx, l.Machines[1], "2 of the old cluster's members would run, its quorum (2)")
	l.rejoin(planFile, survivor, l.Machines[0])
	l.powerOnRetired(ctx, l.Machines[1])
	l.rejoin(planFile, survivor, l.Machines[1])
	full := time.Since(began)
	l.waitStatus(2*time.Minute, "every machine healthy after the recovery", allHealthy)
	t.Logf("permanent loss: fenced %v, etcd rebuilt %v, API server answering %v, three members %v after `hub recover --yes`",
		fenced.Round(time.Millisecond), rebuilt.Round(time.Millisecond), answering.Round(time.Millisecond), full.Round(time.Millisecond))
	fmt.Printf("permanent loss (2 of 3 members): hub recover --yes → etcd rebuilt %v, API server answering %v, three members %v\n",
		rebuilt.Round(time.Millisecond), answering.Round(time.Millisecond), full.Round(time.Millisecond))
}

// Kubernetes mode, five members, three lost for good, and of the two that answer one behind: its etcd
// hung (SIGSTOP) while the others committed more, and goes on after the loss with no leader to catch
// up from. The API server runs on etcd-4's member alone (as kubeadm's on its machine), so the hung
// member holds up none of its requests. With the API server gone, the hub goes on in degraded mode
// and carries the recovery out there; the plan picks the member furthest ahead (etcd-4), not the
// first that answers. Once the API server answers, the recovery is written back (HealthPolicy,
// fence Remediations, Events) and the leader keeps the members it retired held. The member behind is retired with the lost ones and runs the old
// cluster until `agent rejoin` on it (the hub, which cannot agree on a membership meanwhile, says
// so). `hub reboot` powers one lost machine on (2 of the old 5 would run, short of its quorum of 3)
// and refuses a second.
func TestPermanentLossFiveMembers(t *testing.T) {
	l := startLabOf(t, 5, 200*time.Millisecond, 4)
	// The leader enters degraded mode only if, when it loses the Lease (0.77 of a lease duration after
	// its last renewal), a pass has seen quorum lost; that needs a majority of the judges to report the
	// membership, etcd-3's agent among them, which cannot until its etcd goes on 3 s after the loss.
	// The lab's 6 s left it about 2 s for that, which a loaded machine missed (and with no leader, no
	// `hub recover`); 12 s left it about 7, which a cold full test run missed too (etcd-3, going on
	// with 512 appends in its socket, took longer to answer its agent); 20 s leave it about 12.
	l.setHubArg("--lease-duration", "20s")
	l.StartHub()
	l.waitStatus(2*time.Minute, "every machine healthy", allHealthy)
	ctx := t.Context()
	l.configMaps(ctx, "before", 30)
	behind, survivor := l.Machines[3], l.Machines[4]
	// The hub is kept off cp-3 meanwhile: it would reboot a member that stops answering, and a
	// restarted member answers nothing without a quorum.
	out, err := l.hubCLI(ctx, "detach", behind.Name, "--reason", "its etcd hangs on purpose")
	require.NoError(t, err, "%s", out)
	// Raft's leader sends a follower that does not answer at most 512 appends, which wait in its
	// socket to be read when it goes on: 700 writes leave it behind.
	behind.SignalEtcd(syscall.SIGSTOP)
	l.configMaps(ctx, "while-etcd-3-hung", 700)
	for _, m := range l.Machines[:3] {
		m.BreakForGood()
	}
	time.Sleep(3 * time.Second) // the leader steps down: nobody can catch etcd-3 up
	behind.SignalEtcd(syscall.SIGCONT)
	// The API server is gone with etcd's quorum: the leading hub goes on alone (degraded mode, its
	// local journal) and is the one that carries the recovery out.
	l.waitStatus(2*time.Minute, "degraded, quorum lost, three voters, both that answer unhealthy", func(st operator.Status) bool {
		return st.Degraded != "" && st.QuorumLoss != nil && len(st.QuorumLoss.Lost) == 3 &&
			st.Machines[3].EtcdHealth == quorum.Unhealthy.String() && st.Machines[4].EtcdHealth == quorum.Unhealthy.String()
	})

	// The plan, once both members that answer are in it (etcd-3's agent reads it again after the hang).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		out, _ := l.hubCLI(ctx, "recover", "-o", "json")
		var plan pass.RecoveryPlan
		require.NoError(c, json.Unmarshal(out, &plan))
		assert.Len(c, plan.Candidates, 2, "%+v", plan.Candidates)
	}, time.Minute, time.Second)
	// As the refusal tells an operator: a plan not ready (a freshly started degraded hub that lost its
	// observer majority for a pass under load, in a full run) is asked for again a moment later.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		out, err = l.hubCLI(ctx, "recover", "--yes", "--confirm-lost", "cp-0,cp-1,cp-2", "-o", "json")
		if err == nil || !strings.Contains(string(out)+err.Error(), "the recovery plan is not ready") || time.Now().After(deadline) {
			break
		}
	}
	require.NoError(t, err, "%s", out)
	var plan pass.RecoveryPlan
	require.NoError(t, json.Unmarshal(out, &plan))
	require.Len(t, plan.Candidates, 2, "%+v", plan.Candidates)
	t.Logf("candidates: %+v", plan.Candidates)
	assert.Equal(t, "etcd-4", plan.Survivor.Member)
	assert.Equal(t, "etcd-3", plan.Candidates[1].Member)
	assert.Less(t, plan.Candidates[1].Index, plan.Survivor.Index, "etcd-3 is behind")
	assert.Zero(t, plan.DataAtRisk, "the survivor is at the journaled mark")
	for _, m := range l.Machines[:3] {
		assert.Equal(t, "Off", l.Redfish.PowerState(m.Name), "%s fenced through its BMC", m.Name)
	}
	assert.Equal(t, "On", l.Redfish.PowerState(behind.Name), "a member that answers is not fenced")
	planFile := l.Write("plan.json", string(out))
	l.agentRecover(planFile, survivor)
	l.restartAPIServerOn(ctx, survivor)
	var cms corev1.ConfigMapList
	require.NoError(t, l.Client.List(ctx, &cms, client.InNamespace(ns)))
	assert.Len(t, cms.Items, 730, "every object the survivor had, those written while etcd-3 hung too")

	// The API server answers: the hub leaves degraded mode and writes the recovery back (its record
	// into the HealthPolicy, a fence Remediation per lost member, Events) with the pause `hub recover
	// --yes` set; etcd-3's agent reports the old cluster's membership: the observers do not agree on
	// one, and the hub plans nothing, saying why.
	l.waitStatus(2*time.Minute, "leading again, not planning, cp-3 named", func(st operator.Status) bool {
		return st.Degraded == "" && strings.Contains(st.NotPlanning, "cp-3 (etcd-3) still run the old etcd cluster")
	})
	var policy v1alpha1.HealthPolicy
	require.NoError(t, l.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "default"}, &policy))
	assert.Contains(t, policy.Annotations["hale.dev/etcd-recovery"], plan.Token)
	var rems v1alpha1.RemediationList
	require.NoError(t, l.Client.List(ctx, &rems, client.InNamespace(ns)))
	fences := map[string]v1alpha1.RemediationPhase{}
	for _, r := range rems.Items {
		if r.Spec.Strategy == "fence" {
			fences[r.Spec.Machine] = r.Status.Phase
		}
	}
	assert.Equal(t, map[string]v1alpha1.RemediationPhase{"cp-0": v1alpha1.PhaseSucceeded, "cp-1": v1alpha1.PhaseSucceeded, "cp-2": v1alpha1.PhaseSucceeded}, fences)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NotEmpty(c, l.events(string(pass.ReasonEtcdRecovery), "default"), "the EtcdRecovery Event on the HealthPolicy")
		assert.NotEmpty(c, l.events(string(pass.ReasonEtcdRecovery), "cp-0"), "an EtcdRecovery Event on Node cp-0")
	}, 30*time.Second, 500*time.Millisecond)

	// The degraded term's pause is the HealthPolicy's now: the leader holds until the operator resumes.
	require.NoError(t, l.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "default"}, &policy))
	if !assert.True(t, policy.Spec.Paused, "the recovery's pause carried back into the HealthPolicy") {
		// Seen once in a full run (the hub said it carried the pause back, and read none 20 ms later):
		// who wrote which field of the policy, and when.
		fields, _ := json.MarshalIndent(policy.ManagedFields, "", "  ")
		t.Logf("HealthPolicy %s/default at resourceVersion %s, annotations %v, managed fields:\n%s", ns, policy.ResourceVersion, policy.Annotations, fields)
	}
	st := l.waitStatus(time.Minute, "paused", func(st operator.Status) bool { return st.Pause == operator.Paused })
	assert.Contains(t, hub.DescribeBrakes(st.PausedBy), "etcd recovery "+plan.Token)
	for _, cmd := range [][]string{{"resume"}, {"attach", behind.Name}} {
		out, err = l.hubCLI(ctx, cmd...)
		require.NoError(t, err, "%s", out)
	}
	// With etcd-3 running the old cluster, one more old member may come on (2 of the old 5), not two.
	l.powerOnRetired(ctx, l.Machines[0])
	l.refusedPowerOn(ctx, l.Machines[1], "3 of the old cluster's members would run, its quorum (3)")
	for _, m := range []*lab.Machine{behind, l.Machines[0]} {
		l.rejoin(planFile, survivor, m)
	}
	// The observers agree again; the two still out are held until they rejoin.
	l.waitStatus(time.Minute, "cp-1 and cp-2 held, retired by the recovery", func(st operator.Status) bool {
		return st.NotPlanning == "" && st.Machines[1].NeedsOperator == pass.NeedRetired && st.Machines[2].NeedsOperator == pass.NeedRetired
	})
	for _, m := range l.Machines[1:3] {
		l.powerOnRetired(ctx, m)
		l.rejoin(planFile, survivor, m)
	}
	l.waitStatus(2*time.Minute, "every machine healthy after the recovery", allHealthy)
}

// configMaps writes n ConfigMaps named prefix-NN through the API server. A write that fails is
// written again for up to 30 s, as a client would: on a loaded machine etcd may elect a new leader
// meanwhile, and the API server answers "request timed out, possibly due to previous leader failure"
// (the write may have been committed all the same: then it exists).
func (l *rig) configMaps(ctx context.Context, prefix string, n int) {
	for i := range n {
		name := fmt.Sprintf("%s-%02d", prefix, i)
		var err error
		for began := time.Now(); time.Since(began) < 30*time.Second; time.Sleep(200 * time.Millisecond) {
			err = l.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"i": strconv.Itoa(i)}})
			if err == nil || apierrors.IsAlreadyExists(err) {
				err = nil
				break
			}
		}
		require.NoError(l.t, err, "writing ConfigMap %s", name)
	}
}

// agentRecover runs `agent recover` with the plan on the survivor's machine.
func (l *rig) agentRecover(planFile string, survivor *lab.Machine) {
	out, err := survivor.Host.Run(bins.Agent, "recover", "--plan", planFile, "--manifest", survivor.Manifest,
		"--state-dir", survivor.StateDir, "--etcd-endpoint", "http://"+survivor.Host.Addr(2379))
	require.NoError(l.t, err, "agent recover:\n%s", out)
	l.t.Logf("agent recover:\n%s", out)
}

// restartAPIServerOn restarts the API server on the survivor's member alone (as kubeadm's on its
// machine: its local member), and waits until it answers.
func (l *rig) restartAPIServerOn(ctx context.Context, survivor *lab.Machine) {
	require.NoError(l.t, l.RestartOn(survivor))
	began := time.Now()
	for !l.apiAnswers(ctx) {
		if time.Since(began) > 2*time.Minute {
			var n corev1.Namespace
			l.t.Fatalf("the API server does not answer again: %v", l.Client.Get(ctx, client.ObjectKey{Name: ns}, &n))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// powerOnRetired powers a machine the recovery retired on through the hub (`hub reboot --force`: its
// member is in no membership the quorum check knows), as a replacement: an empty disk.
func (l *rig) powerOnRetired(ctx context.Context, m *lab.Machine) {
	assert.Equal(l.t, "Off", l.Redfish.PowerState(m.Name), "%s: the hub did not power it on", m.Name)
	m.Replace()
	out, err := l.hubCLI(ctx, "reboot", m.Name, "--force", "--yes")
	require.NoError(l.t, err, "%s", out)
	require.Eventually(l.t, func() bool { return l.Redfish.PowerState(m.Name) == "On" }, time.Minute, 50*time.Millisecond, "%s powered on", m.Name)
}

// refusedPowerOn checks that `hub reboot --force` refuses to power a retired machine on, saying want.
func (l *rig) refusedPowerOn(ctx context.Context, m *lab.Machine, want string) {
	_, err := l.hubCLI(ctx, "reboot", m.Name, "--force", "--yes")
	require.Error(l.t, err, "%s powered on", m.Name)
	assert.Contains(l.t, err.Error(), want)
	assert.Equal(l.t, "Off", l.Redfish.PowerState(m.Name))
}

// rejoin runs `agent rejoin` with the plan on m, against the survivor's rebuilt cluster.
func (l *rig) rejoin(planFile string, survivor, m *lab.Machine) {
	out, err := m.Host.Run(bins.Agent, "rejoin", "--plan", planFile, "--cluster", "http://"+survivor.Host.Addr(2379),
		"--manifest", m.Manifest, "--state-dir", m.StateDir, "--etcd-endpoint", "http://"+m.Host.Addr(2379))
	require.NoError(l.t, err, "agent rejoin on %s:\n%s", m.Name, out)
	l.t.Logf("agent rejoin on %s:\n%s", m.Name, out)
	// Its agent's next reports say so: the hub counts it in the new cluster from then on.
	l.waitStatus(time.Minute, m.Name+" a healthy voter of the rebuilt cluster", func(st operator.Status) bool {
		for _, ms := range st.Machines {
			if ms.Name == m.Name {
				return ms.Role == "voter" && ms.EtcdHealth == quorum.Healthy.String() && ms.NeedsOperator == ""
			}
		}
		return false
	})
}

// hubCLI runs a hub operator command against the running hub: its standard output, and an error
// that carries its standard error.
func (l *rig) hubCLI(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bins.Hub, append(args, "--socket", l.Socket)...)
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
