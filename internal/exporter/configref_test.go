package exporter

import (
	"flag"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var rewriteDocs = flag.Bool("rewrite-docs", false, "rewrite the configuration reference in docs/LANES-EXPORTER.md")

const (
	refDoc   = "../../docs/LANES-EXPORTER.md"
	refBegin = "<!-- config keys: generated from internal/exporter/configref.go; go test ./internal/exporter -run TestConfigReference -rewrite-docs -->\n"
	refEnd   = "<!-- end of config keys -->\n"
)

// yamlKeys are the keys Config reads: every field's, by its yaml tag, a
// list's elements as name[], an optional section (a pointer to a struct)
// as a key of its own as well as its fields.
func yamlKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		ft := f.Type
		switch {
		case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, key)
			keys = append(keys, yamlKeys(ft.Elem(), key+".")...)
		case ft.Kind() == reflect.Struct && ft.NumField() > 0 && ft.PkgPath() != "time":
			keys = append(keys, yamlKeys(ft, key+".")...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, yamlKeys(ft.Elem(), key+"[].")...)
		default:
			keys = append(keys, key)
		}
	}
	return keys
}

// Every key the file may hold is in the reference, once, and nothing
// else; docs/LANES-EXPORTER.md holds the reference as configKeys renders
// it.
func TestConfigReference(t *testing.T) {
	got := yamlKeys(reflect.TypeFor[Config](), "")
	var listed []string
	for _, k := range configKeys {
		if slices.Contains(listed, k.key) {
			t.Errorf("%s is listed twice", k.key)
		}
		listed = append(listed, k.key)
		if k.def == "" || k.does == "" || k.see == "" {
			t.Errorf("%s: a default, what it does and where it is explained, each", k.key)
		}
	}
	for _, k := range got {
		if !slices.Contains(listed, k) {
			t.Errorf("%s: a key of the file missing from configKeys", k)
		}
	}
	for _, k := range listed {
		if !slices.Contains(got, k) {
			t.Errorf("%s: in configKeys, not a key of the file", k)
		}
	}
	b, err := os.ReadFile(refDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, refBegin), strings.Index(doc, refEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers %q and %q", refDoc, refBegin, refEnd)
	}
	want := doc[:i] + refBegin + configReference() + refEnd + doc[j+len(refEnd):]
	if want == doc {
		return
	}
	if *rewriteDocs {
		if err := os.WriteFile(refDoc, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's configuration reference is stale: go test ./internal/exporter -run TestConfigReference -rewrite-docs", refDoc)
}
