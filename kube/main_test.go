package kube

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hale-dev/hale/test/kubeenv"
)

// shared is the package's one API server for the tests that touch only namespaced objects, each in
// a namespace of its own; the discovery tests (cluster-scoped Nodes), the real baremetal-operator's
// (metal3's own CRDs) and the real Cluster API's (its webhooks) start their own.
var shared kubeenv.Shared

func TestMain(m *testing.M) {
	// controller-runtime's logger, never set, prints a warning with a stack the first time an
	// informer logs: in the middle of a benchmark's result line, whose figure test/run then cannot
	// read (the shared cache's benchmark, in a full run).
	ctrllog.SetLogger(logr.Discard())
	os.Exit(shared.Run(m))
}
