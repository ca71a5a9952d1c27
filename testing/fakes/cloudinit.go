package fakes

import (
	"context"
	"fmt"
	"sync"

	"github.com/virtlet/virtlet/ports"
)

// Datasource keeps each VM's media request in memory.
type Datasource struct {
	Name     string
	mu       sync.Mutex
	media    map[string]ports.MediaRequest
	BuildErr error
	Removes  int
}

// NewDatasource returns a fake datasource handling name.
func NewDatasource(name string) *Datasource {
	return &Datasource{Name: name, media: map[string]ports.MediaRequest{}}
}

func (d *Datasource) BuildMedia(ctx context.Context, req ports.MediaRequest) (ports.Disk, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.BuildErr != nil {
		return ports.Disk{}, d.BuildErr
	}
	if req.Datasource != d.Name {
		return ports.Disk{}, &ports.InvalidError{Field: "datasource", Value: req.Datasource, Allowed: d.Name}
	}
	d.media[req.VMID] = req
	return ports.Disk{Name: "cloud-init", Device: ports.DeviceCDROM, ReadOnly: true,
		Source: ports.DiskSource{Type: ports.SourceFile, Path: "/fake/" + d.Name + "/" + req.VMID + ".iso", Format: "raw"}}, nil
}

func (d *Datasource) RemoveMedia(ctx context.Context, vmID string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Removes++
	delete(d.media, vmID)
	return nil
}

// Media returns the request the VM's media was built from.
func (d *Datasource) Media(vmID string) (ports.MediaRequest, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.media[vmID]
	return m, ok
}

// Count is the number of VMs with media.
func (d *Datasource) Count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.media)
}

// KubeObjects holds ConfigMaps and Secrets by "namespace/name".
type KubeObjects struct {
	ConfigMaps, Secrets map[string]map[string][]byte
	Err                 error // returned by every call when set
}

// NewKubeObjects returns an empty object set.
func NewKubeObjects() *KubeObjects {
	return &KubeObjects{ConfigMaps: map[string]map[string][]byte{}, Secrets: map[string]map[string][]byte{}}
}

func (k *KubeObjects) get(m map[string]map[string][]byte, kind, namespace, name string) (map[string][]byte, error) {
	if k.Err != nil {
		return nil, k.Err
	}
	d, ok := m[namespace+"/"+name]
	if !ok {
		return nil, fmt.Errorf("%s %s/%s: %w", kind, namespace, name, ports.ErrNotFound)
	}
	return d, nil
}

func (k *KubeObjects) ConfigMap(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	return k.get(k.ConfigMaps, "configmap", namespace, name)
}

func (k *KubeObjects) Secret(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	return k.get(k.Secrets, "secret", namespace, name)
}

// ProjectedFiles holds volume files by host path.
type ProjectedFiles map[string][]ports.ProjectedFile

func (p ProjectedFiles) Read(ctx context.Context, hostPath string) ([]ports.ProjectedFile, error) {
	f, ok := p[hostPath]
	if !ok {
		return nil, fmt.Errorf("volume directory %s: %w", hostPath, ports.ErrNotFound)
	}
	return f, nil
}

var (
	_ ports.Datasource     = (*Datasource)(nil)
	_ ports.KubeObjects    = (*KubeObjects)(nil)
	_ ports.ProjectedFiles = ProjectedFiles(nil)
)
