package core_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// observed records what the core reports to its observer.
type observed struct {
	mu     sync.Mutex
	phases []ports.VMPhase
	pulls  []ports.ImagePull
}

func (o *observed) VMPhase(p ports.VMPhase, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.phases = append(o.phases, p)
}

func (o *observed) ImagePull(p ports.ImagePull) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pulls = append(o.pulls, p)
}

func (o *observed) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.phases, o.pulls = nil, nil
}

func (o *observed) snapshot() ([]ports.VMPhase, []ports.ImagePull) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.phases), slices.Clone(o.pulls)
}

// A VM pod's life reports each phase once, in order, and its pull with the
// image's size.
func TestObserverHearsPhasesAndPulls(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	id := e.createVM(t, sb)
	if err := e.rt.StartContainer(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	phases, pulls := e.obs.snapshot()
	want := []ports.VMPhase{ports.PhaseNetwork, ports.PhaseVolumes, ports.PhaseCloudInit, ports.PhaseDefine, ports.PhaseStart}
	if !slices.Equal(phases, want) {
		t.Errorf("phases %v, want %v", phases, want)
	}
	img, err := e.rt.ImageStatus(context.Background(), testImage)
	if err != nil {
		t.Fatal(err)
	}
	if len(pulls) != 1 || pulls[0].Failure != "" || pulls[0].Scheme != "https" || pulls[0].Bytes != img.Size || img.Size == 0 {
		t.Errorf("pulls %+v, want one https pull of %d bytes", pulls, img.Size)
	}
	c := e.rt.Counts()
	if c.Sandboxes[core.SandboxReady] != 1 || c.Containers[core.ContainerRunning] != 1 || len(c.Sandboxes) != 1 || len(c.Containers) != 1 {
		t.Errorf("counts %+v, want one ready sandbox and one running container", c)
	}
}

// A VM the hypervisor claims from its pool of pre-launched VMs keeps the
// pool's name and UUID, and its phases say so: claim in place of define,
// resume in place of start; a VM whose root disk gets files loses its
// paused process and starts cold.
func TestPooledVMsReportTheirPath(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pool   bool
		ann    map[string]string
		phases []ports.VMPhase
		pooled bool // named and identified by the pool
	}{
		{"cold", false, nil,
			[]ports.VMPhase{ports.PhaseNetwork, ports.PhaseVolumes, ports.PhaseCloudInit, ports.PhaseDefine, ports.PhaseStart}, false},
		{"pooled", true, nil,
			[]ports.VMPhase{ports.PhaseNetwork, ports.PhaseVolumes, ports.PhaseCloudInit, ports.PhaseClaim, ports.PhaseResume}, true},
		{"pooled, files written", true, map[string]string{annotations.FilesFromDataSource: "configmap/files"},
			[]ports.VMPhase{ports.PhaseNetwork, ports.PhaseVolumes, ports.PhaseCloudInit, ports.PhaseClaim, ports.PhaseWriteFiles, ports.PhaseStart}, true},
		// The fake, like the libvirt plugin, sends a VM whose pod asks for
		// a UUID to a cold start.
		{"pooled, own UUID", true, map[string]string{annotations.SystemUUID: "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d"},
			[]ports.VMPhase{ports.PhaseNetwork, ports.PhaseVolumes, ports.PhaseCloudInit, ports.PhaseDefine, ports.PhaseStart}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			e.hv.Pool = tc.pool
			e.kube.ConfigMaps["default/files"] = map[string][]byte{"motd": []byte("aGk="), "motd_path": []byte("/etc/motd")}
			sb := e.runPod(t, "p", tc.ann)
			id := e.createVM(t, sb)
			c, err := e.rt.ContainerStatus(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			st, _ := e.hv.Status(ctx, id)
			spec, _ := e.hv.Spec(id)
			if tc.pooled != strings.HasPrefix(c.Spec.Name, "virtlet-pool-") || (tc.pooled && c.Spec.Name != st.Name) {
				t.Errorf("container's VM %q, the hypervisor's %q, defined as %q", c.Spec.Name, st.Name, spec.Name)
			}
			if c.Spec.UUID == "" || (st.UUID != "" && c.Spec.UUID != st.UUID) {
				t.Errorf("container's UUID %q, the hypervisor's %q", c.Spec.UUID, st.UUID)
			}
			if err := e.rt.StartContainer(ctx, id); err != nil {
				t.Fatal(err)
			}
			if c, _ := e.rt.ContainerStatus(ctx, id); c.Prelaunched {
				t.Error("a started VM is still prelaunched")
			}
			if phases, _ := e.obs.snapshot(); !slices.Equal(phases, tc.phases) {
				t.Errorf("phases %v, want %v", phases, tc.phases)
			}
		})
	}
}

// Failed pulls are reported with the class of their failure; concurrent
// pulls of one image are one pull.
func TestObserverClassesPullFailures(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.images.Fail["https://example.com/missing.img"] = fmt.Errorf("GET https://example.com/missing.img: 404 Not Found: %w", ports.ErrNotFound)
	e.images.Fail["https://example.com/down.img"] = fmt.Errorf("GET https://example.com/down.img: 503: %w", ports.ErrUnavailable)
	e.images.Fail["https://example.com/text.img"] = &ports.InvalidError{Field: "image", Reason: "not a VM disk"}
	for _, tt := range []struct {
		image string
		want  ports.PullFailure
	}{
		{"nginx", ports.PullInvalidName},
		{"virtlet.cloud/example.com/missing.img", ports.PullNotFound},
		{"virtlet.cloud/example.com/down.img", ports.PullUnavailable},
		{"virtlet.cloud/example.com/text.img", ports.PullInvalidImage},
		{"virtlet.cloud/example.com/x.img@sha256:" + fmt.Sprintf("%064d", 0), ports.PullInvalidImage},
	} {
		e.obs.reset()
		if _, err := e.rt.PullImage(ctx, tt.image, nil); err == nil {
			t.Fatalf("%s: pulled", tt.image)
		}
		_, pulls := e.obs.snapshot()
		if len(pulls) != 1 || pulls[0].Failure != tt.want || pulls[0].Bytes != 0 {
			t.Errorf("%s: reported %+v, want one failure %s", tt.image, pulls, tt.want)
		}
	}

	e.obs.reset()
	e.images.Delay = 100 * time.Millisecond
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.rt.PullImage(ctx, testImage, nil)
		}()
	}
	wg.Wait()
	if _, pulls := e.obs.snapshot(); len(pulls) != 1 || pulls[0].Failure != "" || pulls[0].Took < 100*time.Millisecond {
		t.Errorf("concurrent pulls reported %+v, want one pull of at least 100ms", pulls)
	}
}
