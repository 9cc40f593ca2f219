package hub

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOneDoor holds the two doors of docs/hub-internals.md: a remediation's journal lines are written
// only through execute.WriteEntry (and begun in Hub.journalBegin), and a notice leaves only through Hub.say (its log
// line, timeline entry, metric and Event, with Config.Notify). It reads the source of every package
// that holds a hub or a journal: a call by one of those names anywhere else fails it.
func TestOneDoor(t *testing.T) {
	doors := map[string][]string{
		// method name → the functions allowed to call it ("Type.Method" or "func")
		"Intent":  {"WriteEntry", "Recorder.Intent"},
		"Outcome": {"WriteEntry", "Recorder.Outcome"},
		"Note":    {"WriteEntry", "Recorder.Note"},
		"Finish":  {"WriteEntry", "Recorder.Finish"},
		"Begin":   {"Hub.journalBegin", "Recorder.Begin"},
		// what a degraded term kept in its local journal, and a degraded etcd recovery's fences,
		// imported once the API server answers (kube/degraded.go, kube/recovery.go)
		"Import": {"ImportDegraded", "ImportRecovery"},
		"Notify": {"Hub.say"},
	}
	var found int
	for _, dir := range []string{".", "../cmd/hub", "../kube", "../kube/cells", "../kube/clusterapi", "../kube/enrol", "../recovery", "degraded", "journal", "journal/boltfile", "execute", "pass", "ledger", "taints", "inventory", "bmcaccess", "assess", "operator", "metrics", "recoveryplan"} {
		fset, files := sources(t, dir)
		for _, f := range files {
			path := fset.Position(f.Pos()).Filename
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				name := fn.Name.Name
				if fn.Recv != nil && len(fn.Recv.List) == 1 {
					typ := fn.Recv.List[0].Type
					if s, ok := typ.(*ast.StarExpr); ok {
						typ = s.X
					}
					if id, ok := typ.(*ast.Ident); ok {
						name = id.Name + "." + name
					}
				}
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					sel, ok := call.Fun.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					allowed, watched := doors[sel.Sel.Name]
					if !watched || isOther(sel) {
						return true
					}
					found++
					if !slices.Contains(allowed, name) && !isStoreImpl(path, name, sel.Sel.Name) {
						t.Errorf("%s: %s calls %s: a journal line or a notice leaves only through %v", fset.Position(call.Pos()), name, sel.Sel.Name, allowed)
					}
					return true
				})
			}
		}
	}
	require.Positive(t, found, "no call through a door found: the scan reads nothing")
}

// sources are the parsed Go files of dir, tests left out.
func sources(t *testing.T, dir string) (*token.FileSet, []*ast.File) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	var files []*ast.File
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		require.NoError(t, err)
		files = append(files, f)
	}
	require.NotEmpty(t, files, "no Go source in %s: a package moved, and the scan must follow it", dir)
	return fset, files
}

// isOther: calls by the same names that are neither: bbolt's db.Begin opens a transaction,
// signal.Notify asks for signals.
func isOther(sel *ast.SelectorExpr) bool {
	id, ok := sel.X.(*ast.Ident)
	return ok && (sel.Sel.Name == "Begin" && id.Name == "db" || sel.Sel.Name == "Notify" && id.Name == "signal")
}

// isStoreImpl: a Store's own method of the same name may call its parts.
func isStoreImpl(path, fn, method string) bool {
	return strings.HasSuffix(fn, "."+method) && strings.Contains(path, "journal")
}
