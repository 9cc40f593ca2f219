package kubeenv

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/health/identity"
)

// EnrolAgent enrols id as the agent on node does in a cluster Hale's agents are installed in
// (deploy/agents: their account hale-agent in namespace ns, its permission to ask): its pod, on
// node, asks with its own bound token for its key to be pinned (a CertificateSigningRequest of
// identity.IdentitySigner). It returns the request's name.
func EnrolAgent(t testing.TB, c client.Client, cfg *rest.Config, ns, node string, id identity.Identity) string {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hale-agent-" + node}, Spec: corev1.PodSpec{ServiceAccountName: "hale-agent",
		NodeName: node, Containers: []corev1.Container{{Name: "agent", Image: "hale"}}}}
	require.NoError(t, c.Create(ctx, pod))
	tr, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ServiceAccounts(ns).CreateToken(ctx, "hale-agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}},
		metav1.CreateOptions{})
	require.NoError(t, err)
	as := rest.AnonymousClientConfig(cfg)
	as.BearerToken = tr.Status.Token
	ac, err := client.New(as, client.Options{Scheme: c.Scheme()})
	require.NoError(t, err)
	req, err := id.EnrolmentRequest(node)
	require.NoError(t, err)
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "hale-identity-" + id.Public().Fingerprint()},
		Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: identity.IdentitySigner, Request: req,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}}}
	require.NoError(t, ac.Create(ctx, csr))
	return csr.Name
}
