package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/kube"
	"github.com/hale-dev/hale/kube/clusterapi"
	"github.com/hale-dev/hale/kube/outofservice"
	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/metal3sim"
)

const hubSA = "system:serviceaccount:hale-system:hale-hub"

var overlays = []string{"standalone-bmc", "capi", "metal3", "capi-witness", "metal3-break-glass"}

// imageTag is the tag base/kustomization.yaml gives the image.
func imageTag(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "kustomization.yaml"))
	require.NoError(t, err)
	_, tag, ok := strings.Cut(string(b), "newTag: ")
	require.True(t, ok)
	return strings.TrimSpace(strings.SplitN(tag, "\n", 2)[0])
}

// kubectl runs the kubectl test/kube/build-assets built, beside kube-apiserver.
func kubectl(_ *testing.T, args ...string) (string, error) { return kubeenv.Kubectl(args...) }

// deploy/: every overlay renders, the same twice, with hale-system labelled for Pod Security's
// privileged level (the agents use host paths and the host network), and a server-side dry run of
// `kubectl apply -k` against a real kube-apiserver accepts every object; so does one of
// `kubectl apply -f` of each of the release's rendered manifests (HALE_RELEASE_DIR, as test/run cuts it).
func TestDeployOverlaysApply(t *testing.T) {
	c, cfg := kubeenv.Start(t)
	kc := kubeenv.Kubeconfig(t, cfg, t.TempDir(), "")
	// A server-side dry run creates nothing, so the namespaced objects would not find the Namespace
	// it would create: it exists first, as after a first real apply.
	require.NoError(t, c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hale-system"}}))
	for _, o := range overlays {
		dir := filepath.Join("..", "..", "deploy", "overlays", o)
		first, err := kubectl(t, "kustomize", dir)
		require.NoError(t, err, first)
		again, err := kubectl(t, "kustomize", dir)
		require.NoError(t, err, again)
		assert.Equal(t, first, again, "%s renders the same every time", o)
		assert.NotRegexp(t, `image: hale\s`, first, "%s: an image the images transformer missed", o)
		assert.Contains(t, first, "image: ghcr.io/hale-dev/hale:"+imageTag(t), o)
		objectsInTheirNamespace(t, c, o, first)
		// A Cluster API overlay's hub follows its Cluster's pause (kube's TestPauseThroughHealthPolicyAndCluster).
		if strings.Contains(o, "capi") || strings.Contains(o, "metal3") {
			assert.Contains(t, first, "- --capi-cluster=auto\n", o)
		} else {
			assert.NotContains(t, first, "--capi-cluster", o)
		}
		assert.Regexp(t, `kind: Namespace\nmetadata:\n  labels:\n(    .*\n)*    pod-security.kubernetes.io/enforce: privileged\n(    .*\n)*  name: hale-system\n`, first, o)
		applies := [][]string{{"-k", dir}}
		if rel := os.Getenv("HALE_RELEASE_DIR"); rel != "" {
			applies = append(applies, []string{"-f", filepath.Join(rel, "hale-"+o+".yaml")})
		}
		for _, a := range applies {
			out, err := kubectl(t, append([]string{"--kubeconfig", kc, "apply", "--dry-run=server"}, a...)...)
			require.NoError(t, err, "%s:\n%s", a, out)
			assert.Contains(t, out, "daemonset.apps/hale-agent created (server dry run)", a)
			assert.Contains(t, out, "networkpolicy.networking.k8s.io/hale-hub created (server dry run)", a)
			assert.Contains(t, out, "validatingadmissionpolicy.admissionregistration.k8s.io/hale-remediation-force created (server dry run)", a)
			if strings.Contains(o, "witness") {
				assert.Contains(t, out, "daemonset.apps/hale-witness created (server dry run)", a)
			}
		}
	}
	// A management cluster's install and a workload cluster's agents (docs/install.md, In a management
	// cluster; TestManagementModeHealsAWorkloadCluster applies both for real).
	for _, d := range []struct{ dir, want string }{
		{"management", "deployment.apps/hale-hub created (server dry run)"},
		{"workload", "daemonset.apps/hale-agent created (server dry run)"},
	} {
		dir := filepath.Join("..", "..", "deploy", d.dir)
		first, err := kubectl(t, "kustomize", dir)
		require.NoError(t, err, first)
		again, err := kubectl(t, "kustomize", dir)
		require.NoError(t, err, again)
		assert.Equal(t, first, again, "%s renders the same every time", d.dir)
		assert.Contains(t, first, "image: ghcr.io/hale-dev/hale:"+imageTag(t), d.dir)
		objectsInTheirNamespace(t, c, d.dir, first)
		out, err := kubectl(t, "--kubeconfig", kc, "apply", "--dry-run=server", "-k", dir)
		require.NoError(t, err, "%s:\n%s", d.dir, out)
		assert.Contains(t, out, d.want, d.dir)
	}
	ownOverlay(t, c, cfg, kc)
}

// ownOverlay builds install.md's "Your own overlay" on a copy of deploy/ tagged v0.1.0 (the tag the doc
// names), with an inventory and a witness configuration of the user's, and applies it with a
// server-side dry run (the ServiceMonitor and PrometheusRule against the Prometheus Operator's CRDs);
// then upgrades it to a v0.2.0 (with one more hub replica) by upgrade.md's command: the release's
// change arrives, the user's files stay.
func ownOverlay(t *testing.T, c client.Client, cfg *rest.Config, kc string) {
	require.NoError(t, kubeenv.InstallMonitoringCRDs(cfg))
	tmp := t.TempDir()
	repo, err := kubeenv.DeployRepo(tmp, "v0.1.0")
	require.NoError(t, err)
	k, err := kubeenv.OwnOverlay(repo)
	require.NoError(t, err)
	dir := filepath.Join(tmp, "mine")
	require.NoError(t, os.Mkdir(dir, 0o755))
	write := func(name, text string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600))
	}
	write("kustomization.yaml", k)
	const inventory = "cluster: prod\nmachines:\n  - {name: cp-a, member: cp-a, class: control-plane, bmc: {endpoint: \"redfish://192.0.2.7\", credentials: /etc/hale/bmc}}\n"
	const witness = "cluster: prod\nrole: witness\netcd:\n  endpoints: [https://192.0.2.7:2379]\n"
	write("inventory.yaml", inventory)
	write("witness-config.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: hale-witness-config, namespace: hale-system}\n"+
		"data:\n  witness.yaml: |\n"+regexp.MustCompile(`(?m)^(.)`).ReplaceAllString(witness, "    $1"))

	render := func() string {
		t.Helper()
		out, err := kubectl(t, "kustomize", dir)
		require.NoError(t, err, out)
		return out
	}
	data := func(rendered, configMap, key string) string {
		t.Helper()
		for doc := range strings.SplitSeq(rendered, "\n---\n") {
			var cm corev1.ConfigMap
			require.NoError(t, yaml.Unmarshal([]byte(doc), &cm))
			if cm.Kind == "ConfigMap" && strings.HasPrefix(cm.Name, configMap) {
				return cm.Data[key]
			}
		}
		t.Fatalf("no ConfigMap %s rendered", configMap)
		return ""
	}
	first := render()
	assert.Equal(t, inventory, data(first, "hale-hub-config", "inventory.yaml"), "the user's inventory")
	assert.Equal(t, witness, data(first, "hale-witness-config", "witness.yaml"), "the user's witness configuration")
	assert.NotContains(t, first, "ghcr.io", "every image from the user's registry")
	assert.Contains(t, first, "image: registry.example.com/hale:v0.1.0")
	assert.Contains(t, first, "  replicas: 2\n")
	objectsInTheirNamespace(t, c, "own overlay", first)
	out, err := kubectl(t, "--kubeconfig", kc, "apply", "--dry-run=server", "-k", dir)
	require.NoError(t, err, out)
	for _, o := range []string{"servicemonitor.monitoring.coreos.com/hale-hub", "prometheusrule.monitoring.coreos.com/hale",
		"daemonset.apps/hale-witness", "deployment.apps/hale-hub"} {
		assert.Regexp(t, regexp.QuoteMeta(o)+`\S* (created|configured|unchanged) \(server dry run\)`, out)
	}

	// The next release, and upgrade.md's command.
	require.NoError(t, kubeenv.TagRelease(repo, "v0.2.0", func(deploy string) error {
		path := filepath.Join(deploy, "base", "hub.yaml")
		b, err := os.ReadFile(path)
		if err == nil {
			err = os.WriteFile(path, []byte(strings.Replace(string(b), "  replicas: 2\n", "  replicas: 3\n", 1)), 0o600)
		}
		return err
	}))
	upgrade := "sed -i 's/?ref=v0.1.0/?ref=v0.2.0/; s/newTag: v0.1.0/newTag: v0.2.0/' kustomization.yaml"
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "upgrade.md"))
	require.NoError(t, err)
	require.Contains(t, string(doc), "`"+upgrade+"`", "upgrade.md's command")
	sed := exec.Command("sh", "-c", upgrade)
	sed.Dir = dir
	b, err := sed.CombinedOutput()
	require.NoError(t, err, string(b))
	next := render()
	assert.Contains(t, next, "  replicas: 3\n", "the new release's change")
	assert.Contains(t, next, "image: registry.example.com/hale:v0.2.0")
	assert.Equal(t, inventory, data(next, "hale-hub-config", "inventory.yaml"), "the user's inventory, kept")
	assert.Equal(t, witness, data(next, "hale-witness-config", "witness.yaml"), "the user's witness configuration, kept")
}

// objectsInTheirNamespace checks an overlay's rendering: every namespaced object in hale-system (a
// component's resources too, which the base's namespace does not reach), every cluster-scoped one
// without a namespace (as the API server's discovery says of its kind), every one labelled
// app.kubernetes.io/part-of=hale, and no Secret at all: an apply must never replace a Secret the user
// made (the gossip key, BMC logins).
func objectsInTheirNamespace(t *testing.T, c client.Client, overlay, rendered string) {
	t.Helper()
	n := 0
	for _, doc := range strings.Split(rendered, "\n---\n") {
		var u unstructured.Unstructured
		require.NoError(t, yaml.Unmarshal([]byte(doc), &u.Object), "%s", overlay)
		if len(u.Object) == 0 {
			continue
		}
		n++
		gvk := u.GroupVersionKind()
		what := fmt.Sprintf("%s: %s %s", overlay, gvk.Kind, u.GetName())
		assert.NotEqual(t, "Secret", gvk.Kind, "%s: an apply would replace the user's own", what)
		assert.Equal(t, "hale", u.GetLabels()["app.kubernetes.io/part-of"], "%s: uninstall.md finds Hale's objects by this label", what)
		namespaced, err := c.IsObjectNamespaced(&u)
		require.NoError(t, err, what)
		if namespaced {
			assert.Equal(t, "hale-system", u.GetNamespace(), what)
		} else {
			assert.Empty(t, u.GetNamespace(), what)
		}
	}
	assert.Greater(t, n, 5, "%s: the objects were found", overlay)
}

// The hub's RBAC, least privilege: deploy/overlays/metal3 applied to a real kube-apiserver (RBAC on),
// then `hub run --kubernetes --discover` run as the hale-hub ServiceAccount (impersonated) heals a
// hung machine through its BareMetalHost, leads the Lease, journals, follows (and creates) the
// HealthPolicy and writes Events: every call it makes is allowed (nothing forbidden in its logs). The
// calls that scenario does not make (Cluster API hand-over and surge) are checked with
// SubjectAccessReviews, and so is a sample the hub and the agent must not be able to make.
func TestDeployRBAC(t *testing.T) {
	c, cfg := kubeenv.Start(t)
	ctx := t.Context()
	dir := t.TempDir()
	admin := kubeenv.Kubeconfig(t, cfg, dir, "")
	out, err := kubectl(t, "--kubeconfig", admin, "apply", "-k", filepath.Join("..", "..", "deploy", "overlays", "metal3"))
	require.NoError(t, err, out)

	canNamed := func(user, verb, group, resource, sub, ns, name string) bool {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:hale-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Subresource: sub, Namespace: ns, Name: name}}}
		require.NoError(t, c.Create(ctx, sar))
		return sar.Status.Allowed
	}
	can := func(user, verb, group, resource, sub, ns string) bool {
		return canNamed(user, verb, group, resource, sub, ns, "")
	}
	// Identities' enrolment: agents and witnesses ask and read; the hub answers and keeps the keys.
	const agentSA, witnessSA = "system:serviceaccount:hale-system:hale-agent", "system:serviceaccount:hale-system:hale-witness"
	for _, a := range []struct {
		user, verb, group, resource, sub, ns, name string
		allowed                                    bool
	}{
		{agentSA, "create", "certificates.k8s.io", "certificatesigningrequests", "", "", "", true},
		{witnessSA, "create", "certificates.k8s.io", "certificatesigningrequests", "", "", "", true},
		{agentSA, "get", "", "configmaps", "", "hale-system", "hale-pinned-keys", true},
		{agentSA, "update", "", "configmaps", "", "hale-system", "hale-pinned-keys", false},
		{agentSA, "get", "", "configmaps", "", "hale-system", "hale-hub-config", false},
		{agentSA, "list", "certificates.k8s.io", "certificatesigningrequests", "", "", "", false},
		{agentSA, "approve", "certificates.k8s.io", "signers", "", "", "hale.dev/identity", false},
		{hubSA, "update", "", "configmaps", "", "hale-system", "hale-pinned-keys", true},
		{hubSA, "update", "", "configmaps", "", "hale-system", "hale-agent-config", false},
		{hubSA, "approve", "certificates.k8s.io", "signers", "", "", "hale.dev/identity", true},
		{hubSA, "approve", "certificates.k8s.io", "signers", "", "", "kubernetes.io/kube-apiserver-client", false},
		{hubSA, "update", "certificates.k8s.io", "certificatesigningrequests", "status", "", "", false},
	} {
		assert.Equal(t, a.allowed, canNamed(a.user, a.verb, a.group, a.resource, a.sub, a.ns, a.name), "%s %s %s/%s %s %q", a.user, a.verb, a.resource, a.sub, a.name, a.ns)
	}
	for _, a := range []struct{ verb, group, resource, sub, ns string }{
		{"patch", "cluster.x-k8s.io", "machines", "status", "capi"},
		{"patch", "cluster.x-k8s.io", "machines", "", "capi"},
		{"get", "cluster.x-k8s.io", "machinesets", "", "capi"},
		{"patch", "cluster.x-k8s.io", "machinedeployments", "", "capi"},
		{"get", "controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes", "", "capi"},
		{"get", "cluster.x-k8s.io", "clusters", "", "capi"},
		{"patch", "cluster.x-k8s.io", "clusters", "", "capi"},
		{"list", "cluster.x-k8s.io", "machinehealthchecks", "", "capi"},
		{"list", "nodemaintenance.medik8s.io", "nodemaintenances", "", ""},
		{"update", "", "nodes", "", ""},
		{"list", "hale.dev", "haleremediations", "", ""},
		{"update", "hale.dev", "haleremediations", "status", "capi"},
		{"update", "hale.dev", "healthpolicies", "", "hale-system"},
		{"patch", "hale.dev", "healthpolicies", "", "hale-system"},
	} {
		assert.True(t, can(hubSA, a.verb, a.group, a.resource, a.sub, a.ns), "the hub may %s %s/%s %s", a.verb, a.resource, a.sub, a.group)
	}
	for _, a := range []struct{ user, verb, group, resource, ns string }{
		{hubSA, "list", "", "secrets", ""},
		{hubSA, "get", "", "secrets", "hale-system"},
		{hubSA, "delete", "", "nodes", ""},
		{hubSA, "patch", "", "nodes", ""},
		{hubSA, "delete", "cluster.x-k8s.io", "machines", "capi"},
		{hubSA, "create", "", "pods", "hale-system"},
		{hubSA, "update", "metal3.io", "baremetalhosts", "metal3"},
		{hubSA, "create", "hale.dev", "remediations", "kube-system"},
		{hubSA, "update", "hale.dev", "haleremediations", "capi"},
		{hubSA, "create", "hale.dev", "haleremediations", "capi"},
		{hubSA, "update", "coordination.k8s.io", "leases", "kube-system"},
		{"system:serviceaccount:hale-system:hale-agent", "get", "", "nodes", ""},
		{"system:serviceaccount:hale-system:hale-agent", "list", "hale.dev", "remediations", "hale-system"},
	} {
		assert.False(t, can(a.user, a.verb, a.group, a.resource, "", a.ns), "%s must not %s %s %s in %q", a.user, a.verb, a.group, a.resource, a.ns)
	}

	// The scenario, as the ServiceAccount.
	tb, invPath := startBed(t, dir)
	bed := createBedNodes(t, c, tb)
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "metal3"}}))
	for _, m := range bed.Machines {
		h := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"online": true, "bmc": map[string]any{"address": m.Endpoint.String()}}}}
		h.SetGroupVersionKind(clusterapi.BareMetalHostGVK)
		h.SetNamespace("metal3")
		h.SetName(m.Node)
		require.NoError(t, c.Create(ctx, h))
	}
	op := &metal3sim.Operator{Client: c, Namespace: "metal3", Interval: 50 * time.Millisecond, Log: tb.Log(), Power: metal3sim.InventoryPower(bed)}
	go op.Run(ctx)

	asHub := kubeenv.Kubeconfig(t, cfg, dir, hubSA, "system:serviceaccounts", "system:serviceaccounts:hale-system", "system:authenticated")
	// Identities enrolled through the API server (the manifests' way): the in-process cluster's agents are
	// pinned in the ConfigMap as the hub would have pinned them, and the hub reads them there. Its own
	// request, made as the ServiceAccount but with no pod's token, is denied (its key is the
	// cluster's, pinned as hub-*).
	clusterKeys, err := os.ReadFile(tb.PinnedKeysFile())
	require.NoError(t, err)
	var keys corev1.ConfigMap
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "hale-system", Name: "hale-pinned-keys"}, &keys))
	keys.Data = map[string]string{identity.PinnedKeysKey: string(clusterKeys)}
	require.NoError(t, c.Update(ctx, &keys))
	logs := runReplica(t, runOptions{inventory: invPath, bind: "127.0.0.1:0", join: tb.Seeds(), keyFile: tb.GossipKeyFile(), identityFile: tb.HubIdentityFile(),
		pinnedFile: filepath.Join(dir, "pinned-keys-copy"), api: apiListen{socket: filepath.Join(dir, "hub.sock")}, logLevel: "info", keep: 20,
		kube: &kubeOptions{kubeconfig: asHub, namespace: "hale-system", lease: "hale-hub", policy: "default", leaseDuration: 2 * time.Second,
			discover: true, discoverEvery: time.Second, enrol: true, agents: []string{"hale-agent", "hale-witness"}, hubs: []string{"hale-hub"}}})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"leading"`) }, 20*time.Second, 50*time.Millisecond)
	time.Sleep(2 * time.Second) // agents heard, machines discovered
	tb.Hang(2)
	require.Eventually(t, func() bool {
		var list v1alpha1.RemediationList
		require.NoError(t, c.List(ctx, &list, client.InNamespace("hale-system")))
		return len(list.Items) == 1 && list.Items[0].Status.Phase == v1alpha1.PhaseSucceeded
	}, 2*time.Minute, 100*time.Millisecond, "cp-2 healed through its BareMetalHost, as the ServiceAccount") // (under load a first try
	// can end having taken no step, when the etcd views are not fresh at its re-check: tried again 30 s later)
	var p v1alpha1.HealthPolicy
	require.Eventually(t, func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: "hale-system", Name: "default"}, &p) == nil && p.Status.Pause == "Running" &&
			p.Annotations[kube.MarkAnnotation] != ""
	}, 10*time.Second, 100*time.Millisecond, "the HealthPolicy created, its status and the raft mark written by the hub")
	// The operator's brakes, through the hub's socket: written to the HealthPolicy as the ServiceAccount.
	for _, args := range [][]string{{"pause", "--reason", "rbac"}, {"resume"}} {
		out, err := runCLI(t, append(args, "--socket", filepath.Join(dir, "hub.sock"))...)
		require.NoError(t, err, "hub %v: %s", args, out)
	}
	assert.NotEmpty(t, tb.Resets(2))
	assert.NotContains(t, strings.ToLower(logs.String()), "forbidden", "every call the hub made was allowed")
	// An enrolment made as an agent's account, but with no pod's token (impersonated): the hub
	// lists it, and denies it with the reason, as the ServiceAccount.
	asAgentCfg := rest.CopyConfig(cfg)
	asAgentCfg.Impersonate = rest.ImpersonationConfig{UserName: agentSA, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:hale-system", "system:authenticated"}}
	asAgent, err := client.New(asAgentCfg, client.Options{Scheme: c.Scheme()})
	require.NoError(t, err)
	req, err := identity.NewIdentity().EnrolmentRequest("cp-1")
	require.NoError(t, err)
	require.NoError(t, asAgent.Create(ctx, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "hale-identity-rbac"},
		Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: identity.IdentitySigner, Request: req, Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}}}))
	require.Eventually(t, func() bool {
		var csr certificatesv1.CertificateSigningRequest
		require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "hale-identity-rbac"}, &csr))
		return len(csr.Status.Conditions) == 1 && csr.Status.Conditions[0].Type == certificatesv1.CertificateDenied &&
			strings.Contains(csr.Status.Conditions[0].Message, "the request carries no node")
	}, 10*time.Second, 100*time.Millisecond, "the enrolment answered by the hub, as the ServiceAccount")
	assert.NotContains(t, strings.ToLower(logs.String()), "forbidden", "every call the hub made was allowed")
}

// The agent mounts exactly the host files it reads: kubeadm's /etc/kubernetes/pki/etcd also holds the
// etcd CA key and the server and peer keys, so it gets the three files of its client, not the directory.
// /var/lib/etcd is the one directory: the disk probe's statfs needs a path on etcd's filesystem; with the
// etcd-disk-dir component, an empty directory beside it instead, at the same place in the container.
// And /var/lib/hale-identity, its own: its identity key and its copy of the pinned keys, which it writes.
func TestAgentMountsOnlyWhatItReads(t *testing.T) {
	files := []string{"/etc/kubernetes/pki/etcd/ca.crt", "/etc/kubernetes/pki/etcd/healthcheck-client.crt",
		"/etc/kubernetes/pki/etcd/healthcheck-client.key", "/etc/kubernetes/pki/ca.crt"}
	narrow := t.TempDir()
	abs, err := filepath.Abs(filepath.Join("..", "..", "deploy"))
	require.NoError(t, err)
	rel := func(p ...string) string { // kustomize takes no absolute paths
		r, err := filepath.Rel(narrow, filepath.Join(append([]string{abs}, p...)...))
		require.NoError(t, err)
		return r
	}
	require.NoError(t, os.WriteFile(filepath.Join(narrow, "kustomization.yaml"), []byte(fmt.Sprintf(
		"resources: [%s]\ncomponents: [%s]\n", rel("overlays", "capi"), rel("components", "etcd-disk-dir"))), 0o600))
	dirs := map[string]string{narrow: "/var/lib/hale/etcd-fs"}
	for _, o := range overlays {
		dirs[filepath.Join(abs, "overlays", o)] = "/var/lib/etcd"
	}
	for dir, dataPath := range dirs {
		out, err := kubectl(t, "kustomize", dir)
		require.NoError(t, err, out)
		var paths []string
		for _, doc := range strings.Split(out, "\n---\n") {
			var obj unstructured.Unstructured
			require.NoError(t, yaml.Unmarshal([]byte(doc), &obj.Object))
			if obj.GetKind() != "DaemonSet" || obj.GetName() != "hale-agent" {
				continue
			}
			volumes, _, err := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "volumes")
			require.NoError(t, err)
			for _, v := range volumes {
				if p, ok, _ := unstructured.NestedString(v.(map[string]any), "hostPath", "path"); ok {
					paths = append(paths, p)
				}
			}
			assert.Contains(t, doc, "mountPath: /var/lib/etcd\n", "%s: the probe's path in the container is the same", dir)
		}
		want := append(slices.Clone(files), dataPath, "/etc/kubernetes/tmp", "/var/lib/hale-identity")
		assert.ElementsMatch(t, want, paths, dir)
	}
}

// spec.force is gated apart from creating Remediations: alice may create them (a quorum-checked
// reboot) but not force one, nor add force to hers later; carol, bound to hale-remediation-force, may;
// the hub's own account may journal a forced reboot it was asked for elsewhere. On a real API server
// with deploy/base/force-policy.yaml applied.
func TestRemediationForceNeedsItsOwnPermission(t *testing.T) {
	c, cfg := kubeenv.Start(t)
	ctx := t.Context()
	admin := kubeenv.Kubeconfig(t, cfg, t.TempDir(), "")
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hale-system"}}))
	for _, f := range []string{"force-policy.yaml", "hub-rbac.yaml"} {
		out, err := kubectl(t, "--kubeconfig", admin, "-n", "hale-system", "apply", "-f", filepath.Join("..", "..", "deploy", "base", f))
		require.NoError(t, err, out)
	}
	out, err := kubectl(t, "--kubeconfig", admin, "-n", "hale-system", "create", "role", "remediation-requester",
		"--verb=create,get,update", "--resource=remediations.hale.dev")
	require.NoError(t, err, out)
	for _, b := range [][]string{
		{"rolebinding", "alice-requests", "--role=remediation-requester", "--user=alice"},
		{"rolebinding", "carol-requests", "--role=remediation-requester", "--user=carol"},
		{"rolebinding", "carol-forces", "--clusterrole=hale-remediation-force", "--user=carol"},
	} {
		out, err := kubectl(t, append([]string{"--kubeconfig", admin, "-n", "hale-system", "create"}, b...)...)
		require.NoError(t, err, out)
	}
	as := func(user string) client.Client {
		uc := rest.CopyConfig(cfg)
		uc.Impersonate = rest.ImpersonationConfig{UserName: user}
		if strings.HasPrefix(user, "system:serviceaccount:") {
			uc.Impersonate.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:hale-system", "system:authenticated"}
		}
		cl, err := client.New(uc, client.Options{Scheme: c.Scheme()})
		require.NoError(t, err)
		return cl
	}
	rem := func(name string, force bool) *v1alpha1.Remediation {
		return &v1alpha1.Remediation{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "hale-system"},
			Spec: v1alpha1.RemediationSpec{Machine: "cp-1", Strategy: "reboot", Force: force}}
	}
	alice, carol, hubAccount := as("alice"), as("carol"), as(hubSA)

	// The policy takes a moment to be in force after it is created; each probe has a name of its own,
	// or one that landed before the policy would make every later probe fail as AlreadyExists.
	probes := 0
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		probes++
		err := alice.Create(ctx, rem(fmt.Sprintf("alice-forced-%d", probes), true))
		if assert.Error(ct, err, "alice created a forced Remediation") {
			assert.Contains(ct, err.Error(), "spec.force overrides the quorum check: alice may create Remediations but not force them")
		}
	}, 20*time.Second, 200*time.Millisecond)
	plain := rem("alice-plain", false)
	require.NoError(t, alice.Create(ctx, plain), "a quorum-checked reboot needs no more than create")
	plain.Spec.Force = true
	err = alice.Update(ctx, plain)
	require.Error(t, err, "nor can force be added afterwards")
	assert.Contains(t, err.Error(), "remediations/force")
	require.NoError(t, carol.Create(ctx, rem("carol-forced", true)))
	require.NoError(t, hubAccount.Create(ctx, rem("hub-forced", true)), "the hub journals a forced reboot it was asked for")
}

// The hale-hub account changes exactly what Hale changes on objects it does not own, on a real API
// server with deploy/overlays/metal3 applied (RBAC gives it patch; the admission policies in
// deploy/base/hub-writes-policy.yaml limit what a patch may do): its annotations on BareMetalHosts and
// Machines, Machine status, a MachineDeployment's replicas; not their specs, labels, other annotations.
// An administrator is not limited.
func TestHubWritesLimitedToWhatHaleChanges(t *testing.T) {
	c, cfg := kubeenv.Start(t)
	ctx := t.Context()
	admin := kubeenv.Kubeconfig(t, cfg, t.TempDir(), "")
	out, err := kubectl(t, "--kubeconfig", admin, "apply", "-k", filepath.Join("..", "..", "deploy", "overlays", "metal3"))
	require.NoError(t, err, out)
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "capi"}}))

	host := &unstructured.Unstructured{}
	host.SetAPIVersion("metal3.io/v1alpha1")
	host.SetKind("BareMetalHost")
	host.SetNamespace("capi")
	host.SetName("host-0")
	host.Object["spec"] = map[string]any{"online": true}
	require.NoError(t, c.Create(ctx, host))
	template := clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{ClusterName: "prod", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptrTo("bootstrap")},
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "Metal3MachineTemplate", Name: "md"}}}
	template.Labels = map[string]string{clusterv1.MachineDeploymentNameLabel: "md"}
	md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: "md"},
		Spec: clusterv1.MachineDeploymentSpec{ClusterName: "prod", Replicas: ptrTo(int32(1)), Selector: metav1.LabelSelector{MatchLabels: template.Labels}, Template: template}}
	require.NoError(t, c.Create(ctx, md))
	machine := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: "m-0", Labels: template.Labels}, Spec: template.Spec}
	require.NoError(t, c.Create(ctx, machine))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: "prod"}, Spec: clusterv1.ClusterSpec{Paused: ptrTo(false)}}
	require.NoError(t, c.Create(ctx, cluster))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-0", Labels: map[string]string{"node-role.kubernetes.io/control-plane": ""}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}}}
	require.NoError(t, c.Create(ctx, node))

	uc := rest.CopyConfig(cfg)
	uc.Impersonate = rest.ImpersonationConfig{UserName: hubSA, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:hale-system", "system:authenticated"}}
	hubClient, err := client.New(uc, client.Options{Scheme: c.Scheme()})
	require.NoError(t, err)
	patch := func(cl client.Client, obj client.Object, status bool, body string) error {
		p := client.RawPatch(types.MergePatchType, []byte(body))
		if status {
			return cl.Status().Patch(ctx, obj, p)
		}
		return cl.Patch(ctx, obj, p)
	}
	// The policies take a moment to be in force after they are created. Each probe changes the spec
	// (online flips), since a patch that changes nothing is allowed: the first probes may land before
	// the policy does.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		current := host.DeepCopy()
		require.NoError(ct, c.Get(ctx, client.ObjectKeyFromObject(host), current))
		online, _, _ := unstructured.NestedBool(current.Object, "spec", "online")
		err := patch(hubClient, current, false, fmt.Sprintf(`{"spec":{"online":%t}}`, !online))
		if assert.Error(ct, err, "the hub account changed a host's spec") {
			assert.Contains(ct, err.Error(), "may not change the spec of BareMetalHosts or Machines")
		}
	}, 20*time.Second, 200*time.Millisecond)
	require.NoError(t, patch(c, host, false, `{"spec":{"online":true}}`), "back online, so the cases below change it")

	for _, tt := range []struct {
		name   string
		obj    client.Object
		status bool
		patch  string
		denied string // empty: allowed
	}{
		{"metal3 reboot annotation added", host, false, `{"metadata":{"annotations":{"reboot.metal3.io/hale":""}}}`, ""},
		{"and removed", host, false, `{"metadata":{"annotations":{"reboot.metal3.io/hale":null}}}`, ""},
		{"a host powered off through its spec", host, false, `{"spec":{"online":false}}`, "may not change the spec"},
		{"another annotation on a host", host, false, `{"metadata":{"annotations":{"baremetalhost.metal3.io/detached":""}}}`, "may change only Hale's annotations"},
		{"a label on a host", host, false, `{"metadata":{"labels":{"owner":"hale"}}}`, "may not change labels"},
		{"surge record on a machine", machine, false, `{"metadata":{"annotations":{"hale.dev/surge-from":"1"}}}`, ""},
		{"machine marked for deletion", machine, false, `{"metadata":{"annotations":{"cluster.x-k8s.io/delete-machine":"hale: replaced"}}}`, ""},
		{"a machine's spec", machine, false, `{"spec":{"providerID":"metal3://elsewhere"}}`, "may not change the spec"},
		{"surge: replicas", md, false, `{"spec":{"replicas":2}}`, ""},
		{"a deployment paused", md, false, `{"spec":{"paused":true}}`, "spec.replicas only"},
		{"a deployment's template", md, false, `{"spec":{"template":{"spec":{"bootstrap":{"dataSecretName":"mine"}}}}}`, "spec.replicas only"},
		{"an annotation on a deployment", md, false, `{"metadata":{"annotations":{"x":"y"}}}`, "spec.replicas only"},
		{"a Cluster paused for a recovery", cluster, false, `{"metadata":{"annotations":{"cluster.x-k8s.io/paused":"","hale.dev/paused-for":"etcd recovery t"}}}`, ""},
		{"and resumed", cluster, false, `{"metadata":{"annotations":{"cluster.x-k8s.io/paused":null,"hale.dev/paused-for":null}}}`, ""},
		{"a Cluster paused through its spec", cluster, false, `{"spec":{"paused":true}}`, "may not change a Cluster's spec"},
		{"another annotation on a Cluster", cluster, false, `{"metadata":{"annotations":{"x":"y"}}}`, "only a Cluster's pause annotations"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := patch(hubClient, tt.obj.DeepCopyObject().(client.Object), tt.status, tt.patch)
			if tt.denied == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.denied)
			require.NoError(t, patch(c, tt.obj.DeepCopyObject().(client.Object), tt.status, tt.patch), "an administrator is not limited")
		})
	}
	// Nodes: RBAC gives update (outofservice.Taints reads and writes the whole Node), not patch.
	for _, tt := range []struct {
		name   string
		change func(*corev1.Node)
		denied string
	}{
		{"a Node cordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }, "only a Node's out-of-service taint"},
		{"another taint on a Node", func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "x", Effect: corev1.TaintEffectNoExecute})
		},
			"only a Node's out-of-service taint"},
		{"a Node's taint taken off", func(n *corev1.Node) { n.Spec.Taints = nil }, "only a Node's out-of-service taint"},
		{"another annotation on a Node", func(n *corev1.Node) { n.Annotations = map[string]string{"x": "y"} }, "only a Node's annotation hale.dev/out-of-service"},
		{"a label on a Node", func(n *corev1.Node) { n.Labels["x"] = "y" }, "and no label"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// As above, the policy may not be in force at once: a change let through is undone.
			require.EventuallyWithT(t, func(ct *assert.CollectT) {
				var n corev1.Node
				require.NoError(ct, c.Get(ctx, client.ObjectKeyFromObject(node), &n))
				was := n.DeepCopy()
				tt.change(&n)
				err := hubClient.Update(ctx, &n)
				if err == nil {
					was.ResourceVersion = n.ResourceVersion
					require.NoError(ct, c.Update(ctx, was))
				}
				if assert.Error(ct, err) {
					assert.Contains(ct, err.Error(), tt.denied)
				}
			}, 20*time.Second, 200*time.Millisecond)
		})
	}
	// Hale's own hand-over to the Machine's owner (its status conditions), and the out-of-service
	// taint on and off a Node (the taints it had stay), as the hub account.
	require.NoError(t, clusterapi.HandOverToOwner(ctx, hubClient, client.ObjectKeyFromObject(machine), "cp-0 is dead"))
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(node), node))
	before := node.Spec.Taints
	taints := outofservice.Taints{Client: hubClient}
	require.NoError(t, taints.Taint(ctx, "cp-0", "fenced"))
	tainted, err := taints.Tainted(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"cp-0"}, tainted)
	require.NoError(t, taints.Untaint(ctx, "cp-0"))
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(node), node))
	assert.Equal(t, before, node.Spec.Taints)
}

func ptrTo[T any](v T) *T { return &v }

// The hub as deployed is ready for a quorum loss: degraded mode on, its journal on a volume that
// outlives a container restart; never scheduled on a control-plane node (it would die with the
// machines it must heal); with standalone BMCs, its own inventory is the break-glass inventory; with
// the break-glass component, the inventory its flag names is in the Secret it mounts; and the flag
// parses with the rest.
func TestHubDeploymentReadyForQuorumLoss(t *testing.T) {
	for _, o := range overlays {
		out, err := kubectl(t, "kustomize", filepath.Join("..", "..", "deploy", "overlays", o))
		require.NoError(t, err, out)
		var hubDoc string
		for _, doc := range strings.Split(out, "\n---\n") {
			if strings.Contains(doc, "kind: Deployment\n") && strings.Contains(doc, "\n  name: hale-hub\n") {
				hubDoc = doc
			}
		}
		require.NotEmpty(t, hubDoc, o)
		var d struct {
			Spec struct {
				Template struct {
					Spec struct {
						Affinity struct {
							NodeAffinity corev1.NodeAffinity `json:"nodeAffinity"`
						} `json:"affinity"`
						Containers []corev1.Container `json:"containers"`
						Volumes    []corev1.Volume    `json:"volumes"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(hubDoc), &d), o)
		pod := d.Spec.Template.Spec
		terms := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		require.NotNil(t, terms, o)
		assert.Contains(t, terms.NodeSelectorTerms[0].MatchExpressions, corev1.NodeSelectorRequirement{
			Key: "node-role.kubernetes.io/control-plane", Operator: corev1.NodeSelectorOpDoesNotExist}, o)
		c := pod.Containers[0]
		mounts := map[string]string{}
		for _, m := range c.VolumeMounts {
			mounts[m.MountPath] = m.Name
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range pod.Volumes {
			volumes[v.Name] = v
		}
		flag := func(name string) string {
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
					return v
				}
			}
			return ""
		}
		journal := flag("degraded-journal")
		require.NotEmpty(t, journal, "%s: degraded mode is on", o)
		v := volumes[mounts[filepath.Dir(journal)]]
		require.NotNil(t, v.EmptyDir, "%s: the degraded journal's directory %s is an emptyDir", o, filepath.Dir(journal))
		assert.Empty(t, v.EmptyDir.Medium, "%s: on disk, not in memory", o)
		// The break-glass inventory: standalone-bmc's is its own inventory (machines, BMCs and the
		// mounted credentials: a two-of-three loss is healed in degraded mode); metal3-break-glass's is
		// in the Secret the user makes (none rendered); elsewhere none, and the docs say what that holds.
		switch bg := flag("break-glass-inventory"); o {
		case "standalone-bmc":
			assert.Equal(t, flag("inventory"), bg, o)
		case "metal3-break-glass":
			secret := volumes[mounts[filepath.Dir(bg)]].Secret
			require.NotNil(t, secret, "%s: the break-glass inventory %s is in a mounted Secret", o, bg)
			assert.Equal(t, "hale-break-glass", secret.SecretName, o)
		default:
			assert.Empty(t, bg, o)
			continue
		}
		cmd := newRunCommand()
		require.NoError(t, cmd.ParseFlags(c.Args[1:]), o)
	}
}
