package knit_test

import (
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The package's API and layering (doc.go): every type a user reaches is declared in knit,
// and packages import each other one way.

// Every type a user can reach from knit's exported names — through fields, method
// signatures, element types — is declared in package knit itself, where go doc and
// pkg.go.dev show its fields and methods: none lives in a package below (lifecycle,
// supervisor, actors, internal/…), and knit declares no exported alias, whose fields and
// methods go doc would not show.
func TestAPIDeclaredInKnit(t *testing.T) {
	// Export data from the build cache (go list -export) is much quicker than type-checking
	// every dependency from source.
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goCmd, "list", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	exports := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, file, ok := strings.Cut(line, "="); ok && file != "" {
			exports[path] = file
		}
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	knit, err := imp.Import("github.com/knitgo/knit")
	if err != nil {
		t.Fatalf("type-checking knit: %v", err)
	}
	scope := knit.Scope()
	for _, n := range scope.Names() {
		if tn, ok := scope.Lookup(n).(*types.TypeName); ok && tn.Exported() && tn.IsAlias() {
			t.Errorf("knit.%s is an alias: go doc shows none of its fields or methods", n)
		}
	}
	declared := 0 // knit's own types the walk reached
	seen := map[types.Type]bool{}
	var walk func(path string, typ types.Type)
	walk = func(path string, typ types.Type) {
		typ = types.Unalias(typ)
		if seen[typ] {
			return
		}
		seen[typ] = true
		switch x := typ.(type) {
		case *types.Named:
			obj := x.Origin().Obj()
			if obj.Pkg() == nil || !strings.HasPrefix(obj.Pkg().Path(), "github.com/knitgo/knit") {
				return // the standard library's and dependencies' own types
			}
			if obj.Pkg().Path() != "github.com/knitgo/knit" {
				if obj.Exported() {
					t.Errorf("%s: type %s.%s is reachable from knit's API but declared outside knit", path, obj.Pkg().Path(), obj.Name())
				}
				return
			}
			declared++
			for i := range x.NumMethods() {
				if m := x.Method(i); m.Exported() {
					walk(path+"."+m.Name(), m.Type())
				}
			}
			for i := range x.TypeArgs().Len() {
				walk(path, x.TypeArgs().At(i))
			}
			walk(path, x.Underlying())
		case *types.Struct:
			for i := range x.NumFields() {
				if f := x.Field(i); f.Exported() {
					walk(path+"."+f.Name(), f.Type())
				}
			}
		case *types.Pointer:
			walk(path, x.Elem())
		case *types.Slice:
			walk(path, x.Elem())
		case *types.Array:
			walk(path, x.Elem())
		case *types.Map:
			walk(path, x.Key())
			walk(path, x.Elem())
		case *types.Chan:
			walk(path, x.Elem())
		case *types.Signature:
			for i := range x.Params().Len() {
				walk(path, x.Params().At(i).Type())
			}
			for i := range x.Results().Len() {
				walk(path, x.Results().At(i).Type())
			}
		case *types.Interface:
			for i := range x.NumMethods() {
				if m := x.Method(i); m.Exported() {
					walk(path+"."+m.Name(), m.Type())
				}
			}
		}
	}
	for _, n := range scope.Names() {
		if obj := scope.Lookup(n); obj.Exported() {
			walk("knit."+n, obj.Type())
		}
	}
	if declared < 20 {
		t.Fatalf("the walk reached %d of knit's types: it saw nothing", declared)
	}
}

// The packages depend on each other one way, top to bottom (a package may skip levels
// downward); commands and examples sit above the root, and so does inspect, the optional
// HTTP inspector, which uses the root's public API only. The root holds the pool and its
// public types; the internal/ packages are the bottom layer.
var layers = []string{"cmd/", "examples/", "inspect", "", "remote", "supervisor", "lifecycle", "actors", "steal", "fastpath", "internal/"}

func layerOf(t *testing.T, pkg string) int {
	rel, ok := strings.CutPrefix(pkg, "github.com/knitgo/knit")
	if !ok {
		return -1
	}
	rel = strings.TrimPrefix(rel, "/")
	for i, l := range layers {
		if rel == l {
			return i
		}
	}
	for i := len(layers) - 1; i >= 0; i-- {
		l := layers[i]
		if rel == l || (strings.HasSuffix(l, "/") && (strings.HasPrefix(rel, l) || rel+"/" == l)) {
			return i
		}
	}
	t.Fatalf("package %s is in no layer: add it to layers", pkg)
	return 0
}

func TestDependenciesGoOneWay(t *testing.T) {
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goCmd, "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 8 {
		t.Fatalf("go list found %d packages", len(lines))
	}
	for _, line := range lines {
		f := strings.Fields(line)
		from := layerOf(t, f[0])
		for _, imp := range f[1:] {
			to := layerOf(t, imp)
			if to < 0 {
				continue
			}
			// Within internal/ packages may use each other; everywhere else only downward.
			if to < from || (to == from && !strings.HasSuffix(layers[from], "/")) {
				t.Errorf("%s imports %s: a package may import only packages below it (%v)", f[0], imp, layers)
			}
		}
	}
}
