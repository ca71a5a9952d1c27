// Package cloudinit builds a VM pod's cloud-init data (seed 004): the
// meta-data, the user-data and the network configuration, from the pod's
// identity, its annotations, the ConfigMap/Secret data they point to, the
// container's env, mounts and volumes, and the pod network. It is pure:
// callers fetch objects and files, datasource plugins package the result.
package cloudinit

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// MountScriptPlaceholder in VirtletCloudInitUserDataScript is replaced by
// the symlink and mount scripts.
const MountScriptPlaceholder = "@virtlet-mount-script@"

// Guest paths of the generated files.
const (
	EnvironmentFile   = "/etc/cloud/environment"
	MountScriptFile   = "/etc/cloud/mount-volumes.sh"
	SymlinkScriptFile = "/etc/cloud/symlink-devs.sh"
)

// File is a file written into the guest (write_files).
type File struct {
	Path string
	Data []byte
	Mode os.FileMode
}

// Volume is a disk or share the guest mounts, or a raw block device it
// links to a path.
type Volume struct {
	Name       string
	Serial     string // the disk's serial, to find its device through sysfs
	Tag        string // a 9p share's mount tag (instead of Serial)
	MountPath  string // where to mount it; "" for a raw block device
	FSType     string // "" lets mount probe
	DevicePath string // raw block: the path the guest should see it at
}

// EnvVar is a container environment variable.
type EnvVar struct {
	Name, Value string
}

// Input is everything the data is built from.
type Input struct {
	PodName, Namespace string
	Options            annotations.VMOptions
	// UserDataSource holds the data of the object VirtletCloudInitUserDataSource
	// names (nil without the annotation).
	UserDataSource map[string][]byte
	// SSHKeySource holds the data of the object VirtletSSHKeySource names
	// (nil without the annotation).
	SSHKeySource map[string][]byte
	Env          []EnvVar
	Files        []File // ConfigMap and Secret volume files, at their guest paths
	Volumes      []Volume
	Network      *ports.NetworkAttachment
}

// Data is the generated cloud-init data.
type Data struct {
	MetaData      []byte // JSON
	UserData      []byte // empty when there is nothing to say
	NetworkConfig []byte // network-config v1 YAML (NoCloud) or network_data.json (ConfigDrive); empty for DHCP
}

// Build generates the data for the datasource the options select.
func Build(in Input) (Data, error) {
	keys, err := sshKeys(in)
	if err != nil {
		return Data{}, err
	}
	var d Data
	if d.MetaData, err = metaData(in, keys); err != nil {
		return Data{}, err
	}
	if d.UserData, err = userData(in); err != nil {
		return Data{}, err
	}
	if !in.Options.ForceDHCP && in.Network != nil && len(in.Network.Interfaces) > 0 {
		if in.Options.CloudInitImageType == annotations.ImageTypeConfigDrive {
			d.NetworkConfig, err = networkData(in.Network)
		} else {
			d.NetworkConfig, err = networkConfigV1(in.Network)
		}
		if err != nil {
			return Data{}, err
		}
	}
	return d, nil
}

func invalid(annotation, value, reason, allowed string) error {
	return &ports.InvalidError{Field: "annotation " + annotation, Value: value, Reason: reason, Allowed: allowed}
}

// sshKeys are the VirtletSSHKeySource keys, then the VirtletSSHKeys ones;
// with VirtletCloudInitUserDataOverwrite the annotation's keys replace the
// source's when both are set.
func sshKeys(in Input) ([]string, error) {
	var fromSource []string
	if ref := in.Options.SSHKeySource; ref != nil && in.SSHKeySource != nil {
		key := ref.Key
		if key == "" {
			key = annotations.DefaultSSHKeyName
		}
		raw, ok := in.SSHKeySource[key]
		if !ok {
			return nil, invalid(annotations.SSHKeySource, ref.String(),
				fmt.Sprintf("%s %s has no key %q", ref.Kind, ref.Name, key), "one of its keys: "+keyList(in.SSHKeySource))
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				fromSource = append(fromSource, line)
			}
		}
	}
	if in.Options.UserDataOverwrite && len(in.Options.SSHKeys) > 0 {
		return in.Options.SSHKeys, nil
	}
	return append(fromSource, in.Options.SSHKeys...), nil
}

// metaData is the meta-data JSON: instance-id, local-hostname and
// public-keys, overridden by VirtletCloudInitMetaData; ConfigDrive repeats
// the instance-id as uuid and the hostname as hostname.
func metaData(in Input, keys []string) ([]byte, error) {
	md := map[string]interface{}{
		"instance-id":    in.PodName + "." + in.Namespace,
		"local-hostname": in.PodName,
	}
	if len(keys) > 0 {
		md["public-keys"] = keys
	}
	for k, v := range in.Options.MetaData {
		md[k] = v
	}
	if in.Options.CloudInitImageType == annotations.ImageTypeConfigDrive {
		if _, ok := in.Options.MetaData["uuid"]; !ok {
			md["uuid"] = md["instance-id"]
		}
		if _, ok := in.Options.MetaData["hostname"]; !ok {
			md["hostname"] = md["local-hostname"]
		}
		// OpenStack's own name for the keys, which cloud-init's ConfigDrive
		// reader also understands.
		if list, ok := md["public-keys"].([]string); ok {
			named := map[string]string{}
			for i, k := range list {
				named[fmt.Sprintf("key%d", i)] = k
			}
			md["public_keys"] = named
		}
	}
	return json.MarshalIndent(md, "", "  ")
}

// userData merges, in order, the generated user-data, the user-data source
// and VirtletCloudInitUserData; or returns VirtletCloudInitUserDataScript
// with its placeholder replaced.
func userData(in Input) ([]byte, error) {
	o := in.Options
	if o.UserDataScript != "" {
		scripts := symlinkScript(in.Volumes) + mountScript(in.Volumes)
		return []byte(strings.ReplaceAll(o.UserDataScript, MountScriptPlaceholder, scripts)), nil
	}
	merge := Merge
	if o.UserDataOverwrite {
		merge = Overwrite
	}
	ud := generated(in)
	if in.UserDataSource != nil {
		src, err := sourceUserData(o, in.UserDataSource)
		if err != nil {
			return nil, err
		}
		ud = merge(ud, src)
	}
	if o.UserData != nil {
		ud = merge(ud, copyValue(o.UserData).(map[string]interface{}))
	}
	if len(ud) == 0 {
		return nil, nil
	}
	out, err := yaml.Marshal(ud)
	if err != nil {
		return nil, fmt.Errorf("render user-data: %w", err)
	}
	return append([]byte("#cloud-config\n"), out...), nil
}

// sourceUserData reads the user-data object: every key as YAML into the
// dict, or the one key VirtletCloudInitUserDataSourceKey names holding the
// whole document, plain or base64.
func sourceUserData(o annotations.VMOptions, data map[string][]byte) (map[string]interface{}, error) {
	ref := o.UserDataSource
	if ref.Key != "" {
		raw, ok := data[ref.Key]
		if !ok {
			return nil, invalid(annotations.CloudInitUserDataSourceKey, ref.Key,
				fmt.Sprintf("%s %s has no such key", ref.Kind, ref.Name), "one of its keys: "+keyList(data))
		}
		if o.UserDataSourceEncoding == annotations.EncodingBase64 {
			dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
			if err != nil {
				return nil, invalid(annotations.CloudInitUserDataSourceEncoding, o.UserDataSourceEncoding,
					fmt.Sprintf("key %s of %s %s is not valid base64: %v", ref.Key, ref.Kind, ref.Name, err), "")
			}
			raw = dec
		}
		m, err := yamlMap(raw)
		if err != nil {
			return nil, invalid(annotations.CloudInitUserDataSourceKey, ref.Key,
				fmt.Sprintf("key %s of %s %s: %v", ref.Key, ref.Kind, ref.Name, err), "a YAML mapping of cloud-config keys")
		}
		return m, nil
	}
	out := map[string]interface{}{}
	for k, raw := range data {
		var v interface{}
		if err := yaml.Unmarshal(raw, &v); err != nil {
			return nil, invalid(annotations.CloudInitUserDataSource, ref.String(),
				fmt.Sprintf("key %s is not YAML: %v", k, err), "YAML values, one cloud-config key per key")
		}
		out[k] = v
	}
	return out, nil
}

func yamlMap(raw []byte) (map[string]interface{}, error) {
	var v interface{}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("not YAML: %v", err)
	}
	if v == nil {
		return map[string]interface{}{}, nil
	}
	m, ok := v.(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("not a YAML mapping")
	}
	return m, nil
}

func keyList(data map[string][]byte) string {
	var keys []string
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return "(none)"
	}
	return strings.Join(keys, ", ")
}

// generated is the user-data Virtlet writes itself: files, mounts, and the
// scripts that find volumes without udev.
func generated(in Input) map[string]interface{} {
	ud := map[string]interface{}{}
	var files []interface{}
	if len(in.Env) > 0 {
		var b strings.Builder
		for _, e := range in.Env {
			fmt.Fprintf(&b, "%s=%s\n", e.Name, e.Value)
		}
		files = append(files, map[string]interface{}{"path": EnvironmentFile, "permissions": "0644", "content": b.String()})
	}
	for _, f := range in.Files {
		files = append(files, map[string]interface{}{
			"path": f.Path, "permissions": fmt.Sprintf("%04o", f.Mode.Perm()),
			"encoding": "b64", "content": base64.StdEncoding.EncodeToString(f.Data),
		})
	}
	var mounts []interface{}
	haveBlock := false
	for _, v := range in.Volumes {
		switch {
		case v.Tag != "" && v.MountPath != "":
			mounts = append(mounts, []interface{}{v.Tag, v.MountPath, "9p", "trans=virtio,version=9p2000.L,nofail", "0", "0"})
		case v.MountPath != "":
			mounts = append(mounts, []interface{}{diskByID(v.Serial), v.MountPath, fsType(v.FSType), "defaults,nofail", "0", "2"})
		}
		if v.DevicePath != "" {
			haveBlock = true
		}
	}
	if len(in.Volumes) > 0 {
		files = append(files, map[string]interface{}{"path": MountScriptFile, "permissions": "0755", "content": mountScript(in.Volumes)})
	}
	if haveBlock {
		files = append(files, map[string]interface{}{"path": SymlinkScriptFile, "permissions": "0755", "content": symlinkScript(in.Volumes)})
		ud["runcmd"] = []interface{}{
			SymlinkScriptFile,
			[]interface{}{"ln", "-sf", SymlinkScriptFile, "/var/lib/cloud/scripts/per-boot/symlink-devs.sh"},
		}
	}
	if len(files) > 0 {
		ud["write_files"] = files
	}
	if len(mounts) > 0 {
		ud["mounts"] = mounts
	}
	return ud
}

// diskByID is where udev links a disk with this serial (virtio-blk; SCSI
// disks get a scsi-0QEMU_QEMU_HARDDISK_ link, which the mount script finds
// without udev anyway).
func diskByID(serial string) string { return "/dev/disk/by-id/virtio-" + serial }

func fsType(t string) string {
	if t == "" {
		return "auto"
	}
	return t
}

// findDevice is shell that sets dev to the block device with serial $1,
// from sysfs: virtio-blk exposes the serial, SCSI disks their VPD page 0x80.
const findDevice = `find_dev() {
  for b in /sys/block/*; do
    s=$(cat "$b/serial" 2>/dev/null || tail -c +5 "$b/device/vpd_pg80" 2>/dev/null | tr -d '\0 ')
    if [ "$s" = "$1" ]; then echo "/dev/${b##*/}"; return 0; fi
  done
  return 1
}
`

// mountScript mounts the volumes that are not mounted yet (idempotent).
func mountScript(vols []Volume) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Mounts the VM pod's volumes; safe to run again.\n")
	b.WriteString(findDevice)
	for _, v := range vols {
		if v.MountPath == "" {
			continue
		}
		fmt.Fprintf(&b, "mkdir -p %s\n", shellQuote(v.MountPath))
		if v.Tag != "" {
			fmt.Fprintf(&b, "grep -q ' %s ' /proc/mounts || mount -t 9p -o trans=virtio,version=9p2000.L %s %s\n",
				v.MountPath, shellQuote(v.Tag), shellQuote(v.MountPath))
			continue
		}
		typeFlag := ""
		if v.FSType != "" {
			typeFlag = "-t " + v.FSType + " "
		}
		fmt.Fprintf(&b, "if ! grep -q ' %s ' /proc/mounts && dev=$(find_dev %s); then mount %s\"$dev\" %s; fi\n",
			v.MountPath, shellQuote(v.Serial), typeFlag, shellQuote(v.MountPath))
	}
	return b.String()
}

// symlinkScript links raw block volumes to the paths the pod asked for.
func symlinkScript(vols []Volume) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Links the VM pod's raw block volumes; safe to run again.\n")
	b.WriteString(findDevice)
	for _, v := range vols {
		if v.DevicePath == "" {
			continue
		}
		fmt.Fprintf(&b, "if dev=$(find_dev %s); then mkdir -p \"$(dirname %s)\"; ln -sf \"$dev\" %s; fi\n",
			shellQuote(v.Serial), shellQuote(v.DevicePath), shellQuote(v.DevicePath))
	}
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
