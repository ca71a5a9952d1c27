package fakes

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/virtlet/virtlet/ports"
)

// Volumes is an in-memory ports.Volumes for one or more types. Disks are
// files under /fake/volumes, shares directories under /fake/shares; a type
// listed in Keys gets an RBD-like network disk carrying that secret.
type Volumes struct {
	mu       sync.Mutex
	prepared map[string]ports.VolumeRequest // by VMID/Name
	kept     map[string]string              // secrets Validate kept, by PodUID/Name
	// Fail makes the named method return the error.
	Fail map[string]error
	// FailVolume makes Prepare of the named volume fail.
	FailVolume map[string]error
	// Format is the file system Prepare asks the guest to make on disks.
	Format string
	// Releases counts Release calls; Prepares successful Prepare calls.
	Releases, Prepares int
	// Roots are the types RootfsTypes reports ("ceph"): their flexvolumes
	// may hold a persistent root.
	Roots []string
}

// NewVolumes returns an empty fake.
func NewVolumes() *Volumes {
	return &Volumes{prepared: map[string]ports.VolumeRequest{}, kept: map[string]string{},
		Fail: map[string]error{}, FailVolume: map[string]error{}, Roots: []string{"ceph"}}
}

// RootfsTypes reports Roots.
func (v *Volumes) RootfsTypes(ctx context.Context) ([]string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.Fail["RootfsTypes"]; err != nil {
		return nil, err
	}
	return append([]string(nil), v.Roots...), nil
}

// Validate requires a size option for type "sized", keeps option
// "secret" itself, and refuses shares and block devices.
func (v *Volumes) Validate(ctx context.Context, req ports.VolumeRequest) (map[string]string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.Fail["Validate"]; err != nil {
		return nil, err
	}
	if req.Type == ports.VolumeShare || req.Type == ports.VolumeBlock {
		return nil, &ports.InvalidError{Field: "volume type", Value: req.Type}
	}
	if req.Type == "sized" && req.Options["size"] == "" {
		return nil, &ports.InvalidError{Field: "sized volume " + req.Name + " option size", Reason: "missing"}
	}
	out := map[string]string{}
	for k, val := range req.Options {
		if k == "secret" {
			v.kept[req.PodUID+"/"+req.Name] = val
			continue
		}
		out[k] = val
	}
	return out, nil
}

// Forget drops a kept secret.
func (v *Volumes) Forget(ctx context.Context, req ports.VolumeRequest) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.kept, req.PodUID+"/"+req.Name)
	return v.Fail["Forget"]
}

// Kept returns the secret Validate kept for a pod's volume.
func (v *Volumes) Kept(podUID, name string) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.kept[podUID+"/"+name]
	return s, ok
}

func (v *Volumes) Prepare(ctx context.Context, req ports.VolumeRequest) (ports.VolumeAttachment, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.Fail["Prepare"]; err != nil {
		return ports.VolumeAttachment{}, err
	}
	if err := v.FailVolume[req.Name]; err != nil {
		return ports.VolumeAttachment{}, err
	}
	if req.Type == "sized" && req.Options["size"] == "" {
		return ports.VolumeAttachment{}, &ports.InvalidError{Field: "sized volume " + req.Name + " option size", Reason: "missing"}
	}
	v.prepared[req.VMID+"/"+req.Name] = req
	v.Prepares++
	key := req.VMID + "-" + req.Name
	switch {
	case req.Type == ports.VolumeShare:
		return ports.VolumeAttachment{Filesystems: []ports.Filesystem{{Source: "/fake/shares/" + key, AccessMode: "squash"}}}, nil
	case req.Type == ports.VolumeBlock:
		d := ports.Disk{Name: "vol-" + req.Name, Source: ports.DiskSource{Type: ports.SourceBlock, Path: "/dev/fake-" + req.Name, Format: "raw"}}
		if req.Rootfs != nil {
			d.Source.Offset, d.Source.Size = 1<<20, req.Rootfs.ImageVirtualSize
		}
		return ports.VolumeAttachment{Disks: []ports.Disk{d}}, nil
	}
	if secret, ok := v.kept[req.PodUID+"/"+req.Name]; ok {
		d := ports.Disk{Name: "vol-" + req.Name, Source: ports.DiskSource{
			Type: ports.SourceNetwork, Protocol: "rbd", Name: "pool/" + req.Name, Format: "raw",
			Hosts: []ports.NetworkHost{{Name: "127.0.0.1", Port: "6789"}},
			Auth:  &ports.DiskAuth{Username: "admin", SecretType: "ceph", Secret: []byte(secret)}}}
		if req.Rootfs != nil {
			d.Source.Offset, d.Source.Size = 1<<20, req.Rootfs.ImageVirtualSize
		}
		return ports.VolumeAttachment{Disks: []ports.Disk{d}}, nil
	}
	return ports.VolumeAttachment{Disks: []ports.Disk{{Name: "vol-" + req.Name,
		Source: ports.DiskSource{Type: ports.SourceFile, Path: "/fake/volumes/" + key + ".qcow2", Format: "qcow2"}}}, Format: v.Format}, nil
}

func (v *Volumes) Release(ctx context.Context, req ports.VolumeRequest) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.Releases++
	if err := v.Fail["Release"]; err != nil {
		return err
	}
	delete(v.prepared, req.VMID+"/"+req.Name)
	return nil
}

// SetFail makes the named method return err (nil: succeed again), safe
// while the runtime calls the fake from its own goroutines.
func (v *Volumes) SetFail(method string, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err == nil {
		delete(v.Fail, method)
		return
	}
	v.Fail[method] = err
}

// Prepared lists the prepared volumes as "VMID/name type".
func (v *Volumes) Prepared() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for k, r := range v.prepared {
		out = append(out, fmt.Sprintf("%s %s", k, r.Type))
	}
	sort.Strings(out)
	return out
}

// Request returns the request a prepared volume was prepared with.
func (v *Volumes) Request(vmID, name string) (ports.VolumeRequest, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	r, ok := v.prepared[vmID+"/"+name]
	return r, ok
}

// VolumeDirs is a ports.VolumeDirs over flexvolume options by directory.
type VolumeDirs map[string]map[string]string

func (d VolumeDirs) FlexvolumeOptions(ctx context.Context, dir string) (map[string]string, error) {
	o, ok := d[dir]
	if !ok {
		return nil, fmt.Errorf("%s/%s: %w", dir, ports.FlexvolumeOptionsFile, ports.ErrNotFound)
	}
	out := map[string]string{}
	for k, v := range o {
		out[k] = v
	}
	return out, nil
}

var (
	_ ports.Volumes      = (*Volumes)(nil)
	_ ports.RootfsHolder = (*Volumes)(nil)
	_ ports.VolumeDirs   = VolumeDirs{}
)
