package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/adapters/diskfiles"
	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/harness"
)

// BenchmarkFilesFromDataSource: what VirtletFilesFromDataSource adds to a
// VM's creation: three files written into the root file system of a fresh
// overlay of the cloud test image (Debian's, ext4), as the libvirt plugin
// does, without mounting it (a raw copy, debugfs, the changed chunks
// written back; every tool unprivileged). No target: the cost of writing
// without a host mount.
func BenchmarkFilesFromDataSource(b *testing.B) {
	cloud, err := harness.GuestImage("cloud")
	if err != nil {
		b.Fatal(err)
	}
	dir := harness.SearchableTempDir(b)
	base := filepath.Join(dir, "cloud.qcow2")
	if out, err := exec.Command("cp", "--reflink=auto", cloud, base).CombinedOutput(); err != nil {
		b.Fatalf("cp: %v %s", err, out)
	}
	os.Chmod(base, 0o644)
	files := []ports.GuestFile{
		{Path: "/etc/app/app.conf", Data: []byte(strings.Repeat("key = value\n", 200)), Mode: 0o644},
		{Path: "/etc/app/secret.key", Data: []byte("not much of a secret\n"), Mode: 0o600},
		{Path: "/root/.ssh/authorized_keys", Data: []byte("ssh-ed25519 AAAA bench\n"), Mode: 0o600},
	}
	runs := size(5, 1)
	var times []time.Duration
	b.ResetTimer()
	for i := 0; i < runs; i++ {
		b.StopTimer()
		overlay := filepath.Join(dir, fmt.Sprintf("root-%d.qcow2", i))
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-u", "-F", "qcow2", "-b", base, overlay, "4G").CombinedOutput(); err != nil {
			b.Fatalf("qemu-img create: %v %s", err, out)
		}
		os.Chmod(overlay, 0o600)
		b.StartTimer()
		start := time.Now()
		if err := diskfiles.Write(context.Background(), diskimage.Tool{}, diskfiles.Disk{Path: overlay, Format: "qcow2", Backing: base},
			files, filepath.Join(dir, "inject", "vm")); err != nil {
			b.Fatal(err)
		}
		times = append(times, time.Since(start))
	}
	b.StopTimer()
	m := median(times)
	b.ReportMetric(float64(m.Milliseconds()), "write-ms")
	fmt.Printf("FilesFromDataSource: 3 files into the cloud image's ext4 root, no host mount: %s median; runs %v\n", m.Round(time.Millisecond), round(times))
	record(Row{Figure: "VirtletFilesFromDataSource: 3 files into a fresh overlay of the cloud image (ext4, 4 GiB), no host mount",
		Ours: ms(m), Target: "none (the cost of writing without mounting)"})
}
