package libvirt

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// The probe really boots under QEMU: TCG always works where QEMU is
// installed.
func TestProbeBootsUnderTCG(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal("qemu-system-x86_64 is needed (testing/setup.sh installs it)")
	}
	disk := filepath.Join(t.TempDir(), "probe.img")
	os.WriteFile(disk, probeDisk(), 0o644)
	took, err := runProbe(context.Background(), qemu, "tcg", disk, 20e9)
	if err != nil {
		t.Fatalf("the probe does not boot under TCG: %v", err)
	}
	t.Logf("TCG probe: %s", took)
}

func TestProbeVerdictIsCachedPerBoot(t *testing.T) {
	dir := t.TempDir()
	first, cached := accelProbe{qemu: "qemu-system-x86_64", dir: dir}.choose(context.Background(), "auto")
	if cached {
		t.Fatal("a fresh directory had a cached verdict")
	}
	again, cached := accelProbe{qemu: "qemu-system-x86_64", dir: dir}.choose(context.Background(), "auto")
	first.probes = nil // the figures of a verdict's probes are not kept
	if !cached || again != first {
		t.Fatalf("second call: %+v cached=%v, first %+v", again, cached, first)
	}
	os.WriteFile(filepath.Join(dir, "accelerator.json"), []byte(`{"Key":"another boot","Accel":{"Name":"kvm"}}`), 0o600)
	if _, cached := (accelProbe{qemu: "qemu-system-x86_64", dir: dir}).choose(context.Background(), "auto"); cached {
		t.Fatal("a verdict from another boot was reused")
	}
}

func TestChooseAccelerator(t *testing.T) {
	for _, want := range []string{"tcg", "kvm"} {
		if a := (accelProbe{qemu: "qemu-system-x86_64", dir: t.TempDir()}).probe(context.Background(), want); a.Name != want || !strings.Contains(a.Reason, "forced") {
			t.Errorf("forced %s: %+v", want, a)
		}
	}
	a := accelProbe{qemu: "qemu-system-x86_64", dir: t.TempDir()}.probe(context.Background(), "auto")
	if _, err := os.Stat("/dev/kvm"); err != nil {
		// Without KVM the probe is not run at all.
		if a.Name != "tcg" || a.Reason != "no /dev/kvm" {
			t.Fatalf("auto without /dev/kvm: %+v", a)
		}
		return
	}
	// Both probes really ran, and the verdict is the one their figures
	// call for: KVM only when it booted the probe, faster than TCG.
	p := a.probes
	if p == nil || (p.TCGErr == nil && p.TCG <= 0) || (p.KVMErr == nil && p.KVM <= 0) {
		t.Fatalf("auto without both probes' results: %+v %+v", a, p)
	}
	if p.TCGErr != nil {
		t.Errorf("the probe does not boot under TCG here: %v", p.TCGErr)
	}
	wantKVM := p.KVMErr == nil && (p.TCGErr != nil || p.KVM < p.TCG)
	if got := a.Name == "kvm"; got != wantKVM || !strings.Contains(a.Reason, "TCG") || a.DomainType != map[bool]string{true: "kvm", false: "qemu"}[wantKVM] {
		t.Fatalf("auto chose %s (%s) from KVM %s (%v) and TCG %s (%v)", a.Name, a.Reason, p.KVM, p.KVMErr, p.TCG, p.TCGErr)
	}
	t.Logf("auto: %s (%s)", a.Name, a.Reason)
	if a := (accelProbe{qemu: "/nonexistent/qemu", dir: t.TempDir()}).probe(context.Background(), "auto"); a.Name != "tcg" || !strings.Contains(a.Reason, "both KVM") {
		if _, err := os.Stat("/dev/kvm"); err == nil {
			t.Fatalf("broken QEMU: %+v", a)
		}
	}
}

// The probes fit in the caller's deadline (Configure's), leaving time
// for the rest of its work.
func TestProbeLimitsFitTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		left     time.Duration // 0: no deadline
		tcg, kvm time.Duration
		ok       bool
	}{
		{0, 20 * time.Second, 3 * time.Second, true},
		{60 * time.Second, 20 * time.Second, 3 * time.Second, true},
		{29 * time.Second, 20 * time.Second, 3 * time.Second, true},
		{16500 * time.Millisecond, 10 * time.Second, 1500 * time.Millisecond, true},
		{6 * time.Second, 0, 0, false},
	} {
		ctx := context.Background()
		if tc.left > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, tc.left)
			defer cancel()
		}
		tcg, kvm, ok := probeLimits(ctx)
		near := func(got, want time.Duration) bool { return got <= want && got > want-100*time.Millisecond }
		if ok != tc.ok || tc.ok && (!near(tcg, tc.tcg) || !near(kvm, tc.kvm)) {
			t.Errorf("%s left: tcg %s, kvm %s, ok %v; want %s, %s, %v", tc.left, tcg, kvm, ok, tc.tcg, tc.kvm, tc.ok)
		}
	}
	// With no time to probe, the verdict is TCG at once.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := os.Stat("/dev/kvm"); err == nil {
		if a := (accelProbe{qemu: "qemu-system-x86_64", dir: t.TempDir()}).probe(ctx, "auto"); a.Name != "tcg" || !strings.Contains(a.Reason, "no time left") {
			t.Fatalf("auto with 3 s left: %+v", a)
		}
	}
}

// A bad agentWait fails Configure naming the field and what it takes.
func TestConfigureRefusesABadAgentWait(t *testing.T) {
	for _, v := range []string{`"soon"`, `"-1s"`, `"5"`} {
		h := New(logrus.New())
		err := h.Configure(context.Background(), ports.PluginConfig{Config: []byte(`{"agentWait": ` + v + `}`), StateDir: t.TempDir()})
		var inv *ports.InvalidError
		if !errors.As(err, &inv) || inv.Field != "libvirt config agentWait" || !strings.Contains(err.Error(), "a duration") {
			t.Errorf("agentWait %s: %v", v, err)
		}
	}
}

// A translation cache size out of range fails Configure naming the field
// and the range.
func TestConfigureRefusesABadTranslationCache(t *testing.T) {
	for _, v := range []string{"-1", "1025"} {
		h := New(logrus.New())
		err := h.Configure(context.Background(), ports.PluginConfig{Config: []byte(`{"tcgTranslationCacheMiB": ` + v + `}`), StateDir: t.TempDir()})
		var inv *ports.InvalidError
		if !errors.As(err, &inv) || inv.Field != "libvirt config tcgTranslationCacheMiB" || !strings.Contains(err.Error(), "0 (sized per VM) to 1024 (QEMU's largest default)") {
			t.Errorf("tcgTranslationCacheMiB %s: %v", v, err)
		}
	}
}

func TestProbeVerdict(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	failed := errors.New("no result within 3s")
	for _, c := range []struct {
		name           string
		tcg            time.Duration
		tcgErr         error
		kvm            time.Duration
		kvmErr         error
		want, inTheWhy string
	}{
		{"a working KVM", ms(470), nil, ms(110), nil, "kvm", "under KVM"},
		{"a working KVM on a loaded host", ms(2500), nil, ms(900), nil, "kvm", "under KVM"},
		{"this host's nested KVM, idle", ms(470), nil, ms(2700), nil, "tcg", "slow here"},
		// The probe that let KVM through once: both slowed by load.
		{"this host's nested KVM, loaded", ms(2522), nil, ms(2952), nil, "tcg", "slow here"},
		{"KVM out of time", ms(90), nil, ms(3000), failed, "tcg", "KVM probe failed"},
		{"TCG broken", 0, failed, ms(110), nil, "kvm", "under KVM"},
		{"both broken", 0, failed, 0, failed, "tcg", "both KVM"},
	} {
		a := probeVerdict(c.tcg, c.tcgErr, c.kvm, c.kvmErr)
		if a.Name != c.want || !strings.Contains(a.Reason, c.inTheWhy) {
			t.Errorf("%s: %s (%s), want %s (…%s…)", c.name, a.Name, a.Reason, c.want, c.inTheWhy)
		}
	}
}
