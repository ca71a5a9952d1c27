package core

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/core/cloudinit"
	"github.com/virtlet/virtlet/ports"
)

// cloudInitService reads what a VM's cloud-init data is made from: the
// pod's ConfigMaps and Secrets, its datasource plugin and the files of
// VirtletFilesFromDataSource.
type cloudInitService struct{ *shared }

// cloudInitInput gathers what a VM's cloud-init data is built from: the
// objects the annotations name, the files of the ConfigMap, Secret,
// projected and downward API volume mounts (a VM cannot see the node's
// files, so they travel into the guest by cloud-init write_files), the
// container's env and the pod's network. Errors name the annotation or
// mount at fault.
func (r *cloudInitService) cloudInitInput(ctx context.Context, sb *Sandbox, opts annotations.VMOptions, cfg ContainerConfig, projected []Mount) (cloudinit.Input, error) {
	in := cloudinit.Input{PodName: sb.Name, Namespace: sb.Namespace, Hostname: sb.Hostname, Options: opts, Network: sb.Network}
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
	for _, m := range projected {
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
func (r *cloudInitService) kubeObject(ctx context.Context, namespace string, ref annotations.ObjectRef, annotation string) (map[string][]byte, error) {
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

// datasource returns the plugin for the pod's VirtletCloudInitImageType:
// any type an installed datasource plugin handles.
func (r *cloudInitService) datasource(opts annotations.VMOptions) (ports.Datasource, error) {
	ds, ok := r.deps.Datasources[opts.CloudInitImageType]
	if !ok {
		installed := slices.Sorted(maps.Keys(r.deps.Datasources))
		allowed := strings.Join(installed, ", ")
		if len(installed) == 0 {
			allowed = "none: no datasource plugin is installed (add one's manifest)"
		}
		return nil, &ports.InvalidError{Field: "annotation " + annotations.CloudInitImageType, Value: opts.CloudInitImageType,
			Reason: "no installed datasource plugin handles this type", Allowed: allowed}
	}
	return ds, nil
}

// filesFromDataSource reads the files VirtletFilesFromDataSource names:
// every key X of the ConfigMap or Secret is a file, written at the path in
// X_path, its value encoded as X_encoding says (base64, the default, or
// plain), as Virtlet did. Errors name the key and the path.
func (r *cloudInitService) filesFromDataSource(ctx context.Context, sb *Sandbox, opts annotations.VMOptions) ([]ports.GuestFile, error) {
	ref := opts.FilesFromDataSource
	if ref == nil {
		return nil, nil
	}
	data, err := r.kubeObject(ctx, sb.Namespace, *ref, annotations.FilesFromDataSource)
	if err != nil {
		return nil, err
	}
	mode := os.FileMode(0o644)
	if ref.Kind == annotations.Secret {
		mode = 0o600
	}
	fail := func(key, value, reason, allowed string) error {
		return &ports.InvalidError{Field: fmt.Sprintf("annotation %s (%s), key %s", annotations.FilesFromDataSource, ref, key),
			Value: value, Reason: reason, Allowed: allowed}
	}
	var files []ports.GuestFile
	seen := map[string]string{}
	for _, key := range slices.Sorted(maps.Keys(data)) {
		if strings.HasSuffix(key, "_path") || strings.HasSuffix(key, "_encoding") {
			if _, ok := data[strings.TrimSuffix(strings.TrimSuffix(key, "_path"), "_encoding")]; !ok {
				return nil, fail(key, "", "it belongs to no file key", "X_path and X_encoding keys next to a key X holding the content")
			}
			continue
		}
		rawPath, ok := data[key+"_path"]
		if !ok {
			return nil, fail(key+"_path", "", "missing: every file key needs the path to write it at", "an absolute guest path, e.g. /etc/app.conf")
		}
		p := strings.TrimSpace(string(rawPath))
		if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
			return nil, fail(key+"_path", p, "not a clean absolute file path", "an absolute guest path without '..', e.g. /etc/app.conf")
		}
		// A NUL would cut the path short in the kernel's eyes (or fail
		// the write after the VM is defined); a control character has no
		// place in a file name kubelet would make.
		if strings.ContainsFunc(p, unicode.IsControl) {
			return nil, fail(key+"_path", strconv.Quote(p), "holds a NUL or control character", "an absolute guest path of printable characters")
		}
		if prev, dup := seen[p]; dup {
			return nil, fail(key+"_path", p, "key "+prev+" writes the same path", "one key per path")
		}
		seen[p] = key
		content := data[key]
		switch enc := strings.TrimSpace(string(data[key+"_encoding"])); enc {
		case "", annotations.EncodingBase64:
			dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(content)))
			if err != nil {
				return nil, fail(key, "", fmt.Sprintf("the content for %s is not valid base64 (%v)", p, err),
					"base64 content, or "+key+"_encoding: plain")
			}
			content = dec
		case annotations.EncodingPlain:
		default:
			return nil, fail(key+"_encoding", enc, "unknown encoding", "base64 (the default) or plain")
		}
		files = append(files, ports.GuestFile{Path: p, Data: content, Mode: mode, Source: "key " + key + " of " + ref.String()})
	}
	if len(files) == 0 {
		return nil, fail("(none)", "", fmt.Sprintf("%s %s has no file keys", ref.Kind, ref.Name), "keys X with X_path (and optionally X_encoding)")
	}
	return files, nil
}

// cloudInitDisk is the media disk on the pod's disk bus, read-only: a
// CD-ROM on SCSI unless the plugin made a disk image, always a disk on
// virtio-blk (which has no CD-ROMs).
func cloudInitDisk(d ports.Disk, bus ports.DiskBus) ports.Disk {
	d.Bus = bus
	d.ReadOnly = true
	if d.Device == "" {
		d.Device = ports.DeviceCDROM
	}
	if bus == ports.BusVirtio {
		d.Device = ports.DeviceDisk
	}
	return d
}
