package kube

import (
	"os"
	"testing"

	"github.com/hale-dev/hale/test/kubeenv"
)

// shared is the package's one API server for the tests that touch only namespaced objects, each in
// a namespace of its own; the discovery tests (cluster-scoped Nodes), the real baremetal-operator's
// (metal3's own CRDs) and the real Cluster API's (its webhooks) start their own.
var shared kubeenv.Shared

func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }
