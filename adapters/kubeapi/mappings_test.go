package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/virtlet/virtlet/ports"
)

func mapping(namespace, name string, spec map[string]interface{}) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "virtlet.k8s/v1", "kind": "VirtletImageMapping",
		"metadata": map[string]interface{}{"name": name, "namespace": namespace},
		"spec":     spec,
	}}
}

func dynamicClient(objects ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ImageMappingResource: "VirtletImageMappingList"}, objects...)
}

// The image mappings of kube-system, each one's spec as JSON by name;
// another namespace's are not Virtlet's.
func TestImageMappings(t *testing.T) {
	dyn := dynamicClient(
		mapping("kube-system", "seed", map[string]interface{}{"translations": []interface{}{
			map[string]interface{}{"name": "cirros", "url": "https://example.com/cirros.img"}}}),
		mapping("default", "elsewhere", map[string]interface{}{"prefix": "x"}),
	)
	c := NewForClientsets(nil, dyn)
	got, err := c.ImageMappings(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("mappings %q: want kube-system's seed only", got)
	}
	var spec struct {
		Translations []struct{ Name, URL string }
	}
	if err := json.Unmarshal(got["seed"], &spec); err != nil || len(spec.Translations) != 1 || spec.Translations[0].URL != "https://example.com/cirros.img" {
		t.Errorf("seed's spec %s: %v", got["seed"], err)
	}
}

// The custom resource not installed: no mappings and no error; refused:
// the error names the ClusterRole that grants it.
func TestImageMappingsErrors(t *testing.T) {
	gr := ImageMappingResource.GroupResource()
	for _, tc := range []struct {
		name    string
		err     error
		want    error
		message string
	}{
		{"not installed", apierrors.NewNotFound(gr, ""), nil, ""},
		{"forbidden", apierrors.NewForbidden(gr, "", errors.New("RBAC")), ports.ErrFailedPrecondition, MappingReader},
		{"unavailable", apierrors.NewServiceUnavailable("down"), ports.ErrUnavailable, "list VirtletImageMapping objects in kube-system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dyn := dynamicClient()
			dyn.PrependReactor("list", "virtletimagemappings", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.err
			})
			got, err := NewForClientsets(nil, dyn).ImageMappings(context.Background())
			if tc.want == nil {
				if err != nil || len(got) != 0 {
					t.Fatalf("got %q, %v; want none and no error", got, err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.message) {
				t.Errorf("err %v; want %v naming %q", err, tc.want, tc.message)
			}
		})
	}
	// Without a client for custom resources: none.
	if got, err := NewForClientset(nil).ImageMappings(context.Background()); err != nil || got != nil {
		t.Errorf("no dynamic client: %q, %v", got, err)
	}
}
