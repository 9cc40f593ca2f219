package netns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/hale-dev/hale/test/kubeassets"
)

// Binaries are the programs a lab runs: the hub, the agent and hale-demo (its Redfish simulator)
// built from this module, and the etcd binary test/kube/build-assets builds.
type Binaries struct{ Hub, Agent, Demo, Etcd string }

// Build builds the hub, the agent and hale-demo into dir (which must exist) and finds the etcd binary in
// $KUBEBUILDER_ASSETS (default ~/.cache/hale/kube-assets-1.36.3). It runs from anywhere inside the
// module.
func Build(dir string) (Binaries, error) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return Binaries{}, fmt.Errorf("finding the module (run from the repository): %w", err)
	}
	b := Binaries{Hub: filepath.Join(dir, "hub"), Agent: filepath.Join(dir, "agent"), Demo: filepath.Join(dir, "hale-demo")}
	for _, p := range []struct{ out, pkg string }{{b.Hub, "./cmd/hub"}, {b.Agent, "./cmd/agent"}, {b.Demo, "./cmd/hale-demo"}} {
		cmd := exec.Command("go", "build", "-o", p.out, p.pkg)
		cmd.Dir = strings.TrimSpace(string(root))
		if msg, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("building %s: %w\n%s", p.pkg, err, msg)
		}
	}
	b.Etcd = filepath.Join(kubeassets.Dir(), "etcd")
	if _, err := os.Stat(b.Etcd); err != nil {
		return Binaries{}, fmt.Errorf("the etcd binary: %w (test/kube/build-assets builds it, test/run runs it first; or set KUBEBUILDER_ASSETS to its directory)", err)
	}
	return b, nil
}
