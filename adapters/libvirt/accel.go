package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// accelerator is the chosen way to run guests.
type accelerator struct {
	DomainType string // libvirt domain type: "kvm" or "qemu"
	Name       string // "kvm" or "tcg"
	Reason     string // why, with the probe's figures
}

var (
	kvmAccel = accelerator{DomainType: "kvm", Name: "kvm"}
	tcgAccel = accelerator{DomainType: "qemu", Name: "tcg"}
)

// probeDisk is a disk whose boot sector writes 0x31 to the isa-debug-exit
// port: QEMU then exits with status (0x31<<1)|1 = 99. Booting it goes
// through the firmware and a disk read, as every VM does.
func probeDisk() []byte {
	disk := make([]byte, 512*64)
	code := []byte{0xB0, 0x31, 0xE6, 0xF4, 0xF4, 0xEB, 0xFD} // mov al,0x31; out 0xf4,al; hlt; jmp $-3
	copy(disk, code)
	disk[510], disk[511] = 0x55, 0xAA
	return disk
}

const probeExit = 99

// runProbe boots the probe disk with an accelerator and returns how long
// it took, or an error if it failed or ran out of time.
func runProbe(ctx context.Context, qemu, accel, disk string, limit time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, "-accel", accel, "-machine", "pc", "-m", "32", "-nodefaults", "-display", "none",
		"-drive", "file="+disk+",format=raw,if=ide", "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04", "-no-reboot")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return took, fmt.Errorf("no result within %s", limit)
	case errors.As(err, &exit) && exit.ExitCode() == probeExit:
		return took, nil
	case err != nil:
		return took, fmt.Errorf("%v: %s", err, lastLine(out))
	default:
		return took, fmt.Errorf("exited without running the probe")
	}
}

// lastLine is QEMU's error: warnings come first.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// cachedAccelerator returns the verdict of an earlier probe in dir, valid
// while the host has not rebooted and QEMU has not changed; otherwise it
// probes and saves the verdict.
func cachedAccelerator(ctx context.Context, want, qemu, dir string) (accelerator, bool) {
	key := probeKey(qemu)
	file := filepath.Join(dir, "accelerator.json")
	if want == "auto" && key != "" {
		var saved struct {
			Key   string
			Accel accelerator
		}
		if data, err := os.ReadFile(file); err == nil && json.Unmarshal(data, &saved) == nil && saved.Key == key {
			return saved.Accel, true
		}
	}
	a := chooseAccelerator(ctx, want, qemu, dir)
	if want == "auto" && key != "" {
		if data, err := json.Marshal(struct {
			Key   string
			Accel accelerator
		}{key, a}); err == nil {
			os.WriteFile(file, data, 0o600)
		}
	}
	return a, false
}

// probeKey identifies this boot of the host and this QEMU binary.
func probeKey(qemu string) string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	path, err := exec.LookPath(qemu)
	if err != nil {
		return ""
	}
	info, err := os.Stat(path)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%s %s %d %d", strings.TrimSpace(string(boot)), path, info.Size(), info.ModTime().UnixNano())
}

// chooseAccelerator decides between KVM and TCG with a real probe: KVM is
// used only if the probe boots under it within the deadline and not much
// slower than under TCG. (On this project's CI machines /dev/kvm exists but
// KVM guests crawl: the device file alone proves nothing.)
func chooseAccelerator(ctx context.Context, want, qemu, dir string) accelerator {
	switch want {
	case "tcg":
		a := tcgAccel
		a.Reason = "forced by the plugin config"
		return a
	case "kvm":
		a := kvmAccel
		a.Reason = "forced by the plugin config"
		return a
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		a := tcgAccel
		a.Reason = "no /dev/kvm"
		return a
	}
	disk := filepath.Join(dir, "accel-probe.img")
	if err := os.WriteFile(disk, probeDisk(), 0o644); err != nil {
		a := tcgAccel
		a.Reason = "cannot write the probe disk: " + err.Error()
		return a
	}
	defer os.Remove(disk)
	tcgTook, tcgErr := runProbe(ctx, qemu, "tcg", disk, 20*time.Second)
	kvmTook, kvmErr := runProbe(ctx, qemu, "kvm", disk, 3*time.Second)
	switch {
	case tcgErr != nil && kvmErr != nil:
		a := tcgAccel
		a.Reason = fmt.Sprintf("QEMU failed the probe under both KVM (%v) and TCG (%v); VMs will likely fail too", kvmErr, tcgErr)
		return a
	case kvmErr != nil:
		a := tcgAccel
		a.Reason = fmt.Sprintf("the KVM probe failed (%v); TCG booted it in %s", kvmErr, tcgTook.Round(time.Millisecond))
		return a
	case tcgErr == nil && kvmTook > 2*tcgTook+500*time.Millisecond:
		a := tcgAccel
		a.Reason = fmt.Sprintf("KVM works but is slow here: the probe booted in %s under KVM, %s under TCG",
			kvmTook.Round(time.Millisecond), tcgTook.Round(time.Millisecond))
		return a
	default:
		a := kvmAccel
		a.Reason = fmt.Sprintf("the probe booted in %s under KVM (%s under TCG)", kvmTook.Round(time.Millisecond), tcgTook.Round(time.Millisecond))
		return a
	}
}
