// Package images downloads VM disk images: https URLs (TLS verified against
// the system's CAs plus any configured ones), hashed while they are
// written, then checked to be a VM disk (qcow2 or a raw partitioned disk).
// It is served as the image plugin.
package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/ports"
)

// Config is the plugin's manifest config.
type Config struct {
	// CAFiles are PEM files of CAs trusted besides the system's.
	CAFiles []string `json:"caFiles,omitempty"`
	// MaxRedirects bounds redirects (default 10).
	MaxRedirects int `json:"maxRedirects,omitempty"`
	// ProgressInterval is how often a download logs its progress (default 5s).
	ProgressInterval string `json:"progressInterval,omitempty"`
}

// Source is the image source adapter.
type Source struct {
	log logrus.FieldLogger

	mu       sync.Mutex
	client   *http.Client
	progress time.Duration
}

// New returns a source trusting the system's CAs.
func New(log logrus.FieldLogger) *Source {
	s := &Source{log: log}
	if err := s.apply(Config{}); err != nil {
		panic(err) // the zero config always applies
	}
	return s
}

func (s *Source) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "images", Kind: ports.KindImage, Version: "0.1.0", Handles: []string{"https"}}
}

// Configure applies the manifest config.
func (s *Source) Configure(ctx context.Context, pc ports.PluginConfig) error {
	var c Config
	if len(pc.Config) > 0 {
		dec := json.NewDecoder(bytes.NewReader(pc.Config))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return fmt.Errorf("images config: %v: %w", err, ports.ErrInvalidArgument)
		}
	}
	return s.apply(c)
}

func (s *Source) apply(c Config) error {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	for i, f := range c.CAFiles {
		pem, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("images config: caFiles[%d]: %v: %w", i, err, ports.ErrInvalidArgument)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("images config: caFiles[%d]: %s holds no PEM certificate: %w", i, f, ports.ErrInvalidArgument)
		}
	}
	maxRedirects := c.MaxRedirects
	if maxRedirects == 0 {
		maxRedirects = 10
	}
	progress := 5 * time.Second
	if c.ProgressInterval != "" {
		if progress, err = time.ParseDuration(c.ProgressInterval); err != nil || progress <= 0 {
			return fmt.Errorf("images config: progressInterval %q: want a duration such as 5s: %w", c.ProgressInterval, ports.ErrInvalidArgument)
		}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	client := &http.Client{Transport: transport, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) > maxRedirects {
			return fmt.Errorf("more than %d redirects", maxRedirects)
		}
		if req.URL.Scheme != "https" {
			return fmt.Errorf("redirect to %s: only https is allowed", redact(req.URL))
		}
		return nil
	}}
	s.mu.Lock()
	s.client, s.progress = client, progress
	s.mu.Unlock()
	return nil
}

// redact drops credentials and query strings from a URL for messages.
func redact(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.Fragment = nil, "", ""
	return c.String()
}

// Fetch downloads req.Location to req.Dest.
func (s *Source) Fetch(ctx context.Context, req ports.FetchRequest) (ports.FetchResult, error) {
	u, err := url.Parse(req.Location)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return ports.FetchResult{}, &ports.InvalidError{Field: "image location", Value: req.Location, Allowed: "an https:// URL"}
	}
	where := redact(u)
	s.mu.Lock()
	client, progressEvery := s.client, s.progress
	s.mu.Unlock()

	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, req.Location, nil)
	if err != nil {
		return ports.FetchResult{}, fmt.Errorf("GET %s: %w", where, err)
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return ports.FetchResult{}, fmt.Errorf("GET %s: %w", where, unwrapURLError(err))
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return ports.FetchResult{}, fmt.Errorf("GET %s: %s: %w", where, resp.Status, ports.ErrNotFound)
	case resp.StatusCode >= 500:
		return ports.FetchResult{}, fmt.Errorf("GET %s: %s: %w", where, resp.Status, ports.ErrUnavailable)
	case resp.StatusCode != http.StatusOK:
		return ports.FetchResult{}, fmt.Errorf("GET %s: %s", where, resp.Status)
	}
	f, err := os.OpenFile(req.Dest, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return ports.FetchResult{}, fmt.Errorf("create %s: %w", req.Dest, err)
	}
	defer f.Close()
	log := s.log.WithFields(logrus.Fields{"image": req.Name, "url": where})
	hash := sha256.New()
	pw := &progressWriter{log: log, total: resp.ContentLength, every: progressEvery, start: time.Now(), last: time.Now()}
	n, err := io.Copy(io.MultiWriter(f, hash, pw), resp.Body)
	if err != nil && !(errors.Is(err, io.ErrUnexpectedEOF) && resp.ContentLength > n) {
		return ports.FetchResult{}, fmt.Errorf("download %s: %w (after %d bytes)", where, err, n)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return ports.FetchResult{}, fmt.Errorf("download %s: truncated: got %d of %d bytes", where, n, resp.ContentLength)
	}
	if err := f.Sync(); err != nil {
		return ports.FetchResult{}, fmt.Errorf("write %s: %w", req.Dest, err)
	}
	digest := "sha256:" + hex.EncodeToString(hash.Sum(nil))
	if req.ExpectedDigest != "" && digest != req.ExpectedDigest {
		return ports.FetchResult{}, fmt.Errorf("download %s: digest mismatch: the data is %s, the name pins %s: %w", where, digest, req.ExpectedDigest, ports.ErrInvalidArgument)
	}
	info, err := diskimage.Inspect(req.Dest)
	if err != nil {
		return ports.FetchResult{}, fmt.Errorf("image %s from %s: %v: %w", req.Name, where, err, ports.ErrInvalidArgument)
	}
	elapsed := time.Since(pw.start)
	log.WithFields(logrus.Fields{"bytes": n, "seconds": elapsed.Seconds(), "MiBps": rate(n, elapsed), "format": info.Format, "digest": digest}).
		Info("image downloaded")
	return ports.FetchResult{Digest: digest, Size: n, Format: info.Format, VirtualSize: info.VirtualSize}, nil
}

// unwrapURLError drops net/url's "Get \"url\":" prefix, which repeats the
// (unredacted) URL.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / (1 << 20) / d.Seconds()
}

// progressWriter logs a download's progress at an interval.
type progressWriter struct {
	log         logrus.FieldLogger
	total, done int64
	every       time.Duration
	start, last time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.done += int64(len(b))
	if now := time.Now(); now.Sub(p.last) >= p.every {
		p.last = now
		f := logrus.Fields{"bytes": p.done, "MiBps": rate(p.done, now.Sub(p.start))}
		if p.total > 0 {
			f["total"] = p.total
			f["percent"] = 100 * p.done / p.total
		}
		p.log.WithFields(f).Info("downloading image")
	}
	return len(b), nil
}

var _ ports.ImageSource = (*Source)(nil)
