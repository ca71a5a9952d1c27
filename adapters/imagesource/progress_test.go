package imagesource_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/virtlet/virtlet/adapters/imagesource"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/harness"
)

// A slow download logs its progress (bytes so far, rates, share of the
// total) at most once an interval, a stall included; a download shorter
// than the interval logs none.
func TestSlowDownloadLogsProgress(t *testing.T) {
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "1G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	data, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	const piece = 8 << 10
	// 8 KiB every 10 ms, with a 150 ms stall a third of the way: well under
	// one 256 KiB chunk of the copy, so only counting as bytes arrive sees it.
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		for i := 0; i < len(data); i += piece {
			w.Write(data[i:min(i+piece, len(data))])
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond)
			if i/piece == len(data)/piece/3 {
				time.Sleep(150 * time.Millisecond)
			}
		}
	}))
	defer slow.Close()
	quick := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer quick.Close()

	log, hook := logtest.NewNullLogger()
	s := imagesource.New(log)
	const every = 50 * time.Millisecond
	cfg, _ := json.Marshal(imagesource.Config{ProgressInterval: every.String()})
	if err := s.Configure(context.Background(), ports.PluginConfig{Config: cfg}); err != nil {
		t.Fatal(err)
	}
	fetch := func(url string) time.Duration {
		t.Helper()
		start := time.Now()
		res, err := s.Fetch(context.Background(), ports.FetchRequest{Name: "virtlet.cloud/disk", Location: url, Dest: filepath.Join(harness.SearchableTempDir(t), "dl")})
		if err != nil || res.Size != int64(len(data)) {
			t.Fatalf("fetch %s: %+v %v", url, res, err)
		}
		return time.Since(start)
	}

	took := fetch(slow.URL + "/disk.qcow2")
	var lines []*logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Message == "downloading image" {
			lines = append(lines, e)
		}
	}
	if len(lines) < 3 {
		t.Fatalf("%d progress lines in a %s download with a %s interval", len(lines), took, every)
	}
	if most := int(took/every) + 1; len(lines) > most {
		t.Errorf("%d progress lines in %s: more than one every %s", len(lines), took, every)
	}
	var prev int64
	stalled := false
	for i, e := range lines {
		n, _ := e.Data["bytes"].(int64)
		if e.Level != logrus.InfoLevel || n < prev || n > int64(len(data)) || e.Data["total"] != int64(len(data)) ||
			e.Data["MiBps"] == nil || e.Data["averageMiBps"] == nil || e.Data["image"] != "virtlet.cloud/disk" {
			t.Errorf("progress line %d: %s %v", i, e.Level, e.Data)
		}
		// Each line carries the time it was decided on, a whole interval
		// or more after the one before, however late its goroutine ran.
		if i > 0 && e.Time.Sub(lines[i-1].Time) < every {
			t.Errorf("progress lines %d and %d only %s apart", i-1, i, e.Time.Sub(lines[i-1].Time))
		}
		if e.Data["stalled"] == true {
			stalled = true
		}
		prev = n
	}
	if !stalled {
		t.Errorf("no progress line tells the stall: %v", lines)
	}

	hook.Reset()
	cfg, _ = json.Marshal(imagesource.Config{ProgressInterval: "5s"})
	if err := s.Configure(context.Background(), ports.PluginConfig{Config: cfg}); err != nil {
		t.Fatal(err)
	}
	fetch(quick.URL + "/disk.qcow2")
	for _, e := range hook.AllEntries() {
		if e.Message == "downloading image" {
			t.Errorf("a quick download logged progress: %v", e.Data)
		}
	}
}
