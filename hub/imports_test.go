package hub

import (
	"bytes"
	"go/ast"
	"go/build"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPackageImports holds the boundaries of docs/hub-internals.md: what each package under hub/ may
// import directly. The assessor is pure (no clock but the one its observations carry, no lock, no
// I/O); degraded mode's rules know nothing of Kubernetes (kube runs them); and the hub itself reaches
// Kubernetes only through the interfaces kube implements.
func TestPackageImports(t *testing.T) {
	const mod = "github.com/hale-dev/hale/"
	io := []string{"context", "log/slog", "os", "net", "net/http", "sync", "math/rand/v2", "go.etcd.io/bbolt",
		"github.com/prometheus/", mod + "bmc", mod + "kube", mod + "hub"}
	k8s := []string{"k8s.io/", "sigs.k8s.io/", mod + "kube", mod + "api/"}
	for _, tc := range []struct {
		dir       string
		forbidden []string
	}{
		{"assess", io},
		{"pass", io},
		{"assess/assesstest", io},
		{"degraded", k8s},
		// the journal keeps remediations; what they do and who decides them is the hub's
		// the executor carries out one remediation through the interfaces it owns (World, Power, Owner)
		{"execute", append([]string{"go.etcd.io/bbolt", "github.com/prometheus/", mod + "hub"}, k8s...)},
		{"journal", append([]string{"log/slog", "github.com/prometheus/", mod + "bmc", mod + "hub"}, k8s...)},
		// the inventory file and the BMC accounts are read for the hub, never from it
		{"inventory", append([]string{"go.etcd.io/bbolt", "github.com/prometheus/", mod + "hub", mod + "hub/journal"}, k8s...)},
		{"bmcaccess", append([]string{"go.etcd.io/bbolt", "github.com/prometheus/", mod + "hub", mod + "hub/journal"}, k8s...)},
		// the operator API's values: no I/O, no hub
		{"operator", append([]string{"go.etcd.io/bbolt", "github.com/prometheus/", "log/slog", "net/http", mod + "hub", mod + "bmc"}, k8s...)},
		// the metrics read the operator's status and count what the hub tells them
		{"metrics", append([]string{"go.etcd.io/bbolt", mod + "hub", mod + "bmc"}, k8s...)},
		// the recovery plan decides over values: the hub carries it out
		{"recoveryplan", append([]string{"go.etcd.io/bbolt", "github.com/prometheus/", "log/slog", "net/http", "sync", mod + "hub", mod + "bmc"}, k8s...)},
		// the taint writer reaches the Nodes only through the interface kube implements
		{"taints", append([]string{"go.etcd.io/bbolt", "github.com/prometheus/", mod + "hub", mod + "bmc"}, k8s...)},
		// the ledger is the journal's summary in memory: it reads the journal, never writes past it
		{"ledger", append([]string{"go.etcd.io/bbolt", "github.com/prometheus/", mod + "hub", mod + "bmc"}, k8s...)},
		{".", k8s},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			pkg, err := build.ImportDir(filepath.Clean(tc.dir), 0)
			require.NoError(t, err)
			require.NotEmpty(t, pkg.Imports)
			for _, imp := range pkg.Imports {
				bad := slices.ContainsFunc(tc.forbidden, func(f string) bool {
					return imp == f || strings.HasSuffix(f, "/") && strings.HasPrefix(imp, f)
				})
				assert.False(t, bad, "hub/%s imports %s, which it may not (docs/hub-internals.md)", tc.dir, imp)
			}
		})
	}
}

// TestPurePackagesImportNoIO: the pure packages (the planner, the assessor, the pass) and the leaf
// packages of values they read (a report, a BMC's values, a remediation) import, transitively
// (`go list -deps`), nothing but the standard library and one another: the pass's inputs are values,
// and no gossip, etcd client, gRPC, bbolt, Prometheus or Kubernetes comes in with them.
func TestPurePackagesImportNoIO(t *testing.T) {
	const mod = "github.com/hale-dev/hale/"
	pure := []string{mod + "quorum", mod + "hub/assess", mod + "hub/pass", mod + "hub/journal", mod + "health/report", mod + "bmc/bmcval"}
	for _, pkg := range pure {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).CombinedOutput()
		require.NoError(t, err, "go list -deps %s: %s", pkg, out)
		for _, dep := range strings.Fields(string(out)) {
			assert.True(t, slices.Contains(pure, dep), "%s imports %s (transitively), which is neither the standard library nor a pure package (docs/hub-internals.md)", pkg, dep)
		}
	}
}

// TestPurePackagesReadNoClock: the pure packages read no clock (time.Now and its kin: a pass's time
// is a fact it is given).
func TestPurePackagesReadNoClock(t *testing.T) {
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true}
	for _, dir := range []string{"assess", "pass", "journal", "../quorum", "../health/report", "../bmc/bmcval"} {
		fset, files := sources(t, dir)
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				x, ok := sel.X.(*ast.Ident)
				if !ok {
					return true
				}
				if x.Name == "time" && clock[sel.Sel.Name] {
					t.Errorf("%s: time.%s: the pure packages read no clock (docs/hub-internals.md)", fset.Position(sel.Pos()), sel.Sel.Name)
				}
				return true
			})
		}
	}
}

// TestSizes holds docs/hub-internals.md's sizes: no package of the module (tests, test rigs under
// test/ and generated code left out) over 3,000 lines, and no such file over 450. A package that
// grows past them is split by concern, not trimmed.
func TestSizes(t *testing.T) {
	const maxPackage, maxFile = 3000, 450
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	packages := map[string]int{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || rel == "test" {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || strings.HasPrefix(name, "zz_generated") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n := bytes.Count(src, []byte("\n"))
		assert.LessOrEqual(t, n, maxFile, "%s: %d lines: split it by concern (docs/hub-internals.md)", rel, n)
		packages[filepath.Dir(rel)] += n
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, len(packages), 20, "the walk found the module's packages")
	for dir, n := range packages {
		assert.LessOrEqual(t, n, maxPackage, "package %s: %d lines: split it by concern (docs/hub-internals.md)", dir, n)
	}
}
