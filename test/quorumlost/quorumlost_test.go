// Package quorumlost tests Kubernetes mode's degraded mode on real components, on test/lab's
// machines in network namespaces: a real kube-apiserver on the machines' real etcd members (static
// pods), agents and witnesses, the hub (the real `hub run --kubernetes` binary) and a Redfish
// simulator whose power runs the machines' processes. Two etcd members are killed: etcd loses quorum,
// the API server stops answering, and the hub must heal them alone, then record what it did in the
// API server once it answers again.
package quorumlost

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/test/lab"
	"github.com/hale-dev/hale/test/netns"
	"github.com/hale-dev/hale/test/proc"
)

const ns = "hale-system"

// bins are built once for the package.
var bins netns.Binaries

func TestMain(m *testing.M) {
	if why := netns.Available(); why != "" {
		fmt.Fprintf(os.Stderr, "test/quorumlost: %s: these tests need root and real network namespaces (test/lab)\n", why)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "hale-quorumlost-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if bins, err = netns.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "test/quorumlost:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// rig is test/lab's cluster with its etcd as static pods, the API server on that etcd, and the hub's
// command line ready for Kubernetes mode (not started).
type rig struct {
	*lab.Cluster
	*lab.APIServer
	t *testing.T
	// standaloneArgs are the lab's own hub command line (standalone: a bbolt journal).
	standaloneArgs []string
}

// startLab starts three machines (etcd as static pods, their agents), two witnesses, the BMCs and
// the API server on every member; the hub's arguments are ready, not started.
func startLab(t *testing.T) *rig { return startLabOf(t, 3, 200*time.Millisecond, -1) }

// startLabWith is startLab with BMCs that take powerOn to power a machine on.
func startLabWith(t *testing.T, powerOn time.Duration) *rig { return startLabOf(t, 3, powerOn, -1) }

// startLabOf is startLab with members machines, whose BMCs take powerOn to power one on, and the API
// server on machine apiOn's member alone (as kubeadm's on its machine), or on every member (-1).
func startLabOf(t *testing.T, members int, powerOn time.Duration, apiOn int) *rig {
	// With a quorum of five members lost, two witnesses leave the hub a strict majority of its
	// observers with none to spare (the hub, two agents and two witnesses: 5 of 8), and one agent
	// flapping under load kept it out of degraded mode (a full test run, beside test/kubeadm). Three
	// leave one to spare.
	//
	// Its policy acts on a machine dead or failing after 2 s: these tests are of what follows a lost
	// quorum (degraded mode, the break-glass inventory, the recovery), where the shipped waits (10 s
	// for a dead member needed for quorum, 30 s for a member killed under a running agent) would cost
	// them two minutes; test/lab's stall matrix and test/kubeadm's two hung nodes run those.
	c := lab.Start(t, bins, lab.Shape{Machines: members, Witnesses: max(2, members-2)},
		lab.Options{StaticPods: true, NoHub: true, PowerOn: powerOn, Policy: lab.ActSoon})
	l := &rig{Cluster: c, t: t, standaloneArgs: slices.Clone(c.HubArgs)}
	on := c.Machines
	if apiOn >= 0 {
		on = on[apiOn : apiOn+1]
	}
	l.APIServer = c.StartAPIServer(t, c.Lab.Host("api"), on...)
	ctx := t.Context()
	require.NoError(t, l.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, l.Client.Create(ctx, &v1alpha1.HealthPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}))
	for _, m := range c.Machines {
		require.NoError(t, l.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.Name,
			Labels: map[string]string{"node-role.kubernetes.io/control-plane": ""}}}))
	}
	// Kubernetes mode: the lab's command line without its journal, the Lease, discovery, degraded
	// mode's journal and the inventory as the break-glass one.
	args := slices.Clone(c.HubArgs)
	i := slices.Index(args, "--journal")
	args = slices.Delete(args, i, i+2)
	inventory := args[slices.Index(args, "--inventory")+1]
	l.HubArgs = append(args, "--kubernetes", "--kubeconfig", l.Kubeconfig, "--namespace", ns, "--discover",
		"--lease-duration", "6s", "--discover-interval", "2s",
		"--degraded-journal", filepath.Join(c.Dir, "degraded.db"), "--break-glass-inventory", inventory)
	return l
}

// setHubArg sets the value of one of the hub's flags.
func (l *rig) setHubArg(flag, value string) {
	i := slices.Index(l.HubArgs, flag)
	require.True(l.t, i >= 0 && i+1 < len(l.HubArgs), "no hub flag %s", flag)
	l.HubArgs[i+1] = value
}

// killHub kills the running hub (SIGKILL) and waits for it to end.
func (l *rig) killHub() {
	if p := l.KillHub(); p != nil {
		<-p.Done()
	}
}

// standalone makes the hub's arguments those of a standalone hub (bbolt journal, the inventory's BMCs).
func (l *rig) standalone() { l.HubArgs = slices.Clone(l.standaloneArgs) }

// startStandby starts a second hub replica on the hub's host (its own socket, gossip port, metrics
// and volume) that must stand by throughout.
func (l *rig) startStandby() *proc.Process {
	args := slices.Clone(l.HubArgs)
	for flag, value := range map[string]string{"--socket": filepath.Join(l.Dir, "standby.sock"), "--gossip-bind": l.HubHost.Addr(7948),
		"--metrics-address": "127.0.0.1:9358", "--degraded-journal": filepath.Join(l.Dir, "standby-degraded.db")} {
		args[slices.Index(args, flag)+1] = value
	}
	return l.HubHost.Start("standby-hub", args...)
}

// waitStatus polls the hub's status until ok says so.
func (l *rig) waitStatus(within time.Duration, what string, ok func(operator.Status) bool) operator.Status {
	l.t.Helper()
	deadline := time.Now().Add(within)
	var last operator.Status
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(l.t.Context(), 5*time.Second)
		st, err := l.Status(ctx)
		cancel()
		if err == nil && ok(st) {
			return st
		}
		last, lastErr = st, err
		time.Sleep(200 * time.Millisecond)
	}
	b, _ := json.MarshalIndent(last, "", "  ")
	l.t.Fatalf("not %s within %v (last error %v); last status:\n%s", what, within, lastErr, b)
	return last
}

func allHealthy(st operator.Status) bool {
	if len(st.Machines) == 0 {
		return false
	}
	for _, m := range st.Machines {
		if m.Verdict != assess.VerdictHealthy || m.EtcdHealth != "healthy" {
			return false
		}
	}
	return st.Degraded == ""
}

// apiAnswers reports whether the API server answers a read within a second.
func (l *rig) apiAnswers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var n corev1.Namespace
	return l.Client.Get(ctx, client.ObjectKey{Name: ns}, &n) == nil
}

// loseQuorum kills two members, waits for the API server to stop answering and then to answer
// again, and returns how long that took from the kill.
func (l *rig) loseQuorum(within time.Duration) time.Duration {
	l.t.Helper()
	ctx := l.t.Context()
	killed := time.Now()
	l.Machines[1].KillEtcd()
	l.Machines[2].KillEtcd()
	for l.apiAnswers(ctx) {
		require.Less(l.t, time.Since(killed), 30*time.Second, "the API server still answers with two of three members dead")
		time.Sleep(100 * time.Millisecond)
	}
	l.t.Logf("the API server stopped answering %v after the kill", time.Since(killed).Round(time.Millisecond))
	for !l.apiAnswers(ctx) {
		if time.Since(killed) > within {
			l.t.Fatalf("the API server did not answer again within %v of losing quorum", within)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(killed)
}

// resets is each machine's Redfish resets (the simulator's log, independent of the hub).
func (l *rig) resets() map[string][]string {
	out := map[string][]string{}
	for _, m := range l.Machines {
		out[m.Name] = l.Redfish.Resets(m.Name)
	}
	return out
}

// remediations lists the Remediation objects by machine, once every one has ended.
func (l *rig) remediationsEnded(within time.Duration) map[string][]v1alpha1.Remediation {
	l.t.Helper()
	var by map[string][]v1alpha1.Remediation
	require.EventuallyWithT(l.t, func(c *assert.CollectT) {
		var list v1alpha1.RemediationList
		require.NoError(c, l.Client.List(l.t.Context(), &list, client.InNamespace(ns)))
		by = map[string][]v1alpha1.Remediation{}
		for _, r := range list.Items {
			by[r.Spec.Machine] = append(by[r.Spec.Machine], r)
			assert.NotEqual(c, v1alpha1.PhaseInProgress, r.Status.Phase, "%s still in progress", r.Name)
		}
		assert.Len(c, by["cp-1"], 1)
		assert.Len(c, by["cp-2"], 1)
	}, within, 500*time.Millisecond)
	return by
}

// events lists Hale's Events with reason, regarding name.
func (l *rig) events(reason, regarding string) []eventsv1.Event {
	var list eventsv1.EventList
	require.NoError(l.t, l.Client.List(l.t.Context(), &list))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Reason == reason && e.Regarding.Name == regarding {
			out = append(out, e)
		}
	}
	return out
}

// healedInKubernetesMode checks what the API server holds once the hub has healed both members: one
// Remediation each, Succeeded, recorded during the degraded term; the Events; one reset each.
func (l *rig) healedInKubernetesMode() {
	t := l.t
	by := l.remediationsEnded(90 * time.Second)
	for _, name := range []string{"cp-1", "cp-2"} {
		r := by[name][0]
		assert.Equal(t, v1alpha1.PhaseSucceeded, r.Status.Phase, "%s: %+v", name, r.Status.History)
		var texts []string
		for _, e := range r.Status.History {
			texts = append(texts, e.Detail)
		}
		assert.Contains(t, strings.Join(texts, "\n"), "while the API server did not answer", name)
		t.Logf("%s: %s %s:\n  %s", name, r.Name, r.Status.Phase, strings.Join(texts, "\n  "))
	}
	assert.Empty(t, by["cp-0"], "cp-0 was never touched")
	resets := l.resets()
	t.Logf("Redfish resets: %v", resets)
	assert.Len(t, resets["cp-1"], 1, "one power action for cp-1")
	assert.Len(t, resets["cp-2"], 1, "one power action for cp-2")
	assert.Empty(t, resets["cp-0"])
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for _, name := range []string{"cp-1", "cp-2"} {
			var said []string
			for _, reason := range []pass.Reason{pass.ReasonRemediated, pass.ReasonRemediationInterrupted} {
				for _, e := range l.events(string(reason), name) {
					said = append(said, e.Note)
				}
			}
			assert.NotEmpty(c, said, "an Event on Node %s", name)
		}
		assert.NotEmpty(c, l.events(string(pass.ReasonDegradedMode), "default"), "the DegradedMode Event on the HealthPolicy")
	}, 30*time.Second, 500*time.Millisecond)
	for _, e := range l.events(string(pass.ReasonDegradedMode), "default") {
		t.Logf("Event %s on HealthPolicy default: %s", e.Reason, e.Note)
	}
}

// The whole failure: two of three members die, etcd and the API server with them; the leading hub
// goes on alone with the break-glass BMCs, power-cycles both, and once the API server answers records
// what it did as Remediations and Events. Also measured: the same failure with a standalone hub.
//
// A second replica stands by throughout: when the API server answers again it does not take the Lease
// the degraded leader had no chance to renew (the leader renews it at the same epoch).
func TestQuorumLostHealedInKubernetesMode(t *testing.T) {
	l := startLab(t)
	l.StartHub()
	l.waitStatus(90*time.Second, "leading, every machine healthy", allHealthy)
	standby := l.startStandby()
	time.Sleep(2 * time.Second) // campaigning
	took := l.loseQuorum(3 * time.Minute)
	t.Logf("Kubernetes mode (degraded): members killed → API server answering again in %v", took.Round(time.Millisecond))
	l.healedInKubernetesMode()
	l.waitStatus(60*time.Second, "leading again, every machine healthy", allHealthy)
	var lease coordinationv1.Lease
	require.NoError(t, l.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "hale-hub"}, &lease))
	assert.EqualValues(t, 0, *lease.Spec.LeaseTransitions, "the degraded leader renewed its Lease: no new epoch")
	assert.NotContains(t, standby.Logs(), `"msg":"leading"`, "the standby replica stood by")
	fmt.Printf("quorum lost (2 of 3 etcd members killed) → API server answering again: Kubernetes mode (degraded) %v\n", took.Round(time.Millisecond))
}

// The hub is killed while degraded; its replacement in the same pod (same volume) continues the term:
// one power action each, both recorded. The BMCs take 4 s to power a machine on, so that the kill
// lands inside the degraded term's work and the API server cannot be back before the replacement.
func TestQuorumLostHubKilledWhileDegraded(t *testing.T) {
	l := startLabWith(t, 4*time.Second)
	l.StartHub()
	l.waitStatus(90*time.Second, "leading, every machine healthy", allHealthy)
	ctx := t.Context()
	killed := time.Now()
	l.Machines[1].KillEtcd()
	l.Machines[2].KillEtcd()
	st := l.waitStatus(60*time.Second, "degraded", func(st operator.Status) bool { return st.Degraded != "" })
	t.Logf("degraded %v after the kill: %s", time.Since(killed).Round(time.Millisecond), st.Degraded)
	l.killHub()
	l.StartHub()
	for !l.apiAnswers(ctx) {
		require.Less(t, time.Since(killed), 3*time.Minute, "the API server did not answer again")
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("hub killed while degraded and started again: API server answering %v after the members were killed", time.Since(killed).Round(time.Millisecond))
	l.healedInKubernetesMode()
	assert.Contains(t, l.HubProc().Logs(), "continuing the degraded term", "the second hub continued the first one's term")
}

// Without a break-glass inventory the degraded hub reaches no BMC: both dead members are held, and
// said why; nothing is power-cycled.
func TestQuorumLostWithoutBreakGlassIsHeld(t *testing.T) {
	l := startLab(t)
	i := slices.Index(l.HubArgs, "--break-glass-inventory")
	l.HubArgs = slices.Delete(l.HubArgs, i, i+2)
	l.StartHub()
	l.waitStatus(90*time.Second, "leading, every machine healthy", allHealthy)
	l.Machines[1].KillEtcd()
	l.Machines[2].KillEtcd()
	st := l.waitStatus(60*time.Second, "degraded, both dead members held for want of a break-glass inventory", func(st operator.Status) bool {
		held := 0
		for _, m := range st.Machines {
			if strings.Contains(m.Decision, "without a break-glass inventory") {
				held++
			}
		}
		return st.Degraded != "" && held == 2
	})
	assert.Contains(t, st.Degraded, "no break-glass inventory")
	for _, m := range st.Machines {
		t.Logf("%s: %s: %s", m.Name, m.Verdict, m.Decision)
	}
	time.Sleep(5 * time.Second)
	assert.Empty(t, l.resets()["cp-1"])
	assert.Empty(t, l.resets()["cp-2"])
}

// The same failure with the standalone hub (bbolt journal, no API server in its way), for the
// comparison the README prints.
func TestQuorumLostStandaloneForComparison(t *testing.T) {
	l := startLab(t)
	l.standalone()
	l.StartHub()
	l.waitStatus(90*time.Second, "every machine healthy", allHealthy)
	took := l.loseQuorum(3 * time.Minute)
	// One member back gives quorum back: the API server may answer before the second reset is logged.
	require.Eventually(t, func() bool { r := l.resets(); return len(r["cp-1"]) >= 1 && len(r["cp-2"]) >= 1 }, 30*time.Second, 100*time.Millisecond)
	resets := l.resets()
	assert.Len(t, resets["cp-1"], 1)
	assert.Len(t, resets["cp-2"], 1)
	t.Logf("standalone: members killed → API server answering again in %v", took.Round(time.Millisecond))
	fmt.Printf("quorum lost (2 of 3 etcd members killed) → API server answering again: standalone %v\n", took.Round(time.Millisecond))
}
