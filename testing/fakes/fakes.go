// Package fakes holds in-memory test doubles of the ports, for unit tests of
// the core. They are never evidence that a feature works with real parts.
package fakes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// Store is an in-memory ports.StateStore.
type Store struct {
	mu   sync.Mutex
	data map[ports.Bucket]map[string][]byte
	// FailApply, when set, fails every Apply.
	FailApply error
	// Applies counts successful Apply calls.
	Applies int
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{data: map[ports.Bucket]map[string][]byte{}}
}

func (s *Store) Get(ctx context.Context, b ports.Bucket, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[b][key]
	if !ok {
		return nil, fmt.Errorf("%s/%s: %w", b, key, ports.ErrNotFound)
	}
	return append([]byte(nil), v...), nil
}

func (s *Store) List(ctx context.Context, b ports.Bucket) (map[string][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]byte, len(s.data[b]))
	for k, v := range s.data[b] {
		out[k] = append([]byte(nil), v...)
	}
	return out, nil
}

func (s *Store) Apply(ctx context.Context, ops ...ports.StoreOp) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.FailApply != nil {
		return s.FailApply
	}
	for _, op := range ops {
		if !knownBucket(op.Bucket) || op.Key == "" {
			return fmt.Errorf("%s/%q: %w", op.Bucket, op.Key, ports.ErrInvalidArgument)
		}
	}
	for _, op := range ops {
		if s.data[op.Bucket] == nil {
			s.data[op.Bucket] = map[string][]byte{}
		}
		if op.Value == nil {
			delete(s.data[op.Bucket], op.Key)
		} else {
			s.data[op.Bucket][op.Key] = append([]byte(nil), op.Value...)
		}
	}
	s.Applies++
	return nil
}

func knownBucket(b ports.Bucket) bool {
	for _, known := range ports.Buckets {
		if b == known {
			return true
		}
	}
	return false
}

// Keys lists the keys of a bucket, sorted.
func (s *Store) Keys(b ports.Bucket) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for k := range s.data[b] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (s *Store) Close() error { return nil }

// FakeVirtualSize is the virtual size the fake image source reports.
const FakeVirtualSize = 32 << 20

// ImageSource "downloads" deterministic bytes derived from the location.
type ImageSource struct {
	mu sync.Mutex
	// Content overrides the bytes served for a location.
	Content map[string][]byte
	// Fail makes Fetch of a location fail with the error.
	Fail map[string]error
	// Fetches counts calls per location.
	Fetches map[string]int
	// Requests holds every request, in order.
	Requests []ports.FetchRequest
	// Delay makes every fetch take this long.
	Delay time.Duration
	// ManifestDigests override the manifest digest reported for a
	// registry location (docker://, oci:): by default the digest the
	// location pins, or the sha256 of the location.
	ManifestDigests map[string]string
}

// NewImageSource returns a source serving every location.
func NewImageSource() *ImageSource {
	return &ImageSource{Content: map[string][]byte{}, Fail: map[string]error{}, Fetches: map[string]int{}, ManifestDigests: map[string]string{}}
}

// PluginInfo describes the fake when served as a plugin.
func (s *ImageSource) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "fake-images", Kind: ports.KindImage, Version: "0.0.0-test", Handles: []string{"https"}}
}

// ContentFor returns the bytes served for location.
func (s *ImageSource) ContentFor(location string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.Content[location]; ok {
		return c
	}
	return []byte("FAKE-DISK-IMAGE " + location + "\n")
}

// DigestFor returns the digest Fetch reports for location.
func (s *ImageSource) DigestFor(location string) string {
	sum := sha256.Sum256(s.ContentFor(location))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (s *ImageSource) Fetch(ctx context.Context, req ports.FetchRequest) (ports.FetchResult, error) {
	s.mu.Lock()
	s.Fetches[req.Location]++
	s.Requests = append(s.Requests, req)
	err := s.Fail[req.Location]
	delay := s.Delay
	manifest, overridden := s.ManifestDigests[req.Location]
	s.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ports.FetchResult{}, ctx.Err()
		}
	}
	if err != nil {
		return ports.FetchResult{}, err
	}
	data := s.ContentFor(req.Location)
	if err := os.WriteFile(req.Dest, data, 0o600); err != nil {
		return ports.FetchResult{}, err
	}
	sum := sha256.Sum256(data)
	res := ports.FetchResult{Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data)), Format: "qcow2", VirtualSize: FakeVirtualSize}
	if strings.HasPrefix(req.Location, "docker://") || strings.HasPrefix(req.Location, "oci:") {
		switch _, pinned, ok := strings.Cut(req.Location, "@"); {
		case overridden:
			res.ManifestDigest = manifest
		case ok:
			res.ManifestDigest = pinned
		default:
			loc := sha256.Sum256([]byte(req.Location))
			res.ManifestDigest = "sha256:" + hex.EncodeToString(loc[:])
		}
	}
	return res, nil
}

// ImageFiles is a ports.ImageFiles over a temporary directory.
type ImageFiles struct {
	Dir string
	mu  sync.Mutex
	n   int
}

// NewImageFiles stores files under dir.
func NewImageFiles(dir string) *ImageFiles { return &ImageFiles{Dir: dir} }

func (f *ImageFiles) NewTemp(ctx context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return filepath.Join(f.Dir, fmt.Sprintf("tmp-%d", f.n)), nil
}

func (f *ImageFiles) Commit(ctx context.Context, tmp, digest string) (string, error) {
	dst := f.path(digest)
	if err := os.Rename(tmp, dst); err != nil {
		return "", err
	}
	return dst, nil
}

func (f *ImageFiles) Discard(ctx context.Context, tmp string) error {
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (f *ImageFiles) path(digest string) string {
	return filepath.Join(f.Dir, strings.TrimPrefix(digest, "sha256:"))
}

func (f *ImageFiles) Path(ctx context.Context, digest string) (string, error) {
	p := f.path(digest)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s: %w", digest, ports.ErrNotFound)
	}
	return p, nil
}

func (f *ImageFiles) Remove(ctx context.Context, digest string) error {
	if err := os.Remove(f.path(digest)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (f *ImageFiles) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(f.Dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "tmp-") {
			out = append(out, "sha256:"+e.Name())
		}
	}
	return out, nil
}

func (f *ImageFiles) Usage(ctx context.Context) (ports.FilesystemUsage, error) {
	u := ports.FilesystemUsage{Timestamp: time.Now(), Mountpoint: f.Dir}
	entries, err := os.ReadDir(f.Dir)
	if err != nil {
		return u, err
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			u.UsedBytes += uint64(info.Size())
			u.InodesUsed++
		}
	}
	return u, nil
}

// Network hands out addresses from 198.18.0.0/24 and records calls.
type Network struct {
	mu        sync.Mutex
	next      int
	Active    map[string]ports.NetworkAttachment
	Teardowns map[string]int
	SetupErr  error
	NotReady  string
}

// NewNetwork returns a ready fake network.
func NewNetwork() *Network {
	return &Network{Active: map[string]ports.NetworkAttachment{}, Teardowns: map[string]int{}}
}

func (n *Network) Ready(ctx context.Context) (ports.NetworkReadiness, error) {
	if n.NotReady != "" {
		return ports.NetworkReadiness{Reason: "FakeNotReady", Message: n.NotReady}, nil
	}
	return ports.NetworkReadiness{Ready: true}, nil
}

func (n *Network) Setup(ctx context.Context, req ports.NetworkRequest) (ports.NetworkAttachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.SetupErr != nil {
		return ports.NetworkAttachment{}, n.SetupErr
	}
	n.next++
	att := ports.NetworkAttachment{NetNSPath: "/var/run/netns/fake-" + req.SandboxID, Interfaces: []ports.NetworkInterface{{
		Name: "eth0", MAC: fmt.Sprintf("52:54:00:00:00:%02x", n.next), MTU: 1500, Bridge: fmt.Sprintf("vlb-fake%d", n.next),
		IPs: []ports.IPConfig{{Address: fmt.Sprintf("198.18.0.%d/24", n.next+1), Gateway: "198.18.0.1"}},
	}}}
	n.Active[req.SandboxID] = att
	return att, nil
}

// AdoptMACs gives the sandbox's interfaces the MACs, in order.
func (n *Network) AdoptMACs(ctx context.Context, req ports.NetworkRequest, macs []string) (ports.NetworkAttachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	att, ok := n.Active[req.SandboxID]
	if !ok {
		return att, fmt.Errorf("fake network: sandbox %s has no network: %w", req.SandboxID, ports.ErrNotFound)
	}
	if len(macs) != len(att.Interfaces) {
		return att, fmt.Errorf("fake network: %d MACs for %d interfaces: %w", len(macs), len(att.Interfaces), ports.ErrInvalidArgument)
	}
	ifaces := append([]ports.NetworkInterface(nil), att.Interfaces...)
	for i := range ifaces {
		ifaces[i].MAC = macs[i]
	}
	att.Interfaces = ifaces
	n.Active[req.SandboxID] = att
	return att, nil
}

func (n *Network) Teardown(ctx context.Context, req ports.NetworkRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.Active, req.SandboxID)
	n.Teardowns[req.SandboxID]++
	return nil
}

var (
	_ ports.StateStore  = (*Store)(nil)
	_ ports.ImageSource = (*ImageSource)(nil)
	_ ports.ImageFiles  = (*ImageFiles)(nil)
	_ ports.Network     = (*Network)(nil)
)
