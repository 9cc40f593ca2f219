// Package bmo runs metal3's real baremetal-operator (v0.13.2, built by test/kube/build-bmo) against a
// test's kube-apiserver, in test mode: its host state machine, conditions, finalizers, annotation
// handling and Events are the operator's own; power and timings are its fixture provisioner's (no
// Ironic, no BMC). That provisioner keeps one power state per process, so each host gets an operator
// of its own, watching only the host's namespace.
package bmo

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Version is the baremetal-operator these tests run.
const Version = "v0.13.2"

// Dir is where test/kube/build-bmo puts the operator's binary and its config (CRDs, webhooks):
// $HALE_BMO_DIR, or a cache in the home directory.
func Dir() string {
	if d := os.Getenv("HALE_BMO_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "hale", "bmo-"+Version)
}

// CRDs is the directory of the operator's own CRDs.
func CRDs(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(Dir(), "config", "base", "crds", "bases")
	if _, err := os.Stat(filepath.Join(Dir(), "baremetal-operator")); err != nil {
		t.Fatalf("no baremetal-operator in %s: run test/kube/build-bmo (test/run does)", Dir())
	}
	return dir
}

// Operator is one running baremetal-operator process.
type Operator struct {
	Namespace string
	mu        sync.Mutex
	logs      bytes.Buffer
}

// Logs returns what the operator logged so far.
func (o *Operator) Logs() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.logs.String()
}

func (o *Operator) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.logs.Write(p)
}

// Start runs an operator for namespace with kubeconfig, webhooks off, and waits until it is ready;
// it stops when the test ends (its log is shown when the test failed).
func Start(t testing.TB, kubeconfig, namespace string) *Operator {
	t.Helper()
	CRDs(t)
	health := freePort(t)
	o := &Operator{Namespace: namespace}
	cmd := exec.Command(filepath.Join(Dir(), "baremetal-operator"), "-test-mode", "-namespace", namespace, "-webhook-port", "0",
		"-metrics-addr", "0", "-health-addr", "127.0.0.1:"+strconv.Itoa(health))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "POD_NAMESPACE="+namespace)
	cmd.Stdout, cmd.Stderr = o, o
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("baremetal-operator for %s:\n%s", namespace, o.Logs())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", health)
	for {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return o
			}
		}
		select {
		case <-done:
			t.Fatalf("baremetal-operator for %s exited: %s", namespace, o.Logs())
		case <-ctx.Done():
			t.Fatalf("baremetal-operator for %s not ready in 30 s: %s", namespace, o.Logs())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
