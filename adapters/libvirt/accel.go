package libvirt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
		"-drive", "file="+disk+",format=raw,if=ide,readonly=on", "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04", "-no-reboot")
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
		return took, fmt.Errorf("%v: %s", err, firstLine(out))
	default:
		return took, fmt.Errorf("exited without running the probe")
	}
}

func firstLine(b []byte) string {
	for i, c := range b {
		if c == '\n' {
			return string(b[:i])
		}
	}
	return string(b)
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
