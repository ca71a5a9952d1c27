package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// qemuSplit is where a running VM's QEMU memory goes: the guest's RAM
// (resident: what the guest touched), the TCG translation cache, QEMU's
// own (the rest; private: not shared with other processes, such as the
// libraries' code), and the page tables mapping it all.
type qemuSplit struct {
	total, guest, tcg, pageTables int64
	// QEMU's own, anonymous (its heap, threads' stacks, device memory)
	// and file-backed (its code and libraries', which the node's QEMUs
	// share but for the pages each wrote, ownFileDirty).
	ownAnon, ownFile, ownFileDirty int64
}

// overhead is what QEMU costs beyond the guest's touched memory.
func (s qemuSplit) overhead() int64 { return s.total - s.guest + s.pageTables }

// overheadAtDensity is the overhead without the code the node's QEMUs
// share (resident once for them all).
func (s qemuSplit) overheadAtDensity() int64 {
	return s.ownAnon + s.ownFileDirty + s.tcg + s.pageTables
}

// splitQEMU reads /proc/PID/smaps and status. The guest's RAM is the
// anonymous mapping the size of its memory (QEMU allocates it whole; up to
// 8 MiB more for alignment); the translation cache is the one mapping
// both writable and executable.
func splitQEMU(pid string, memory int64) (qemuSplit, error) {
	var s qemuSplit
	f, err := os.Open("/proc/" + pid + "/smaps")
	if err != nil {
		return s, err
	}
	defer f.Close()
	type mapping struct {
		size       int64
		anon, code bool
		rss, dirty int64
	}
	var maps []*mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			lo, hi, _ := strings.Cut(fields[0], "-")
			a, _ := strconv.ParseUint(lo, 16, 64)
			z, _ := strconv.ParseUint(hi, 16, 64)
			maps = append(maps, &mapping{size: int64(z - a), anon: len(fields) == 5, code: fields[1] == "rwxp"})
			continue
		}
		if len(maps) == 0 || len(fields) != 3 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Rss:":
			maps[len(maps)-1].rss = kb << 10
		case "Private_Dirty:":
			maps[len(maps)-1].dirty = kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	var ram *mapping
	for _, m := range maps {
		if m.anon && !m.code && m.size >= memory && m.size <= memory+8<<20 && (ram == nil || m.size > ram.size) {
			ram = m
		}
	}
	if ram == nil {
		return s, fmt.Errorf("QEMU %s has no anonymous mapping of its guest's %d bytes", pid, memory)
	}
	for _, m := range maps {
		s.total += m.rss
		switch {
		case m == ram:
			s.guest = m.rss
		case m.code:
			s.tcg += m.rss
		case m.anon:
			s.ownAnon += m.rss
		default:
			s.ownFile += m.rss
			s.ownFileDirty += m.dirty
		}
	}
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmPTE:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			s.pageTables = kb << 10
		}
	}
	return s, nil
}

// BenchmarkVMOverhead measures what a running VM pod costs the node beyond
// its guest's memory (issue 26, item 1): its QEMU's resident memory split
// into the guest's touched RAM, the TCG translation cache, QEMU's own and
// the page tables, for the tiny guest (128 MiB) with the libvirt plugin's
// per-VM translation cache (an eighth of its memory: 16 MiB), with QEMU's
// default (tcgTranslationCacheMiB: 1024) and with 8 MiB, and for a 1 GiB
// guest (its per-VM cache 128 MiB); and the daemon's and plugins' resident
// memory, shared by the node's VMs. Each VM is measured 10 s after its
// ready marker.
func BenchmarkVMOverhead(b *testing.B) {
	_, translation := serveGuest(b, "tiny", "tiny")
	dir := builtBinaries(b)
	type vmCase struct {
		name   string
		tbMiB  int
		memory int64
	}
	// tbMiB 0: the shipped default, sized per VM.
	cases := []vmCase{{"tiny guest, 128 MiB, the per-VM translation cache: 16 MiB", 0, 128 << 20},
		{"tiny guest, 128 MiB, QEMU's default translation cache", 1024, 128 << 20},
		{"tiny guest, 128 MiB, translation cache 8 MiB", 8, 128 << 20},
		{"1 GiB guest (the tiny one), the per-VM translation cache: 128 MiB", 0, 1 << 30}}[:size(4, 1)]
	settle := time.Duration(size(10, 1)) * time.Second
	b.ResetTimer()
	var rows []Row
	var fixed int64
	for _, c := range cases {
		config := libvirtBenchConfig(os.Getenv("VIRTLET_E2E_POOL"), c.tbMiB)
		d := harness.NewDaemon(b, filepath.Join(dir, "virtlet"), harness.WithConfig(harness.Shipped(dir), "libvirt", config))
		rt, pulled := startPullingTiny(b, d, translation)
		name := fmt.Sprintf("overhead-%d", len(rows))
		p, err := runTinyPodOf(rt, d.Dir, pulled.ImageRef, name, nil, c.memory)
		if err != nil {
			b.Fatal(err)
		}
		if err := waitReady(p, 3*time.Minute); err != nil {
			b.Fatal(err)
		}
		time.Sleep(settle)
		pid, err := harness.QEMUPID(p.domain)
		if err != nil {
			b.Fatal(err)
		}
		s, err := splitQEMU(pid, c.memory)
		if err != nil {
			b.Fatal(err)
		}
		if fixed == 0 {
			fixed = treeRSS(d.PID())
		}
		removePod(context.Background(), rt, p.sandbox)
		d.Stop()
		mib := func(n int64) string { return fmt.Sprintf("%.1f", mibOf(n)) }
		row := Row{
			Figure: "Per-VM overhead: QEMU's RSS beyond the guest's touched memory, + page tables (" + c.name + "): QEMU's own (anonymous + code) + translation cache + page tables",
			Ours: fmt.Sprintf("%s MiB = %s + %s + %s + %s; without the code the node's QEMUs share (all but its %s MiB written): %s MiB; the guest touched %s MiB, QEMU's RSS %s MiB",
				mib(s.overhead()), mib(s.ownAnon), mib(s.ownFile), mib(s.tcg), mib(s.pageTables), mib(s.ownFileDirty), mib(s.overheadAtDensity()), mib(s.guest), mib(s.total)),
			Target: "≤ 40 MiB per tiny VM under TCG",
			Met:    met(s.overhead() <= 40<<20),
		}
		if c.memory == 1<<30 {
			// The daemon and its plugins serve every VM of the node: their
			// share is counted at the 50 VMs P5Density runs here.
			share := fixed / 50
			whole := s.overhead() + share
			row.Figure = "Node cost beyond guest memory of a 1 vCPU / 1 GiB VM (" + c.name + "): QEMU beyond the guest + page tables + the daemon's and plugins' share"
			row.Ours = fmt.Sprintf("%s MiB = %s + %s + %s (their %s MiB over 50 VMs); the guest touched %s MiB", mib(whole), mib(s.overhead()-s.pageTables),
				mib(s.pageTables), mib(share), mib(fixed), mib(s.guest))
			row.Floor = "KubeVirt's overhead formula: ≈ 290 MiB"
			row.Ratio = ratioOf(mibOf(whole), 290)
			row.Target, row.Met = "≤ 100 MiB", met(whole <= 100<<20)
		}
		rows = append(rows, row)
	}
	b.StopTimer()
	fmt.Printf("\nPer-VM overhead (TCG; measured %s after the guest's ready marker)\n", settle)
	WriteTable(os.Stdout, rows)
	record(rows...)
}
