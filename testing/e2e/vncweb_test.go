package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/virtlet/virtlet/testing/harness"
)

// autologinUserData makes the cloud VM log root in on its first text
// console (tty1), which its VNC display shows, so that what is typed
// into the display runs (vnc --web).
const autologinUserData = `write_files:
- path: /etc/systemd/system/getty@tty1.service.d/autologin.conf
  content: |
    [Service]
    ExecStart=
    ExecStart=-/sbin/agetty --autologin root --noclear %I $TERM
runcmd:
- [systemctl, daemon-reload]
- [systemctl, --no-block, restart, getty@tty1.service]
`

// vncWebInBrowser runs virtletctl vnc --web for the pod and opens its page
// in headless Chromium: the page shows what the VM's display shows (the
// page's canvas against libvirt's own screenshot of the display), a line
// typed into the page runs in the guest (the file it makes is there for
// kubectl exec), and closing the page ends virtletctl.
func vncWebInBrowser(t *testing.T, k *harness.Kube, d *harness.Daemon, ctl, pod string) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("Debian's chromium is not installed (testing/setup.sh installs it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	vnc := exec.CommandContext(ctx, ctl, "--kubeconfig", k.Kubeconfig, "vnc", pod, "--web")
	stdout, _ := vnc.StdoutPipe()
	vnc.Stderr = os.Stderr
	if err := vnc.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- vnc.Wait() }()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	url := regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+/[0-9a-f]{32}/vnc_lite\.html\?\S+`).FindString(line)
	if url == "" {
		t.Fatalf("virtletctl vnc --web says %q", line)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1024, 768))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	browser, closeBrowser := chromedp.NewContext(actx)
	defer closeBrowser()
	// The page's errors, failed loads and console, for a page that does
	// not connect.
	var pageMu sync.Mutex
	var pageLog []string
	note := func(s string) { pageMu.Lock(); pageLog = append(pageLog, s); pageMu.Unlock() }
	if err := chromedp.Listen(browser, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			desc := d.Text
			if d.Exception != nil {
				desc += " " + d.Exception.Description
			}
			note(fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber, desc))
		case *runtime.EventConsoleAPICalled:
			var args []string
			for _, a := range ev.Args {
				args = append(args, string(a.Value))
			}
			note(fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
		case *network.EventLoadingFailed:
			note(fmt.Sprintf("load failed: %s %s", ev.Type, ev.ErrorText))
		}
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := chromedp.Do(browser, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	_, err = chromedp.Run(browser, chromedp.Poll[bool](`document.getElementById('status').textContent.startsWith('Connected')`,
		chromedp.WithPollingTimeout(2*time.Minute)))
	status, _ := chromedp.Run(browser, chromedp.Text(chromedp.CSS("#status")))
	if err != nil {
		pageMu.Lock()
		defer pageMu.Unlock()
		t.Fatalf("the page did not connect to the display in %s: %v (status %q); the page's log:\n%s",
			time.Since(start).Round(time.Second), err, status, strings.Join(pageLog, "\n"))
	}
	t.Logf("noVNC: %s", status)

	// The page shows the display: its canvas is libvirt's screenshot of
	// it, pixel for pixel but for a blinking cursor.
	domain := vmDomain(t, k, d, pod)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		page := canvasImage(t, browser)
		screen := displayImage(t, domain)
		same, total := samePixels(page, screen)
		if total > 0 && float64(same) >= 0.99*float64(total) {
			t.Logf("the page's canvas is the display's screenshot: %d×%d, %d of %d pixels the same", page.Bounds().Dx(), page.Bounds().Dy(), same, total)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page's canvas (%v) is not the display (%v): %d of %d pixels the same", page.Bounds(), screen.Bounds(), same, total)
		}
		time.Sleep(2 * time.Second)
	}

	// What is typed into the page reaches the guest: root's shell on tty1
	// runs it (keys without Shift: the headless browser's key events
	// carry no modifiers), and the file it makes is there for the guest
	// agent to find.
	b := make([]byte, 4)
	rand.Read(b)
	marker := "/root/vnctyped" + hex.EncodeToString(b)
	made := func() bool {
		_, err := k.Kubectl("exec", pod, "--", "test", "-e", marker)
		return err == nil
	}
	deadline = time.Now().Add(3 * time.Minute)
	for !made() {
		if time.Now().After(deadline) {
			shot := filepath.Join(os.TempDir(), "vnc-web-"+filepath.Base(marker)+".png")
			var buf bytes.Buffer
			png.Encode(&buf, canvasImage(t, browser))
			os.WriteFile(shot, buf.Bytes(), 0o644)
			t.Fatalf("what was typed into the page did not run in the guest (no %s; the page: %s)", marker, shot)
		}
		if err := chromedp.Do(browser, chromedp.Click(chromedp.CSS("#screen canvas")), chromedp.KeyEvent("touch "+marker+"\r")); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 10 && !made(); i++ {
			time.Sleep(2 * time.Second)
		}
	}
	t.Logf("typed into the page: touch %s, which ran in the guest", marker)

	// Closing the page ends virtletctl.
	closeBrowser()
	acancel()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("virtletctl vnc --web after the page closed: %v", err)
		}
	case <-time.After(time.Minute):
		t.Errorf("virtletctl vnc --web still runs a minute after its page closed")
	}
}

// canvasImage is noVNC's canvas, as the page draws it.
func canvasImage(t *testing.T, browser context.Context) image.Image {
	t.Helper()
	dataURL, err := chromedp.Run(browser, chromedp.Evaluate[string](`document.querySelector('#screen canvas').toDataURL('image/png')`))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(dataURL, "data:image/png;base64,"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the canvas: %v", err)
	}
	return img
}

// displayImage is libvirt's screenshot of the domain's display (QEMU's
// screendump).
func displayImage(t *testing.T, domain string) image.Image {
	t.Helper()
	file := filepath.Join(t.TempDir(), "screen.ppm")
	if out, err := harness.Virsh("screenshot", domain, file); err != nil {
		t.Fatalf("virsh screenshot: %v %s", err, out)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// libvirt hands over what QEMU wrote: a PPM, or a PNG where QEMU
	// can write one.
	var img image.Image
	if bytes.HasPrefix(data, []byte("\x89PNG")) {
		img, err = png.Decode(bytes.NewReader(data))
	} else {
		img, err = decodePPM(data)
	}
	if err != nil {
		t.Fatalf("the screenshot: %v", err)
	}
	return img
}

// decodePPM decodes a binary PPM (P6, 8 bits per sample).
func decodePPM(data []byte) (image.Image, error) {
	var fields []int
	rest := data
	if !bytes.HasPrefix(rest, []byte("P6")) {
		return nil, fmt.Errorf("not a binary PPM")
	}
	rest = rest[2:]
	for len(fields) < 3 {
		rest = bytes.TrimLeft(rest, " \t\r\n")
		if bytes.HasPrefix(rest, []byte("#")) {
			if i := bytes.IndexByte(rest, '\n'); i >= 0 {
				rest = rest[i+1:]
				continue
			}
			return nil, fmt.Errorf("truncated header")
		}
		end := bytes.IndexAny(rest, " \t\r\n")
		if end < 0 {
			return nil, fmt.Errorf("truncated header")
		}
		n, err := strconv.Atoi(string(rest[:end]))
		if err != nil {
			return nil, fmt.Errorf("header: %v", err)
		}
		fields = append(fields, n)
		rest = rest[end:]
	}
	w, h, maxval := fields[0], fields[1], fields[2]
	rest = rest[1:] // the one whitespace byte before the samples
	if maxval != 255 || len(rest) < w*h*3 {
		return nil, fmt.Errorf("%dx%d, max %d, %d bytes of samples", w, h, maxval, len(rest))
	}
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := 0; i < w*h; i++ {
		copy(img.Pix[i*4:], rest[i*3:i*3+3])
		img.Pix[i*4+3] = 255
	}
	return img, nil
}

// samePixels counts the pixels of the same colour in two images of one
// size (total 0 when the sizes differ).
func samePixels(a, b image.Image) (same, total int) {
	if a.Bounds().Size() != b.Bounds().Size() {
		return 0, 0
	}
	ao, bo := a.Bounds().Min, b.Bounds().Min
	for y := 0; y < a.Bounds().Dy(); y++ {
		for x := 0; x < a.Bounds().Dx(); x++ {
			ar, ag, ab, _ := a.At(ao.X+x, ao.Y+y).RGBA()
			br, bg, bb, _ := b.At(bo.X+x, bo.Y+y).RGBA()
			if ar>>8 == br>>8 && ag>>8 == bg>>8 && ab>>8 == bb>>8 {
				same++
			}
			total++
		}
	}
	return same, total
}
