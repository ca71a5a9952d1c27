package libvirt

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/ports"
)

// testURI is libvirt's test driver: in process, no libvirtd, one shared
// set of domains per process, real lifecycle events.
const testURI = "test:///default"

// configured returns an adapter configured against the test driver with
// the records of stateDir; tune changes it before it is configured.
func configured(t *testing.T, stateDir string, log logrus.FieldLogger, tune ...func(*Hypervisor)) *Hypervisor {
	t.Helper()
	h := New(log)
	for _, f := range tune {
		f(h)
	}
	cfg, _ := json.Marshal(Config{URI: testURI, Accelerator: "tcg"})
	if err := h.Configure(context.Background(), ports.PluginConfig{Config: cfg, StateDir: stateDir}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.close)
	return h
}

func newRecord(id, state string) *record {
	return &record{Spec: ports.VMSpec{ID: id, Name: "virtlet-" + id[:12] + "-" + state, UUID: uuid.NewString()},
		DiskPaths: map[string]string{}, State: ports.VMState(state)}
}

// One record that cannot be parsed (a torn write, a disk error) is set
// aside, loudly, and the plugin starts with the others.
func TestUnreadableRecordIsQuarantinedAndTheOthersLoad(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, "records")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	good := newRecord("0123456789abcdef", "defined")
	data, _ := json.Marshal(good)
	if err := os.WriteFile(filepath.Join(dir, good.Spec.ID+".json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	const secretish = `{"spec": {"id": "fedcba9876543210", "userData": "password: hunter2"`
	bad := filepath.Join(dir, "fedcba9876543210.json")
	if err := os.WriteFile(bad, []byte(secretish), 0o600); err != nil {
		t.Fatal(err)
	}
	log, hook := test.NewNullLogger()
	h := configured(t, state, log)

	if st, err := h.Status(context.Background(), good.Spec.ID); err != nil || st.State != ports.VMDefined {
		t.Fatalf("the good record: %+v %v", st, err)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Fatalf("the bad record is still in place: %v", err)
	}
	aside, _ := filepath.Glob(bad + atomicfile.QuarantineMarker + "*")
	if len(aside) != 1 {
		t.Fatalf("quarantined files %v", aside)
	}
	logged := false
	for _, e := range hook.AllEntries() {
		text, _ := e.String()
		if strings.Contains(text, "hunter2") {
			t.Errorf("the log quotes the record: %s", text)
		}
		if e.Level == logrus.ErrorLevel && e.Data["path"] == bad && e.Data["quarantinedAs"] == aside[0] && e.Data[logrus.ErrorKey] != nil {
			logged = true
		}
	}
	if !logged {
		for _, e := range hook.AllEntries() {
			t.Logf("%s %s %v", e.Level, e.Message, e.Data)
		}
		t.Fatal("no error-level entry naming the record, where it went and why")
	}
}

// A record write the plugin's death interrupted leaves a temporary file,
// which the next start removes.
func TestInterruptedRecordWriteIsCleanedUp(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, "records")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	torn := filepath.Join(dir, "0123456789abcdef.json"+atomicfile.TempSuffix)
	if err := os.WriteFile(torn, []byte(`{"spec": {"id": "0123`), 0o600); err != nil {
		t.Fatal(err)
	}
	configured(t, state, quietLog())
	if _, err := os.Stat(torn); !os.IsNotExist(err) {
		t.Fatalf("the interrupted write's file is still there: %v", err)
	}
}
