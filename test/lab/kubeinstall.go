package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/netns"
)

// UpWithHale makes the cluster that test/kubecluster gives a user and test/kubeadm tests: three
// control-plane nodes (cp-2's BMC behind IPMI) and two workers, Hale installed on it as
// docs/install.md says, and waits until Hale's pods are Ready. It returns the cluster and when
// `kubectl apply -k` returned.
func UpWithHale(ctx context.Context, t netns.TB, assets string, o KubeOptions) (*KubeCluster, time.Time) {
	t.Helper()
	start := time.Now()
	c := StartKube(t, assets, KubeShape{ControlPlanes: 3, Workers: 2, IPMI: 1}, o)
	t.Logf("kube lab: cluster up (kubeadm init and joins, every Node Ready) in %s; installing Hale as docs/install.md says", time.Since(start).Round(time.Second))
	applied := c.InstallHale(ctx)
	if out, err := c.Kubectl(ctx, "-n", "hale-system", "wait", "--for=condition=Ready", "pods", "--all", "--timeout=5m"); err != nil {
		t.Fatalf("kube lab: Hale's pods not Ready: %v\n%s", err, out)
	}
	t.Logf("kube lab: Hale's pods Ready %s after kubectl apply", time.Since(applied).Round(time.Second))
	return c, applied
}

// Try is a command test/kubecluster tells its user to type in AdminShell, and what it shows.
type Try struct{ Line, Shows string }

// Tries are the commands test/kubecluster tells its user to type in AdminShell; test/kubeadm types
// them on its cluster.
func Tries() []Try {
	return []Try{
		{"kubectl get nodes", "the nodes"},
		{"kubectl -n hale-system exec deploy/hale-hub -- hub status", "Hale's view (a standby replica names the pod to ask instead)"},
	}
}

// InstallHale installs Hale on the cluster as docs/install.md says ("On Kubernetes", the standalone-bmc
// overlay), step by step with the commands it gives, in the user's own overlay ("Your own overlay": on
// a copy of the repository's deploy/, tagged as the doc's release, fetched by kustomize with git), with
// the lab's inventory and witnesses on the workers (and the label on the nodes they run on: two of three
// control-plane machines gone then leave a majority of the expected observers), without the
// monitoring components (no Prometheus Operator here). It returns when `kubectl apply -k` returned.
func (c *KubeCluster) InstallHale(ctx context.Context) time.Time {
	c.T.Helper()
	fatal := func(err error) {
		c.T.Helper()
		if err != nil {
			c.T.Fatalf("kube lab: installing Hale: %v", err)
		}
	}
	repo, err := kubeenv.DeployRepo(c.T.TempDir(), "v0.1.0")
	fatal(err)
	c.Overlay = filepath.Join(c.T.TempDir(), "hale")
	fatal(os.Mkdir(c.Overlay, 0o755))
	documented := func(text string) { c.T.Helper(); c.Documented("install.md", text) }
	sh := func(line string) {
		c.T.Helper()
		if out, err := c.Shell(ctx, c.Overlay, line); err != nil {
			c.T.Fatalf("kube lab: installing Hale: %v\n%s", err, out)
		}
	}
	write := func(name, text string) {
		c.T.Helper()
		fatal(os.WriteFile(filepath.Join(c.Overlay, name), []byte(text), 0o644))
	}
	// 1. Namespace and gossip key.
	gossip := `kubectl create namespace hale-system; kubectl -n hale-system create secret generic hale-gossip-key --from-literal=key="$(head -c 32 /dev/urandom | base64)"`
	documented(gossip)
	sh(gossip)
	// 2. BMC credentials, and the machines in the overlay's inventory.yaml, made from the example.
	creds := `kubectl -n hale-system create secret generic hale-bmc-credentials --from-literal=username=hale --from-literal=password='…'`
	documented(creds)
	sh(strings.NewReplacer("username=hale", "username=admin", "'…'", "'lab-secret'").Replace(creds))
	documented("your machines in an `inventory.yaml` of [your own overlay](#your-own-overlay)\n   (`deploy/components/bmc/inventory.yaml` is the example)")
	example, err := os.ReadFile(filepath.Join(repo, "deploy", "components", "bmc", "inventory.yaml"))
	fatal(err)
	head, _, ok := strings.Cut(string(example), "machines:\n")
	if !ok {
		c.T.Fatalf("kube lab: deploy/components/bmc/inventory.yaml is not as install.md describes it")
	}
	var machines strings.Builder
	for _, n := range c.ControlPlanes() {
		fmt.Fprintf(&machines, "  - {name: %s, member: %s, class: control-plane, bmc: {endpoint: %q, credentials: /etc/hale/bmc}}\n", n.Name, n.Name, n.BMC)
	}
	write("inventory.yaml", head+"machines:\n"+machines.String())
	// 3. The image, built without Docker, loaded where the nodes' containerd finds it (what a push to a
	// registry and the kubelet's pull would do), named in the overlay.
	root, err := repoRoot()
	fatal(err)
	documented("`deploy/image/build-oci hale.tar TAG`")
	archive := filepath.Join(c.T.TempDir(), "hale.tar")
	started := time.Now()
	build := exec.CommandContext(ctx, filepath.Join(root, "deploy", "image", "build-oci"), archive, "lab")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		c.T.Fatalf("kube lab: deploy/image/build-oci: %v\n%s", err, out)
	}
	built := time.Now()
	c.LoadImage(ctx, archive, "hale.lab/hale")
	c.T.Logf("kube lab: the image built in %s, loaded on the %d nodes in %s", built.Sub(started).Round(100*time.Millisecond),
		len(c.Nodes), time.Since(built).Round(100*time.Millisecond))
	documented("`images:` names your registry")
	own, err := kubeenv.OwnOverlay(repo, "alerts", "servicemonitor")
	fatal(err)
	mine := strings.NewReplacer("newName: registry.example.com/hale", "newName: hale.lab/hale", "newTag: v0.1.0", "newTag: lab").Replace(own)
	if mine == own {
		c.T.Fatalf("kube lab: install.md's own overlay names no image as the lab expects")
	}
	write("kustomization.yaml", mine)
	var workers []string
	for _, n := range c.Nodes {
		if !n.ControlPlane {
			workers = append(workers, n.Name)
		}
	}
	label := "`kubectl label node NODE... hale.dev/witness=true`"
	documented(label)
	sh(strings.NewReplacer("`", "", "NODE...", strings.Join(workers, " ")).Replace(label))
	c.witnessEtcd(repo, documented, sh, write)
	// 4. Apply.
	documented("`kubectl apply -k .`")
	documented("| `deploy/overlays/standalone-bmc` |")
	applied := time.Now()
	sh("kubectl apply -k .")
	return applied
}

// witnessEtcd gives the witnesses etcd access as install.md says: a Secret of kubeadm's
// healthcheck-client certificate, taken from the first control-plane node's disk (install.md runs the
// command there), and the members' client URLs in the overlay's witness-config.yaml: the witness
// component's ConfigMap, copied, its etcd section uncommented.
func (c *KubeCluster) witnessEtcd(repo string, documented, sh func(string), write func(name, text string)) {
	c.T.Helper()
	documented("the `etcd:` section of\n`deploy/components/witness/witness.yaml`, set in [your own overlay](#your-own-overlay)")
	documented("`kubectl -n hale-system create secret generic hale-witness-etcd\n--from-file=ca.crt=/etc/kubernetes/pki/etcd/ca.crt")
	documented("  - path: witness-config.yaml")
	pki := c.T.TempDir()
	for _, f := range []string{"ca.crt", "healthcheck-client.crt", "healthcheck-client.key"} {
		b, err := c.Nodes[0].ReadFile("/etc/kubernetes/pki/etcd/" + f)
		if err == nil {
			err = os.WriteFile(filepath.Join(pki, f), b, 0o600)
		}
		if err != nil {
			c.T.Fatalf("kube lab: %v", err)
		}
	}
	sh(fmt.Sprintf("kubectl -n hale-system create secret generic hale-witness-etcd --from-file=ca.crt=%[1]s/ca.crt "+
		"--from-file=tls.crt=%[1]s/healthcheck-client.crt --from-file=tls.key=%[1]s/healthcheck-client.key", pki))
	var urls []string
	for _, n := range c.ControlPlanes() {
		urls = append(urls, "https://"+n.Host.Addr(2379))
	}
	path := filepath.Join(repo, "deploy", "components", "witness", "witness.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		c.T.Fatalf("kube lab: %v", err)
	}
	var configMap string
	for doc := range strings.SplitSeq(string(b), "\n---\n") {
		if strings.Contains(doc, "\nkind: ConfigMap\n") {
			configMap = doc
		}
	}
	after := strings.NewReplacer("    # etcd:\n", "    etcd:\n",
		"    #   endpoints: [https://10.0.0.11:2379, https://10.0.0.12:2379, https://10.0.0.13:2379]\n", "      endpoints: ["+strings.Join(urls, ", ")+"]\n",
		"    #   tls: {", "      tls: {").Replace(configMap)
	if strings.Count(after, "\n") != strings.Count(configMap, "\n") || !strings.Contains(after, "      endpoints: [https://") {
		c.T.Fatalf("kube lab: %s's etcd section is not as install.md describes it", path)
	}
	write("witness-config.yaml", after+"\n")
}

// Documented fails the test when docs/doc no longer says text: what the lab types as an operator is
// the doc's text, with the doc's placeholders filled in by the lab's values.
func (c *KubeCluster) Documented(doc, text string) {
	c.T.Helper()
	root, err := repoRoot()
	if err != nil {
		c.T.Fatalf("kube lab: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", doc))
	if err != nil {
		c.T.Fatalf("kube lab: %v", err)
	}
	if !strings.Contains(string(b), text) {
		c.T.Fatalf("kube lab: docs/%s no longer says %q, which the test types as it says", doc, text)
	}
}
