// Command hops counts how often a reader following one function's calls moves between files and
// between packages: a depth-first walk of the static call graph from the function (each function of
// the module read once, its calls in the order they appear), where a hop is a call followed into
// another file (package) than the caller's, and a hop back is one into a file (package) read before. docs/hub-internals.md keeps the
// figures for one pass.
//
//	go run ./test/hops '(*github.com/hale-dev/hale/hub.Hub).pass'
//
// -v lists the walk. Calls through interfaces and function values are not followed (the static call
// graph): where the reader goes from there depends on what is plugged in. -opaque names packages
// (module-relative, comma-separated) whose functions are entered but not followed further: a reader
// of the pass reads the planner's PlanPass as its documentation says, not its internals.
//
//	go run ./test/hops -opaque quorum,hub/assess '(*github.com/hale-dev/hale/hub.Hub).pass'
//
// -only names the one package (module-relative) whose functions are followed: the walk of a reader of
// that package, who reads every other package's functions by their documentation (entered, each a
// hop, not followed).
//
//	go run ./test/hops -only hub '(*github.com/hale-dev/hale/hub.Hub).pass'
package main

import (
	"errors"
	"flag"
	"fmt"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/callgraph"
	"golang.org/x/tools/go/callgraph/static"
	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

func main() {
	verbose := flag.Bool("v", false, "list the walk: each function read, with its file")
	module := flag.String("module", "github.com/hale-dev/hale", "only functions of packages under this path are followed")
	opaque := flag.String("opaque", "", "packages under the module (comma-separated: quorum,hub/assess) entered but not followed further")
	only := flag.String("only", "", "the one package under the module (hub) whose functions are followed; any other's are entered, not followed")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: hops [-v] [-module PATH] FUNCTION   (as go/ssa names it, e.g. '(*github.com/hale-dev/hale/hub.Hub).pass')")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	var stop []string
	for _, p := range strings.Split(*opaque, ",") {
		if p = strings.TrimSpace(p); p != "" {
			stop = append(stop, *module+"/"+p)
		}
	}
	follow := func(pkg string) bool { return !slices.Contains(stop, pkg) }
	if *only != "" {
		within := *module + "/" + strings.TrimSpace(*only)
		follow = func(pkg string) bool { return pkg == within }
		if !strings.Contains(flag.Arg(0), within+".") {
			fmt.Fprintf(os.Stderr, "hops: %s is not a function of -only's package %s\n", flag.Arg(0), within)
			os.Exit(2)
		}
	}
	w, err := walk(flag.Arg(0), *module, follow)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hops:", err)
		os.Exit(1)
	}
	if *verbose {
		for _, s := range w.steps {
			fmt.Printf("%s%s  %s\n", strings.Repeat("  ", s.depth), s.fn, s.file)
		}
	}
	fmt.Printf("%s: %d functions in %d files, %d hops between files, %d of them back to a file already left; "+
		"%d packages, %d hops between them, %d back to a package already left\n",
		flag.Arg(0), len(w.steps), len(w.files), w.hops, w.back, len(w.pkgs), w.pkgHops, w.pkgBack)
}

type step struct {
	fn, file string
	depth    int
}

type walked struct {
	steps      []step
	files      map[string]bool
	hops, back int
	// the same between packages (a file's directory)
	pkgs             map[string]bool
	pkgHops, pkgBack int
}

// walk follows the calls from root, into the functions of the packages follow accepts (those of the
// others are entered, not followed).
func walk(root, module string, follow func(pkg string) bool) (walked, error) {
	cfg := &packages.Config{Mode: packages.LoadAllSyntax}
	// The root's package and what it imports are all a static walk from it can reach (the whole
	// module took four times as long: 84 s in a loaded test run).
	pkgs, err := packages.Load(cfg, packageOf(root))
	if err != nil {
		return walked{}, fmt.Errorf("loading %s: %w", packageOf(root), err)
	}
	if packages.PrintErrors(pkgs) > 0 {
		return walked{}, errors.New("the packages do not load (above)")
	}
	prog, _ := ssautil.AllPackages(pkgs, ssa.InstantiateGenerics)
	prog.Build()
	cg := static.CallGraph(prog)
	var start *callgraph.Node
	for fn, n := range cg.Nodes {
		if fn != nil && fn.String() == root {
			start = n
		}
	}
	if start == nil {
		return walked{}, fmt.Errorf("no function %s in %s (name it as go/ssa does: '(*PKG.Type).method' or 'PKG.func')", root, module)
	}
	wd, _ := os.Getwd()
	w := walked{files: map[string]bool{}, pkgs: map[string]bool{}}
	seen := map[*callgraph.Node]bool{}
	current := ""
	var visit func(n *callgraph.Node, depth int)
	visit = func(n *callgraph.Node, depth int) {
		seen[n] = true
		file := ""
		if pos := n.Func.Pos(); pos.IsValid() {
			file = prog.Fset.Position(pos).Filename
			if rel, err := filepath.Rel(wd, file); err == nil {
				file = rel
			}
		}
		if file != "" { // a synthetic wrapper has no file: the reader goes straight through it
			w.steps = append(w.steps, step{fn: n.Func.String(), file: file, depth: depth})
			if current != "" && file != current {
				w.hops++
				if w.files[file] {
					w.back++
				}
			}
			if dir := filepath.Dir(file); current != "" && dir != filepath.Dir(current) {
				w.pkgHops++
				if w.pkgs[dir] {
					w.pkgBack++
				}
			}
			w.files[file], current = true, file
			w.pkgs[filepath.Dir(file)] = true
		}
		if depth > 0 && !follow(pkgOf(n.Func)) {
			return // read as documented
		}
		out := slices.Clone(n.Out)
		slices.SortStableFunc(out, func(a, b *callgraph.Edge) int { return int(sitePos(a) - sitePos(b)) })
		for _, e := range out {
			if seen[e.Callee] || !inModule(e.Callee.Func, module) {
				continue
			}
			visit(e.Callee, depth+1)
			if file != "" {
				current = file // back in the caller
			}
		}
	}
	visit(start, 0)
	return w, nil
}

// packageOf is the package of a function as go/ssa names it: "(*example.com/m/p.T).f" and
// "example.com/m/p.f" are both in example.com/m/p.
func packageOf(fn string) string {
	fn = strings.TrimLeft(fn, "(*")
	if i := strings.Index(fn, ")"); i >= 0 {
		fn = fn[:i]
	}
	slash := strings.LastIndex(fn, "/") + 1
	if dot := strings.Index(fn[slash:], "."); dot >= 0 {
		return fn[:slash+dot]
	}
	return fn
}

func sitePos(e *callgraph.Edge) token.Pos {
	if e.Site == nil {
		return token.NoPos
	}
	return e.Site.Pos()
}

// written is the function whose source f is: a generic function for its instance, the enclosing
// function for a closure.
func written(f *ssa.Function) *ssa.Function {
	if o := f.Origin(); o != nil { // an instance of a generic function: where it is written
		f = o
	}
	for f.Parent() != nil {
		f = f.Parent()
	}
	return f
}

// pkgOf is the path of the package f is written in ("" for a synthetic function).
func pkgOf(f *ssa.Function) string {
	if f = written(f); f.Pkg == nil {
		return ""
	}
	return f.Pkg.Pkg.Path()
}

func inModule(f *ssa.Function, module string) bool {
	if f = written(f); f.Pkg == nil { // a method wrapper: its receiver's package
		return f.Synthetic != "" && len(f.Params) > 0 && strings.Contains(f.Params[0].Type().String(), module)
	}
	p := f.Pkg.Pkg.Path()
	return p == module || strings.HasPrefix(p, module+"/")
}
