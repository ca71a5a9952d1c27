package cri

import (
	"testing"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

// kubelet shows a runtime version it cannot parse as "Unknown": every
// build's version reaches it as a semantic version, a release's as it is.
func TestRuntimeVersionIsSemantic(t *testing.T) {
	for _, tc := range []struct{ build, want string }{
		{"v1.2.3", "v1.2.3"},
		{"1.2.3-rc.1+abc", "1.2.3-rc.1+abc"},
		{"df3ba06-dirty", "0.0.0+df3ba06-dirty"},
		{"devel", "0.0.0+devel"},
		{"v1.2.3-4-gdf3ba06", "v1.2.3-4-gdf3ba06"},
		{"a b/c..d", "0.0.0+a-b-c.d"},
		{"", "0.0.0"},
	} {
		got := semanticVersion(tc.build)
		if got != tc.want {
			t.Errorf("semanticVersion(%q) = %q, want %q", tc.build, got, tc.want)
		}
		if _, err := utilversion.ParseSemantic(got); err != nil {
			t.Errorf("semanticVersion(%q) = %q: %v", tc.build, got, err)
		}
	}
}
