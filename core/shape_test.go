package core_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines bounds a core function: a use case longer than this is a
// table of steps (steps.go) or a service's helpers.
const maxFuncLines = 80

// TestCoreShape keeps the core readable: no function over maxFuncLines
// lines, and the Runtime a composition of services (runtime.go) that
// declares only what joins them, never a use case of its own.
func TestCoreShape(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	methods := map[string][]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if lines > maxFuncLines {
				t.Errorf("%s: %s is %d lines, more than %d", fset.Position(fn.Pos()), fn.Name.Name, lines, maxFuncLines)
			}
			if fn.Recv != nil {
				methods[receiverType(fn.Recv.List[0].Type)] = append(methods[receiverType(fn.Recv.List[0].Type)], fn.Name.Name)
			}
		}
	}
	// Load, Status and Counts read across every service; every other
	// method belongs to the service that owns its state.
	if got := methods["Runtime"]; len(got) > 3 {
		t.Errorf("Runtime declares %d methods %v; a use case belongs to one of its services", len(got), got)
	}
	for _, svc := range []string{"sandboxService", "vmService", "imageService", "volumeService", "cloudInitService", "accessService", "statsService", "reconciler"} {
		if len(methods[svc]) == 0 {
			t.Errorf("service %s has no methods: is the list above out of date?", svc)
		}
	}
}

func receiverType(e ast.Expr) string {
	if star, ok := e.(*ast.StarExpr); ok {
		e = star.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
