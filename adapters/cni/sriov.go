package cni

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/ports"
)

// pciDevices is where the host's PCI devices are (a test points it
// elsewhere).
var pciDevices = "/sys/bus/pci/devices"

// sriovVF returns the PCI address of the SR-IOV virtual function behind
// the pod interface ifName of the namespace nsPath, or "" when the
// interface is none (a veth, a bridge port, a physical function): the
// driver's bus address (ethtool) names a PCI device whose physfn link
// leads to its physical function.
func sriovVF(nsPath, ifName string) (string, error) {
	var bus string
	err := inNetNS(nsPath, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		info, err := unix.IoctlGetEthtoolDrvinfo(fd, ifName)
		if err != nil {
			return nil // no driver information: no PCI device
		}
		bus = unix.ByteSliceToString(info.Bus_info[:])
		return nil
	})
	if err != nil || bus == "" {
		return "", err
	}
	return vfAt(bus), nil
}

// vfAt returns bus when the PCI device at bus is a virtual function.
func vfAt(bus string) string {
	if filepath.Base(bus) != bus || bus == "." || bus == ".." {
		return ""
	}
	if _, err := os.Lstat(filepath.Join(pciDevices, bus, "physfn")); err == nil {
		return bus
	}
	return ""
}

// errSRIOV refuses a pod interface that is an SR-IOV virtual function: the
// design of passing it to the VM is in ARCHITECTURE.md ("SR-IOV"), and no
// node with VFs has tested it.
func errSRIOV(ifName, bus string) error {
	return fmt.Errorf("pod interface %s is the SR-IOV virtual function %s: VM pods cannot take VFs yet "+
		"(designed in ARCHITECTURE.md, \"SR-IOV\"; no node with VFs has tested it): %w", ifName, bus, ports.ErrUnimplemented)
}
