// Package cloudinit builds a VM pod's cloud-init data (docs/cloud-init.md): the
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

// Volume is a disk or share the guest mounts at MountPath, or a block
// device it links to DevicePath.
type Volume struct {
	Name string
	// A disk is found by GuestPath (the udev link of its serial on its
	// bus), or without udev by Serial through sysfs.
	Serial    string
	GuestPath string
	Tag       string // a 9p share's mount tag (instead of a serial)
	MountPath string
	// Format is the file system the mount script makes on a blank disk
	// ("ext4"); empty: the disk is mounted as it is, its type probed.
	Format     string
	FormatUUID string // the new file system's UUID, if set
	DevicePath string
	ReadOnly   bool
}

// EnvVar is a container environment variable.
type EnvVar struct {
	Name, Value string
}

// Input is everything the data is built from.
type Input struct {
	PodName, Namespace string
	// Hostname is the pod's host name as kubelet gives it (the pod's name
	// unless its spec names another); empty means the pod's name.
	Hostname string
	Options  annotations.VMOptions
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
	// PersistentRoot: the VM boots a persistent root file system, which
	// keeps the network configuration of its first boot; it gets no
	// network-config (its address comes by DHCP), as in Virtlet.
	PersistentRoot bool
}

// Data is the generated cloud-init data, in cloud-init's own forms: a
// datasource plugin lays it out on its medium.
type Data struct {
	MetaData      []byte // JSON
	UserData      []byte // empty when there is nothing to say
	NetworkConfig []byte // network config version 1 (YAML); empty for DHCP
	// Network is the attachment NetworkConfig describes; nil for DHCP.
	Network *ports.NetworkAttachment
}

// Build generates the data.
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
	if !in.Options.ForceDHCP && !in.PersistentRoot && in.Network != nil && len(in.Network.Interfaces) > 0 {
		if d.NetworkConfig, err = networkConfigV1(in.Network); err != nil {
			return Data{}, err
		}
		d.Network = in.Network
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

// metaData is the meta-data JSON: instance-id, local-hostname (the pod's
// host name, which is its name unless spec.hostname says otherwise) and
// public-keys, overridden by VirtletCloudInitMetaData. (A datasource adds
// what its format repeats, e.g. ConfigDrive's uuid and hostname.)
func metaData(in Input, keys []string) ([]byte, error) {
	md := map[string]interface{}{
		"instance-id":    in.PodName + "." + in.Namespace,
		"local-hostname": in.hostname(),
	}
	if len(keys) > 0 {
		md["public-keys"] = keys
	}
	for k, v := range in.Options.MetaData {
		md[k] = v
	}
	return json.MarshalIndent(md, "", "  ")
}

func (in Input) hostname() string {
	if in.Hostname != "" {
		return in.Hostname
	}
	return in.PodName
}

// userData is, as Virtlet made it, one of:
//   - the whole document VirtletCloudInitUserDataSourceKey names in the
//     source, else VirtletCloudInitUserDataScript, with the mount script
//     placeholder replaced;
//   - the user's data merged into the generated user-data (generated first,
//     lists appended, the user's values winning otherwise). The user's data
//     is the source's keys and VirtletCloudInitUserData merged, or, with
//     VirtletCloudInitUserDataOverwrite, VirtletCloudInitUserData alone
//     replacing the source's. The generated parts (files, mounts, scripts)
//     are kept either way.
func userData(in Input) ([]byte, error) {
	o := in.Options
	script := o.UserDataScript
	if ref := o.UserDataSource; ref != nil && ref.Key != "" && in.UserDataSource != nil {
		doc, err := sourceDocument(o, in.UserDataSource)
		if err != nil {
			return nil, err
		}
		script = string(doc)
	}
	if script != "" {
		scripts := symlinkScript(in.Volumes) + mountScript(in.Volumes)
		return []byte(strings.ReplaceAll(script, MountScriptPlaceholder, scripts)), nil
	}
	user := map[string]interface{}{}
	if in.UserDataSource != nil && o.UserDataSource != nil {
		src, err := sourceUserData(o, in.UserDataSource)
		if err != nil {
			return nil, err
		}
		user = src
	}
	if o.UserData != nil {
		ann := copyValue(o.UserData).(map[string]interface{})
		if o.UserDataOverwrite {
			user = ann
		} else {
			user = Merge(user, ann)
		}
	}
	ud := Merge(generated(in), user)
	linkMountsToDisks(ud, in.Volumes)
	if len(ud) == 0 {
		return nil, nil
	}
	out, err := yaml.Marshal(ud)
	if err != nil {
		return nil, fmt.Errorf("render user-data: %w", err)
	}
	return append([]byte("#cloud-config\n"), out...), nil
}

// sourceDocument is the whole user-data document VirtletCloudInitUserDataSourceKey
// names in the source (decoded per VirtletCloudInitUserDataSourceEncoding):
// a script, or a #cloud-config document, which must then be a mapping.
func sourceDocument(o annotations.VMOptions, data map[string][]byte) ([]byte, error) {
	ref := o.UserDataSource
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
	if strings.HasPrefix(string(raw), "#cloud-config") {
		if _, err := yamlMap(raw); err != nil {
			return nil, invalid(annotations.CloudInitUserDataSourceKey, ref.Key,
				fmt.Sprintf("key %s of %s %s: %v", ref.Key, ref.Kind, ref.Name, err), "a #cloud-config document that is a YAML mapping, or a script")
		}
	}
	return raw, nil
}

// sourceUserData reads every key of a VirtletCloudInitUserDataSource object
// as a user-data key, its value YAML.
func sourceUserData(o annotations.VMOptions, data map[string][]byte) (map[string]interface{}, error) {
	ref := o.UserDataSource
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
	haveBlock, haveMounts := false, false
	for _, v := range in.Volumes {
		switch {
		case v.MountPath == "":
		case v.Tag != "":
			mounts = append(mounts, []interface{}{v.Tag, v.MountPath, "9p", mountOptions("trans=virtio,version=9p2000.L,nofail", v.ReadOnly), "0", "0"})
		default:
			mounts = append(mounts, []interface{}{v.GuestPath, v.MountPath, fsType(v.Format), mountOptions("defaults,nofail", v.ReadOnly), "0", "2"})
		}
		haveMounts = haveMounts || v.MountPath != ""
		haveBlock = haveBlock || v.DevicePath != ""
	}
	// The scripts find devices without udev, make file systems on blank
	// ephemeral disks (which cloud-init's mounts cannot), and run at every
	// boot: the block links live in /dev, which a reboot empties.
	var runcmd []interface{}
	if haveBlock {
		files = append(files, map[string]interface{}{"path": SymlinkScriptFile, "permissions": "0755", "content": symlinkScript(in.Volumes)})
		runcmd = append(runcmd, SymlinkScriptFile,
			[]interface{}{"ln", "-sf", SymlinkScriptFile, "/var/lib/cloud/scripts/per-boot/symlink-devs.sh"})
	}
	if haveMounts {
		files = append(files, map[string]interface{}{"path": MountScriptFile, "permissions": "0755", "content": mountScript(in.Volumes)})
		runcmd = append(runcmd, MountScriptFile,
			[]interface{}{"ln", "-sf", MountScriptFile, "/var/lib/cloud/scripts/per-boot/mount-volumes.sh"})
	}
	if len(runcmd) > 0 {
		ud["runcmd"] = runcmd
	}
	if len(files) > 0 {
		ud["write_files"] = files
	}
	if len(mounts) > 0 {
		ud["mounts"] = mounts
	}
	if in.Network != nil {
		if rc := resolvConf(in.Network.DNS); rc != nil {
			ud["manage_resolv_conf"] = true
			ud["resolv_conf"] = rc
		}
	}
	return ud
}

// resolvConf is cloud-init's resolv_conf for a pod whose DNS config has
// resolver options (kubelet gives every ClusterFirst pod "ndots:5"):
// neither DHCP nor network-config can carry options, so the whole
// resolv.conf goes this way to the guests whose cloud-init manages it
// (cc_resolv_conf: RHEL, Fedora, SUSE, Alpine, Photon; not Debian or
// Ubuntu). nil when there are no options: name servers and search domains
// already reach every guest by DHCP and network-config.
func resolvConf(dns *ports.DNSConfig) map[string]interface{} {
	if dns == nil || len(dns.Options) == 0 {
		return nil
	}
	// cloud-init writes "key:value" for a value, the bare key for true.
	opts := map[string]interface{}{}
	for _, o := range dns.Options {
		if k, v, ok := strings.Cut(o, ":"); ok {
			opts[k] = v
		} else {
			opts[o] = true
		}
	}
	rc := map[string]interface{}{"options": opts}
	if len(dns.Servers) > 0 {
		rc["nameservers"] = stringList(dns.Servers)
	}
	if len(dns.Searches) > 0 {
		rc["searchdomains"] = stringList(dns.Searches)
	}
	return rc
}

// stringList is ss as the generic list the merge rules work on.
func stringList(ss []string) []interface{} {
	out := make([]interface{}, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func mountOptions(opts string, readOnly bool) string {
	if readOnly {
		return opts + ",ro"
	}
	return opts
}

func fsType(t string) string {
	if t == "" {
		return "auto"
	}
	return t
}

// linkMountsToDisks points the user's own mounts entries that name a block
// volume's device path at its disk instead: cloud-init mounts file systems
// before runcmd makes the links (docs/cloud-init.md).
func linkMountsToDisks(ud map[string]interface{}, vols []Volume) {
	list, ok := ud["mounts"].([]interface{})
	if !ok {
		return
	}
	for _, entry := range list {
		fields, ok := entry.([]interface{})
		if !ok || len(fields) == 0 {
			continue
		}
		dev, _ := fields[0].(string)
		for _, v := range vols {
			if v.DevicePath != "" && v.DevicePath == dev {
				fields[0] = v.GuestPath
			}
		}
	}
}

// findDevice is shell that prints the block device of a disk: through
// its udev link ($1) when the guest has udev, else by its serial ($2) from
// sysfs (virtio-blk shows the serial, SCSI disks their VPD page 0x80).
const findDevice = `find_dev() {
  if [ -b "$1" ]; then readlink -f "$1"; return 0; fi
  for b in /sys/block/*; do
    s=$(cat "$b/serial" 2>/dev/null || tail -c +5 "$b/device/vpd_pg80" 2>/dev/null | tr -d '\0 ')
    if [ "$s" = "$2" ]; then echo "/dev/${b##*/}"; return 0; fi
  done
  return 1
}
`

// mounted is shell that says whether a path is mounted on (busybox guests
// have no mountpoint command).
const mounted = `mounted() { awk -v p="$1" '{ m = $2; gsub(/\\040/, " ", m) } m == p { f = 1 } END { exit !f }' /proc/mounts; }
`

// blank is shell that says whether a device's first 64 KiB are zeros: a
// disk never written, on which a file system may be made.
const blank = `blank() { [ "$(dd if="$1" bs=65536 count=1 2>/dev/null | tr -d '\0' | wc -c)" -eq 0 ]; }
`

// mountScript mounts the volumes that are not mounted yet (idempotent),
// making a file system first on a blank disk that asks for one.
func mountScript(vols []Volume) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Mounts the VM pod's volumes; safe to run again.\n")
	b.WriteString(findDevice)
	b.WriteString(mounted)
	for _, v := range vols {
		if v.Format != "" {
			b.WriteString(blank)
			break
		}
	}
	for _, v := range vols {
		if v.MountPath == "" {
			continue
		}
		mp := shellQuote(v.MountPath)
		fmt.Fprintf(&b, "mkdir -p %s\n", mp)
		if v.Tag != "" {
			fmt.Fprintf(&b, "mounted %s || mount -t 9p -o %s %s %s\n",
				mp, mountOptions("trans=virtio,version=9p2000.L", v.ReadOnly), shellQuote(v.Tag), mp)
			continue
		}
		fmt.Fprintf(&b, "if ! mounted %s && dev=$(find_dev %s %s); then\n", mp, shellQuote(v.GuestPath), shellQuote(v.Serial))
		if v.Format != "" {
			uuid := ""
			switch {
			case v.FormatUUID == "":
			case v.Format == "xfs": // mkfs.xfs has no -U
				uuid = "-m uuid=" + shellQuote(v.FormatUUID) + " "
			default: // ext2/3/4, btrfs
				uuid = "-U " + shellQuote(v.FormatUUID) + " "
			}
			fmt.Fprintf(&b, "  if blank \"$dev\"; then mkfs.%s -q %s\"$dev\"; fi\n", v.Format, uuid)
		}
		opts := ""
		if v.ReadOnly {
			opts = "-o ro "
		}
		fmt.Fprintf(&b, "  mount %s\"$dev\" %s\nfi\n", opts, mp)
	}
	return b.String()
}

// symlinkScript links block volumes to the paths the pod asked for.
func symlinkScript(vols []Volume) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Links the VM pod's block volumes; safe to run again.\n")
	b.WriteString(findDevice)
	for _, v := range vols {
		if v.DevicePath == "" {
			continue
		}
		fmt.Fprintf(&b, "if dev=$(find_dev %s %s); then mkdir -p \"$(dirname %s)\"; ln -sf \"$dev\" %s; fi\n",
			shellQuote(v.GuestPath), shellQuote(v.Serial), shellQuote(v.DevicePath), shellQuote(v.DevicePath))
	}
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
