package libvirt

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
	first, cached := cachedAccelerator(context.Background(), "auto", "qemu-system-x86_64", dir)
	if cached {
		t.Fatal("a fresh directory had a cached verdict")
	}
	again, cached := cachedAccelerator(context.Background(), "auto", "qemu-system-x86_64", dir)
	if !cached || again != first {
		t.Fatalf("second call: %+v cached=%v, first %+v", again, cached, first)
	}
	os.WriteFile(filepath.Join(dir, "accelerator.json"), []byte(`{"Key":"another boot","Accel":{"Name":"kvm"}}`), 0o600)
	if _, cached := cachedAccelerator(context.Background(), "auto", "qemu-system-x86_64", dir); cached {
		t.Fatal("a verdict from another boot was reused")
	}
}

func TestChooseAccelerator(t *testing.T) {
	for _, want := range []string{"tcg", "kvm"} {
		if a := chooseAccelerator(context.Background(), want, "qemu-system-x86_64", t.TempDir()); a.Name != want || !strings.Contains(a.Reason, "forced") {
			t.Errorf("forced %s: %+v", want, a)
		}
	}
	a := chooseAccelerator(context.Background(), "auto", "qemu-system-x86_64", t.TempDir())
	if _, err := os.Stat("/dev/kvm"); err != nil {
		// Without KVM the probe is not run at all.
		if a.Name != "tcg" || a.Reason != "no /dev/kvm" {
			t.Fatalf("auto without /dev/kvm: %+v", a)
		}
		return
	}
	if (a.Name != "kvm" && a.Name != "tcg") || !strings.Contains(a.Reason, "TCG") || strings.Contains(a.Reason, "both KVM") {
		t.Fatalf("auto: %+v", a)
	}
	t.Logf("auto: %s (%s)", a.Name, a.Reason)
	if a := chooseAccelerator(context.Background(), "auto", "/nonexistent/qemu", t.TempDir()); a.Name != "tcg" || !strings.Contains(a.Reason, "both KVM") {
		if _, err := os.Stat("/dev/kvm"); err == nil {
			t.Fatalf("broken QEMU: %+v", a)
		}
	}
}
