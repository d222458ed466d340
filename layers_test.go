package knit_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The packages depend on each other one way, top to bottom (a package may skip levels
// downward); commands and examples sit above the root, and so does inspect, the optional
// HTTP inspector, which uses the root's public API only. The root holds the pool and its
// public types; the internal/ packages are the bottom layer.
var layers = []string{"cmd/", "examples/", "inspect", "", "supervisor", "lifecycle", "actors", "steal", "fastpath", "internal/"}

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
