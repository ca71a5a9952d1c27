package core

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/core/cloudinit"
	"github.com/virtlet/virtlet/ports"
)

// projectedVolume matches the host paths kubelet mounts ConfigMap, Secret,
// projected and downward API volumes from. A VM cannot see the node's
// files, so their files travel into the guest by cloud-init write_files.
var projectedVolume = regexp.MustCompile(`/volumes/kubernetes\.io~(configmap|secret|projected|downward-api)/[^/]+/?$`)

// cloudInitInput gathers what a VM's cloud-init data is built from: the
// objects the annotations name, the files of projected volume mounts, the
// container's env and the pod's network. Errors name the annotation or
// mount at fault.
func (r *Runtime) cloudInitInput(ctx context.Context, sb *Sandbox, opts annotations.VMOptions, cfg ContainerConfig) (cloudinit.Input, error) {
	in := cloudinit.Input{PodName: sb.Name, Namespace: sb.Namespace, Options: opts, Network: sb.Network}
	if ref := opts.UserDataSource; ref != nil {
		data, err := r.kubeObject(ctx, sb.Namespace, *ref, annotations.CloudInitUserDataSource)
		if err != nil {
			return in, err
		}
		in.UserDataSource = data
	}
	if ref := opts.SSHKeySource; ref != nil {
		data, err := r.kubeObject(ctx, sb.Namespace, *ref, annotations.SSHKeySource)
		if err != nil {
			return in, err
		}
		in.SSHKeySource = data
	}
	for _, e := range cfg.Env {
		in.Env = append(in.Env, cloudinit.EnvVar{Name: e.Name, Value: e.Value})
	}
	for _, m := range cfg.Mounts {
		if !projectedVolume.MatchString(m.HostPath) {
			continue
		}
		if r.deps.Files == nil {
			return in, fmt.Errorf("mount %s: the runtime cannot read projected volume files: %w", m.ContainerPath, ports.ErrFailedPrecondition)
		}
		files, err := r.deps.Files.Read(ctx, m.HostPath)
		if err != nil {
			return in, fmt.Errorf("mount %s (volume %s): %w", m.ContainerPath, path.Base(m.HostPath), err)
		}
		for _, f := range files {
			in.Files = append(in.Files, cloudinit.File{Path: path.Join(m.ContainerPath, f.Path), Data: f.Data, Mode: f.Mode})
		}
	}
	return in, nil
}

// kubeObject fetches the ConfigMap or Secret an annotation names, in the
// pod's namespace.
func (r *Runtime) kubeObject(ctx context.Context, namespace string, ref annotations.ObjectRef, annotation string) (map[string][]byte, error) {
	if r.deps.Kube == nil {
		return nil, fmt.Errorf("annotation %s refers to %s/%s, but the daemon reads no Kubernetes objects (run it in the cluster, or with --kubeconfig or --kube-objects-dir): %w",
			annotation, ref.Kind, ref.Name, ports.ErrFailedPrecondition)
	}
	var (
		data map[string][]byte
		err  error
	)
	switch ref.Kind {
	case annotations.ConfigMap:
		data, err = r.deps.Kube.ConfigMap(ctx, namespace, ref.Name)
	case annotations.Secret:
		data, err = r.deps.Kube.Secret(ctx, namespace, ref.Name)
	default:
		return nil, &ports.InvalidError{Field: "annotation " + annotation, Value: ref.String(), Allowed: "configmap/NAME or secret/NAME"}
	}
	if errors.Is(err, ports.ErrNotFound) {
		return nil, fmt.Errorf("annotation %s: %s %s/%s does not exist: %w", annotation, ref.Kind, namespace, ref.Name, ports.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("annotation %s: read %s %s/%s: %w", annotation, ref.Kind, namespace, ref.Name, err)
	}
	return data, nil
}

// datasource returns the plugin for the pod's VirtletCloudInitImageType.
func (r *Runtime) datasource(opts annotations.VMOptions) (ports.Datasource, error) {
	ds, ok := r.deps.Datasources[opts.CloudInitImageType]
	if !ok {
		return nil, fmt.Errorf("annotation %s: no datasource plugin %q is installed, so the VM cannot get its cloud-init data (add its plugin manifest): %w",
			annotations.CloudInitImageType, opts.CloudInitImageType, ports.ErrFailedPrecondition)
	}
	return ds, nil
}

// cloudInitDisk is the media disk on the pod's disk bus: a CD-ROM on SCSI,
// a read-only disk on virtio-blk (which has no CD-ROMs).
func cloudInitDisk(d ports.Disk, bus ports.DiskBus) ports.Disk {
	d.Bus = bus
	d.ReadOnly = true
	d.Device = ports.DeviceCDROM
	if bus == ports.BusVirtio {
		d.Device = ports.DeviceDisk
	}
	return d
}
