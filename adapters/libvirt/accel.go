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

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
)

// accelerator is the chosen way to run guests.
type accelerator struct {
	DomainType string // libvirt domain type: "kvm" or "qemu"
	Name       string // "kvm" or "tcg"
	Reason     string // why, with the probe's figures
	// TBCacheMiB is every TCG domain's translation cache size, the
	// plugin's tcgTranslationCacheMiB; 0 sizes it per VM (tbCacheMiB).
	TBCacheMiB int `json:"-"`
	// probes are the probes' results the verdict came from (none when
	// forced, without /dev/kvm, or read from the cache).
	probes *probeResults
}

// probeResults are how long the probe took to boot under each
// accelerator, or why it failed.
type probeResults struct {
	TCG, KVM       time.Duration
	TCGErr, KVMErr error
}

// kvmDevice is the KVM device QEMU opens for a KVM domain.
const kvmDevice = "/dev/kvm"

// maxTBCacheMiB is the largest translation cache the config takes: QEMU's
// own default size on a host of 8 GiB or more (an eighth of the host's
// memory on a smaller one).
const maxTBCacheMiB = 1024

// The translation cache a TCG VM gets when the config sizes none: an
// eighth of its memory, within these bounds. QEMU's own default reserves
// 1 GiB and keeps stale code until it is full: the cloud test image's
// systemd boot left 270 MiB of it resident. Capped at 64 MiB (its 512 MiB
// VM's eighth) it booted 11 % slower (11.2 s to its login prompt against
// 10.1 s) with 241 MiB less RSS, at 32 MiB 37 % and at 16 MiB 2× slower;
// the tiny guest (128 MiB: 16 MiB) boots as fast at 16 MiB as uncapped,
// and thrashes at 8 (BenchmarkTCGTranslationCache); as a VM pod (160 MiB:
// 20 MiB) it is ready as early as uncapped (BenchmarkKubeApply with
// VIRTLET_BENCH_TB_CACHE_MIB=1024): up to a tenth of a TCG boot for a
// quarter to a half of QEMU's memory (VMOverhead: the tiny pod's QEMU
// 104 MiB instead of 136). tcgTranslationCacheMiB: 1024 is QEMU's own
// default on hosts of 8 GiB or more.
const (
	minTBCacheMiB = 16
	tbCacheCapMiB = 256
)

// tbCacheMiB is the translation cache, in MiB, of a VM of memoryBytes
// (its domain's <memory>, the most it can be resized to: fixed for its
// life) under this accelerator: none (0) under KVM, the config's size if
// it gives one, else an eighth of the VM's memory, 16 to 256 MiB.
func (a accelerator) tbCacheMiB(memoryBytes int64) int {
	switch {
	case a.DomainType != tcgAccel.DomainType:
		return 0
	case a.TBCacheMiB > 0:
		return a.TBCacheMiB
	}
	return min(max(int(memoryBytes>>20)/8, minTBCacheMiB), tbCacheCapMiB)
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

// accelProbe chooses the accelerator the node's VMs run under by booting
// a probe disk with its QEMU, and keeps its verdict in dir.
type accelProbe struct {
	qemu string // the emulator the probe runs
	dir  string // where the verdict is kept
}

// choose returns the verdict of an earlier probe, valid while the host
// has not rebooted and QEMU has not changed (cached true); otherwise it
// probes and saves the verdict.
func (p accelProbe) choose(ctx context.Context, want string) (a accelerator, cached bool) {
	key := probeKey(p.qemu)
	file := filepath.Join(p.dir, "accelerator.json")
	if want == "auto" && key != "" {
		var saved struct {
			Key   string
			Accel accelerator
		}
		if data, err := os.ReadFile(file); err == nil && json.Unmarshal(data, &saved) == nil && saved.Key == key {
			return saved.Accel, true
		}
	}
	a = p.probe(ctx, want)
	if want == "auto" && key != "" {
		if data, err := json.Marshal(struct {
			Key   string
			Accel accelerator
		}{key, a}); err == nil {
			atomicfile.Write(file, data, 0o600)
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
	// probeRule changes with probeVerdict's rule: a verdict an older rule
	// made is not reused.
	const probeRule = 2
	return fmt.Sprintf("rule %d %s %s %d %d", probeRule, strings.TrimSpace(string(boot)), path, info.Size(), info.ModTime().UnixNano())
}

// probe decides between KVM and TCG with a real probe: KVM is
// used only if the probe boots under it within the deadline and faster
// than under TCG (probeVerdict). (On this project's CI machines /dev/kvm exists but
// KVM guests crawl: the device file alone proves nothing.)
func (p accelProbe) probe(ctx context.Context, want string) accelerator {
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
	if _, err := os.Stat(kvmDevice); err != nil {
		a := tcgAccel
		a.Reason = "no /dev/kvm"
		return a
	}
	tcgLimit, kvmLimit, ok := probeLimits(ctx)
	if !ok {
		a := tcgAccel
		a.Reason = "no time left to probe KVM within the caller's deadline"
		return a
	}
	disk := filepath.Join(p.dir, "accel-probe.img")
	if err := os.WriteFile(disk, probeDisk(), 0o644); err != nil {
		a := tcgAccel
		a.Reason = "cannot write the probe disk: " + err.Error()
		return a
	}
	defer os.Remove(disk)
	tcgTook, tcgErr := runProbe(ctx, p.qemu, "tcg", disk, tcgLimit)
	kvmTook, kvmErr := runProbe(ctx, p.qemu, "kvm", disk, kvmLimit)
	a := probeVerdict(tcgTook, tcgErr, kvmTook, kvmErr)
	a.probes = &probeResults{TCG: tcgTook, KVM: kvmTook, TCGErr: tcgErr, KVMErr: kvmErr}
	return a
}

// probeVerdict chooses from the two probes' results. A working KVM boots
// the probe faster than TCG, which translates the firmware's code (here
// ≈ 0.1 s against ≈ 0.5 s idle): KVM is chosen only then. This host's
// nested KVM boots it in 2.7–3 s, then fails real guests with "KVM
// internal error ... emulation failure" and QEMU pauses them; a bound
// relative to TCG alone (2× + 0.5 s) let it through once, when load made
// the TCG probe take 2.5 s.
func probeVerdict(tcgTook time.Duration, tcgErr error, kvmTook time.Duration, kvmErr error) accelerator {
	switch {
	case tcgErr != nil && kvmErr != nil:
		a := tcgAccel
		a.Reason = fmt.Sprintf("QEMU failed the probe under both KVM (%v) and TCG (%v); VMs will likely fail too", kvmErr, tcgErr)
		return a
	case kvmErr != nil:
		a := tcgAccel
		a.Reason = fmt.Sprintf("the KVM probe failed (%v); TCG booted it in %s", kvmErr, tcgTook.Round(time.Millisecond))
		return a
	case tcgErr == nil && kvmTook >= tcgTook:
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

// Probe limits: TCG gets 20 s, KVM 3 s, when the caller's deadline (the
// plugin's Configure call) leaves that much besides probeReserve for the
// rest of its work; else both shrink in proportion, and under minProbe
// there is no probe at all.
const (
	tcgProbeLimit = 20 * time.Second
	kvmProbeLimit = 3 * time.Second
	probeReserve  = 5 * time.Second
	minProbe      = 2 * time.Second
)

func probeLimits(ctx context.Context) (tcg, kvm time.Duration, ok bool) {
	deadline, has := ctx.Deadline()
	if !has {
		return tcgProbeLimit, kvmProbeLimit, true
	}
	budget := time.Until(deadline) - probeReserve
	if budget >= tcgProbeLimit+kvmProbeLimit {
		return tcgProbeLimit, kvmProbeLimit, true
	}
	if budget < minProbe {
		return 0, 0, false
	}
	share := float64(budget) / float64(tcgProbeLimit+kvmProbeLimit)
	return time.Duration(share * float64(tcgProbeLimit)), time.Duration(share * float64(kvmProbeLimit)), true
}
