// Package bmo runs metal3's real baremetal-operator (v0.13.2, built by test/kube/build-bmo) against a
// test's kube-apiserver, in test mode: its host state machine, conditions, finalizers, annotation
// handling and Events are the operator's own; power and timings are its fixture provisioner's (no
// Ironic, no BMC). That provisioner keeps one power state per process, so each host gets an operator
// of its own, watching only the host's namespace.
package bmo

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hale-dev/hale/test/proc"
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
	*proc.Process
	Namespace string
}

// Start runs an operator for namespace with kubeconfig, webhooks off, and waits until it is ready;
// it stops when the test ends (its log is shown when the test failed).
func Start(t testing.TB, kubeconfig, namespace string) *Operator {
	t.Helper()
	CRDs(t)
	health := proc.FreePort(t)
	cmd := exec.Command(filepath.Join(Dir(), "baremetal-operator"), "-test-mode", "-namespace", namespace, "-webhook-port", "0",
		"-metrics-addr", "0", "-health-addr", "127.0.0.1:"+strconv.Itoa(health))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "POD_NAMESPACE="+namespace)
	o := &Operator{Process: proc.Start(t, "baremetal-operator for "+namespace, cmd), Namespace: namespace}
	o.WaitReady(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", health), 30*time.Second)
	return o
}
