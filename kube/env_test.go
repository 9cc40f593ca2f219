package kube

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hale-dev/hale/api/v1alpha1"
)

// moduleDir is where the module cache holds module@version (downloaded when missing): Cluster API's
// CRDs come from there, as its own repository ships them.
func moduleDir(t *testing.T, modVersion string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", modVersion).Output()
	require.NoError(t, err, "go mod download %s", modVersion)
	var m struct{ Dir, Error string }
	require.NoError(t, json.Unmarshal(out, &m))
	require.Empty(t, m.Error)
	return m.Dir
}

// startAPIServer starts a real kube-apiserver (and its etcd) through envtest with Hale's CRDs, from
// KUBEBUILDER_ASSETS or the cache test/kube/build-assets fills; test/run builds them when missing.
// Missing binaries fail the test: they are never silently skipped.
func startAPIServer(t *testing.T) client.Client {
	t.Helper()
	c, _ := startAPIServerConfig(t)
	return c
}

func startAPIServerConfig(t *testing.T) (client.Client, *rest.Config) {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		home, _ := os.UserHomeDir()
		assets = filepath.Join(home, ".cache", "hale", "kube-assets-1.36.3")
	}
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		t.Fatalf("no kube-apiserver in %s: run test/kube/build-assets (test/run does) or set KUBEBUILDER_ASSETS", assets)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ErrorIfCRDPathMissing: true,
		CRDDirectoryPaths: []string{filepath.Join("..", "deploy", "crds"), moduleDir(t, "sigs.k8s.io/cluster-api@v1.14.2") + "/core/config/crd/bases"}}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	require.NoError(t, clusterv1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	return c, cfg
}
