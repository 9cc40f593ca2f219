// Package kubeenv starts a real kube-apiserver (and its etcd) for tests through envtest, with Hale's
// CRDs, Cluster API's (core and KubeadmControlPlane), medik8s' NodeMaintenance and stand-ins for
// metal3's BareMetalHost, Metal3Cluster and Metal3Machine CRDs, from KUBEBUILDER_ASSETS or the cache
// test/kube/build-assets fills (test/run builds them when missing). Missing binaries fail the test:
// they are never silently skipped.
package kubeenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// moduleDir is where the module cache holds module@version (downloaded when missing): Cluster API's
// CRDs come from there, as its own repository ships them. A module the checksum database does not
// know is downloaded without it, and its hash must be sum (pinned here instead).
func moduleDir(modVersion, sum string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", modVersion)
	if sum != "" {
		path, _, _ := strings.Cut(modVersion, "@")
		cmd.Env = append(os.Environ(), "GONOSUMDB="+path)
	}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	var m struct{ Dir, Error, Sum string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	if m.Error != "" {
		return "", fmt.Errorf("go mod download %s: %s", modVersion, m.Error)
	}
	if sum != "" && m.Sum != sum {
		return "", fmt.Errorf("go mod download %s: its hash is %s, not the %s pinned in test/kubeenv: not used", modVersion, m.Sum, sum)
	}
	return m.Dir, nil
}

// medik8s' node-maintenance-operator, for its NodeMaintenance CRD: the checksum database does not know
// it (the module proxy serves it), so its hash is pinned.
const nodeMaintenance, nodeMaintenanceSum = "github.com/medik8s/node-maintenance-operator@v0.17.0", "h1:2zHpibBhwj3e+9k0J+4dy7rXDB3P1QQ/zZKQ0lVvW9E="

// crdDirs are the CRDs Start installs besides Hale's: Cluster API's core (when capiCore) and
// KubeadmControlPlane, medik8s' NodeMaintenance, and the stand-ins for metal3's (or metal3's own
// BareMetalHost, when metal3CRDs is set).
func crdDirs(metal3CRDs string, capiCore bool) ([]string, error) {
	capi, err := moduleDir("sigs.k8s.io/cluster-api@v1.14.2", "")
	if err != nil {
		return nil, err
	}
	nmo, err := moduleDir(nodeMaintenance, nodeMaintenanceSum)
	if err != nil {
		return nil, err
	}
	if metal3CRDs == "" {
		root, err := repoRoot()
		if err != nil {
			return nil, err
		}
		metal3CRDs = filepath.Join(root, "test", "kubeenv", "crds")
	}
	dirs := []string{capi + "/controlplane/kubeadm/config/crd/bases", nmo + "/config/crd/bases", metal3CRDs}
	if capiCore {
		dirs = append(dirs, capi+"/core/config/crd/bases")
	}
	return dirs, nil
}

// Start starts the API server for the test and returns a client (with Hale's, Cluster API's and the
// built-in types) and its config; it stops when the test ends. Tests that touch only namespaced
// objects share one server instead (Shared).
func Start(t testing.TB) (client.Client, *rest.Config) {
	t.Helper()
	return StartWithMetal3(t, "")
}

// StartWithMetal3 is Start with metal3's own CRDs from metal3CRDs (the real baremetal-operator's
// config/base/crds/bases, test/kube/build-bmo) in place of the stand-in BareMetalHost CRD.
func StartWithMetal3(t testing.TB, metal3CRDs string) (client.Client, *rest.Config) {
	t.Helper()
	dirs, err := crdDirs(metal3CRDs, true)
	require.NoError(t, err)
	c, cfg, _ := startOn(t, nil, dirs...)
	return c, cfg
}

// StartBare is Start with Hale's CRDs only: for tests that install Cluster API's own way (test/capi
// renders each provider's config with its webhooks).
func StartBare(t testing.TB) (client.Client, *rest.Config) {
	t.Helper()
	c, cfg, _ := startOn(t, nil)
	return c, cfg
}

// StartForCAPI is StartBare with KubeadmControlPlane's CRD and the stand-ins for metal3's
// (BareMetalHost, and Metal3Cluster and Metal3Machine, Cluster API's infrastructure on them): a
// management cluster whose Cluster API core manager test/capi installs and runs (its own CRDs and
// webhooks), without KubeadmControlPlane's.
func StartForCAPI(t testing.TB) (client.Client, *rest.Config) {
	t.Helper()
	dirs, err := crdDirs("", false)
	require.NoError(t, err)
	c, cfg, _ := startOn(t, nil, dirs...)
	return c, cfg
}

// StartOnEtcd is Start on the etcd cluster at endpoints (client URLs) instead of envtest's own
// etcd: a test that stops its members stops the API server's storage, as a quorum loss does. The
// environment restarts the API server (ControlPlane.APIServer's Stop and Start), as after an etcd
// recovery.
func StartOnEtcd(t testing.TB, endpoints []string) (client.Client, *rest.Config, *envtest.Environment) {
	t.Helper()
	return startOn(t, endpoints)
}

// startOn starts the API server with Hale's CRDs and those in crdDirs, on the etcd at endpoints when
// there are any; it stops when the test ends.
func startOn(t testing.TB, endpoints []string, crdDirs ...string) (client.Client, *rest.Config, *envtest.Environment) {
	t.Helper()
	certDir := ""
	if len(endpoints) > 0 {
		// The API server's certificates in a directory of the test's: a restart keeps them (envtest
		// makes new ones, signed by a new CA, in a directory of its own).
		certDir = t.TempDir()
	}
	env, c, cfg, err := launch(certDir, endpoints, crdDirs...)
	for try := 2; err != nil && try <= 3; try++ {
		// envtest's own etcd can lose the port it picked to another process of the test between the
		// pick and the bind, and then fails at once five times ("timeout waiting for process etcd to
		// start", in 0.35 s: test/quorumlost in a CI run): a new start picks new ports.
		t.Logf("starting the API server (try %d of 3) after: %v", try, err)
		env, c, cfg, err = launch(certDir, endpoints, crdDirs...)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	return c, cfg, env
}

// launch starts an API server with Hale's CRDs and those in crdDirs (its certificates in certDir, when
// given).
func launch(certDir string, endpoints []string, crdDirs ...string) (*envtest.Environment, client.Client, *rest.Config, error) {
	assets := kubeassets.Dir()
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		return nil, nil, nil, fmt.Errorf("no kube-apiserver in %s: run test/kube/build-assets (test/run does) or set KUBEBUILDER_ASSETS", assets)
	}
	root, err := repoRoot()
	if err != nil {
		return nil, nil, nil, err
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ErrorIfCRDPathMissing: true,
		CRDDirectoryPaths: append([]string{filepath.Join(root, "deploy", "crds")}, crdDirs...)}
	if len(endpoints) > 0 {
		env.ControlPlane.GetAPIServer().Configure().Set("etcd-servers", strings.Join(endpoints, ","))
	}
	// No fsync for the API server's own etcd: it shares the disk with the rest of the run (the real
	// cluster's nodes, their images and etcd), whose writes stalled its fsyncs, and with them its reads,
	// for seconds (a full run: the shared server took 3.8 s to answer a GET). Its data lives as long as
	// the test, and a stopped process's writes are in the page cache either way.
	if env.ControlPlane.Etcd == nil {
		env.ControlPlane.Etcd = &envtest.Etcd{}
	}
	env.ControlPlane.Etcd.Configure().Set("unsafe-no-fsync", "true")
	env.ControlPlane.GetAPIServer().CertDir = certDir
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("starting the API server: %w", err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, clusterv1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			_ = env.Stop()
			return nil, nil, nil, err
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, nil, nil, err
	}
	return env, c, cfg, nil
}

// Shared is one API server (as Start's) for the tests of one test binary: the first test that asks
// starts it, the package's TestMain stops it after the last (Run). Each test gets a namespace of its
// own, so tests that touch only namespaced objects cannot see each other's. A test that needs
// cluster-scoped objects of its own (Nodes, RBAC, admission policies), other CRDs or another etcd
// starts its own server.
type Shared struct {
	once sync.Once
	env  *envtest.Environment
	c    client.Client
	cfg  *rest.Config
	err  error
	n    atomic.Int64
}

// Run runs the package's tests (TestMain's m) and stops the server if one started; it returns the
// exit code for os.Exit.
func (s *Shared) Run(m *testing.M) int {
	code := m.Run()
	if s.env != nil {
		if err := s.env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the shared API server: %v\n", err)
		}
	}
	return code
}

// Namespace returns the shared server's client and config, and a new namespace for the test (named
// after it, created).
func (s *Shared) Namespace(t testing.TB) (client.Client, *rest.Config, string) {
	t.Helper()
	s.once.Do(func() {
		var dirs []string
		if dirs, s.err = crdDirs("", true); s.err == nil {
			s.env, s.c, s.cfg, s.err = launch("", nil, dirs...)
		}
	})
	require.NoError(t, s.err, "the package's shared API server")
	name := fmt.Sprintf("t%d-%s", s.n.Add(1), strings.Trim(nonName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-"))
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	require.NoError(t, s.c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return s.c, s.cfg, name
}

// nonName is what a namespace's name may not hold.
var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

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
		Clusters:       map[string]*clientcmdapi.Cluster{"envtest": {Server: cfg.Host, CertificateAuthorityData: cfg.CAData, TLSServerName: cfg.ServerName}},
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

// ControllerManager runs the kube-controller-manager test/kube/build-assets built against cfg's API
// server with only the named controllers (as `--controllers`), until the test ends; its output goes
// to the test's log when the test fails.
func ControllerManager(t testing.TB, cfg *rest.Config, controllers ...string) {
	t.Helper()
	dir := t.TempDir()
	var out bytes.Buffer
	cmd := exec.Command(filepath.Join(kubeassets.Dir(), "kube-controller-manager"), "--kubeconfig", Kubeconfig(t, cfg, dir, ""),
		"--controllers", strings.Join(controllers, ","), "--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false")
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start(), "kube-controller-manager (test/kube/build-assets builds it)")
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("kube-controller-manager:\n%s", out.String())
		}
	})
}
