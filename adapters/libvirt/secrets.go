package libvirt

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// secretSpace derives the UUIDs of the secrets of a VM's network disks.
var secretSpace = uuid.MustParse("5a0c62b4-7f3c-4d35-9f6e-2c9e1f0d8b41")

// secretUsage names the secret of a VM's disk; Undefine finds a VM's
// secrets by this prefix even without a record.
func secretUsage(vmID, disk string) string { return NamePrefix + vmID + "-" + disk }

// defineSecrets keeps the keys of a VM's network disks in libvirt secrets
// and returns their UUIDs by disk name. The secrets are ephemeral and
// private: libvirtd holds them in memory only and never shows them, and
// QEMU receives them encrypted with the domain's master key, so a key is
// never on a command line, in the domain XML or in a file.
func defineSecrets(conn *libvirt.Connect, spec ports.VMSpec) (map[string]string, error) {
	out := map[string]string{}
	for _, d := range spec.Disks {
		a := d.Source.Auth
		if d.Source.Type != ports.SourceNetwork || a == nil {
			continue
		}
		if len(a.Secret) == 0 || a.SecretType == "" {
			undefineSecrets(conn, spec.ID)
			return nil, fmt.Errorf("disk %s: its %s authentication has no key: %w", d.Name, d.Source.Protocol, ports.ErrInvalidArgument)
		}
		id := uuid.NewSHA1(secretSpace, []byte(spec.ID+"/"+d.Name)).String()
		def := &libvirtxml.Secret{Ephemeral: "yes", Private: "yes", UUID: id,
			Description: fmt.Sprintf("Virtlet: key of disk %s of VM %s (pod %s/%s)", d.Name, spec.Name, spec.PodNamespace, spec.PodName),
			Usage:       &libvirtxml.SecretUsage{Type: a.SecretType, Name: secretUsage(spec.ID, d.Name)}}
		doc, err := def.Marshal()
		if err != nil {
			return nil, err
		}
		sec, err := conn.SecretDefineXML(doc, 0)
		if err != nil {
			undefineSecrets(conn, spec.ID)
			return nil, libvirtError("define the secret of disk "+d.Name, err)
		}
		err = sec.SetValue(a.Secret, 0)
		sec.Free()
		if err != nil {
			undefineSecrets(conn, spec.ID)
			return nil, libvirtError("set the secret of disk "+d.Name, err)
		}
		out[d.Name] = id
	}
	return out, nil
}

// undefineSecrets removes every secret of a VM; none is fine.
func undefineSecrets(conn *libvirt.Connect, vmID string) error {
	secrets, err := conn.ListAllSecrets(0)
	if err != nil {
		return libvirtError("list secrets", err)
	}
	var errs []error
	prefix := NamePrefix + vmID + "-"
	for i := range secrets {
		s := &secrets[i]
		usage, err := s.GetUsageID()
		if err == nil && strings.HasPrefix(usage, prefix) {
			if err := s.Undefine(); err != nil {
				var le libvirt.Error
				if !errors.As(err, &le) || le.Code != libvirt.ERR_NO_SECRET {
					errs = append(errs, libvirtError("undefine secret "+usage, err))
				}
			}
		}
		s.Free()
	}
	return errors.Join(errs...)
}
