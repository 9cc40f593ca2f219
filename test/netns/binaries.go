package netns

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hale-dev/hale/test/kubeassets"
	"github.com/hale-dev/hale/test/proc"
)

// Binaries are the programs a lab runs: the hub, the agent and hale-demo (its Redfish simulator)
// built from this module, and the etcd binary test/kube/build-assets builds.
type Binaries struct{ Hub, Agent, Demo, Etcd string }

// Build builds the hub, the agent and hale-demo into dir, which must exist (static, as the image
// does: proc.Build), and finds the etcd binary in $KUBEBUILDER_ASSETS (default
// ~/.cache/hale/kube-assets-1.36.3). It runs from anywhere inside the module.
func Build(dir string) (Binaries, error) {
	b := Binaries{Hub: filepath.Join(dir, "hub"), Agent: filepath.Join(dir, "agent"), Demo: filepath.Join(dir, "hale-demo")}
	if err := proc.Build(map[string]string{b.Hub: "./cmd/hub", b.Agent: "./cmd/agent", b.Demo: "./cmd/hale-demo"}); err != nil {
		return Binaries{}, err
	}
	b.Etcd = filepath.Join(kubeassets.Dir(), "etcd")
	if _, err := os.Stat(b.Etcd); err != nil {
		return Binaries{}, fmt.Errorf("the etcd binary: %w (test/kube/build-assets builds it, test/run runs it first; or set KUBEBUILDER_ASSETS to its directory)", err)
	}
	return b, nil
}
