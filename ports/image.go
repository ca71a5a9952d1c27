package ports

import (
	"context"
	"regexp"
	"time"
)

// ImageSource downloads VM disk images from one kind of location (an URL
// scheme or a registry transport).
type ImageSource interface {
	// Fetch writes the image at req.Location to req.Dest, hashing it while
	// it writes, and reports its sha256 digest and size. A partial file is
	// left for the caller to discard on error.
	Fetch(ctx context.Context, req FetchRequest) (FetchResult, error)
}

// FetchRequest asks an ImageSource for one image.
type FetchRequest struct {
	Name     string // the image name the user gave, for messages
	Location string // resolved location, e.g. https://host/path or docker://reg/repo:tag
	// Transport is the name of a transport configuration, if any.
	Transport string
	// TransportConfig is that configuration, as JSON (may be empty).
	TransportConfig []byte
	Auth            *RegistryAuth
	Dest            string // file to create and write
	// ExpectedDigest, when set ("sha256:<hex>"), must match the data.
	ExpectedDigest string
	// MaxBytes, when not 0, is the most a download may write: a larger
	// image is refused (ErrInvalidArgument) as soon as that is known.
	MaxBytes int64
	// KeepFreeBytes, when not 0, is the space Dest's file system must keep
	// free: a download that would take it fails (ErrUnavailable) before it
	// starts when its size is known, else as it gets there.
	KeepFreeBytes int64
}

// RegistryAuth carries image pull credentials. Never logged.
type RegistryAuth struct {
	Username      string
	Password      string
	Auth          string
	ServerAddress string
	IdentityToken string
	RegistryToken string
}

// FetchResult describes a fetched image.
type FetchResult struct {
	Digest      string // "sha256:<hex>" of the bytes written to Dest
	Size        int64
	Format      string // "qcow2" or "raw"
	VirtualSize int64  // bytes the guest sees
	// ManifestDigest is, for a registry image, the digest of the manifest
	// the name resolved to (checked against the name's digest when it
	// has one): the image's repo digest. Empty for other sources.
	ManifestDigest string
}

// ImageFiles stores image data content-addressed on the local disk.
type ImageFiles interface {
	// NewTemp reserves a path for a download in progress.
	NewTemp(ctx context.Context) (string, error)
	// Commit moves a finished download to its content-addressed place and
	// returns the final path. Committing a digest that is stored already
	// discards the temporary file and succeeds.
	Commit(ctx context.Context, tempPath, digest string) (string, error)
	// Discard removes a temporary download.
	Discard(ctx context.Context, tempPath string) error
	// Path returns the stored file of digest, ErrNotFound if absent.
	Path(ctx context.Context, digest string) (string, error)
	// Remove deletes the stored file of digest; absent files are not an error.
	Remove(ctx context.Context, digest string) error
	// List returns the digests stored.
	List(ctx context.Context) ([]string, error)
	// Usage reports the storage used.
	Usage(ctx context.Context) (FilesystemUsage, error)
}

// FilesystemUsage is the space used by a store.
type FilesystemUsage struct {
	Timestamp  time.Time
	Mountpoint string // the store's directory
	UsedBytes  uint64
	InodesUsed uint64
}

// ImageTranslations reads the operator's image name translation configs.
type ImageTranslations interface {
	// Translations returns the current configs (reloaded when they change)
	// and the problems of files that could not be read; a bad file does not
	// stop the others from loading.
	Translations(ctx context.Context) ([]TranslationConfig, []error)
}

// TranslationConfig is one translation file, in Virtlet's format.
type TranslationConfig struct {
	Source string `json:"-"` // the file it came from
	// Prefix, when set, makes the config apply to names
	// virtlet.cloud/<prefix>/<name> only, matched without the prefix.
	Prefix       string                     `json:"prefix,omitempty"`
	Translations []Translation              `json:"translations,omitempty"`
	Transports   map[string]TransportConfig `json:"transports,omitempty"`
}

// Translation maps an image name, or names matching a regexp, to a URL.
type Translation struct {
	Name      string `json:"name,omitempty"`
	Regexp    string `json:"regexp,omitempty"`
	URL       string `json:"url"`
	Transport string `json:"transport,omitempty"`
}

// Pattern compiles the translation's regexp as it applies, as Virtlet
// applied it: a match anywhere in the name (the part after the config's
// prefix) translates it; ^ and $ anchor it to the whole name.
func (t Translation) Pattern() (*regexp.Regexp, error) {
	return regexp.Compile(t.Regexp)
}

// TransportConfig says how to reach a server.
type TransportConfig struct {
	TimeoutMillis int64         `json:"timeout,omitempty"` // milliseconds, as in Virtlet
	MaxRedirects  *int          `json:"maxRedirects,omitempty"`
	Proxy         string        `json:"proxy,omitempty"`
	TLS           *TransportTLS `json:"tls,omitempty"`
}

// TransportTLS configures TLS to a server.
type TransportTLS struct {
	Certificates []TLSCertificate `json:"certificates,omitempty"`
	ServerName   string           `json:"serverName,omitempty"`
	Insecure     bool             `json:"insecure,omitempty"`
}

// TLSCertificate is a PEM certificate: a CA to trust, or with Key a client
// certificate to present.
type TLSCertificate struct {
	Cert string `json:"cert"`
	Key  string `json:"key,omitempty"`
}
