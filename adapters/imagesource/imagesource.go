// Package imagesource downloads VM disk images: https URLs (TLS verified against
// the system's CAs, the configured ones and a translation's transport), and
// the http and file URLs an operator's translation names; hashed while they
// are written, then checked to be a VM disk (qcow2 or a raw partitioned
// disk). It is served as the image plugin.
package imagesource

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/checkpointarchive"
	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/ports"
)

// Config is the plugin's manifest config.
type Config struct {
	CAFiles          []string `json:"caFiles,omitempty" jsonschema_description:"PEM files of certificate authorities trusted besides the system's"`
	MaxRedirects     int      `json:"maxRedirects,omitempty" jsonschema:"minimum=0" jsonschema_description:"the most redirects a download follows"`
	ProgressInterval string   `json:"progressInterval,omitempty" jsonschema_description:"how often a download logs its progress: a duration such as 5s"`
	// An id no account or VM has.
	ToolUID uint32 `json:"toolUID,omitempty" jsonschema_description:"the user (and group) ID that runs qemu-img check on a downloaded image"`
}

// Source is the image source adapter.
type Source struct {
	log logrus.FieldLogger

	mu       sync.Mutex
	roots    *x509.CertPool // the system's CAs plus the configured ones
	redirect int
	progress time.Duration
	clients  map[string]*http.Client // by transport config
	tool     diskimage.Tool
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
	return ports.PluginInfo{Name: "images", Kind: ports.KindImage, Handles: []string{"https", "http", "file", "docker", "oci"}}
}

// DefaultConfig declares the plugin's config (ports.ConfigDefaulter).
func (s *Source) DefaultConfig() any {
	return Config{MaxRedirects: 10, ProgressInterval: "5s", ToolUID: diskimage.DefaultToolUID}
}

// Configure applies the manifest config.
func (s *Source) Configure(ctx context.Context, pc ports.PluginConfig) error {
	c := s.DefaultConfig().(Config)
	if err := pc.Decode(&c); err != nil {
		return fmt.Errorf("images: %w", err)
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
	redirects := c.MaxRedirects
	if redirects == 0 {
		redirects = 10
	}
	progress := 5 * time.Second
	if c.ProgressInterval != "" {
		if progress, err = time.ParseDuration(c.ProgressInterval); err != nil || progress <= 0 {
			return fmt.Errorf("images config: progressInterval %q: want a duration such as 5s: %w", c.ProgressInterval, ports.ErrInvalidArgument)
		}
	}
	s.mu.Lock()
	s.roots, s.redirect, s.progress, s.clients = roots, redirects, progress, map[string]*http.Client{}
	s.tool = diskimage.Tool{UID: c.ToolUID}
	s.mu.Unlock()
	return nil
}

// client returns the HTTP client of a transport config (cached).
func (s *Source) client(raw []byte) (*http.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[string(raw)]; ok {
		return c, nil
	}
	var tc ports.TransportConfig
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &tc); err != nil {
			return nil, fmt.Errorf("transport config: %v: %w", err, ports.ErrInvalidArgument)
		}
	}
	tlsCfg := &tls.Config{RootCAs: s.roots, MinVersion: tls.VersionTLS12}
	if t := tc.TLS; t != nil {
		tlsCfg.ServerName, tlsCfg.InsecureSkipVerify = t.ServerName, t.Insecure
		extra := false
		roots := s.roots.Clone()
		for i, c := range t.Certificates {
			if c.Key != "" {
				pair, err := tls.X509KeyPair([]byte(c.Cert), []byte(c.Key))
				if err != nil {
					return nil, fmt.Errorf("transport tls.certificates[%d]: %v: %w", i, err, ports.ErrInvalidArgument)
				}
				tlsCfg.Certificates = append(tlsCfg.Certificates, pair)
				continue
			}
			if !roots.AppendCertsFromPEM([]byte(c.Cert)) {
				return nil, fmt.Errorf("transport tls.certificates[%d]: not a PEM certificate: %w", i, ports.ErrInvalidArgument)
			}
			extra = true
		}
		if extra {
			tlsCfg.RootCAs = roots
		}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsCfg
	if tc.Proxy != "" {
		proxy, err := url.Parse(tc.Proxy)
		if err != nil {
			return nil, fmt.Errorf("transport proxy %q: %v: %w", tc.Proxy, err, ports.ErrInvalidArgument)
		}
		transport.Proxy = http.ProxyURL(proxy)
	}
	maxRedirects := s.redirect
	if tc.MaxRedirects != nil {
		maxRedirects = *tc.MaxRedirects
	}
	c := &http.Client{Transport: transport, Timeout: time.Duration(tc.TimeoutMillis) * time.Millisecond,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > maxRedirects {
				return fmt.Errorf("more than %d redirects", maxRedirects)
			}
			if via[0].URL.Scheme == "https" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect from https to %s refused", redact(req.URL))
			}
			return nil
		}}
	s.clients[string(raw)] = c
	return c, nil
}

// redact drops credentials and query strings from a URL for messages.
func redact(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.Fragment = nil, "", ""
	return c.String()
}

// Fetch downloads req.Location to req.Dest: https and http URLs with the
// request's transport settings, file URLs from the node's disk.
func (s *Source) Fetch(ctx context.Context, req ports.FetchRequest) (ports.FetchResult, error) {
	var tc ports.TransportConfig
	if len(req.TransportConfig) > 0 {
		if err := json.Unmarshal(req.TransportConfig, &tc); err != nil {
			return ports.FetchResult{}, fmt.Errorf("transport config: %v: %w", err, ports.ErrInvalidArgument)
		}
	}
	var body io.Reader
	size := int64(-1)
	where := req.Location
	if strings.HasPrefix(req.Location, "docker://") || strings.HasPrefix(req.Location, "oci:") {
		rc, n, manifestDigest, err := s.registryDisk(ctx, req, tc)
		if err != nil {
			return ports.FetchResult{}, err
		}
		defer rc.Close()
		res, err := s.store(ctx, req, where, rc, n)
		if err != nil {
			return ports.FetchResult{}, err
		}
		res.ManifestDigest = manifestDigest
		return res, nil
	}
	u, err := url.Parse(req.Location)
	if err != nil || !(u.Scheme == "https" || u.Scheme == "http" || u.Scheme == "file") {
		return ports.FetchResult{}, &ports.InvalidError{Field: "image location", Value: req.Location,
			Allowed: "an https://, http://, file://, docker:// or oci: location"}
	}
	where = redact(u)
	switch u.Scheme {
	case "file":
		f, err := os.Open(u.Path)
		if errors.Is(err, fs.ErrNotExist) {
			return ports.FetchResult{}, fmt.Errorf("%s: %w", where, ports.ErrNotFound)
		}
		if err != nil {
			return ports.FetchResult{}, fmt.Errorf("open %s: %w", where, err)
		}
		defer f.Close()
		if info, err := f.Stat(); err == nil {
			size = info.Size()
		}
		body = f
	default:
		if u.Host == "" {
			return ports.FetchResult{}, &ports.InvalidError{Field: "image location", Value: req.Location, Reason: "no host"}
		}
		client, err := s.client(req.TransportConfig)
		if err != nil {
			return ports.FetchResult{}, err
		}
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
		body, size = resp.Body, resp.ContentLength
	}
	return s.store(ctx, req, where, body, size)
}

// store writes a download to req.Dest, hashing it in the same pass, and
// checks it: size, pinned digest, and that it is a VM disk.
func (s *Source) store(ctx context.Context, req ports.FetchRequest, where string, body io.Reader, size int64) (ports.FetchResult, error) {
	log := s.log.WithFields(logrus.Fields{"image": req.Name, "url": where})
	s.mu.Lock()
	progressEvery, tool := s.progress, s.tool
	s.mu.Unlock()
	if err := checkLimits(req, where, size); err != nil {
		return ports.FetchResult{}, err
	}
	f, err := os.OpenFile(req.Dest, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return ports.FetchResult{}, fmt.Errorf("create %s: %w", req.Dest, err)
	}
	defer f.Close()
	hash := sha256.New()
	start := time.Now()
	counted := &progress{r: &limited{r: body, req: req}}
	stop := counted.report(log, size, progressEvery)
	n, err := hashingCopy(f, hash, counted)
	stop()
	if err != nil && !(errors.Is(err, io.ErrUnexpectedEOF) && size > n) {
		return ports.FetchResult{}, fmt.Errorf("download %s: %w (after %d bytes)", where, err, n)
	}
	if size >= 0 && n != size {
		return ports.FetchResult{}, fmt.Errorf("download %s: truncated: got %d of %d bytes", where, n, size)
	}
	copied := time.Since(start)
	if err := f.Sync(); err != nil {
		return ports.FetchResult{}, fmt.Errorf("write %s: %w", req.Dest, err)
	}
	digest := "sha256:" + hex.EncodeToString(hash.Sum(nil))
	if req.ExpectedDigest != "" && digest != req.ExpectedDigest {
		return ports.FetchResult{}, fmt.Errorf("download %s: digest mismatch: the data is %s, the name pins %s: %w", where, digest, req.ExpectedDigest, ports.ErrInvalidArgument)
	}
	// A VM checkpoint archive (a pod restoring a VM names one): no disk
	// tool reads it; the daemon reads it as untrusted when it restores.
	if checkpointarchive.Recognise(req.Dest) {
		log.WithFields(logrus.Fields{"bytes": n, "seconds": time.Since(start).Seconds(), "format": ports.ImageFormatCheckpoint, "digest": digest}).
			Info("image downloaded")
		return ports.FetchResult{Digest: digest, Size: n, Format: ports.ImageFormatCheckpoint}, nil
	}
	// This package's own parser first: it refuses what would make a QEMU
	// tool open another file; then qemu-img, unprivileged, for the rest.
	info, err := diskimage.Inspect(req.Dest)
	if err != nil {
		return ports.FetchResult{}, fmt.Errorf("image %s from %s: %v: %w", req.Name, where, err, ports.ErrInvalidArgument)
	}
	checkStart := time.Now()
	if err := tool.Check(ctx, req.Dest, info); err != nil {
		if errors.Is(err, diskimage.ErrNotADisk) {
			return ports.FetchResult{}, fmt.Errorf("image %s from %s: %v: %w", req.Name, where, err, ports.ErrInvalidArgument)
		}
		return ports.FetchResult{}, fmt.Errorf("image %s from %s: %w", req.Name, where, err)
	}
	elapsed := time.Since(start)
	log.WithFields(logrus.Fields{"bytes": n, "seconds": elapsed.Seconds(), "copySeconds": copied.Seconds(), "checkSeconds": time.Since(checkStart).Seconds(), "MiBps": rate(n, elapsed),
		"format": info.Format, "digest": digest}).
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

var _ ports.ImageSource = (*Source)(nil)
