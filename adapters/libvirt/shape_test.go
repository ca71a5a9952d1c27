package libvirt

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The package keeps its shape: no type declares more than maxMethods
// methods and no file is longer than maxLines lines (the adapter is split
// by concern; see the package comment).
const (
	maxMethods = 25
	maxLines   = 600
)

func TestPackageShape(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	methods := map[string]int{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(src, []byte("\n")); n > maxLines {
			t.Errorf("%s has %d lines; at most %d", name, n, maxLines)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil && len(fd.Recv.List) == 1 {
				methods[receiverType(fd.Recv.List[0].Type)]++
			}
		}
	}
	if methods["Hypervisor"] == 0 {
		t.Fatal("no method of Hypervisor found: the test reads the wrong files")
	}
	for typ, n := range methods {
		if n > maxMethods {
			t.Errorf("type %s declares %d methods; at most %d", typ, n, maxMethods)
		}
	}
}

// receiverType names a method's receiver type (T, *T, T[P]).
func receiverType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return receiverType(x.X)
	case *ast.IndexExpr:
		return receiverType(x.X)
	case *ast.IndexListExpr:
		return receiverType(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}
