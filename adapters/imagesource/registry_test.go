package imagesource_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containers/image/v5/types"

	"github.com/virtlet/virtlet/adapters/imagesource"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/containerdisk"
	"github.com/virtlet/virtlet/testing/harness"
)

// registryWith runs a plain-HTTP registry on loopback holding
// disks/tiny:v1, a containerDisk of a fresh qcow2 image (whose bytes it
// returns), and each of more (repository:tag → the image's files).
func registryWith(t *testing.T, more map[string]containerdisk.Files) (*containerdisk.Registry, []byte) {
	t.Helper()
	path, disk := qcow2(t)
	reg, err := containerdisk.StartRegistry()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	files, _ := containerdisk.DiskFiles(path, "tiny.qcow2")
	more["disks/tiny:v1"] = files
	for ref, files := range more {
		if err := containerdisk.Push(context.Background(), "docker://"+reg.Addr+"/"+ref, files, true); err != nil {
			t.Fatal(err)
		}
	}
	return reg, disk
}

func TestRegistryAndOCILayoutPulls(t *testing.T) {
	ctx := context.Background()
	reg, disk := registryWith(t, map[string]containerdisk.Files{"disks/nodisk:v1": {"etc/hello": []byte("hi")}})
	layoutDir := t.TempDir()
	if err := containerdisk.Push(ctx, "oci:"+layoutDir+":v2", containerdisk.Files{"disk/other.img": raw()}, false); err != nil {
		t.Fatal(err)
	}
	insecure, _ := json.Marshal(ports.TransportConfig{TLS: &ports.TransportTLS{Insecure: true}})
	s := imagesource.New(quiet())
	for _, tc := range []struct {
		name, location string
		transport      []byte
		want           string // digest, or an error fragment
		kind           error
	}{
		{"registry", "docker://" + reg.Addr + "/disks/tiny:v1", insecure, containerdisk.Sum(disk), nil},
		{"oci layout", "oci:" + layoutDir + ":v2", nil, containerdisk.Sum(raw()), nil},
		{"no disk layer", "docker://" + reg.Addr + "/disks/nodisk:v1", insecure, "has no VM disk in its 1 layer(s)", ports.ErrInvalidArgument},
		{"unknown tag", "docker://" + reg.Addr + "/disks/tiny:v9", insecure, "v9", ports.ErrNotFound},
		{"plain http registry without the insecure transport", "docker://" + reg.Addr + "/disks/tiny:v1", nil, "http", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(harness.SearchableTempDir(t), "d")
			res, err := s.Fetch(ctx, ports.FetchRequest{Name: "virtlet.cloud/x", Location: tc.location, TransportConfig: tc.transport, Dest: dest})
			if strings.HasPrefix(tc.want, "sha256:") {
				if err != nil || res.Digest != tc.want {
					t.Fatalf("%+v %v, want digest %s", res, err, tc.want)
				}
				if got, _ := os.ReadFile(dest); containerdisk.Sum(got) != tc.want {
					t.Fatal("the stored data is not the disk file")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.kind != nil && !errors.Is(err, tc.kind)) {
				t.Fatalf("err %v, want %v containing %q", err, tc.kind, tc.want)
			}
		})
	}
}

// raw is a small raw disk (a partition table signature).
func raw() []byte {
	b := make([]byte, 1<<16)
	b[510], b[511] = 0x55, 0xaa
	return b
}

// A registry behind TLS (trusted through the translation's transport) and
// htpasswd: the pod's image pull secret, as kubelet passes it in
// PullImageRequest.Auth, is what gets the disk.
func TestPullSecretsAndRegistryTLS(t *testing.T) {
	reg, err := containerdisk.StartRegistry(containerdisk.RegistryOptions{TLS: true, User: "puller", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ca, _ := os.ReadFile(reg.CAFile)
	certDir := t.TempDir()
	os.WriteFile(filepath.Join(certDir, "ca.crt"), ca, 0o644)
	ctx := context.Background()
	err = containerdisk.PushAs(ctx, "docker://"+reg.Addr+"/private/disk:v1", containerdisk.Files{"disk/x.img": raw()},
		&types.SystemContext{DockerCertPath: certDir, DockerAuthConfig: &types.DockerAuthConfig{Username: "puller", Password: "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	trust, _ := json.Marshal(ports.TransportConfig{TLS: &ports.TransportTLS{Certificates: []ports.TLSCertificate{{Cert: string(ca)}}}})
	s := imagesource.New(quiet())
	fetch := func(auth *ports.RegistryAuth, transport []byte) error {
		_, err := s.Fetch(ctx, ports.FetchRequest{Name: "x", Location: "docker://" + reg.Addr + "/private/disk:v1",
			TransportConfig: transport, Auth: auth, Dest: filepath.Join(harness.SearchableTempDir(t), "d")})
		return err
	}
	if err := fetch(nil, trust); !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pull secret") {
		t.Fatalf("without a pull secret: %v", err)
	}
	if err := fetch(&ports.RegistryAuth{Username: "puller", Password: "wrong"}, trust); err == nil {
		t.Fatal("a wrong password pulled")
	}
	if err := fetch(&ports.RegistryAuth{Username: "puller", Password: "s3cret"}, trust); err != nil {
		t.Fatalf("with the pull secret: %v", err)
	}
	// kubelet may pass the secret as a base64 user:password "auth" field.
	if err := fetch(&ports.RegistryAuth{Auth: base64.StdEncoding.EncodeToString([]byte("puller:s3cret"))}, trust); err != nil {
		t.Fatalf("with an auth field: %v", err)
	}
	if err := fetch(&ports.RegistryAuth{Username: "puller", Password: "s3cret"}, nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without trusting the registry's CA: %v", err)
	}
}
