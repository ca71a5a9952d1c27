package containerdisk

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
)

// Liar is a plain-HTTP proxy in front of a registry that changes what the
// registry sends, as a compromised registry or a man in the middle would.
// The first element of a repository's path names the lie:
// /v2/<lie>/<repo>/... is the registry's /v2/<repo>/..., with
//
//	honest    nothing changed
//	flipped   each layer (a gzip blob) with its 10th byte changed: gzip's
//	          OS byte, which gzip itself does not check
//	garbled   each layer with its middle byte changed: the decompressor
//	          fails before the digest is known
//	longer    each layer one byte longer
//	shorter   each layer one byte shorter
//	swapped   each manifest asked for by digest replaced by Swap, another
//	          image's
//
// and in every lie, the tag "multi" is an honest OCI index whose
// linux/amd64 entry is the repository's manifest of tag "v1".
type Liar struct {
	Addr string // 127.0.0.1:port
	// Swap is the manifest the swapped lie sends (an OCI image manifest).
	Swap []byte
	srv  *httptest.Server
	up   string
}

// NewLiar starts a liar in front of the registry at upstream (host:port,
// plain HTTP).
func NewLiar(upstream string) *Liar {
	l := &Liar{up: upstream}
	l.srv = httptest.NewServer(http.HandlerFunc(l.serve))
	l.Addr = strings.TrimPrefix(l.srv.URL, "http://")
	return l
}

// Close stops the proxy.
func (l *Liar) Close() { l.srv.Close() }

const ociManifest = "application/vnd.oci.image.manifest.v1+json"

// Manifest reads repo's manifest of reference (a tag or a digest) from the
// registry, as an OCI image manifest.
func (l *Liar) Manifest(repo, reference string) ([]byte, error) {
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://%s/v2/%s/manifests/%s", l.up, repo, reference), nil)
	req.Header.Set("Accept", ociManifest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("manifest %s:%s: %s", repo, reference, resp.Status)
	}
	return body, err
}

// Index is the OCI index the tag "multi" of repo is: one linux/amd64
// entry, repo's manifest of tag "v1".
func (l *Liar) Index(repo string) ([]byte, error) {
	m, err := l.Manifest(repo, "v1")
	if err != nil {
		return nil, err
	}
	return []byte(fmt.Sprintf(`{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [`+
		`{"mediaType": %q, "digest": %q, "size": %d, "platform": {"architecture": "amd64", "os": "linux"}}]}`, ociManifest, Sum(m), len(m))), nil
}

func (l *Liar) serve(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v2/")
	if !ok || rest == "" {
		l.forward(w, r, r.URL.Path, "")
		return
	}
	lie, rest, _ := strings.Cut(rest, "/")
	repo, ref, isManifest := strings.Cut(rest, "/manifests/")
	switch {
	case isManifest && ref == "multi":
		index, err := l.Index(repo)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		send(w, index, "application/vnd.oci.image.index.v1+json")
	case isManifest && lie == "swapped" && strings.HasPrefix(ref, "sha256:"):
		send(w, l.Swap, ociManifest)
	default:
		l.forward(w, r, "/v2/"+rest, lie)
	}
}

// send serves a manifest with its digest.
func send(w http.ResponseWriter, body []byte, mediaType string) {
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", Sum(body))
	w.Write(body)
}

// forward passes the request to the registry as path, and its answer back
// with a layer changed as lie says.
func (l *Liar) forward(w http.ResponseWriter, r *http.Request, path, lie string) {
	up, err := http.NewRequest(r.Method, "http://"+l.up+path, nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	up.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(up)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if strings.Contains(path, "/blobs/") && r.Method == "GET" && bytes.HasPrefix(body, []byte{0x1f, 0x8b}) && len(body) > 10 {
		switch lie {
		case "flipped":
			body[9] ^= 0xff
		case "garbled":
			body[len(body)/2] ^= 0xff
		case "longer":
			body = append(body, 0)
		case "shorter":
			body = body[:len(body)-1]
		}
	}
	for k, v := range resp.Header {
		if k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(resp.StatusCode)
	w.Write(body)
}
