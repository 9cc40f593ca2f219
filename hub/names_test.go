package hub

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One word per idea: a constant of the hub's vocabulary is named as its value, after its type's
// prefix (ReasonRemediationInterrupted is "RemediationInterrupted", NeedUnseen "Unseen"), so that what a
// log line, an Event or a metric label says is what the code says.
func TestConstantsAreNamedAsTheirValues(t *testing.T) {
	prefixes := map[string]string{"Reason": "Reason", "OperatorNeed": "Need", "Result": "Result", "Verdict": "Verdict", "EntryKind": "Entry"}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	sub, err := filepath.Glob("*/*.go") // hub/assess and the other packages under hub
	require.NoError(t, err)
	files = append(files, sub...)
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		require.NoError(t, err)
		for _, d := range file.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					typ, value := constOf(vs, vs.Values[i])
					prefix, ours := prefixes[typ]
					if !ours {
						continue
					}
					checked++
					assert.True(t, strings.EqualFold(name.Name, prefix+value), "%s: %s is %q: want %s%s", f, name.Name, value, prefix, value)
				}
			}
		}
	}
	assert.Greater(t, checked, 40, "the vocabulary was found")
}

// constOf is a constant's type and string value: `T = "v"`, or `T(OtherConst)` whose name gives
// the value after its own prefix (Reason(NeedUnseen) is "Unseen").
func constOf(vs *ast.ValueSpec, v ast.Expr) (string, string) {
	typ := ""
	if id, ok := vs.Type.(*ast.Ident); ok {
		typ = id.Name
	}
	switch e := v.(type) {
	case *ast.BasicLit:
		s, err := strconv.Unquote(e.Value)
		if err != nil {
			return "", ""
		}
		return typ, s
	case *ast.CallExpr:
		fn, ok1 := e.Fun.(*ast.Ident)
		arg, ok2 := e.Args[0].(*ast.Ident)
		if ok1 && ok2 && strings.HasPrefix(arg.Name, "Need") {
			return fn.Name, strings.TrimPrefix(arg.Name, "Need")
		}
	}
	return "", ""
}
