package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/fakes"
)

type staticTranslations struct {
	cfgs []ports.TranslationConfig
	errs []error
}

func (s staticTranslations) Translations(ctx context.Context) ([]ports.TranslationConfig, []error) {
	return s.cfgs, s.errs
}

func TestImageNameTranslations(t *testing.T) {
	one := 1
	cfgs := []ports.TranslationConfig{
		{Source: "/etc/virtlet/images/10-regexps.yaml", Translations: []ports.Translation{
			{Regexp: `cirros|ubuntu/(\d+\.\d+)`, URL: "https://cloud-images.ubuntu.com/releases/$1/ubuntu-$1.img"},
			{Regexp: `escape/(.*)`, URL: "file:///srv/images/../$1"},
		}},
		{Source: "/etc/virtlet/images/20-names.yaml", Translations: []ports.Translation{
			{Name: "cirros", URL: "https://github.com/mirantis/virtlet/releases/download/v0.9.3/cirros.img"},
			{Name: "local", URL: "http://10.0.0.1/local.img", Transport: "lan"},
			{Name: "disk", URL: "file:///srv/images/disk.qcow2"},
			{Name: "broken", URL: "https://x/y", Transport: "missing"},
		}, Transports: map[string]ports.TransportConfig{"lan": {TimeoutMillis: 5000, MaxRedirects: &one}}},
		{Source: "/etc/virtlet/images/30-prefix.yaml", Prefix: "corp", Translations: []ports.Translation{
			{Regexp: `(.*)`, URL: "https://images.corp.example.com/$1"},
		}},
	}
	images := fakes.NewImageSource()
	rt, err := core.New(core.Deps{Hypervisor: fakehypervisor.New(), Store: fakes.NewStore(), ImageFiles: fakes.NewImageFiles(t.TempDir()),
		ImageSources: map[string]ports.ImageSource{"https": images, "http": images, "file": images},
		Translations: staticTranslations{cfgs: cfgs, errs: []error{errors.New("a bad file")}}}, core.Options{Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		image, url, transport string
	}{
		{"virtlet.cloud/cirros", "https://github.com/mirantis/virtlet/releases/download/v0.9.3/cirros.img", ""}, // exact beats regexp
		{"virtlet.cloud/ubuntu/18.04:latest", "https://cloud-images.ubuntu.com/releases/18.04/ubuntu-18.04.img", ""},
		{"virtlet.cloud/local", "http://10.0.0.1/local.img", `{"timeout":5000,"maxRedirects":1}`},
		{"virtlet.cloud/disk", "file:///srv/images/disk.qcow2", ""},
		{"virtlet.cloud/corp/team/vm.qcow2", "https://images.corp.example.com/team/vm.qcow2", ""},
		{"virtlet.cloud/example.com/other.img", "https://example.com/other.img", ""}, // the default rule
	} {
		if _, err := rt.PullImage(ctx, tc.image, nil); err != nil {
			t.Errorf("%s: %v", tc.image, err)
			continue
		}
		req := images.Requests[len(images.Requests)-1]
		if req.Location != tc.url || string(req.TransportConfig) != tc.transport {
			t.Errorf("%s → %s %s, want %s %s", tc.image, req.Location, req.TransportConfig, tc.url, tc.transport)
		}
	}
	for _, tc := range []struct{ image, want string }{
		{"virtlet.cloud/escape/x", "expands it to a URL with '..'"},
		{"virtlet.cloud/broken", `names a transport the file does not define`},
	} {
		if _, err := rt.PullImage(ctx, tc.image, nil); !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.image, err)
		}
	}
	var tc ports.TransportConfig
	json.Unmarshal(images.Requests[2].TransportConfig, &tc)
	if fmt.Sprint(tc.TimeoutMillis, *tc.MaxRedirects) != "5000 1" {
		t.Errorf("transport config %+v", tc)
	}
}
