package hub

import (
	"go/ast"
	"go/build"
	"go/token"
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
	// the pass may read bmc's and the journal's values (values only: TestPurePackagesReadValuesOnly)
	passIO := slices.DeleteFunc(slices.Clone(io), func(s string) bool { return s == mod+"bmc" })
	for _, tc := range []struct {
		dir       string
		forbidden []string
	}{
		{"assess", io},
		{"pass", passIO},
		{"assess/assesstest", io},
		{"degraded", k8s},
		// the journal keeps remediations; what they do and who decides them is the hub's
		// the executor carries out one remediation through the interfaces it owns (World, Power, Owner)
		{"execute", append([]string{"go.etcd.io/bbolt", "github.com/prometheus/", mod + "hub"}, k8s...)},
		{"journal", append([]string{"log/slog", "github.com/prometheus/", mod + "bmc", mod + "hub"}, k8s...)},
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

// TestPurePackagesReadValuesOnly: the pure packages read no clock (time.Now and its kin: a pass's
// time is a fact it is given), and of bmc and the journal they use types and constants only (a power
// state, a BMC's endpoint, a remediation's state), never a function or a variable: no I/O by way of
// an import the pass needs for its values.
func TestPurePackagesReadValuesOnly(t *testing.T) {
	valuesOf := map[string]map[string]bool{}
	for name, dir := range map[string]string{"bmc": "../bmc", "journal": "journal"} {
		valuesOf[name] = map[string]bool{}
		_, files := sources(t, dir)
		for _, f := range files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok == token.VAR || g.Tok == token.IMPORT {
					continue
				}
				for _, s := range g.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						valuesOf[name][s.Name.Name] = true
					case *ast.ValueSpec:
						for _, n := range s.Names {
							valuesOf[name][n.Name] = true
						}
					}
				}
			}
		}
		require.NotEmpty(t, valuesOf[name], "no types or constants found in %s", dir)
	}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true}
	for _, dir := range []string{"assess", "pass"} {
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
				switch {
				case x.Name == "time" && clock[sel.Sel.Name]:
					t.Errorf("%s: time.%s: the pure packages read no clock (docs/hub-internals.md)", fset.Position(sel.Pos()), sel.Sel.Name)
				case valuesOf[x.Name] != nil && !valuesOf[x.Name][sel.Sel.Name]:
					t.Errorf("%s: %s.%s: the pure packages use %s's types and constants only (docs/hub-internals.md)", fset.Position(sel.Pos()), x.Name, sel.Sel.Name, x.Name)
				}
				return true
			})
		}
	}
}
