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
