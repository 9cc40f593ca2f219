// Package docgen writes the reference pages under docs/reference from the code itself: a command
// tree from its cobra definitions, a configuration file from its Go types and their doc comments, a
// CRD from its OpenAPI schema. Each page is checked by a test in the package that owns what it
// documents: the test fails when the committed page is not what the code says, and HALE_UPDATE_DOCS=1
// rewrites it.
package docgen

import (
	"encoding"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Header opens every generated page.
const Header = "<!-- Generated from the code: do not edit. HALE_UPDATE_DOCS=1 go test ./... rewrites it. -->\n\n"

// Check compares the committed page at path with want; they differ: the test fails naming the page and
// the command that rewrites it, or, with HALE_UPDATE_DOCS=1, the page is rewritten.
func Check(t testing.TB, path, want string) {
	t.Helper()
	if os.Getenv("HALE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: write it with HALE_UPDATE_DOCS=1 go test -run '%s' .", err, t.Name())
	}
	if string(got) != want {
		t.Errorf("%s is not what the code says: rewrite it with HALE_UPDATE_DOCS=1 go test -run '%s' . and commit it\n%s",
			path, t.Name(), firstDifference(string(got), want))
	}
}

// firstDifference shows the first line that differs.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		gl, wl := "", ""
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n  the page: %s\n  the code: %s", i+1, gl, wl)
		}
	}
	return ""
}

// Commands is the reference of root's command tree: each command that is not hidden, depth first in
// its order of declaration, with its usage, its description and its flags as --help prints them;
// root's section is a level-2 heading, its commands' level 3, theirs level 4. cobra's own `completion`
// is in it, as --help lists it.
func Commands(root *cobra.Command) string {
	root.InitDefaultCompletionCmd() // cobra adds `completion` only when the command runs
	var b strings.Builder
	var walk func(c *cobra.Command, depth int)
	walk = func(c *cobra.Command, depth int) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		fmt.Fprintf(&b, "%s `%s`\n\n", strings.Repeat("#", min(depth+2, 4)), c.CommandPath())
		desc := c.Long
		if desc == "" {
			desc = c.Short
		}
		if desc != "" {
			b.WriteString(strings.TrimSpace(desc) + "\n\n")
		}
		if c.Runnable() {
			fmt.Fprintf(&b, "```\n%s\n```\n\n", c.UseLine())
		}
		if c.Example != "" {
			fmt.Fprintf(&b, "Examples:\n\n```\n%s\n```\n\n", strings.TrimRight(c.Example, "\n"))
		}
		if fl := flagUsages(c.LocalNonPersistentFlags()); fl != "" {
			fmt.Fprintf(&b, "Flags:\n\n```\n%s```\n\n", fl)
		}
		if fl := flagUsages(c.PersistentFlags()); fl != "" {
			fmt.Fprintf(&b, "Flags for it and every command under it:\n\n```\n%s```\n\n", fl)
		}
		for _, sub := range c.Commands() {
			walk(sub, depth+1)
		}
	}
	walk(root, 0)
	return b.String()
}

// flagUsages is fs as --help prints it, without the help flag cobra adds to every command.
func flagUsages(fs *pflag.FlagSet) string {
	out := pflag.NewFlagSet("", pflag.ContinueOnError)
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" && !f.Hidden {
			out.AddFlag(f)
		}
	})
	out.SortFlags = fs.SortFlags
	return out.FlagUsagesWrapped(100)
}

// Field is one setting of a configuration file.
type Field struct {
	Path, Type, Doc string
}

// Fields lists the settings of the struct type t, as its json tags name them, each with its doc
// comment read from the source of the package that declares it (repo: the repository's root; a type
// from outside the repository has no comments). A nested struct's settings follow as PATH.field, a
// list's as PATH[].field, a map's as PATH.NAME.field. A type that decodes itself (json.Unmarshaler or
// encoding.TextUnmarshaler) is one setting; so is a map whose values are interfaces, which the caller
// lists itself.
func Fields(repo string, t reflect.Type, prefix string) ([]Field, error) {
	d := docs{repo: repo, parsed: map[string]map[string]map[string]string{}}
	var out []Field
	err := d.walk(t, "", prefix, &out)
	return out, err
}

// docs reads doc comments of struct fields: package path → type → field → comment.
type docs struct {
	repo   string
	parsed map[string]map[string]map[string]string
}

const module = "github.com/hale-dev/hale"

// walk lists t's fields under prefix; pkg is the package of the type t is declared in, for an unnamed
// struct type (which has no package of its own).
func (d *docs) walk(t reflect.Type, pkg, prefix string, out *[]Field) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() != "" {
		pkg = t.PkgPath()
	}
	comments, err := d.comments(pkg, t)
	if err != nil {
		return err
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, inline := jsonName(f)
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if inline {
			if err := d.walk(ft, pkg, prefix, out); err != nil {
				return err
			}
			continue
		}
		path := join(prefix, name)
		doc := userDoc(comments[f.Name], f.Name, name)
		switch {
		case ft.Kind() == reflect.Struct && !leaf(ft):
			if doc != "" {
				*out = append(*out, Field{Path: path, Type: "section", Doc: doc})
			}
			if err := d.walk(ft, pkg, path, out); err != nil {
				return err
			}
		case ft.Kind() == reflect.Slice && !leaf(elem(ft)):
			*out = append(*out, Field{Path: path, Type: "list", Doc: doc})
			if err := d.walk(elem(ft), pkg, path+"[]", out); err != nil {
				return err
			}
		case ft.Kind() == reflect.Map && !leaf(elem(ft)):
			*out = append(*out, Field{Path: path, Type: "map of name to section", Doc: doc})
			if err := d.walk(elem(ft), pkg, path+".NAME", out); err != nil {
				return err
			}
		default:
			*out = append(*out, Field{Path: path, Type: typeName(ft), Doc: doc})
		}
	}
	return nil
}

func elem(t reflect.Type) reflect.Type {
	t = t.Elem()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// jsonName is the field's name in the file, and whether its fields are the parent's (embedded
// without a name, or tagged inline).
func jsonName(f reflect.StructField) (string, bool) {
	tag := f.Tag.Get("json")
	name, opts, _ := strings.Cut(tag, ",")
	if strings.Contains(","+opts+",", ",inline,") || (f.Anonymous && name == "") {
		return "", true
	}
	if name == "" {
		return f.Name, false
	}
	return name, false
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// leaf says whether t is one setting: not a struct of this repository's to walk (a struct from
// elsewhere, a Kubernetes condition, is one setting named by its type).
func leaf(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	if t.Kind() != reflect.Struct || p.Implements(jsonUnmarshaler) || p.Implements(textUnmarshaler) {
		return true
	}
	return t.PkgPath() != "" && t.PkgPath() != module && !strings.HasPrefix(t.PkgPath(), module+"/")
}

// typeName says what a setting holds, in the file's words.
func typeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Name() {
	case "Duration":
		return "duration"
	case "Time":
		return "time (RFC 3339)"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice:
		return "list of " + plural(typeName(t.Elem()))
	case reflect.Map:
		return "map of " + typeName(t.Key()) + " to " + typeName(t.Elem())
	case reflect.Interface:
		return "section"
	}
	return strings.ToLower(t.Name())
}

func plural(s string) string {
	if strings.HasSuffix(s, "s") || strings.Contains(s, " ") {
		return s
	}
	return s + "s"
}

// goName matches a Go field name opening a comment: "Cooldown: …", "Node names …", "Role is …".
var goName = regexp.MustCompile(`^([A-Z][A-Za-z0-9]*)([:, ])`)

// userDoc is a field's doc comment for someone writing the file: without markers for code generators
// (+listType=map), joined into one paragraph, the Go name it opens with replaced by the file's name.
func userDoc(doc, goField, fileName string) string {
	var lines []string
	for l := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "+") {
			lines = append(lines, l)
		}
	}
	doc = strings.Join(strings.Fields(strings.Join(lines, " ")), " ")
	if m := goName.FindStringSubmatch(doc); m != nil && m[1] == goField {
		doc = "`" + fileName + "`" + doc[len(m[1]):]
	}
	return strings.ReplaceAll(doc, "|", `\|`)
}

// comments are the doc comments of t's fields, by Go field name, read from the source of pkg when it
// is in this repository.
func (d *docs) comments(pkg string, t reflect.Type) (map[string]string, error) {
	if pkg != module && !strings.HasPrefix(pkg, module+"/") {
		return nil, nil
	}
	if _, ok := d.parsed[pkg]; !ok {
		types, err := parseStructs(filepath.Join(d.repo, strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")))
		if err != nil {
			return nil, err
		}
		d.parsed[pkg] = types
	}
	if t.Name() != "" {
		return d.parsed[pkg][t.Name()], nil
	}
	return d.anonymous(pkg, t), nil
}

// anonymous finds the comments of an unnamed struct type (a field's own struct { … }) by its fields.
func (d *docs) anonymous(pkg string, t reflect.Type) map[string]string {
	for key, fields := range d.parsed[pkg] {
		if !strings.HasPrefix(key, "{") {
			continue
		}
		names := strings.Split(strings.Trim(key, "{}"), ",")
		if len(names) != t.NumField() {
			continue
		}
		match := true
		for i, n := range names {
			match = match && t.Field(i).Name == n
		}
		if match {
			return fields
		}
	}
	return nil
}

// parseStructs reads the doc comments of every struct type's fields in the package in dir (test
// files left out); unnamed struct types are keyed by their field names, {A,B}.
func parseStructs(dir string) (map[string]map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the source of %s: %w", dir, err)
	}
	fset := token.NewFileSet()
	out := map[string]map[string]string{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.TypeSpec:
				if st, ok := n.Type.(*ast.StructType); ok {
					out[n.Name.Name] = fieldComments(st)
				}
			case *ast.StructType:
				var names []string
				for _, f := range n.Fields.List {
					for _, id := range f.Names {
						names = append(names, id.Name)
					}
					if len(f.Names) == 0 {
						names = append(names, embeddedName(f.Type))
					}
				}
				key := "{" + strings.Join(names, ",") + "}"
				if _, ok := out[key]; !ok {
					out[key] = fieldComments(n)
				}
			}
			return true
		})
	}
	return out, nil
}

func fieldComments(st *ast.StructType) map[string]string {
	m := map[string]string{}
	for _, f := range st.Fields.List {
		text := f.Doc.Text()
		if text == "" {
			text = f.Comment.Text()
		}
		for _, id := range f.Names {
			m[id.Name] = text
		}
	}
	return m
}

func embeddedName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return embeddedName(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// Table renders fields as a table of setting, type and description.
func Table(fields []Field) string {
	var b strings.Builder
	b.WriteString("| setting | type | |\n|---|---|---|\n")
	for _, f := range fields {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", f.Path, f.Type, f.Doc)
	}
	return b.String()
}

// Undocumented are the paths of fields without a description.
func Undocumented(fields []Field) []string {
	var out []string
	for _, f := range fields {
		if f.Doc == "" {
			out = append(out, f.Path)
		}
	}
	return out
}
