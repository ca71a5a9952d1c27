package annotations

import (
	"go/ast"
	goparser "go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// Every Virtlet annotation constant is documented in Reference, once.
func TestEveryAnnotationIsDocumented(t *testing.T) {
	f, err := goparser.ParseFile(token.NewFileSet(), "annotations.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]int{}
	for _, d := range Reference {
		documented[d.Name]++
		if d.Values == "" || d.Meaning == "" {
			t.Errorf("%s: values and meaning must be documented", d.Name)
		}
	}
	consts := 0
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			for _, value := range spec.(*ast.ValueSpec).Values {
				lit, ok := value.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				if v, _ := strconv.Unquote(lit.Value); strings.HasPrefix(v, "Virtlet") {
					consts++
					if documented[v] != 1 {
						t.Errorf("annotation %s is documented %d times in Reference, want once", v, documented[v])
					}
				}
			}
		}
	}
	if consts != len(Reference) {
		t.Errorf("annotations.go names %d Virtlet annotations, Reference documents %d", consts, len(Reference))
	}
}
