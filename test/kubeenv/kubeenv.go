// Package kubeenv starts a real kube-apiserver (and its etcd) for tests through envtest, with Hale's
// CRDs, Cluster API's (core and KubeadmControlPlane) and a stand-in for metal3's BareMetalHost CRD,
// from KUBEBUILDER_ASSETS or the cache test/kube/build-assets fills (test/run builds them when
// missing). Missing binaries fail the test: they are never silently skipped.
package kubeenv

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hale-dev/hale/api/v1alpha1"
	"github.com/hale-dev/hale/test/kubeassets"
)

// repoRoot is the module's root: where go.mod is, from the test's directory up.
func repoRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// moduleDir is where the module cache holds module@version (downloaded when missing): Cluster API's
// CRDs come from there, as its own repository ships them.
func moduleDir(t testing.TB, modVersion string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", modVersion).Output()
	require.NoError(t, err, "go mod download %s", modVersion)
	var m struct{ Dir, Error string }
	require.NoError(t, json.Unmarshal(out, &m))
	require.Empty(t, m.Error)
	return m.Dir
}

// Start starts the API server for the test and returns a client (with Hale's, Cluster API's and the
// built-in types) and its config; it stops when the test ends.
func Start(t testing.TB) (client.Client, *rest.Config) {
	t.Helper()
	capi := moduleDir(t, "sigs.k8s.io/cluster-api@v1.14.2")
	return start(t, capi+"/core/config/crd/bases", capi+"/controlplane/kubeadm/config/crd/bases",
		filepath.Join(repoRoot(t), "test", "kubeenv", "crds"))
}

// StartWithMetal3 is Start with metal3's own CRDs from metal3CRDs (the real baremetal-operator's
// config/base/crds/bases, test/kube/build-bmo) in place of the stand-in BareMetalHost CRD.
func StartWithMetal3(t testing.TB, metal3CRDs string) (client.Client, *rest.Config) {
	t.Helper()
	capi := moduleDir(t, "sigs.k8s.io/cluster-api@v1.14.2")
	return start(t, capi+"/core/config/crd/bases", capi+"/controlplane/kubeadm/config/crd/bases", metal3CRDs)
}

// StartBare is Start with Hale's CRDs only: for tests that install Cluster API's own way (test/capi
// renders each provider's config with its webhooks).
func StartBare(t testing.TB) (client.Client, *rest.Config) {
	t.Helper()
	return start(t)
}

// StartOnEtcd is Start on the etcd cluster at endpoints (client URLs) instead of envtest's own
// etcd: a test that stops its members stops the API server's storage, as a quorum loss does.
func StartOnEtcd(t testing.TB, endpoints []string) (client.Client, *rest.Config) {
	t.Helper()
	return startOn(t, endpoints)
}

// start starts the API server with Hale's CRDs and those in crdDirs.
func start(t testing.TB, crdDirs ...string) (client.Client, *rest.Config) {
	t.Helper()
	return startOn(t, nil, crdDirs...)
}

// startOn is start, on the etcd at endpoints when there are any.
func startOn(t testing.TB, endpoints []string, crdDirs ...string) (client.Client, *rest.Config) {
	t.Helper()
	assets := kubeassets.Dir()
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		t.Fatalf("no kube-apiserver in %s: run test/kube/build-assets (test/run does) or set KUBEBUILDER_ASSETS", assets)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ErrorIfCRDPathMissing: true,
		CRDDirectoryPaths: append([]string{filepath.Join(repoRoot(t), "deploy", "crds")}, crdDirs...)}
	if len(endpoints) > 0 {
		env.ControlPlane.GetAPIServer().Configure().Set("etcd-servers", strings.Join(endpoints, ","))
	}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	require.NoError(t, clusterv1.AddToScheme(scheme))
	require.NoError(t, apiextensionsv1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	return c, cfg
}

// Kubectl runs the kubectl test/kube/build-assets built and returns its combined output.
func Kubectl(args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.Command(filepath.Join(kubeassets.Dir(), "kubectl"), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// Kubeconfig writes a kubeconfig file for cfg into dir, acting as user (impersonated, with groups)
// when user is not empty, and returns its path: for the CLI, and for RBAC checks as someone else.
func Kubeconfig(t testing.TB, cfg *rest.Config, dir, user string, groups ...string) string {
	t.Helper()
	auth := &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken,
		Impersonate: user, ImpersonateGroups: groups}
	kc := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"envtest": {Server: cfg.Host, CertificateAuthorityData: cfg.CAData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"user": auth},
		Contexts:       map[string]*clientcmdapi.Context{"envtest": {Cluster: "envtest", AuthInfo: "user"}},
		CurrentContext: "envtest",
	}
	name := user
	if name == "" {
		name = "admin"
	}
	path := filepath.Join(dir, "kubeconfig-"+name)
	require.NoError(t, clientcmd.WriteToFile(kc, path))
	return path
}
