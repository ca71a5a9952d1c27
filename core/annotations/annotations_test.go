package annotations

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

func TestDefaults(t *testing.T) {
	for name, in := range map[string]map[string]string{
		"nil":              nil,
		"only target":      {TargetRuntime: TargetRuntimeValue},
		"blank values":     {VCPUCount: "", DiskDriver: "  ", RootVolumeSize: ""},
		"other annotation": {"example.com/owner": "team-a"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(in)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := Defaults()
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %+v, want %+v", got, want)
			}
			if got.VCPUCount != 1 || got.DiskDriver != ports.BusSCSI || got.CloudInitImageType != "nocloud" || got.UserDataSourceEncoding != "plain" {
				t.Fatalf("seed defaults not applied: %+v", got)
			}
		})
	}
}

func TestValid(t *testing.T) {
	one := 1
	tests := []struct {
		name string
		in   map[string]string
		want func(*VMOptions)
	}{
		{"vcpus", map[string]string{VCPUCount: "2"}, func(o *VMOptions) { o.VCPUCount = 2 }},
		{"vcpus max", map[string]string{VCPUCount: "255"}, func(o *VMOptions) { o.VCPUCount = 255 }},
		{"max vcpus", map[string]string{VCPUCount: "2", MaxVCPUCount: "8"}, func(o *VMOptions) { o.VCPUCount, o.MaxVCPUCount = 2, 8 }},
		{"cpu topology of the most vCPUs", map[string]string{MaxVCPUCount: "4", CPUTopology: "sockets=4"}, func(o *VMOptions) {
			o.MaxVCPUCount, o.CPUSetting = 4, &ports.CPUSetting{Topology: &ports.CPUTopology{Sockets: 4, Cores: 1, Threads: 1}}
		}},
		{"virtio", map[string]string{DiskDriver: "virtio"}, func(o *VMOptions) { o.DiskDriver = ports.BusVirtio }},
		{"scsi", map[string]string{DiskDriver: "scsi"}, func(o *VMOptions) { o.DiskDriver = ports.BusSCSI }},
		{"host-model", map[string]string{CPUModel: "host-model"}, func(o *VMOptions) { o.CPUModel = "host-model" }},
		{"q35", map[string]string{MachineType: "q35"}, func(o *VMOptions) { o.MachineType = "q35" }},
		{"migrate from", map[string]string{MigrateFrom: `{"pod":"ns/vm","uid":"u-1","node":"node-1","domain":"virtlet-0123456789ab-vm","uuid":"9b1f4a52-5a6e-4c3e-9d55-3a4f0c2b1e7d","macs":["52:54:00:12:34:56"]}`},
			func(o *VMOptions) {
				o.MigrateFrom = &MigrationSource{Pod: "ns/vm", UID: "u-1", Node: "node-1", Domain: "virtlet-0123456789ab-vm",
					UUID: "9b1f4a52-5a6e-4c3e-9d55-3a4f0c2b1e7d", MACs: []string{"52:54:00:12:34:56"}}
			}},
		{"cpu topology", map[string]string{VCPUCount: "4", CPUTopology: "sockets=2, cores=2"}, func(o *VMOptions) {
			o.VCPUCount, o.CPUSetting = 4, &ports.CPUSetting{Topology: &ports.CPUTopology{Sockets: 2, Cores: 2, Threads: 1}}
		}},
		{"cpu topology with host-model", map[string]string{VCPUCount: "2", CPUModel: "host-model", CPUTopology: "threads=2"}, func(o *VMOptions) {
			o.VCPUCount, o.CPUModel = 2, "host-model"
			o.CPUSetting = &ports.CPUSetting{Mode: "host-model", Topology: &ports.CPUTopology{Sockets: 1, Cores: 1, Threads: 2}}
		}},
		{"watchdog", map[string]string{Watchdog: "i6300esb"}, func(o *VMOptions) { o.Watchdog = &ports.Watchdog{Model: "i6300esb", Action: "reset"} }},
		{"uefi", map[string]string{Firmware: "uefi"}, func(o *VMOptions) { o.Firmware = ports.FirmwareUEFI }},
		{"hyper-v", map[string]string{HyperV: "true"}, func(o *VMOptions) { o.HyperV = true }},
		{"bios", map[string]string{Firmware: "bios", SecureBoot: "false"}, func(o *VMOptions) {}},
		{"secure boot", map[string]string{Firmware: "uefi", SecureBoot: "true", MachineType: "q35"}, func(o *VMOptions) {
			o.Firmware, o.SecureBoot, o.MachineType = ports.FirmwareUEFI, true, "q35"
		}},
		{"itco watchdog on q35", map[string]string{MachineType: "pc-q35-7.2", Watchdog: "itco", WatchdogAction: "poweroff"}, func(o *VMOptions) {
			o.MachineType, o.Watchdog = "pc-q35-7.2", &ports.Watchdog{Model: "itco", Action: "poweroff"}
		}},
		{"clock offset", map[string]string{Clock: "+7200"}, func(o *VMOptions) { o.Clock = ports.ClockSpec{Offset: "variable", AdjustmentSeconds: 7200} }},
		{"clock in a time zone", map[string]string{Clock: "Europe/Berlin"}, func(o *VMOptions) { o.Clock = ports.ClockSpec{Offset: "timezone", Timezone: "Europe/Berlin"} }},
		{"clock in local time", map[string]string{Clock: "localtime"}, func(o *VMOptions) { o.Clock.Offset = "localtime" }},
		{"timers", map[string]string{ClockTimers: "rtc:catchup, pit:delay,hpet:no,kvmclock:yes"}, func(o *VMOptions) {
			o.Clock.Timers = []ports.ClockTimer{{Name: "rtc", TickPolicy: "catchup"}, {Name: "pit", TickPolicy: "delay"}, {Name: "hpet", Present: "no"}, {Name: "kvmclock", Present: "yes"}}
		}},
		{"versioned machine", map[string]string{MachineType: "pc-i440fx-7.2"}, func(o *VMOptions) { o.MachineType = "pc-i440fx-7.2" }},
		{"cpu setting from docs/vm-pods.md", map[string]string{LibvirtCPUSetting: "Match: exact\nModel:\n  Fallback: allow\n  Value: core2duo\n"},
			func(o *VMOptions) {
				o.CPUSetting = &ports.CPUSetting{Match: "exact", Model: &ports.CPUSettingModel{Fallback: "allow", Value: "core2duo"}}
			}},
		{"cpu setting with features and topology", map[string]string{LibvirtCPUSetting: `
Mode: custom
Topology: {Sockets: 1, Cores: 2, Threads: 1}
Features:
- {Policy: require, Name: vmx}
Numa:
  Cells:
  - {ID: 1, CPUs: "0-1", Memory: 512, Unit: MiB}
`}, func(o *VMOptions) {
			o.CPUSetting = &ports.CPUSetting{Mode: "custom", Topology: &ports.CPUTopology{Sockets: 1, Cores: 2, Threads: 1},
				Features: []ports.CPUFeature{{Policy: "require", Name: "vmx"}},
				Numa:     &ports.CPUNuma{Cells: []ports.CPUNumaCell{{ID: &one, CPUs: "0-1", Memory: 512, Unit: "MiB"}}}}
		}},
		{"configdrive", map[string]string{CloudInitImageType: "configdrive"}, func(o *VMOptions) { o.CloudInitImageType = "configdrive" }},
		{"nocloud", map[string]string{CloudInitImageType: "nocloud"}, func(o *VMOptions) { o.CloudInitImageType = "nocloud" }},
		{"meta-data yaml (docs/cloud-init.md)", map[string]string{CloudInitMetaData: "instance-id: foobar\n"},
			func(o *VMOptions) { o.MetaData = map[string]interface{}{"instance-id": "foobar"} }},
		{"meta-data json", map[string]string{CloudInitMetaData: `{"instance-id": "foobar", "n": 1}`},
			func(o *VMOptions) { o.MetaData = map[string]interface{}{"instance-id": "foobar", "n": float64(1)} }},
		{"user-data (docs/cloud-init.md)", map[string]string{CloudInitUserData: "users:\n- name: cloudy\n  gecos: Magic Cloud App Daemon User\n  inactive: true\n  system: true\n"},
			func(o *VMOptions) {
				o.UserData = map[string]interface{}{"users": []interface{}{map[string]interface{}{
					"name": "cloudy", "gecos": "Magic Cloud App Daemon User", "inactive": true, "system": true}}}
			}},
		{"overwrite", map[string]string{CloudInitUserDataOverwrite: "true"}, func(o *VMOptions) { o.UserDataOverwrite = true }},
		{"booleans other than lowercase true are false", map[string]string{CloudInitUserDataOverwrite: "True", ForceDHCPNetworkConfig: "yes", Chown9pfsMounts: "1"}, func(o *VMOptions) {}},
		{"script", map[string]string{CloudInitUserDataScript: "#!/bin/sh\necho hello world\n"}, func(o *VMOptions) { o.UserDataScript = "#!/bin/sh\necho hello world\n" }},
		{"user-data source configmap", map[string]string{CloudInitUserDataSource: "configmap/vm-user-data"},
			func(o *VMOptions) { o.UserDataSource = &ObjectRef{Kind: ConfigMap, Name: "vm-user-data"} }},
		{"user-data source key base64", map[string]string{CloudInitUserDataSource: "secret/ud", CloudInitUserDataSourceKey: "user-data", CloudInitUserDataSourceEncoding: "base64"},
			func(o *VMOptions) {
				o.UserDataSource = &ObjectRef{Kind: Secret, Name: "ud", Key: "user-data"}
				o.UserDataSourceEncoding = "base64"
			}},
		{"ssh keys", map[string]string{SSHKeys: "ssh-rsa AAAA... me@localhost\n\n  ssh-ed25519 BBBB you@there  \n"},
			func(o *VMOptions) { o.SSHKeys = []string{"ssh-rsa AAAA... me@localhost", "ssh-ed25519 BBBB you@there"} }},
		{"ssh key source default key", map[string]string{SSHKeySource: "secret/mysecret"},
			func(o *VMOptions) {
				o.SSHKeySource = &ObjectRef{Kind: Secret, Name: "mysecret", Key: "authorized_keys"}
			}},
		{"ssh key source with key", map[string]string{SSHKeySource: "configmap/keys/admins"},
			func(o *VMOptions) { o.SSHKeySource = &ObjectRef{Kind: ConfigMap, Name: "keys", Key: "admins"} }},
		{"files from data source", map[string]string{FilesFromDataSource: "configmap/files"},
			func(o *VMOptions) { o.FilesFromDataSource = &ObjectRef{Kind: ConfigMap, Name: "files"} }},
		{"root volume 1Gi", map[string]string{RootVolumeSize: "1Gi"}, func(o *VMOptions) { o.RootVolumeSize = 1 << 30 }},
		{"root volume 4G", map[string]string{RootVolumeSize: "4G"}, func(o *VMOptions) { o.RootVolumeSize = 4_000_000_000 }},
		{"chown", map[string]string{Chown9pfsMounts: "true"}, func(o *VMOptions) { o.Chown9pfsMounts = true }},
		{"force dhcp", map[string]string{ForceDHCPNetworkConfig: "true"}, func(o *VMOptions) { o.ForceDHCP = true }},
		{"system uuid normalised", map[string]string{SystemUUID: "4A9C4D3E-0B1F-4A57-9E3C-6F7F2F6F1C2D"},
			func(o *VMOptions) { o.SystemUUID = "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := Defaults()
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %#v\nwant %#v", got, want)
			}
		})
	}
}

func TestInvalid(t *testing.T) {
	tests := []struct {
		name string
		in   map[string]string
		// every fragment must appear in the message
		want []string
	}{
		{"vcpus lots", map[string]string{VCPUCount: "lots"}, []string{"annotation VirtletVCPUCount", `"lots"`, "not an integer", "1 to 255"}},
		{"vcpus zero", map[string]string{VCPUCount: "0"}, []string{"VirtletVCPUCount", `"0"`, "out of range"}},
		{"vcpus too many", map[string]string{VCPUCount: "256"}, []string{"VirtletVCPUCount", "out of range"}},
		{"disk ide", map[string]string{DiskDriver: "ide"}, []string{"annotation VirtletDiskDriver", `"ide"`, `"scsi" or "virtio"`}},
		{"machine type with a space", map[string]string{MachineType: "pc q35"}, []string{"annotation VirtletMachineType", `"pc q35"`, "pc, q35, or a machine type of the node's QEMU"}},
		{"machine type in capitals", map[string]string{MachineType: "Q35"}, []string{"annotation VirtletMachineType", `"Q35"`}},
		{"clock in no zone", map[string]string{Clock: "Mars/Olympus_Mons"}, []string{"annotation VirtletClock", `"Mars/Olympus_Mons"`, "no such time zone", "Europe/Berlin"}},
		{"clock offset not a number", map[string]string{Clock: "+2h"}, []string{"annotation VirtletClock", `"+2h"`, "signed offset in seconds"}},
		{"clock offset beyond a century", map[string]string{Clock: "-9999999999"}, []string{"annotation VirtletClock", "within a century"}},
		{"timer unknown", map[string]string{ClockTimers: "tsc:yes"}, []string{"annotation VirtletClockTimers", `"tsc:yes" is not one`, "hpet, kvmclock, pit, rtc"}},
		{"timer policy it does not take", map[string]string{ClockTimers: "hpet:catchup"}, []string{"annotation VirtletClockTimers", `hpet takes no policy "catchup"`, "hpet: yes, no"}},
		{"timer twice", map[string]string{ClockTimers: "rtc:delay,rtc:catchup"}, []string{"annotation VirtletClockTimers", "rtc is given twice"}},
		{"cpu topology not the vCPU count", map[string]string{VCPUCount: "2", CPUTopology: "sockets=2,cores=2"}, []string{"annotation VirtletCPUTopology", "2×2×1 is 4 vCPUs, the pod has 2 (VirtletVCPUCount)"}},
		{"max vcpus below the count", map[string]string{VCPUCount: "4", MaxVCPUCount: "2"}, []string{"annotation VirtletMaxVCPUCount", `"2"`, "out of range", "from the vCPU count (VirtletVCPUCount, 4) to 255"}},
		{"max vcpus not a number", map[string]string{MaxVCPUCount: "many"}, []string{"annotation VirtletMaxVCPUCount", "not an integer"}},
		{"cpu topology not the most vCPUs", map[string]string{VCPUCount: "2", MaxVCPUCount: "4", CPUTopology: "cores=2"}, []string{"annotation VirtletCPUTopology", "1×2×1 is 2 vCPUs, the pod has 4 (VirtletMaxVCPUCount)"}},
		{"cpu topology key twice", map[string]string{CPUTopology: "cores=1,cores=1"}, []string{"annotation VirtletCPUTopology", "cores is given twice"}},
		{"cpu topology unknown key", map[string]string{CPUTopology: "dies=1"}, []string{"annotation VirtletCPUTopology", `"dies" is not sockets, cores or threads`}},
		{"cpu topology not a count", map[string]string{CPUTopology: "cores=0"}, []string{"annotation VirtletCPUTopology", `"cores=0" is not a count`}},
		{"cpu topology twice", map[string]string{CPUTopology: "cores=1", LibvirtCPUSetting: "Topology: {Sockets: 1, Cores: 1, Threads: 1}\n"}, []string{"annotation VirtletCPUTopology", "both are set"}},
		{"watchdog unknown", map[string]string{Watchdog: "ib700"}, []string{"annotation VirtletWatchdog", `"ib700"`, "i6300esb or itco"}},
		{"firmware unknown", map[string]string{Firmware: "coreboot"}, []string{"annotation VirtletFirmware", `"coreboot"`, "bios or uefi"}},
		{"migrate from not JSON", map[string]string{MigrateFrom: "node-1/vm"}, []string{"annotation VirtletMigrateFrom", "it is not that JSON", "virtletctl migrate writes it"}},
		{"migrate from an unknown key", map[string]string{MigrateFrom: `{"pod":"ns/vm","xml":"<domain/>"}`}, []string{"annotation VirtletMigrateFrom", `unknown field "xml"`}},
		{"migrate from no pod", map[string]string{MigrateFrom: `{"pod":"vm","uid":"u","node":"n","domain":"d","uuid":"x"}`}, []string{"annotation VirtletMigrateFrom", "pod is not NAMESPACE/NAME"}},
		{"migrate from no uuid", map[string]string{MigrateFrom: `{"pod":"ns/vm","uid":"u","node":"n","domain":"d"}`}, []string{"annotation VirtletMigrateFrom", "must all be given"}},
		{"migrate from a bad MAC", map[string]string{MigrateFrom: `{"pod":"ns/vm","uid":"u","node":"n","domain":"d","uuid":"x","macs":["52:54:00:12:34"]}`}, []string{"annotation VirtletMigrateFrom", `"52:54:00:12:34" is not a MAC`}},
		{"hyper-v not a boolean", map[string]string{HyperV: "on"}, []string{"annotation VirtletHyperV", `"on"`, "true or false"}},
		{"secure boot not a boolean", map[string]string{Firmware: "uefi", MachineType: "q35", SecureBoot: "yes"}, []string{"annotation VirtletSecureBoot", `"yes"`, "true or false"}},
		{"secure boot with bios", map[string]string{SecureBoot: "true", MachineType: "q35"}, []string{"annotation VirtletSecureBoot", "a UEFI feature", "VirtletFirmware uefi"}},
		{"secure boot on pc", map[string]string{Firmware: "uefi", SecureBoot: "true"}, []string{"annotation VirtletSecureBoot", "needs SMM", "VirtletMachineType q35"}},
		{"itco watchdog on pc", map[string]string{Watchdog: "itco"}, []string{"annotation VirtletWatchdog", "itco is the Q35 chipset's watchdog", "VirtletMachineType q35"}},
		{"watchdog action alone", map[string]string{WatchdogAction: "reset"}, []string{"annotation VirtletWatchdogAction", "no VirtletWatchdog is set"}},
		{"watchdog action unknown", map[string]string{Watchdog: "i6300esb", WatchdogAction: "explode"}, []string{"annotation VirtletWatchdogAction", `"explode"`, "reset, poweroff, shutdown, dump"}},
		{"cpu model", map[string]string{CPUModel: "host-passthrough"}, []string{"VirtletCPUModel", "host-model"}},
		{"cpu setting yaml", map[string]string{LibvirtCPUSetting: "Match: [exact"}, []string{"VirtletLibvirtCPUSetting", "cannot parse"}},
		{"cpu setting unknown key", map[string]string{LibvirtCPUSetting: "Match: exact\nModle: x\n"}, []string{"VirtletLibvirtCPUSetting", `unknown field "Modle"`}},
		{"cpu setting bad match", map[string]string{LibvirtCPUSetting: "Match: fuzzy\n"}, []string{"VirtletLibvirtCPUSetting", "Match is not valid", "minimum, exact, strict"}},
		{"cpu setting feature policy", map[string]string{LibvirtCPUSetting: "Features: [{Policy: maybe, Name: vmx}]"}, []string{"Features[0].Policy"}},
		{"cpu setting feature name", map[string]string{LibvirtCPUSetting: "Features: [{Policy: require}]"}, []string{"Features[0].Name is empty"}},
		{"image type", map[string]string{CloudInitImageType: "No Cloud!"}, []string{"VirtletCloudInitImageType", `"nocloud", "configdrive", or the type of another installed datasource plugin`}},
		{"user-data yaml", map[string]string{CloudInitUserData: "users: [\n  - name: x\n"}, []string{"annotation VirtletCloudInitUserData", "cannot parse"}},
		{"user-data list", map[string]string{CloudInitUserData: "- a\n- b\n"}, []string{"VirtletCloudInitUserData", "list, not a mapping"}},
		{"meta-data scalar", map[string]string{CloudInitMetaData: "hello"}, []string{"VirtletCloudInitMetaData", "string, not a mapping"}},
		{"user-data source kind", map[string]string{CloudInitUserDataSource: "pvc/x"}, []string{"VirtletCloudInitUserDataSource", `kind "pvc"`}},
		{"user-data source with key part", map[string]string{CloudInitUserDataSource: "configmap/x/y"}, []string{"VirtletCloudInitUserDataSource", "parts"}},
		{"user-data source name", map[string]string{CloudInitUserDataSource: "configmap/Bad_Name"}, []string{"VirtletCloudInitUserDataSource", "not a valid object name"}},
		{"key without source", map[string]string{CloudInitUserDataSourceKey: "user-data"}, []string{"VirtletCloudInitUserDataSourceKey", "no user-data source"}},
		{"encoding", map[string]string{CloudInitUserDataSourceEncoding: "gzip"}, []string{"VirtletCloudInitUserDataSourceEncoding", `"plain" or "base64"`}},
		{"ssh key source shape", map[string]string{SSHKeySource: "mysecret"}, []string{"annotation VirtletSSHKeySource", `"mysecret"`, "kind/name", "configmap/<name>[/<key>]"}},
		{"ssh key source too many parts", map[string]string{SSHKeySource: "secret/a/b/c"}, []string{"VirtletSSHKeySource", "parts"}},
		{"ssh key source kind", map[string]string{SSHKeySource: "pod/a"}, []string{"VirtletSSHKeySource", `kind "pod"`}},
		{"files source", map[string]string{FilesFromDataSource: "secret/"}, []string{"VirtletFilesFromDataSource", "not a valid object name"}},
		{"root volume malformed", map[string]string{RootVolumeSize: "1 GB"}, []string{"annotation VirtletRootVolumeSize", `"1 GB"`, "not a quantity", "1Gi"}},
		{"root volume negative", map[string]string{RootVolumeSize: "-1Gi"}, []string{"VirtletRootVolumeSize", "positive"}},
		{"root volume fractional", map[string]string{RootVolumeSize: "0.5"}, []string{"VirtletRootVolumeSize", "positive whole number"}},
		{"uuid", map[string]string{SystemUUID: "not-a-uuid"}, []string{"VirtletSystemUUID", "not a UUID"}},
		{"nil uuid", map[string]string{SystemUUID: "00000000-0000-0000-0000-000000000000"}, []string{"VirtletSystemUUID", "nil UUID"}},
		{"unknown annotation", map[string]string{"VirtletVCPUcount": "2"}, []string{"VirtletVCPUcount", "unknown Virtlet annotation", "did you mean VirtletVCPUCount?"}},
		{"misspelt annotation", map[string]string{"VirtletDiskDrivr": "virtio"}, []string{"VirtletDiskDrivr", "did you mean VirtletDiskDriver?"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.in)
			if err == nil {
				t.Fatal("Parse accepted a bad value")
			}
			if !errors.Is(err, ports.ErrInvalidArgument) {
				t.Errorf("error %v is not ErrInvalidArgument", err)
			}
			var inv *ports.InvalidError
			if !errors.As(err, &inv) || !strings.HasPrefix(inv.Field, "annotation Virtlet") {
				t.Errorf("error %v does not name its annotation", err)
			}
			for _, frag := range tt.want {
				if !strings.Contains(err.Error(), frag) {
					t.Errorf("message %q lacks %q", err.Error(), frag)
				}
			}
		})
	}
}

func TestAllErrorsReportedInOrder(t *testing.T) {
	_, err := Parse(map[string]string{VCPUCount: "lots", DiskDriver: "ide", RootVolumeSize: "huge"})
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	iDisk, iRoot, iVCPU := strings.Index(msg, DiskDriver), strings.Index(msg, RootVolumeSize), strings.Index(msg, VCPUCount)
	if iDisk < 0 || iRoot < 0 || iVCPU < 0 || !(iDisk < iRoot && iRoot < iVCPU) {
		t.Fatalf("want all three errors sorted by annotation, got %q", msg)
	}
}

func TestLongValuesAbbreviated(t *testing.T) {
	doc := "users: [\n" + strings.Repeat("  - name: someone\n", 50)
	_, err := Parse(map[string]string{CloudInitUserData: doc})
	if err == nil {
		t.Fatal("accepted")
	}
	if strings.Contains(err.Error(), "someone\n") || len(err.Error()) > 400 {
		t.Fatalf("message echoes the whole document: %q", err.Error())
	}
}

// Errors reach the daemon's log and kubectl describe: they never quote
// a value that may hold secrets, nor the value of an unknown annotation
// (a misspelt user-data annotation); other values are quoted.
func TestErrorsQuoteNoSecret(t *testing.T) {
	const secret = "hunter2-secret"
	for _, tc := range []struct{ key, value string }{
		{CloudInitUserData, "password: " + secret + "\n- broken: ["},
		{CloudInitUserData, "- " + secret},
		{CloudInitMetaData, "[" + secret},
		{CloudInitUserDataScript, ""},
		{"VirtletCloudInitUserDat", "password: " + secret},
	} {
		if tc.value == "" {
			continue // a script is never invalid by content
		}
		_, err := Parse(map[string]string{tc.key: tc.value})
		if err == nil {
			t.Fatalf("%s accepted", tc.key)
		}
		if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: %q", tc.key, err.Error())
		}
	}
	_, err := Parse(map[string]string{VCPUCount: "lots"})
	if err == nil || !strings.Contains(err.Error(), `invalid value "lots"`) {
		t.Errorf("a plain annotation's value is quoted: %v", err)
	}
}

// FuzzParse checks that no annotation value makes the parser panic and that
// whatever it accepts is within the documented ranges.
func FuzzParse(f *testing.F) {
	f.Add(VCPUCount, "2")
	f.Add(RootVolumeSize, "1Gi")
	f.Add(LibvirtCPUSetting, "Match: exact\nModel:\n  Fallback: allow\n  Value: core2duo\n")
	f.Add(CloudInitUserData, "users:\n- name: cloudy\n")
	f.Add(SSHKeySource, "secret/mysecret/key")
	f.Add(SystemUUID, "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d")
	f.Add("VirtletDiskDrivr", "virtio")
	f.Fuzz(func(t *testing.T, key, value string) {
		opts, err := Parse(map[string]string{key: value})
		if err != nil {
			if !errors.Is(err, ports.ErrInvalidArgument) {
				t.Fatalf("error of the wrong kind: %v", err)
			}
			return
		}
		if opts.VCPUCount < 1 || opts.VCPUCount > MaxVCPUs {
			t.Fatalf("accepted vcpus %d", opts.VCPUCount)
		}
		if opts.DiskDriver != ports.BusSCSI && opts.DiskDriver != ports.BusVirtio {
			t.Fatalf("accepted disk driver %q", opts.DiskDriver)
		}
		if opts.CloudInitImageType != ImageTypeNoCloud && opts.CloudInitImageType != ImageTypeConfigDrive {
			t.Fatalf("accepted image type %q", opts.CloudInitImageType)
		}
		if opts.RootVolumeSize < 0 {
			t.Fatalf("accepted root volume size %d", opts.RootVolumeSize)
		}
		for _, ref := range []*ObjectRef{opts.UserDataSource, opts.SSHKeySource, opts.FilesFromDataSource} {
			if ref != nil && (ref.Kind != ConfigMap && ref.Kind != Secret || !validName(ref.Name)) {
				t.Fatalf("accepted object ref %+v", ref)
			}
		}
	})
}
