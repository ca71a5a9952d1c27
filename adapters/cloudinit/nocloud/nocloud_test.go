package nocloud

import (
	"testing"

	"github.com/virtlet/virtlet/ports"
)

// NoCloud carries cloud-init's own forms as they are: meta-data,
// user-data (an empty #cloud-config when there is none: cloud-init
// refuses a seed without it) and network-config v1 when there is one.
func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  ports.MediaRequest
		want map[string]string
	}{
		{"all", ports.MediaRequest{MetaData: []byte(`{"a":1}`), UserData: []byte("#!/bin/sh\n"), NetworkConfig: []byte("version: 1\n")},
			map[string]string{"meta-data": `{"a":1}`, "user-data": "#!/bin/sh\n", "network-config": "version: 1\n"}},
		{"no user-data, DHCP", ports.MediaRequest{MetaData: []byte(`{}`)},
			map[string]string{"meta-data": `{}`, "user-data": EmptyUserData}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Layout(tc.req)
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("%v %v", got, err)
			}
			for k, v := range tc.want {
				if string(got[k]) != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}
