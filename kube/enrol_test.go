package kube

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/kube/enrol"
	"github.com/hale-dev/hale/test/capture"
)

// Enrolment on a real API server, with real service account tokens bound to pods on nodes: an
// agent's request pins its key for the node its pod runs on, and is approved; a request for another
// node, from another account, or with a token bound to no pod is denied with the reason and pins
// nothing; a new key for a node replaces the old; hub replicas whose pods are gone are unpinned.
func TestEnrolmentPinsTheNodeTheAPIServerVouchesFor(t *testing.T) {
	c, cfg, ns := shared.Namespace(t)
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(cfg)
	for _, sa := range []string{"hale-agent", "hale-hub", "someone-else"} {
		require.NoError(t, c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}))
	}
	// Any service account may ask: RBAC lets both create requests (the hub tells them apart).
	role := ns + "-enrol"
	require.NoError(t, c.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create"}}}}))
	require.NoError(t, c.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "Group", Name: "system:serviceaccounts:" + ns}}}))
	// The agents may read the pinned keys (deploy/agents/identities.yaml).
	require.NoError(t, c.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pinned-keys"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{identity.PinnedConfigMap}, Verbs: []string{"get"}}}}))
	require.NoError(t, c.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pinned-keys"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pinned-keys"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "hale-agent"}}}))
	node := func(name string) string { return ns + "-" + name }
	for _, n := range []string{"cp-1", "cp-2"} {
		require.NoError(t, c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node(n)}}))
	}
	pod := func(name, sa, on string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: on,
			Containers: []corev1.Container{{Name: "agent", Image: "hale"}}}}
		require.NoError(t, c.Create(ctx, p))
		return p
	}
	// token is a token of account sa, bound to pod p when not nil (as the kubelet's projected token of
	// an agent's pod is).
	token := func(sa string, p *corev1.Pod) string {
		req := &authenticationv1.TokenRequest{}
		if p != nil {
			req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	asAgent := func(sa string, p *corev1.Pod) client.Client {
		ac := rest.AnonymousClientConfig(cfg)
		ac.BearerToken = token(sa, p)
		cl, err := client.New(ac, client.Options{Scheme: c.Scheme()})
		require.NoError(t, err)
		return cl
	}
	enrolAs := func(as client.Client, name string, id identity.Identity, forNode string) {
		t.Helper()
		pemReq, err := id.EnrolmentRequest(forNode)
		require.NoError(t, err)
		require.NoError(t, as.Create(ctx, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
			Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: identity.IdentitySigner, Request: pemReq,
				Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}}}))
	}
	answer := func(name string) (certificatesv1.RequestConditionType, string) {
		var csr certificatesv1.CertificateSigningRequest
		require.NoError(t, c.Get(ctx, client.ObjectKey{Name: name}, &csr))
		require.Len(t, csr.Status.Conditions, 1, name)
		return csr.Status.Conditions[0].Type, csr.Status.Conditions[0].Message
	}

	pinned := enrol.PinnedKeys{Client: c, Key: client.ObjectKey{Namespace: ns, Name: identity.PinnedConfigMap}}
	require.NoError(t, c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.PinnedConfigMap}}))
	logs := &capture.Buffer{}
	e := &enrol.Enroller{Client: c, Pinned: pinned, Agents: []string{"system:serviceaccount:" + ns + ":hale-agent"},
		Hubs: []string{"system:serviceaccount:" + ns + ":hale-hub"}, Log: slog.New(slog.NewTextHandler(logs, nil))}
	lines := func() string {
		ls, err := pinned.Read(ctx)
		require.NoError(t, err)
		var out []string
		for _, l := range ls {
			out = append(out, l.String())
		}
		return strings.Join(out, "\n")
	}

	agent1 := pod("agent-cp-1", "hale-agent", node("cp-1"))
	id1, id1b, forger := identity.NewIdentity(), identity.NewIdentity(), identity.NewIdentity()
	enrolAs(asAgent("hale-agent", agent1), "cp-1", id1, node("cp-1"))
	enrolAs(asAgent("hale-agent", agent1), "cp-2-from-cp-1", forger, node("cp-2"))
	enrolAs(asAgent("someone-else", pod("other-on-cp-2", "someone-else", node("cp-2"))), "other-account", forger, node("cp-2"))
	enrolAs(asAgent("hale-agent", nil), "unbound-token", forger, node("cp-2"))
	require.NoError(t, e.Pass(ctx))

	assert.Equal(t, node("cp-1")+" "+id1.Public().String(), lines())
	kind, msg := answer(ns + "-cp-1")
	assert.Equal(t, certificatesv1.CertificateApproved, kind)
	assert.Contains(t, msg, "the key of "+node("cp-1")+" pinned")
	for name, why := range map[string]string{
		"cp-2-from-cp-1": `the request names "` + node("cp-2") + `", but its requester may enrol only "` + node("cp-1") + `"`,
		"other-account":  `requested by "system:serviceaccount:` + ns + `:someone-else", not by a Hale agent's or hub's service account`,
		"unbound-token":  "the request carries no node: the requester's token is not bound to a pod on a node",
	} {
		kind, msg := answer(ns + "-" + name)
		assert.Equal(t, certificatesv1.CertificateDenied, kind, name)
		assert.Contains(t, msg, why, name)
	}

	// The node's disk was replaced: its agent made a new key and enrols it; the old one goes.
	enrolAs(asAgent("hale-agent", agent1), "cp-1-new-disk", id1b, node("cp-1"))
	// A hub replica enrols its own key for the names of its pod; the line of one that is gone goes.
	hubPod := pod("hale-hub-abc", "hale-hub", node("cp-2"))
	enrolAs(asAgent("hale-hub", hubPod), "hub-abc", identity.NewIdentity(), enrol.HubPinName(hubPod.Name))
	enrolAs(asAgent("hale-hub", hubPod), "hub-as-a-node", forger, node("cp-2"))
	_, err := pinned.Pin(ctx, enrol.HubPinName("hale-hub-gone"), identity.NewIdentity().Public())
	require.NoError(t, err)
	require.NoError(t, e.Pass(ctx))
	kind, msg = answer(ns + "-hub-as-a-node")
	assert.Equal(t, certificatesv1.CertificateDenied, kind)
	assert.Contains(t, msg, `its requester may enrol only "hub-hale-hub-abc-*"`)
	got := lines()
	assert.Contains(t, got, node("cp-1")+" "+id1b.Public().String())
	assert.NotContains(t, got, id1.Public().String(), "the old key of the node")
	assert.Contains(t, got, "hub-hale-hub-abc-* ")
	assert.NotContains(t, got, "hub-hale-hub-gone-*")
	assert.NotContains(t, got, forger.Public().String())
	assert.Contains(t, logs.String(), "enrolment denied")

	// What every member reads back is a pinned-keys file: the key pinned for the node verifies.
	var cm corev1.ConfigMap
	require.NoError(t, c.Get(ctx, pinned.Key, &cm))
	p, err := identity.ParsePinned([]byte(cm.Data[identity.PinnedKeysKey]), "test")
	require.NoError(t, err)
	assert.Equal(t, []identity.PublicKey{id1b.Public()}, p.Keys(node("cp-1")))
	assert.Equal(t, 2, p.Len())

	// The agent's own client, as it runs in the agent's pod on cp-2: it reads the pinned keys, asks
	// for its key, and has it (and its local copy) once the hub has answered.
	dir := t.TempDir()
	files := map[string][]byte{"token": []byte(token("hale-agent", pod("agent-cp-2", "hale-agent", node("cp-2")))), "ca.crt": cfg.CAData}
	for name, b := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o600))
	}
	id2 := identity.NewIdentity()
	agent := &identity.Enrolment{Server: cfg.Host, CAFile: filepath.Join(dir, "ca.crt"), TokenFile: filepath.Join(dir, "token"), Namespace: ns,
		ConfigMap: pinned.Key.Name, Node: node("cp-2"), Identity: id2, Copy: filepath.Join(dir, "pinned-keys"), Log: slog.New(slog.NewTextHandler(logs, nil))}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	got2 := make(chan identity.Pinned, 100)
	go agent.Run(runCtx, func(p identity.Pinned) { got2 <- p })
	deadline := time.After(30 * time.Second)
	for have := false; !have; {
		require.NoError(t, e.Pass(ctx))
		select {
		case p := <-got2:
			have = slices.ContainsFunc(p.Keys(node("cp-2")), func(k identity.PublicKey) bool { return k.String() == id2.Public().String() })
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the agent's key was not pinned in 30 s:\n%s", logs)
		}
	}
	restarted := &identity.Enrolment{Copy: agent.Copy, Log: agent.Log} // the agent started again, the API server down
	assert.Equal(t, []identity.PublicKey{id2.Public()}, restarted.Start().Keys(node("cp-2")), "the local copy, for a start while the API server is down")
	assert.NotContains(t, logs.String(), "the local copy cannot be read")
	kind, _ = answer("hale-identity-" + id2.Public().Fingerprint())
	assert.Equal(t, certificatesv1.CertificateApproved, kind)
}
