// Package kubeadm runs Hale on a real kubeadm control plane (test/lab's kubeadm cluster): three
// control-plane nodes and two workers, each a systemd machine with containerd and a kubelet, powered
// by a BMC, with Hale installed as docs/install.md says.
package kubeadm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/lab"
)

var assets string

func TestMain(m *testing.M) {
	if why := lab.KubeAvailable(); why != "" {
		fmt.Fprintf(os.Stderr, "test/kubeadm: %s: these tests need root, podman and haproxy\n", why)
		os.Exit(1)
	}
	var err error
	if assets, err = lab.KubeAssets(); err != nil {
		fmt.Fprintf(os.Stderr, "test/kubeadm: %v\n", err)
		os.Exit(1)
	}
	ctrllog.SetLogger(logr.Discard()) // the management cluster's client (managementCell)
	os.Exit(m.Run())
}

// TestHaleOnKubeadm makes two such clusters side by side, each Hale installed as docs/install.md says,
// and runs the scenarios on them: on the first, kubeadm's upgrade, pauses, hangs and panics, an
// operator's reboot, two of three hung and the permanent loss; on the second, under a Cluster API
// management cluster's hub, then off Kubernetes onto the Debian packages. Each cluster mostly waits (a
// tenth of a core once booted): side by side they take the longer one's time, not both. The second
// boots once the first is installed, so that the two boots (most of a cluster's CPU) never overlap.
func TestHaleOnKubeadm(t *testing.T) {
	// HALE_KUBEADM_ONLY=install stops the first cluster after the install; =upgrade, =two-hang,
	// =permanent-loss runs that scenario alone on it, =management or =standalone on the second (to work
	// on one, e.g. in a loop under load), the other cluster not made.
	only := os.Getenv("HALE_KUBEADM_ONLY")
	onFirst, onSecond := []string{"install", "upgrade", "two-hang", "permanent-loss"}, []string{"management", "standalone"}
	first, second := only == "" || slices.Contains(onFirst, only), only == "" || slices.Contains(onSecond, only)
	require.True(t, first || second, "HALE_KUBEADM_ONLY=%s: not a scenario (%s)", only, strings.Join(append(onFirst, onSecond...), ", "))
	firstInstalled := make(chan struct{})
	installed := sync.OnceFunc(func() { close(firstInstalled) })
	// test/run starts test/lab beside the clusters' scenarios once both boots (most of their CPU) are
	// over: HALE_KUBEADM_BOOTED names the file written then, or when the second cluster ends before.
	bootsOver := sync.OnceFunc(func() {
		if path := os.Getenv("HALE_KUBEADM_BOOTED"); path != "" {
			if err := os.WriteFile(path, nil, 0o644); err != nil {
				t.Errorf("HALE_KUBEADM_BOOTED: %v", err)
			}
		}
	})
	t.Run("self-hosted", func(t *testing.T) {
		defer installed() // also when it fails before: the second cluster does not wait on it
		if !first {
			t.Skipf("HALE_KUBEADM_ONLY=%s runs on the second cluster", only)
		}
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
		defer cancel()
		c := upAndInstalled(ctx, t)
		installed()
		typeTries(ctx, t, c)
		enrolled(ctx, t, c)
		if only == "install" {
			return
		}
		if only == "" || only == "upgrade" {
			kubeadmUpgrade(ctx, t, c, c.Node("cp-1"))
		}
		if only == "" {
			hangsAndReboots(ctx, t, c)
		}
		if only == "" || only == "two-hang" {
			// Two of three hang at once: etcd loses quorum and the API server with it; the leading hub,
			// its Lease lost, goes on alone in degraded mode with the inventory's BMCs and power-cycles both.
			twoHangAndHeal(ctx, t, c, c.Node("cp-1"), c.Node("cp-2"))
		}
		if only == "" || only == "permanent-loss" {
			// Two of three destroyed with their disks: recovered from the survivor as docs/operating.md says.
			permanentLoss(ctx, t, c)
		}
	})
	t.Run("management-then-standalone", func(t *testing.T) {
		defer bootsOver()
		if !second {
			t.Skipf("HALE_KUBEADM_ONLY=%s runs on the first cluster", only)
		}
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
		defer cancel()
		select {
		case <-firstInstalled:
		case <-ctx.Done():
			t.Fatal("the first cluster never got installed")
		}
		c := upAndInstalled(ctx, t)
		bootsOver()
		if only == "" || only == "management" {
			// Under a Cluster API management cluster's hub, the install its fallback; a hung node healed by
			// the management cluster's cell, another by the fallback while the management cluster is gone.
			managementCell(ctx, t, c)
		}
		if only == "" || only == "standalone" {
			// Off Kubernetes, onto the same machines from the Debian packages, and a hung node healed.
			standalonePath(ctx, t, c)
		}
	})
}

// upAndInstalled makes the cluster, checks that kubeadm made what it says (a static etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler per control-plane node, run by its
// kubelet), and installs Hale as docs/install.md says: every agent reports, a hub leads, and it sees
// every machine Healthy, having touched no machine's power on the way.
func upAndInstalled(ctx context.Context, t *testing.T) *lab.KubeCluster {
	t.Helper()
	// The cluster test/kubecluster gives a user, made by the same function, Hale installed as
	// docs/install.md says.
	c, applied := lab.UpWithHale(ctx, t, assets, lab.KubeOptions{})
	// Each static pod's mirror Pod, as its kubelet registers it: kubeadm made what it says.
	var mirrors []string
	for _, n := range c.ControlPlanes() {
		for _, p := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			mirrors = append(mirrors, p+"-"+n.Name)
		}
	}
	var out string
	require.Eventually(t, func() bool {
		var err error
		out, err = c.Kubectl(ctx, "get", "pods", "-n", "kube-system", "-o", "wide")
		return err == nil && !slices.ContainsFunc(mirrors, func(m string) bool { return !strings.Contains(out, m) })
	}, 2*time.Minute, 2*time.Second, "the control plane's static pods, as kubeadm made them: %v", mirrors)
	for _, n := range c.ControlPlanes() {
		ps, err := n.Exec(ctx, "crictl", "ps", "--name", "etcd", "-q")
		require.NoError(t, err)
		require.NotEmpty(t, strings.TrimSpace(ps), "no etcd container runs on %s", n.Name)
	}
	st := waitStatus(ctx, t, c, "every machine Healthy", allHealthy)
	t.Logf("installed: %d machines Healthy %s after kubectl apply", len(st.Machines), time.Since(applied).Round(time.Second))
	var powered []string
	for i, e := range c.PowerEvents() {
		if c.PowerEventAt(i).After(applied) {
			powered = append(powered, e)
		}
	}
	if len(powered) > 0 { // why, from the hubs' logs and the nodes (seen once in a full run: cp-0 cycled)
		t.Fatalf("a power action while Hale was installed: %v\n%s%s", powered,
			c.HubLines(ctx, `Unhealthy|Remediation|Suspect|Healthy|Quorum|Observer`), c.Diagnostics(ctx))
	}
	return c
}

// typeTries types what test/kubecluster tells its user to type, as the user would: the nodes listed,
// each Ready; Hale's status, from the replica kubectl picks, or from the pod a standby names.
func typeTries(ctx context.Context, t *testing.T, c *lab.KubeCluster) {
	t.Helper()
	tries := lab.Tries()
	require.Len(t, tries, 2, "test/kubecluster tells its user to type something this test does not")
	c.Documented("../README.md", "`sudo env \"PATH=$PATH\" go run ./test/kubecluster`")
	c.Documented("install.md", "`"+tries[1].Line+"`") // install.md's check after the apply
	nodes, err := c.Shell(ctx, "", tries[0].Line)
	require.NoError(t, err)
	for _, n := range c.Nodes {
		require.Regexp(t, `(?m)^`+n.Name+`\s+Ready\s`, nodes, "%s: %s", tries[0].Line, tries[0].Shows)
	}
	status, err := c.Shell(ctx, "", tries[1].Line)
	if m := regexp.MustCompile(`ask its pod: (kubectl -n hale-system exec \S+ -- hub) …`).FindStringSubmatch(status); err != nil && m != nil {
		t.Logf("%s: the standby answered; as it says: %s status", tries[1].Line, m[1])
		status, err = c.Shell(ctx, "", m[1]+" status")
	}
	require.NoError(t, err, "%s: %s", tries[1].Line, tries[1].Shows)
	for _, n := range c.ControlPlanes() {
		require.Regexp(t, `(?m)^`+n.Name+`\s+Healthy\s`, status, tries[1].Line)
	}
}

// kubeadmUpgrade runs a real `kubeadm upgrade node` on n (same version, a patch that changes its
// kube-apiserver's manifest, so that kubeadm replaces it and waits for the kubelet to run the new one)
// and hangs n while kubeadm's directory of new manifests is there: the hub holds n as planned work,
// saying why, and touches no power; thawed, the upgrade ends, the hold goes, every machine Healthy.
func kubeadmUpgrade(ctx context.Context, t *testing.T, c *lab.KubeCluster, n *lab.Node) {
	t.Helper()
	before := len(c.PowerEvents())
	n.WriteFile("/root/patches/kube-apiserver+strategic.yaml", "metadata:\n  annotations:\n    hale.dev/lab-upgrade: \"1\"\n")
	started := time.Now()
	upgraded := make(chan error, 1)
	var out string
	go func() {
		var err error
		// SystemVerification reads the kernel's config, which a container cannot see (as at init).
		out, err = n.Exec(ctx, "kubeadm", "upgrade", "node", "--patches", "/root/patches", "--certificate-renewal=false", "--etcd-upgrade=false",
			"--ignore-preflight-errors=SystemVerification")
		upgraded <- err
	}()
	// kubeadm's new manifests, as the agent sees them (its DaemonSet mounts /etc/kubernetes/tmp).
	for {
		ls, err := n.Exec(ctx, "sh", "-c", "ls -d /etc/kubernetes/tmp/kubeadm-upgraded-manifests*")
		if err == nil && strings.TrimSpace(ls) != "" {
			break
		}
		select {
		case err := <-upgraded:
			t.Fatalf("kubeadm upgrade node on %s ended (%v) before its directory of new manifests was seen:\n%s", n.Name, err, out)
		case <-time.After(200 * time.Millisecond):
		}
		require.Less(t, time.Since(started), 2*time.Minute, "kubeadm upgrade node on %s made no directory of new manifests", n.Name)
	}
	seen := time.Since(started)
	const held = "a kubeadm upgrade is replacing " // hub/pass's words
	waitStatus(ctx, t, c, n.Name+"'s upgrade in hub status (planned work)", func(st operator.Status) bool {
		m, _ := machineIn(st, n.Name)
		return strings.Contains(m.PlannedWork, held)
	})
	n.Freeze()
	hung := time.Now()
	st := waitStatus(ctx, t, c, n.Name+" held: a kubeadm upgrade under way", func(st operator.Status) bool {
		m, _ := machineIn(st, n.Name)
		return m.Verdict == assess.VerdictUnhealthy && strings.Contains(m.Decision, held)
	})
	m, _ := machineIn(st, n.Name)
	t.Logf("kubeadm upgrade: %s hung mid-upgrade (its new manifests there %s after kubeadm started), held %s after: %s",
		n.Name, seen.Round(100*time.Millisecond), time.Since(hung).Round(100*time.Millisecond), m.Decision)
	time.Sleep(20 * time.Second) // a hung node is power-cycled within seconds otherwise
	require.Empty(t, powerChanges(c, before), "no power action while %s's kubeadm upgrade is under way", n.Name)
	n.Thaw()
	select {
	case err := <-upgraded:
		require.NoError(t, err, "kubeadm upgrade node on %s:\n%s", n.Name, out)
	case <-time.After(5 * time.Minute):
		t.Fatalf("kubeadm upgrade node on %s did not end within 5 minutes of the thaw", n.Name)
	}
	done := time.Since(started)
	manifest, err := n.ReadFile("/etc/kubernetes/manifests/kube-apiserver.yaml")
	require.NoError(t, err)
	require.Contains(t, string(manifest), "hale.dev/lab-upgrade", "kubeadm replaced %s's kube-apiserver manifest", n.Name)
	waitStatus(ctx, t, c, "every machine Healthy after the upgrade, the hold gone", func(st operator.Status) bool {
		m, _ := machineIn(st, n.Name)
		return allHealthy(st) && m.PlannedWork == ""
	})
	require.Empty(t, powerChanges(c, before), "no power action during or after %s's kubeadm upgrade", n.Name)
	t.Logf("kubeadm upgrade: kubeadm upgrade node on %s done %s after it started, every machine Healthy %s after, no power action",
		n.Name, done.Round(time.Second), time.Since(started).Round(time.Second))
}

// enrolled checks the identities the install turned on with no key step: every agent and witness
// (on their nodes) and both hub replicas enrolled their keys through the API server, each request
// approved, and every report the hub took (all Healthy, six observers heard) was signed by a pinned key.
func enrolled(ctx context.Context, t *testing.T, c *lab.KubeCluster) {
	t.Helper()
	keys, err := c.Kubectl(ctx, "-n", "hale-system", "get", "configmap", "hale-pinned-keys", "-o", "jsonpath={.data.pinned-keys}")
	require.NoError(t, err)
	var hubs int
	for _, line := range strings.Split(keys, "\n") {
		if strings.HasPrefix(line, "hub-") {
			hubs++
		}
	}
	for _, n := range c.Nodes {
		require.Contains(t, keys, "\n"+n.Name+" ed25519:", "%s's key pinned for its node", n.Name)
	}
	require.Equal(t, 2, hubs, "one line for each hub replica:\n%s", keys)
	csrs, err := c.Kubectl(ctx, "get", "csr", "-o", `jsonpath={range .items[?(@.spec.signerName=="hale.dev/identity")]}{.metadata.name}={.status.conditions[0].type} {end}`)
	require.NoError(t, err)
	fields := strings.Fields(csrs)
	require.Len(t, fields, len(c.Nodes)+2, "an enrolment for each agent, witness and hub replica: %s", csrs)
	for _, f := range fields {
		require.True(t, strings.HasSuffix(f, "=Approved"), "every enrolment approved: %s", csrs)
	}
	t.Logf("identities: %d keys enrolled through the API server, no step by hand", len(fields))
}

// permanentLoss destroys cp-0 (where kubeadm init ran) and cp-1, a few seconds apart (their disks
// gone, their boards dead: their BMCs power them on and nothing boots), and follows docs/operating.md's
// "Permanent quorum loss" with its commands: `hub recover --yes --confirm-lost` in the degraded hub's
// container (the API server is down), `agent recover` on the survivor cp-2 (behind IPMI) with the agent
// taken from the node's image, `hub resume`, then each machine replaced (a new disk with its
// provisioning, no etcd data, etcd's manifest parked where agent rejoin takes it from), powered on
// with `hub reboot --force` and rejoined with `agent rejoin`, one at a time. Every object written
// before the loss is there after it, and resource versions only move forward.
func permanentLoss(ctx context.Context, t *testing.T, c *lab.KubeCluster) {
	t.Helper()
	const objects = 50
	var list strings.Builder
	list.WriteString("apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: before-loss}}\n")
	for i := range objects {
		fmt.Fprintf(&list, "- {apiVersion: v1, kind: ConfigMap, metadata: {name: cm-%02d, namespace: before-loss}, data: {i: \"%d\"}}\n", i, i)
	}
	// A pod on cp-0 (as a StatefulSet's would be): once its Node is out of service the controllers
	// delete it for good, so that its replacement may start elsewhere (non-graceful node shutdown).
	list.WriteString("- {apiVersion: v1, kind: Pod, metadata: {name: on-cp-0, namespace: before-loss}, spec: {nodeName: cp-0, " +
		"containers: [{name: pause, image: 'registry.k8s.io/pause:3.10.2', imagePullPolicy: Never}]}}\n")
	file := filepath.Join(t.TempDir(), "before.yaml")
	require.NoError(t, os.WriteFile(file, []byte(list.String()), 0o644))
	out, err := c.Kubectl(ctx, "apply", "-f", file)
	for applied := time.Now(); err != nil && strings.Contains(out+err.Error(), `serviceaccount "default" not found`); {
		// The pod may come before the namespace's default ServiceAccount (its controller makes it).
		require.Less(t, time.Since(applied), 30*time.Second, "no default ServiceAccount in before-loss: %s", out)
		time.Sleep(time.Second)
		out, err = c.Kubectl(ctx, "apply", "-f", file)
	}
	require.NoError(t, err, out)
	out, err = c.Kubectl(ctx, "-n", "before-loss", "wait", "--for=condition=Ready", "pod/on-cp-0", "--timeout=2m")
	require.NoError(t, err, out)
	before := listVersion(ctx, t, c)

	leading, err := leader(ctx, c)
	require.NoError(t, err)
	node, err := c.Kubectl(ctx, "-n", "hale-system", "get", "pod", leading, "-o", "jsonpath={.spec.nodeName}")
	require.NoError(t, err)
	hubNode, survivor := c.Node(node), c.Node("cp-2")
	lost := time.Now()
	c.Node("cp-0").Destroy()
	c.Node("cp-1").Destroy()

	// The hub's part, from the node of the replica that leads (it went on alone, degraded): the plan
	// is refused until the hub has classified the loss; the operator confirms the two machines (their
	// BMCs read them on: the hub cannot tell them from the far side of a partition).
	inHub := "crictl exec $(crictl ps -q --label io.kubernetes.container.name=hub) hub recover --yes --confirm-lost cp-1,cp-2 -o json --socket /run/hale/hub.sock > plan.json"
	c.Documented("operating.md", inHub)
	inHub = strings.Replace(inHub, "cp-1,cp-2", "cp-0,cp-1", 1)
	// Destroyed back to back, the survivor may not have applied the last entries the others
	// committed: the hub then refuses and names them, and the operator, having decided the API
	// server's last writes may go, accepts the loss by its size as operating.md says.
	c.Documented("operating.md", "`--accept-data-loss N`: the survivor is N raft entries behind the mark, and you accept losing them.")
	atRisk := regexp.MustCompile(`accept the loss by its size: --accept-data-loss (\d+)`)
	var plan pass.RecoveryPlan
	for accepted := ""; ; {
		out, err := hubNode.Exec(ctx, "sh", "-c", "cd /root && "+inHub+accepted)
		if err == nil {
			b, rerr := hubNode.ReadFile("/root/plan.json")
			require.NoError(t, rerr)
			require.NoError(t, json.Unmarshal(b, &plan), "%s", b)
			break
		}
		if m := atRisk.FindStringSubmatch(out); m != nil && accepted == "" {
			accepted = " --accept-data-loss " + m[1]
			t.Logf("the survivor is behind the journaled mark: %s; accepted as operating.md says (%s)", strings.TrimSpace(out), strings.TrimSpace(accepted))
			continue
		}
		require.Less(t, time.Since(lost), 5*time.Minute, "hub recover --yes on %s: %v", hubNode.Name, out)
		time.Sleep(2 * time.Second)
	}
	fenced := time.Since(lost)
	require.NotNil(t, plan.Survivor, "a survivor")
	for _, f := range plan.Fence { // confirmed by name, and still fenced by the hub itself: its BMC answers
		require.True(t, f.Fenced, "%s fenced", f.Machine)
		require.Contains(t, f.How, "powered off through its BMC", "%s fenced through its BMC", f.Machine)
		t.Logf("permanent loss: %s %s", f.Machine, f.How)
	}
	require.Equal(t, survivor.Name, plan.Survivor.Machine, "the survivor")
	b, err := hubNode.ReadFile("/root/plan.json")
	require.NoError(t, err)

	// The survivor's part: the agent from the node's image, then `agent recover` with the plan.
	agentFromImage := "mkdir -p /mnt/hale && ctr -n k8s.io images mount IMAGE /mnt/hale && cp /mnt/hale/usr/local/bin/agent /usr/local/sbin/agent && ctr -n k8s.io images unmount /mnt/hale"
	c.Documented("operating.md", agentFromImage)
	agentFromImage = strings.ReplaceAll(agentFromImage, "IMAGE", "hale.lab/hale:lab")
	onNode := func(n *lab.Node, line string) string {
		t.Helper()
		out, err := n.Exec(ctx, "sh", "-c", "cd /root && "+line)
		require.NoError(t, err, "%s\n%s", out, n.Diagnose(ctx))
		t.Logf("%s on %s:\n%s", line, n.Name, out)
		return out
	}
	c.Documented("operating.md", "agent recover --plan plan.json             # kubeadm: etcd as a static pod")
	survivor.WriteFile("/root/plan.json", string(b))
	onNode(survivor, agentFromImage)
	onNode(survivor, "agent recover --plan plan.json")
	rebuilt := time.Since(lost)
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Kubectl(rctx, "--request-timeout=4s", "get", "--raw", "/readyz")
		cancel()
		if err == nil {
			break
		}
		require.Less(t, time.Since(lost), 10*time.Minute, "the API server does not answer after agent recover: %v", err)
		time.Sleep(time.Second)
	}
	answering := time.Since(lost)
	out, err = c.Kubectl(ctx, "-n", "before-loss", "get", "configmaps", "-o", "name")
	require.NoError(t, err, out)
	require.Len(t, strings.Fields(strings.ReplaceAll(out, "configmap/kube-root-ca.crt", "")), objects, "every object written before the loss: %s", out)
	out, err = c.Kubectl(ctx, "-n", "before-loss", "create", "configmap", "after")
	require.NoError(t, err, out)
	after := listVersion(ctx, t, c)
	require.Greater(t, after, before+int64(plan.BumpRevision), "resource versions move forward past the recovery's bump")

	// The hub resumed: it holds the two machines the recovery retired.
	for {
		out, err := hubCLI(ctx, c, "resume")
		if err == nil {
			break
		}
		require.Less(t, time.Since(lost), 12*time.Minute, "hub resume: %v", out)
		time.Sleep(2 * time.Second)
	}
	st := waitStatus(ctx, t, c, "cp-0 and cp-1 retired by the recovery", func(st operator.Status) bool {
		a, _ := machineIn(st, "cp-0")
		b, _ := machineIn(st, "cp-1")
		return a.NeedsOperator == pass.NeedRetired && b.NeedsOperator == pass.NeedRetired
	})
	// By Hale's own recovery, which the degraded term journaled on its pod's disk and its next leader
	// imported: a leader that knew nothing of it would take it for a rebuild outside Hale (token
	// rebuilt-…) and not know its fences.
	for _, name := range []string{"cp-0", "cp-1"} {
		m, _ := machineIn(st, name)
		require.Contains(t, m.Decision, "retired by etcd recovery "+plan.Token, "%s: the recovery imported from the degraded term", name)
	}
	// Fenced through their BMCs and read Off since: their Nodes go out of service (policy.outOfServiceAfter,
	// 1 min by default), and the pods there may start elsewhere; each `hub reboot` below takes it off.
	resumed := time.Now()
	waitStatus(ctx, t, c, "cp-0 and cp-1 out of service", func(st operator.Status) bool {
		a, _ := machineIn(st, "cp-0")
		b, _ := machineIn(st, "cp-1")
		return a.OutOfService != "" && b.OutOfService != ""
	})
	t.Logf("permanent loss: the fenced Nodes out of service %s after hub resume", time.Since(resumed).Round(time.Second))
	outOfService := func() []string { // the Nodes tainted out of service
		out, err := c.Kubectl(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.spec.taints[*].key}{"\n"}{end}`)
		require.NoError(t, err, out)
		var nodes []string
		for line := range strings.Lines(out) {
			if name, keys, _ := strings.Cut(strings.TrimSpace(line), "="); slices.Contains(strings.Fields(keys), "node.kubernetes.io/out-of-service") {
				nodes = append(nodes, name)
			}
		}
		return nodes
	}
	require.Equal(t, []string{"cp-0", "cp-1"}, outOfService())
	tainted := time.Now()
	// podGone waits until the controllers have deleted the pod on cp-0 (cp-1 is replaced meanwhile:
	// `hub reboot cp-0` takes its taint off).
	podGone := func() {
		for {
			out, err := c.Kubectl(ctx, "-n", "before-loss", "get", "pod", "on-cp-0", "-o", "name", "--ignore-not-found")
			require.NoError(t, err, out)
			if strings.TrimSpace(out) == "" {
				break
			}
			require.Less(t, time.Since(tainted), 3*time.Minute, "the pod on cp-0 is still there 3 minutes after its Node went out of service")
			time.Sleep(2 * time.Second)
		}
		t.Logf("permanent loss: the pod on cp-0 deleted %s after its Node went out of service", time.Since(tainted).Round(time.Second))
	}

	// Grow back, one machine at a time: replaced, powered on through the hub, rejoined.
	c.Documented("operating.md", "agent rejoin --plan plan.json --cluster https://10.0.0.3:2379")
	rejoin := "agent rejoin --plan plan.json --cluster https://" + survivor.Host.Addr(2379)
	park := "mkdir -p /var/lib/hale/recovery && mv\n   /etc/kubernetes/manifests/etcd.yaml /var/lib/hale/recovery/etcd.yaml"
	c.Documented("operating.md", park)
	park = strings.ReplaceAll(park, "\n   ", " ")
	for _, n := range []*lab.Node{c.Node("cp-1"), c.Node("cp-0")} {
		if n.Name == "cp-0" {
			podGone()
		}
		n.Replace()
		// Typed on its disk before it is powered on (here from outside, at the disk's mount point).
		line := strings.NewReplacer(" /etc/", " "+n.DiskPath("/etc")+"/", " /var/", " "+n.DiskPath("/var")+"/").Replace(park)
		moved, err := exec.CommandContext(ctx, "sh", "-c", line).CombinedOutput()
		require.NoError(t, err, "%s: %s", line, moved)
		// The hub refuses while it has not heard the machine rejoined before this one report the new
		// cluster (its agent enrols the new key its new disk made first): an operator tries again.
		asked := time.Now()
		for {
			out, err := hubCLI(ctx, c, "reboot", n.Name, "--force", "--yes")
			if err == nil {
				break
			}
			require.Contains(t, out, "the old cluster would serve its old data beside the new one", out)
			require.Less(t, time.Since(asked), time.Minute, "hub reboot %s --force refused for a minute: %s\n%s", n.Name, out, c.Diagnostics(ctx))
			t.Logf("hub reboot %s --force refused %s after asking (tried again in 2 s): %s", n.Name, time.Since(asked).Round(time.Second), strings.TrimSpace(out))
			time.Sleep(2 * time.Second)
		}
		waitRunning(ctx, t, n)
		n.WriteFile("/root/plan.json", string(b))
		onNode(n, agentFromImage)
		onNode(n, rejoin)
		waitStatus(ctx, t, c, n.Name+" a healthy voter of the rebuilt cluster", func(st operator.Status) bool {
			m, _ := machineIn(st, n.Name)
			return m.Role == "voter" && m.EtcdHealth == quorum.Healthy.String() && m.NeedsOperator == ""
		})
	}
	waitStatus(ctx, t, c, "every machine Healthy after the recovery", allHealthy)
	require.Empty(t, outOfService(), "each replaced machine's taint taken off")
	c.WaitReady(ctx)
	out, err = c.Kubectl(ctx, "-n", "before-loss", "get", "configmaps", "-o", "name")
	require.NoError(t, err, out)
	require.Contains(t, out, "configmap/cm-49")
	require.Contains(t, out, "configmap/after")
	t.Logf("permanent loss of 2 of 3 on kubeadm: hub recover --yes done %s after the loss, etcd rebuilt %s, API server answering %s, three voters and every machine Healthy %s "+
		"(%d objects from before the loss all there; resource version %d before, %d after, bump %d)", fenced.Round(time.Second), rebuilt.Round(time.Second),
		answering.Round(time.Second), time.Since(lost).Round(time.Second), objects, before, after, plan.BumpRevision)
}

// listVersion is the resource version of the list of ConfigMaps in before-loss (etcd's revision then).
func listVersion(ctx context.Context, t *testing.T, c *lab.KubeCluster) int64 {
	t.Helper()
	out, err := c.Kubectl(ctx, "get", "--raw", "/api/v1/namespaces/before-loss/configmaps?limit=1")
	require.NoError(t, err, out)
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	v, err := strconv.ParseInt(list.Metadata.ResourceVersion, 10, 64)
	require.NoError(t, err, out)
	return v
}

// waitRunning waits until n's kubelet runs (it has booted).
func waitRunning(ctx context.Context, t *testing.T, n *lab.Node) {
	t.Helper()
	for began := time.Now(); ; time.Sleep(time.Second) {
		if _, err := n.Exec(ctx, "systemctl", "is-active", "--quiet", "kubelet"); err == nil {
			return
		}
		require.Less(t, time.Since(began), 3*time.Minute, "%s has not booted", n.Name)
	}
}

// twoHangAndHeal freezes two control-plane nodes at once and waits until both are power-cycled, the
// API server answers and every machine is Healthy again; it logs the times.
func twoHangAndHeal(ctx context.Context, t *testing.T, c *lab.KubeCluster, a, b *lab.Node) {
	t.Helper()
	before := len(c.PowerEvents())
	hung := time.Now()
	a.Freeze()
	b.Freeze()
	deadline := time.Now().Add(5 * time.Minute)
	var cycled, answering time.Duration
	down := false
	for cycled == 0 || answering == 0 {
		if time.Now().After(deadline) {
			// What each hub replica says of each machine, asked on its worker (the API server may not
			// answer kubectl exec).
			var why strings.Builder
			for _, w := range []string{"w-0", "w-1"} {
				for _, n := range []*lab.Node{a, b} {
					out, _ := c.Node(w).Exec(ctx, "sh", "-c", "crictl exec $(crictl ps -q --label io.kubernetes.container.name=hub) hub explain "+n.Name+" --socket /run/hale/hub.sock 2>&1")
					fmt.Fprintf(&why, "hub explain %s, in the replica on %s:\n%s\n", n.Name, w, out)
				}
			}
			t.Fatalf("two hung of three: after 5 min, power changes %v, API server answering: %v\n%s%s%s", powerChanges(c, before), answering != 0, why.String(),
				c.HubLines(ctx, degradedLines), c.Diagnostics(ctx))
		}
		if cycled == 0 {
			p := powerChanges(c, before)
			if slices.ContainsFunc(p, func(e string) bool { return strings.HasPrefix(e, "power-on "+a.Name+" ") }) &&
				slices.ContainsFunc(p, func(e string) bool { return strings.HasPrefix(e, "power-on "+b.Name+" ") }) {
				cycled = time.Since(hung)
			}
		}
		// Answering again once it was seen down, or once both are cycled (it may answer again before:
		// one member more is quorum).
		if answering == 0 {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := c.Kubectl(rctx, "--request-timeout=4s", "get", "--raw", "/readyz")
			cancel()
			switch {
			case err != nil:
				down = true
			case down || cycled != 0:
				answering = time.Since(hung)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	waitStatus(ctx, t, c, "every machine Healthy after two of three hung", allHealthy)
	c.WaitReady(ctx)
	healed := time.Since(hung)
	powered := powerChanges(c, before)
	for _, n := range []*lab.Node{a, b} {
		var mine []string
		for _, e := range powered {
			if strings.Contains(e, " "+n.Name+" ") {
				mine = append(mine, e)
			}
		}
		require.Len(t, mine, 2, "one power-cycle of each hung node, nothing else: %v", powered)
		require.True(t, strings.HasPrefix(mine[0], "power-off ") && strings.HasPrefix(mine[1], "power-on "), "%v", powered)
	}
	require.Len(t, powered, 4, "one power-cycle of each hung node, nothing else: %v", powered)
	t.Logf("two of three hung (%s, %s): both power-cycled by the degraded hub after %s, API server answering after %s, every machine Healthy after %s",
		a.Name, b.Name, cycled.Round(time.Second), answering.Round(time.Second), healed.Round(time.Second))
	// How much of the leader's window was left: it must see quorum lost before its Lease runs out.
	t.Logf("hung at %s; the hubs on the Lease and degraded mode:\n%s", hung.UTC().Format("15:04:05.000"), c.HubLines(ctx, degradedLines))
}

// degradedLines are the hub's log lines about its Lease, etcd's quorum and degraded mode.
const degradedLines = `degraded|lost the lease|leading|campaigning|QuorumLost|ObserverMajority`

// hangsAndReboots pauses two control-plane nodes that come back by themselves, then hangs each
// control-plane node in turn (each healed before the next), then has an operator reboot one and try a
// second.
func hangsAndReboots(ctx context.Context, t *testing.T, c *lab.KubeCluster) {
	t.Helper()
	// Paused, not hung (a VM stun, a storage stall): podman pause for 5 s, then for 20 s: no power
	// action, every machine Healthy again by itself.
	pauseAndResume(ctx, t, c, c.Node("cp-1"), 5*time.Second)
	pauseAndResume(ctx, t, c, c.Node("cp-2"), 20*time.Second)
	// A control-plane node hangs (frozen: every process stops where it is), once on each machine (two
	// Redfish BMCs, one IPMI): Unhealthy, power-cycled through its BMC, booted from its disk, its static
	// pods and its etcd member back, its Node Ready, every machine Healthy again. cp-1 hangs with
	// nothing in its BMC's record: power-cycled once its stall tolerance has passed without a sign of
	// life. cp-2 and cp-0 panic, their BMCs logging the OS critical stop (Redfish's LogService, IPMI's
	// SEL): power-cycled at once on that proof.
	hung := hangAndHeal(ctx, t, c, c.Node("cp-1"), false)
	panics := []time.Duration{hangAndHeal(ctx, t, c, c.Node("cp-2"), true), hangAndHeal(ctx, t, c, c.Node("cp-0"), true)}
	defer t.Logf("a hung control-plane node, hang → healthy control plane (every machine Healthy, the Node Ready): %s when nothing proves the hang "+
		"(the stall tolerance, 30 s, first), %s and %s on a panic its BMC logged (Cluster API's MachineHealthCheck: 5 min before it starts to replace "+
		"the machine, by default)", hung.Round(time.Second), panics[0].Round(time.Second), panics[1].Round(time.Second))

	// An operator's reboot of a healthy member, the others healthy: done. A second one while it runs
	// would leave one of three voters healthy: refused, with the rule and the numbers.
	before := len(c.PowerEvents())
	out, err := hubCLI(ctx, c, "reboot", "cp-1")
	require.NoError(t, err, out)
	// kubectl exec goes through the control-plane endpoint, and the load balancer may hand it to
	// cp-1's API server as it goes down: the stream then ends (a full run, 2026-12-06: "error: EOF").
	// The operator runs it again, at once: cp-1 is not back for 10 s at least.
	out, err = hubCLI(ctx, c, "reboot", "cp-2")
	for deadline := time.Now().Add(5 * time.Second); err != nil && lostStream(out) && time.Now().Before(deadline); {
		t.Logf("hub reboot cp-2: kubectl's stream lost (%s): again", strings.TrimSpace(out))
		time.Sleep(500 * time.Millisecond)
		out, err = hubCLI(ctx, c, "reboot", "cp-2")
	}
	require.Error(t, err, "a second reboot while cp-1's runs")
	require.Contains(t, out, "leaves 1 of 3 voters healthy; quorum needs 2")
	t.Logf("hub reboot cp-2 while cp-1 reboots: %s", strings.TrimSpace(out))
	waitStatus(ctx, t, c, "every machine Healthy after the operator's reboot", func(st operator.Status) bool {
		return allHealthy(st) && len(powerChanges(c, before)) >= 2
	})
	powered := powerChanges(c, before)
	require.Len(t, powered, 2, "one power-cycle, cp-1's: %v", powered)
	require.True(t, strings.HasPrefix(powered[0], "power-off cp-1 ") && strings.HasPrefix(powered[1], "power-on cp-1 "), "%v", powered)

}

// pauseAndResume pauses n for d (podman pause: the cgroup freezer, as a VM stun) and checks that it
// comes back by itself with no power action.
func pauseAndResume(ctx context.Context, t *testing.T, c *lab.KubeCluster, n *lab.Node, d time.Duration) {
	t.Helper()
	before := len(c.PowerEvents())
	n.Freeze()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	n.Thaw()
	thawed := time.Now()
	waitStatus(ctx, t, c, "every machine Healthy after "+n.Name+"'s pause", allHealthy)
	took := time.Since(thawed)
	if events := c.PowerEvents()[before:]; len(events) > 0 {
		t.Fatalf("%s paused %v: power changes or BMC requests %v\n%s", n.Name, d, events, c.HubLines(ctx, `Unhealthy|Remediation|Resumed|MayResume|Healthy`))
	}
	t.Logf("%s paused %v (podman pause): no power action, every machine Healthy %s after it went on", n.Name, d, took.Round(100*time.Millisecond))
}

// hangAndHeal freezes n (a panic its BMC logs first, when panicked) and waits until the hub has
// power-cycled it through its BMC and the control plane is whole again; it returns the time from the
// hang to then. A hang nothing records is power-cycled only once the stall tolerance has passed.
func hangAndHeal(ctx context.Context, t *testing.T, c *lab.KubeCluster, n *lab.Node, panicked bool) time.Duration {
	t.Helper()
	before := len(c.PowerEvents())
	leading, err := leader(ctx, c)
	require.NoError(t, err)
	hung := time.Now()
	if panicked {
		hung = n.Panic()
	} else {
		n.Freeze()
	}
	st := waitStatus(ctx, t, c, n.Name+" Unhealthy or under remediation", func(st operator.Status) bool {
		m, ok := machineIn(st, n.Name)
		return ok && (m.Verdict == assess.VerdictUnhealthy || m.Remediation != nil) || len(powerChanges(c, before)) > 0
	})
	// The hub's own time of the verdict (the nodes share this host's clock), not when this poll saw it.
	detected := time.Since(hung)
	if m, _ := machineIn(st, n.Name); m.Verdict == assess.VerdictUnhealthy && m.Since.After(hung) {
		detected = m.Since.Sub(hung)
	}
	waitStatus(ctx, t, c, "every machine Healthy after "+n.Name+"'s power-cycle", func(st operator.Status) bool {
		return allHealthy(st) && len(powerChanges(c, before)) >= 2
	})
	c.WaitReady(ctx) // (the Node may not have gone NotReady at all: the node controller waits 50 s)
	healed := time.Since(hung)
	for _, p := range []string{"etcd", "kube-apiserver"} {
		ps, err := n.Exec(ctx, "crictl", "ps", "--name", p, "--state", "running", "-q")
		require.NoError(t, err)
		require.NotEmpty(t, strings.TrimSpace(ps), "%s's %s static pod does not run after its power-cycle", n.Name, p)
	}
	powered := powerChanges(c, before)
	if len(powered) != 2 { // why, from the hubs (seen once in a cold run: a second node cycled)
		t.Fatalf("one power-cycle of the hung node, nothing else: %v\n%s", powered, c.HubLines(ctx, `Unhealthy|Remediation|Suspect|Healthy|Quorum|Observer`))
	}
	for i, kind := range []string{"power-off ", "power-on "} {
		require.True(t, strings.HasPrefix(powered[i], kind+n.Name+" "+bmcOf(c, n)), "one power-cycle of the hung node by its BMC, nothing else: %v", powered)
	}
	var off, on time.Duration // when the BMC powered it off, and on again
	for i, e := range c.PowerEvents()[before:] {
		switch {
		case strings.HasPrefix(e, "power-off ") && off == 0:
			off = c.PowerEventAt(before + i).Sub(hung)
		case strings.HasPrefix(e, "power-on "):
			on = c.PowerEventAt(before + i).Sub(hung)
		}
	}
	how := "hung, nothing in its BMC's record"
	if panicked {
		how = "panicked, its BMC's event log an OS critical stop"
	} else if tol := pass.DefaultStallTolerance; off < tol-time.Second {
		t.Fatalf("%s power-cycled %v after its hang, before its stall tolerance (%v) had passed\n%s", n.Name, off, tol, c.HubLines(ctx, `Unhealthy|Remediation|MayResume`))
	}
	t.Logf("%s %s: Unhealthy (or under remediation) after %s, powered off by %s after %s (on again after %s), healthy control plane after %s",
		n.Name, how, detected.Round(100*time.Millisecond), bmcOf(c, n), off.Round(100*time.Millisecond), on.Round(100*time.Millisecond), healed.Round(time.Second))
	if slow := 30 * time.Second; healed > slow && panicked || healed > pass.DefaultStallTolerance+slow { // slower than it should be: for the record
		t.Logf("%s's heal took %s:\n%s\n%s", n.Name, healed.Round(time.Second), c.Diagnostics(ctx), n.Diagnose(ctx))
	}
	// The leader keeps its Lease: its connection to the hung node's API server (through the kubernetes
	// Service) is dropped within seconds, and its renewals go to another.
	now, err := leader(ctx, c)
	require.NoError(t, err)
	require.Equal(t, leading, now, "the hub's Lease moved while %s hung", n.Name)
	return healed
}

// powerChanges are the power changes since the first'th event.
func powerChanges(c *lab.KubeCluster, first int) []string {
	var out []string
	for _, e := range c.PowerEvents()[first:] {
		if strings.HasPrefix(e, "power-") {
			out = append(out, e)
		}
	}
	return out
}

// bmcOf is how n's BMC reports its power changes (the lab's event detail).
func bmcOf(c *lab.KubeCluster, n *lab.Node) string {
	if c.IPMI[n.Name] != nil {
		return "IPMI"
	}
	return "Redfish"
}

func machineIn(st operator.Status, name string) (operator.MachineStatus, bool) {
	for _, m := range st.Machines {
		if m.Name == name {
			return m, true
		}
	}
	return operator.MachineStatus{}, false
}

// leader is the leading hub replica's pod (the Lease's holder is its identity: hub-POD-RANDOM).
func leader(ctx context.Context, c *lab.KubeCluster) (string, error) {
	holder, err := c.Kubectl(ctx, "-n", "hale-system", "get", "lease", "hale-hub", "-o", "jsonpath={.spec.holderIdentity}")
	if err != nil {
		return "", err
	}
	pods, err := c.Kubectl(ctx, "-n", "hale-system", "get", "pods", "-l", "app.kubernetes.io/name=hale-hub", "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		return "", err
	}
	for _, p := range strings.Fields(pods) {
		if strings.HasPrefix(holder, "hub-"+p+"-") {
			return p, nil
		}
	}
	return "", fmt.Errorf("no hub replica leads (lease holder %q, replicas %s)", holder, pods)
}

// hubCLI runs the hub's CLI in the leading replica, as install.md's check does (kubectl exec … hub …).
func hubCLI(ctx context.Context, c *lab.KubeCluster, args ...string) (string, error) {
	pod, err := leader(ctx, c)
	if err != nil {
		return "", err
	}
	return c.Kubectl(ctx, append([]string{"-n", "hale-system", "exec", pod, "--", "hub"}, args...)...)
}

// lostStream says whether kubectl failed on its connection, not on the command's answer: the stream
// ended, or the API server it reached went away.
func lostStream(out string) bool {
	for _, s := range []string{"error: EOF", "unexpected EOF", "connection refused", "connection reset", "error dialing backend", "Unable to connect to the server"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}

// hubStatus asks the leading hub replica for its status.
func hubStatus(ctx context.Context, c *lab.KubeCluster) (operator.Status, error) {
	return parseStatus(hubCLI(ctx, c, "status", "-o", "json"))
}

// parseStatus reads what `hub status -o json` printed (out), unless it failed (err).
func parseStatus(out string, err error) (operator.Status, error) {
	if err != nil {
		return operator.Status{}, err
	}
	var st operator.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return operator.Status{}, fmt.Errorf("hub status -o json: %w: %s", err, out)
	}
	return st, nil
}

// waitStatus waits until the leading hub's status satisfies ok.
func waitStatus(ctx context.Context, t *testing.T, c *lab.KubeCluster, what string, ok func(operator.Status) bool) operator.Status {
	t.Helper()
	return waitFor(ctx, t, c, what, func(ctx context.Context) (operator.Status, error) { return hubStatus(ctx, c) }, ok)
}

// waitFor waits until the status a hub of c's machines gives satisfies ok.
func waitFor(ctx context.Context, t *testing.T, c *lab.KubeCluster, what string, status func(context.Context) (operator.Status, error), ok func(operator.Status) bool) operator.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var last, failed string // the machines as last seen, and the last error since
	for {
		st, err := status(ctx)
		if err == nil && ok(st) {
			return st
		}
		if err != nil {
			failed = "; then: " + err.Error()
		} else {
			b, _ := json.Marshal(st.Machines)
			last, failed = string(b), ""
		}
		select {
		case <-ctx.Done():
			pods, _ := c.Kubectl(context.Background(), "-n", "hale-system", "get", "pods", "-o", "wide")
			if d, err := time.ParseDuration(os.Getenv("HALE_KUBE_KEEP")); err == nil {
				t.Logf("waiting for %s: %s%s\n%s\nHALE_KUBE_KEEP: keeping the cluster for %s", what, last, failed, pods, d)
				time.Sleep(d)
			}
			// What each hub said of remediations (begun, refused, ended) and its last lines.
			t.Fatalf("waiting for %s: %s%s\n%s\n%s\n%s\n%s", what, last, failed, pods, c.HubLines(context.Background(), "emediation"),
				c.HubLines(context.Background(), "ervice"), c.Diagnostics(context.Background()))
		case <-time.After(time.Second):
		}
	}
}

// allHealthy: the three machines Healthy, the hub hearing the three agents, both witnesses and itself.
func allHealthy(st operator.Status) bool { return healthyHearing(st, 6) }

// healthyHearing: the three machines Healthy, with healthy members and nothing in flight, the hub
// hearing observers.
func healthyHearing(st operator.Status, observers int) bool {
	if len(st.Machines) != 3 || len(st.Observers.Heard) != observers {
		return false
	}
	for _, m := range st.Machines {
		if m.Verdict != assess.VerdictHealthy || m.EtcdHealth != quorum.Healthy.String() || m.Remediation != nil {
			return false
		}
	}
	return true
}
