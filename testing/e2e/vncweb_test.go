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
	"image/color"
	"image/png"
	"math"
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
// in headless Chromium: the page shows the guest's text console (OCR reads
// in the page's screenshot a random marker the guest wrote on its console,
// and the page's canvas is libvirt's own screenshot of the display), a
// line typed into the page runs in the guest (the file it makes is there
// for kubectl exec), and closing the page ends virtletctl.
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
		// A window larger than the display (OVMF's is 1280×800), which
		// the page scales to fit: the console's text is larger than the
		// guest draws it for OCR to read, not smaller.
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1600, 1000))
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

	// The page shows the guest's text console: the guest writes a random
	// marker on its foreground console, the display (libvirt's screenshot
	// of it) is the page's canvas pixel for pixel but for a blinking
	// cursor, and OCR reads the marker in the page's screenshot (a new
	// marker each try).
	domain := vmDomain(t, k, d, pod)
	deadline := time.Now().Add(2 * time.Minute)
	for try := 1; ; try++ {
		marker := consoleMarker()
		write := fmt.Sprintf(`{ printf '\033[H\033[2J'; for i in 1 2 3 4; do echo "%[1]s %[1]s %[1]s"; done; } >/dev/tty0`, marker)
		if out, err := k.Kubectl("exec", pod, "--", "sh", "-c", write); err != nil {
			t.Fatalf("the guest did not write its console: %v %s", err, out)
		}
		time.Sleep(2 * time.Second)
		page := canvasImage(t, browser)
		screen := displayImage(t, domain)
		same, total := samePixels(page, screen)
		shot := pageScreenshot(t, browser)
		read := ocrText(t, shot)
		if total > 0 && float64(same) >= 0.99*float64(total) && strings.Contains(read, marker) {
			t.Logf("the page's canvas is the display's screenshot: %d×%d, %d of %d pixels the same", page.Bounds().Dx(), page.Bounds().Dy(), same, total)
			t.Logf("the guest wrote %s 12 times on its console (try %d); OCR of the page's screenshot (%d×%d) reads it %d times:\n%s",
				marker, try, shot.Bounds().Dx(), shot.Bounds().Dy(), strings.Count(read, marker), strings.TrimSpace(read))
			break
		}
		if time.Now().After(deadline) {
			file := filepath.Join(os.TempDir(), "vnc-web-"+marker+".png")
			var buf bytes.Buffer
			png.Encode(&buf, shot)
			os.WriteFile(file, buf.Bytes(), 0o644)
			t.Fatalf("the page does not show the guest's console after %d tries: its canvas (%v) against the display (%v): %d of %d pixels the same; the guest wrote %s, OCR of the page's screenshot (%s) reads:\n%s",
				try, page.Bounds(), screen.Bounds(), same, total, marker, file, read)
		}
	}

	// What is typed into the page reaches the guest: root's shell on tty1
	// runs it (keys without Shift: the headless browser's key events
	// carry no modifiers), and the file it makes is there for the guest
	// agent to find.
	b := make([]byte, 4)
	rand.Read(b)
	typed := "/root/vnctyped" + hex.EncodeToString(b)
	made := func() bool {
		_, err := k.Kubectl("exec", pod, "--", "test", "-e", typed)
		return err == nil
	}
	deadline = time.Now().Add(3 * time.Minute)
	for !made() {
		if time.Now().After(deadline) {
			shot := filepath.Join(os.TempDir(), "vnc-web-"+filepath.Base(typed)+".png")
			var buf bytes.Buffer
			png.Encode(&buf, canvasImage(t, browser))
			os.WriteFile(shot, buf.Bytes(), 0o644)
			t.Fatalf("what was typed into the page did not run in the guest (no %s; the page: %s)", typed, shot)
		}
		if err := chromedp.Do(browser, chromedp.Click(chromedp.CSS("#screen canvas")), chromedp.KeyEvent("touch "+typed+"\r")); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 10 && !made(); i++ {
			time.Sleep(2 * time.Second)
		}
	}
	t.Logf("typed into the page: touch %s, which ran in the guest", typed)

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

// pageScreenshot is the browser's screenshot of noVNC's canvas, as the
// page shows it (scaled to the window).
func pageScreenshot(t *testing.T, browser context.Context) image.Image {
	t.Helper()
	raw, err := chromedp.Run(browser, chromedp.Screenshot(chromedp.CSS("#screen canvas")))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the page's screenshot: %v", err)
	}
	return img
}

// consoleMarker is a random marker for the guest to write on its text
// console: twelve capital letters from those tesseract tells apart in the
// console's font (not B, G, I, O, Q, S, U, V, W, Y, Z, nor digits, which it
// reads as one another).
func consoleMarker() string {
	const letters = "ACDEFHJKLMNPRTX"
	b := make([]byte, 12)
	rand.Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	return string(b)
}

// ocrText is the text tesseract (Debian's tesseract-ocr) reads in a
// picture of a text console: light text on a dark ground, which it reads
// best dark on light and three times the size, smoothly scaled.
func ocrText(t *testing.T, img image.Image) string {
	t.Helper()
	const scale = 3
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	inv := make([]float64, w*h)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			inv[y*w+x] = 255 - float64(color.GrayModel.Convert(img.At(b.Min.X+x, b.Min.Y+y)).(color.Gray).Y)
		}
	}
	at := func(x, y int) float64 { return inv[min(y, h-1)*w+min(x, w-1)] }
	big := image.NewGray(image.Rect(0, 0, w*scale, h*scale))
	for y := 0; y < h*scale; y++ {
		fy := max((float64(y)+0.5)/scale-0.5, 0)
		y0, ty := int(fy), fy-math.Floor(fy)
		for x := 0; x < w*scale; x++ {
			fx := max((float64(x)+0.5)/scale-0.5, 0)
			x0, tx := int(fx), fx-math.Floor(fx)
			v := (at(x0, y0)*(1-tx)+at(x0+1, y0)*tx)*(1-ty) + (at(x0, y0+1)*(1-tx)+at(x0+1, y0+1)*tx)*ty
			big.Pix[y*big.Stride+x] = uint8(v + 0.5)
		}
	}
	file := filepath.Join(t.TempDir(), "ocr.png")
	var buf bytes.Buffer
	png.Encode(&buf, big)
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("tesseract", file, "stdout", "--psm", "6").Output()
	if err != nil {
		t.Fatalf("tesseract (Debian's tesseract-ocr; testing/setup.sh installs it): %v", err)
	}
	return string(out)
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
