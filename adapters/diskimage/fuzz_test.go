package diskimage_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/testing/harness"
)

// FuzzInspect holds the qcow2 header parser to QEMU's reading of the same
// bytes: whatever the parser accepts, qemu-img info (unprivileged) either
// refuses to open (a corrupt image, which qemu-img check refuses at the
// pull) or reads as a self-contained qcow2 image of the virtual size the
// parser found: no backing file, no data file, no encryption. The seeds
// are real images of every kind the parser meets, small clusters.
func FuzzInspect(f *testing.F) {
	dir := harness.SearchableTempDir(f)
	p := func(n string) string { return filepath.Join(dir, n) }
	for _, seed := range []struct {
		name string
		opts []string
	}{
		{"v3", []string{"-o", "cluster_size=512"}},
		{"v2", []string{"-o", "cluster_size=512,compat=0.10"}},
		{"zstd-l2", []string{"-o", "cluster_size=16384,extended_l2=on,compression_type=zstd"}},
		{"datafile", []string{"-o", "cluster_size=512,data_file=" + p("data") + ",data_file_raw=on"}},
		{"backing", []string{"-o", "cluster_size=512", "-F", "qcow2", "-b", p("v3")}},
	} {
		args := append([]string{"create", "-q", "-f", "qcow2"}, seed.opts...)
		if out, err := exec.Command("qemu-img", append(args, p(seed.name), "1M")...).CombinedOutput(); err != nil {
			f.Fatalf("qemu-img %v: %v\n%s", args, err, out)
		}
	}
	if out, err := exec.Command("qemu-img", "bitmap", "--add", p("v3"), "b0").CombinedOutput(); err != nil {
		f.Fatalf("qemu-img bitmap: %v\n%s", err, out)
	}
	for _, name := range []string{"v3", "v2", "zstd-l2", "datafile", "backing"} {
		data, err := os.ReadFile(p(name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	tool := diskimage.Tool{Timeout: 20 * time.Second}
	f.Fuzz(func(t *testing.T, data []byte) {
		info, err := diskimage.InspectReader(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, diskimage.ErrNotADisk) {
				t.Fatalf("a refusal that is not ErrNotADisk: %v", err)
			}
			return
		}
		if info.Format != diskimage.QCOW2 {
			return // raw: no metadata for QEMU to read
		}
		sum := sha256.Sum256(data)
		file := p("in-" + hex.EncodeToString(sum[:8]) + ".qcow2")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(file)
		q, err := tool.Info(context.Background(), file, "qcow2")
		if err != nil {
			// QEMU does not open it either; but a tool that did not run
			// (a timeout, no access) is no verdict.
			if msg := err.Error(); !strings.Contains(msg, "qemu-img info: exit status 1:") || strings.Contains(msg, "Permission denied") {
				t.Fatalf("qemu-img info gave no verdict: %v", err)
			}
			return
		}
		if q.Format != "qcow2" || q.VirtualSize != info.VirtualSize || q.BackingFilename != "" || q.FormatSpecific.Data.DataFile != "" || q.Encrypted {
			t.Fatalf("the parser accepted %+v; qemu-img info reads %+v", info, q)
		}
	})
}
