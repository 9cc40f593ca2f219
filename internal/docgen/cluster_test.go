package docgen

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"testing"
)

// a name (not a URL: agent rejoin's --cluster is etcd's) after a YAML key or the agent's flag.
var clusterName = regexp.MustCompile(`(?m)(?:^[\s#]*cluster: |--cluster[ =])([A-Za-z0-9][A-Za-z0-9._-]*)(?:[\s\]]|$)`)

// The gossip cluster name must be the same in the agents' configuration and the hub's inventory (the
// hub gossips only with agents of its own cluster: a user who copies two examples that differ has a
// hub that never hears an agent). Every example of the standalone setup names one, and so does every
// manifest of deploy/ for Kubernetes.
func TestClusterNamesAgree(t *testing.T) {
	for _, set := range []struct {
		what  string
		globs []string
	}{
		{"the standalone examples", []string{"docs/*.md", "examples/*.yaml", "deploy/deb/*.yaml", "README.md"}},
		{"the Kubernetes manifests", []string{"deploy/base/*.yaml", "deploy/components/*/*.yaml"}},
	} {
		names := map[string][]string{} // name → where
		for _, g := range set.globs {
			files, err := filepath.Glob(filepath.Join(repo, g))
			require(t, err)
			for _, f := range files {
				b, err := os.ReadFile(f)
				require(t, err)
				for _, m := range clusterName.FindAllStringSubmatch(string(b), -1) {
					names[m[1]] = append(names[m[1]], f)
				}
			}
		}
		if len(names) != 1 {
			var all []string
			for n, where := range names {
				all = append(all, n+" in "+where[0])
			}
			sort.Strings(all)
			t.Errorf("%s name %d cluster names, want one: %v", set.what, len(names), all)
		}
	}
}
