package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// ksmDir is the kernel's KSM control directory.
const ksmDir = "/sys/kernel/mm/ksm"

// ksmTuning is what deploy/node/virtlet-ksm.conf sets at install: ksmd
// scans 1000 pages every 50 ms (80 MiB/s).
var ksmTuning = map[string]string{"pages_to_scan": "1000", "sleep_millisecs": "50"}

// ksmResult is the VMs' memory with and without KSM merging their pages.
type ksmResult struct {
	pssOff, pssOn int64 // the QEMUs' summed proportional set size
	sharing       int64 // pages_sharing: pages that share another's frame
	settled       time.Duration
	ksmdCPU       time.Duration // ksmd's CPU time while it merged
	// The pod that asked not to share: its PSS, and how much of its
	// memory KSM merged (smaps' KSM lines).
	privateOff, privateOn, privateMerged int64
	// hostInUse is the host's memory in use with KSM settled.
	hostInUse int64
}

// measureKSM reads the QEMUs' PSS, turns KSM on with the install's
// tuning, waits until it stops finding new pages to share (or 5 minutes),
// reads the PSS again, and puts KSM back as it found it (unmerging every
// page first).
// private is a domain whose pod asked not to share.
func measureKSM(b *testing.B, domains []string, private string) (ksmResult, error) {
	if _, err := os.Stat(filepath.Join(ksmDir, "run")); err != nil {
		return ksmResult{}, fmt.Errorf("this kernel has no KSM: %w", err)
	}
	saved := map[string]string{}
	for _, k := range []string{"run", "pages_to_scan", "sleep_millisecs"} {
		saved[k] = readKSM(k)
	}
	defer func() {
		writeKSM(b, "run", "2") // unmerge before the previous setting
		for k, v := range saved {
			writeKSM(b, k, v)
		}
	}()
	var res ksmResult
	res.pssOff, res.privateOff = sumPSS(domains), sumPSS([]string{private})
	for k, v := range ksmTuning {
		writeKSM(b, k, v)
	}
	cpu0 := ksmdCPU()
	start := time.Now()
	writeKSM(b, "run", "1")
	last, stable := int64(-1), 0
	for time.Since(start) < 5*time.Minute && stable < 3 {
		time.Sleep(5 * time.Second)
		n, _ := strconv.ParseInt(readKSM("pages_sharing"), 10, 64)
		if n > 0 && n <= last+last/100 { // under 1 % more in 5 s
			stable++
		} else {
			stable = 0
		}
		last = n
	}
	res.settled, res.sharing, res.ksmdCPU = time.Since(start), last, ksmdCPU()-cpu0
	res.pssOn, res.privateOn = sumPSS(domains), sumPSS([]string{private})
	res.privateMerged = ksmMerged(private)
	res.hostInUse = hostMemInUse()
	return res, nil
}

func readKSM(name string) string {
	b, _ := os.ReadFile(filepath.Join(ksmDir, name))
	return strings.TrimSpace(string(b))
}

func writeKSM(b *testing.B, name, value string) {
	if err := os.WriteFile(filepath.Join(ksmDir, name), []byte(value), 0o644); err != nil {
		b.Errorf("KSM %s = %s: %v", name, value, err)
	}
}

// ksmMerged is how much of a domain's QEMU memory KSM merged (the
// smaps_rollup "KSM:" line, Linux 6.1 and later; -1 when unknown).
func ksmMerged(domain string) int64 {
	pid, err := harness.QEMUPID(domain)
	if err != nil {
		return -1
	}
	data, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "KSM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return -1
}

// sumPSS adds up the proportional set size of the domains' QEMUs: a page
// several of them share counts a part in each.
func sumPSS(domains []string) int64 {
	var total int64
	for _, d := range domains {
		pid, err := harness.QEMUPID(d)
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "Pss:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

// ksmdCPU is the kernel's ksmd thread's CPU time so far.
func ksmdCPU() time.Duration {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "ksmd" {
			continue
		}
		pid, _ := strconv.Atoi(e.Name())
		return harness.ProcessCPU(pid)
	}
	return 0
}
