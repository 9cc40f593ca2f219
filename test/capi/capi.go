// Package capi runs Cluster API's real controllers (v1.14.2, built by test/kube/build-capi) against a
// test's kube-apiserver, as plain processes: the core manager, the kubeadm bootstrap and control-plane
// providers, and the Docker provider's manager (CAPD) whose in-memory backend simulates machines, their
// nodes and their etcd members without Docker. Each provider's CRDs and webhook configurations are
// rendered from its own config/default, with every webhook pointed at the manager on 127.0.0.1 through
// one self-signed CA (no cert-manager). The managers run in this process's network, or on a host of a
// netns lab (StartWith), where they reach what that host reaches (a workload cluster's API server).
package capi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hale-dev/hale/test/kubeenv"
	"github.com/hale-dev/hale/test/proc"
)

// Version is the Cluster API release these tests run.
const Version = "v1.14.2"

// Dir is where test/kube/build-capi puts the managers and their config: $HALE_CAPI_DIR, or a cache in
// the home directory.
func Dir() string {
	if d := os.Getenv("HALE_CAPI_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "hale", "capi-"+Version)
}

// provider is one manager: its binary and config/ directory under Dir, and its extra arguments.
type provider struct {
	name string
	args []string
	env  []string
}

// providers are the managers, in the order they start.
func providers() []provider {
	return []provider{
		// A plain Cluster (no ClusterClass) needs ClusterTopology off; RuntimeSDK would want extension
		// servers. MachinePool stays on as shipped (the bootstrap provider's webhooks expect its CRDs).
		{name: "core", args: []string{"--feature-gates=MachinePool=true,ClusterTopology=false,RuntimeSDK=false"}},
		{name: "bootstrap-kubeadm"},
		{name: "controlplane-kubeadm"},
		// The in-memory backend serves each simulated workload cluster's API server on POD_IP.
		{name: "capd", env: []string{"POD_IP=127.0.0.1"}},
	}
}

// Controllers are the running managers, by name (core, bootstrap-kubeadm, controlplane-kubeadm, capd).
type Controllers map[string]*proc.Process

// Options say which managers StartWith runs and where.
type Options struct {
	// Providers are the managers to run, in providers' order: all of them when empty.
	Providers []string
	// Start starts a manager from its command line (env(1)'s: its environment first): a process of
	// a netns lab's host, say. A process in this one's network when nil.
	Start func(name string, args ...string) *proc.Process
	// Reach is an address on this process's loopback at which addr, as the managers' own network
	// reaches it (127.0.0.1:PORT, a manager's webhooks or health endpoint), is reached: by the API
	// server (the webhooks) and the test (readiness). addr itself when nil.
	Reach func(addr string) string
}

// Start installs every provider's CRDs and webhooks into the API server c talks to (kubeconfig is the
// same server, for the managers), starts the managers with syncPeriod as their resync and waits until
// each is ready. They stop when the test ends; their logs are shown when it failed.
func Start(t testing.TB, c client.Client, kubeconfig string, syncPeriod time.Duration) Controllers {
	t.Helper()
	return StartWith(t, c, kubeconfig, syncPeriod, Options{})
}

// StartWith is Start with the managers o names, run where o says.
func StartWith(t testing.TB, c client.Client, kubeconfig string, syncPeriod time.Duration, o Options) Controllers {
	t.Helper()
	if o.Start == nil {
		o.Start = func(name string, args ...string) *proc.Process {
			return proc.Start(t, name, exec.Command(args[0], args[1:]...))
		}
	}
	if o.Reach == nil {
		o.Reach = func(addr string) string { return addr }
	}
	var run []provider
	for _, p := range providers() {
		if len(o.Providers) == 0 || slices.Contains(o.Providers, p.name) {
			run = append(run, p)
		}
	}
	dir := Dir()
	for _, p := range run {
		if _, err := os.Stat(filepath.Join(dir, p.name)); err != nil {
			t.Fatalf("no %s manager in %s: run test/kube/build-capi (test/run does)", p.name, dir)
		}
	}
	certDir, caPEM := servingCert(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ports := map[string]int{}
	for _, p := range run {
		ports[p.name] = proc.FreePort(t)
		install(ctx, t, c, p.name, "https://"+o.Reach("127.0.0.1:"+strconv.Itoa(ports[p.name])), caPEM)
	}
	ctrls := Controllers{}
	for _, p := range run {
		health := "127.0.0.1:" + strconv.Itoa(proc.FreePort(t))
		args := append([]string{"env", "KUBECONFIG=" + kubeconfig, "POD_NAMESPACE=capi-" + p.name}, p.env...)
		args = append(append(args, filepath.Join(dir, p.name), "--leader-elect=false", "--diagnostics-address=0", "--insecure-diagnostics",
			"--webhook-port="+strconv.Itoa(ports[p.name]), "--webhook-cert-dir="+certDir,
			"--health-addr="+health, "--sync-period="+syncPeriod.String()), p.args...)
		ctrls[p.name] = o.Start("Cluster API "+p.name+" manager", args...)
		ctrls[p.name].WaitReady(t, "http://"+o.Reach(health)+"/readyz", time.Minute)
	}
	return ctrls
}

// install renders config/<name>/default and creates its CRDs (conversion webhooks at the manager, at
// base) and webhook configurations (every webhook at the manager), and waits until the CRDs are established.
func install(ctx context.Context, t testing.TB, c client.Client, name, base string, caPEM []byte) {
	t.Helper()
	out, err := kubeenv.Kubectl("kustomize", filepath.Join(Dir(), "config", name, "default"))
	require.NoError(t, err, "rendering %s's config/default: %s", name, out)
	ca := base64.StdEncoding.EncodeToString(caPEM) // caBundle, as unstructured objects hold []byte
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	var crds []string
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, "decoding %s's config/default", name)
		}
		switch u.GetKind() {
		case "CustomResourceDefinition":
			if _, found, _ := unstructured.NestedMap(u.Object, "spec", "conversion", "webhook"); found {
				path, _, _ := unstructured.NestedString(u.Object, "spec", "conversion", "webhook", "clientConfig", "service", "path")
				require.NoError(t, unstructured.SetNestedMap(u.Object, map[string]any{"url": base + path, "caBundle": ca},
					"spec", "conversion", "webhook", "clientConfig"))
			}
			crds = append(crds, u.GetName())
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			hooks, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
			for i, h := range hooks {
				hook := h.(map[string]any)
				path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
				hook["clientConfig"] = map[string]any{"url": base + path, "caBundle": ca}
				hooks[i] = hook
			}
			require.NoError(t, unstructured.SetNestedSlice(u.Object, hooks, "webhooks"))
		default:
			continue
		}
		u.SetAnnotations(nil) // cert-manager's injection annotations: nothing injects here
		require.NoError(t, c.Create(ctx, &u), "creating %s %s from %s's config", u.GetKind(), u.GetName(), name)
	}
	for _, crd := range crds {
		require.Eventually(t, func() bool {
			var got apiextensionsv1.CustomResourceDefinition
			if c.Get(ctx, types.NamespacedName{Name: crd}, &got) != nil {
				return false
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true
				}
			}
			return false
		}, 30*time.Second, 50*time.Millisecond, "CRD %s not established", crd)
	}
}

// servingCert writes a self-signed CA's serving certificate for 127.0.0.1 as tls.crt/tls.key into a
// directory of the test and returns it and the CA's PEM.
func servingCert(t testing.TB) (string, []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hale-test-capi-webhooks"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames: []string{"localhost"}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return dir, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}
