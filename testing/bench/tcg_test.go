package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// tbCacheSizes are the TCG translation cache sizes measured, in MiB (0:
// QEMU's default); the smoke run measures two.
var tbCacheSizes = []int{0, 16, 64, 32, 8}[:size(5, 2)]

// cloudTBCacheSizes are the sizes measured for the cloud guest, whose
// systemd boot runs far more code than the tiny one (not in the smoke
// run: 5 boots of 12–25 s each).
var cloudTBCacheSizes = []int{0, 128, 64, 32, 16}[:size(5, 0)]

var tcgRuns = size(3, 1)

// tcgGuest is a guest BenchmarkTCGTranslationCache boots: its image, its
// memory, the console line that marks it booted.
type tcgGuest struct {
	name, image, memory, marker string
	sizes                       []int
	target                      string // the rows' target, if any
}

// BenchmarkTCGTranslationCache boots guests with bare QEMU under TCG, one
// vCPU, for each translation cache size (QEMU's tb-size, libvirt's
// <tcg><tb-cache>): the tiny guest (128 MiB) to its ready marker, and the
// cloud test image (Debian with systemd, 512 MiB) to its login prompt;
// the time to the marker, QEMU's resident memory then, and how much of it
// the translation cache holds (the resident part of QEMU's code buffer
// mapping). It tells what capping the cache saves per VM and what the
// retranslation costs the boot: the libvirt plugin's per-VM size (an
// eighth of the VM's memory: 16 MiB for the tiny guest, 64 MiB for the
// cloud one) and tcgTranslationCacheMiB. Medians of 3 runs each.
func BenchmarkTCGTranslationCache(b *testing.B) {
	tiny, err := harness.GuestImage("tiny")
	if err != nil {
		b.Fatal(err)
	}
	guests := []tcgGuest{{"tiny guest (128 MiB) to its ready marker", tiny, "128", "@@TINY-READY", tbCacheSizes, "≤ 40 MiB per tiny VM beyond its guest (issue 26)"}}
	if len(cloudTBCacheSizes) > 0 {
		cloud, err := harness.GuestImage("cloud")
		if err != nil {
			b.Fatal(err)
		}
		guests = append(guests, tcgGuest{"cloud guest (systemd, 512 MiB) to its login prompt", cloud, "512", "login:", cloudTBCacheSizes, ""})
	}
	b.ResetTimer()
	var rows []Row
	for _, g := range guests {
		var base tcgBoot
		for _, mib := range g.sizes {
			var boots []tcgBoot
			for i := 0; i < tcgRuns; i++ {
				boots = append(boots, bootTCG(b, g, mib))
			}
			m := medianBoot(boots)
			name := fmt.Sprintf("%d MiB", mib)
			if mib == 0 {
				name, base = "QEMU's default", m
			}
			rows = append(rows, Row{
				Figure: "TCG translation cache " + name + ": " + g.name + "; QEMU RSS; the cache's share",
				Ours:   fmt.Sprintf("%s; RSS %.0f MiB; cache %.1f MiB", ms(m.ready), mibOf(m.rss), mibOf(m.cache)),
				Floor:  fmt.Sprintf("default: %s; RSS %.0f MiB", ms(base.ready), mibOf(base.rss)),
				Ratio:  ratioOf(float64(m.ready), float64(base.ready)),
				Target: g.target,
			})
		}
	}
	b.StopTimer()
	fmt.Printf("\nTCG translation cache (bare QEMU, median of %d)\n", tcgRuns)
	WriteTable(os.Stdout, rows)
	record(rows...)
}

type tcgBoot struct {
	ready      time.Duration
	rss, cache int64
}

func medianBoot(boots []tcgBoot) tcgBoot {
	var ready []time.Duration
	var rss, cache []float64
	for _, x := range boots {
		ready = append(ready, x.ready)
		rss = append(rss, float64(x.rss))
		cache = append(cache, float64(x.cache))
	}
	return tcgBoot{ready: median(ready), rss: int64(medianF(rss)), cache: int64(medianF(cache))}
}

func mibOf(n int64) float64 { return float64(n) / (1 << 20) }

// bootTCG boots a guest with the given translation cache size (MiB; 0:
// QEMU's default) to its marker and measures QEMU there.
func bootTCG(b *testing.B, g tcgGuest, tbMiB int) tcgBoot {
	accel := "tcg"
	if tbMiB > 0 {
		accel += ",tb-size=" + strconv.Itoa(tbMiB)
	}
	start := time.Now()
	sc, pid, stop := bareQEMU(b, g.image, accel, "-m", g.memory) // the last -m counts
	defer stop()
	sc.Split(linesOrMarker(g.marker))
	for sc.Scan() {
		if !strings.Contains(sc.Text(), g.marker) {
			continue
		}
		boot := tcgBoot{ready: time.Since(start)}
		var err error
		if boot.rss, boot.cache, err = qemuCodeBuffer(pid); err != nil {
			b.Fatal(err)
		}
		return boot
	}
	b.Fatalf("the %s never printed %q (tb-size %d MiB): %v", g.name, g.marker, tbMiB, sc.Err())
	return tcgBoot{}
}

// linesOrMarker splits a console into lines, and gives an unfinished
// line once it holds marker: a login prompt waits for input on its line.
func linesOrMarker(marker string) bufio.SplitFunc {
	return func(data []byte, atEOF bool) (int, []byte, error) {
		advance, token, err := bufio.ScanLines(data, atEOF)
		if advance == 0 && token == nil && err == nil && bytes.Contains(data, []byte(marker)) {
			return len(data), data, nil
		}
		return advance, token, err
	}
}

// qemuCodeBuffer reads a QEMU's resident memory and the resident part of
// its TCG code buffer: QEMU maps the buffer executable and writable at
// once (rwxp), the only such mapping of the process.
func qemuCodeBuffer(pid int) (rss, cache int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	inCode := false
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 2 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			inCode = fields[1] == "rwxp" // a mapping's header line
		case len(fields) == 3 && fields[0] == "Rss:":
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			rss += kb << 10
			if inCode {
				cache += kb << 10
			}
		}
	}
	return rss, cache, sc.Err()
}
