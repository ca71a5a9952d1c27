package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/ports"
)

// testConn opens a connection of the test's own to the test driver (its
// domains are shared by every connection of the process).
func testConn(t *testing.T) *libvirt.Connect {
	t.Helper()
	startEventLoop(quietLog())
	conn, err := libvirt.NewConnect(testURI)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

var nextID atomic.Uint64

// addVM defines a domain of ours for a new record on the test driver,
// started or not, and hands the record to h in the given state.
func addVM(t *testing.T, h *Hypervisor, state ports.VMState, start bool) *record {
	t.Helper()
	id := fmt.Sprintf("%016x", uint64(time.Now().UnixNano())+nextID.Add(1))
	r := newRecord(id, string(state))
	conn := testConn(t)
	domXML := fmt.Sprintf(`<domain type='test'><name>%s</name><uuid>%s</uuid><memory>131072</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os>
<metadata><virtlet:vm xmlns:virtlet=%q id=%q createdBy="virtlet"/></metadata></domain>`, r.Spec.Name, r.Spec.UUID, MetadataNS, id)
	dom, err := conn.DomainDefineXML(domXML)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dom.Destroy()
		dom.Undefine()
		dom.Free()
	})
	if start {
		if err := dom.Create(); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records[id] = r
	if err := h.store.save(r); err != nil {
		t.Fatal(err)
	}
	return r
}

// uuidOf is a domain's UUID as the records hold it.
func uuidOf(d *libvirt.Domain) string {
	u, _ := d.GetUUIDString()
	return strings.ToLower(u)
}

// slowDomain makes libvirt hang when asked about r's domain, after it
// answered the first `answers` questions; it returns a channel that tells
// when a call hangs, and a function that releases the hung calls.
func slowDomain(h *Hypervisor, r *record, answers int32) (hung <-chan struct{}, release func()) {
	entered := make(chan struct{}, 16)
	released := make(chan struct{})
	var calls atomic.Int32
	h.domainState = func(d *libvirt.Domain) (libvirt.DomainState, int, error) {
		if uuidOf(d) == r.Spec.UUID && calls.Add(1) > answers {
			entered <- struct{}{}
			<-released
		}
		return d.GetState()
	}
	var once atomic.Bool
	return entered, func() {
		if once.CompareAndSwap(false, true) {
			close(released)
		}
	}
}

// quick fails the test when call does not return within a second.
func quick(t *testing.T, what string, call func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(time.Second):
		t.Fatalf("%s waited for a slow libvirt call about another VM", what)
	}
}

// Stop asks libvirt about its VM without holding the adapter's lock: a
// libvirtd slow to answer about one VM does not hold up calls about
// others.
func TestSlowStopDoesNotHoldUpOtherVMs(t *testing.T) {
	h := configured(t, t.TempDir(), quietLog())
	// A's stop event is on its way: its domain is off, its record running.
	a := addVM(t, h, ports.VMRunning, false)
	b := addVM(t, h, ports.VMDefined, false)
	// libvirtd answers Stop's first question about A, then hangs.
	hung, release := slowDomain(h, a, 1)
	defer release()
	stopped := make(chan error, 1)
	go func() {
		_, err := h.Stop(context.Background(), a.Spec.ID, 0)
		stopped <- err
	}()
	var err error
	select {
	case <-hung:
		quick(t, "Status of another VM", func() error {
			_, err := h.Status(context.Background(), b.Spec.ID)
			return err
		})
		quick(t, "List", func() error {
			_, err := h.List(context.Background())
			return err
		})
		release()
		err = <-stopped
	case err = <-stopped:
	}
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := h.Status(context.Background(), a.Spec.ID); st.State != ports.VMStopped {
		t.Fatalf("A after Stop: %+v", st)
	}
}

// Taking up the VMs after (re)connecting asks libvirt about each without
// holding the adapter's lock.
func TestSlowResumeDoesNotHoldUpOtherVMs(t *testing.T) {
	h := configured(t, t.TempDir(), quietLog())
	a := addVM(t, h, ports.VMRunning, false)
	b := addVM(t, h, ports.VMDefined, false)
	hung, release := slowDomain(h, a, 0)
	defer release()
	resumed := make(chan struct{})
	go func() {
		h.events.resume()
		close(resumed)
	}()
	<-hung
	quick(t, "Status of another VM", func() error {
		_, err := h.Status(context.Background(), b.Spec.ID)
		return err
	})
	release()
	<-resumed
	if st, _ := h.Status(context.Background(), a.Spec.ID); st.State != ports.VMStopped {
		t.Fatalf("A after resume: %+v", st)
	}
}

// After libvirtd went away, the adapter releases the dead connection and
// its callbacks before using a new one: events then arrive once, not once
// per connection the adapter ever had.
func TestReconnectReleasesTheOldConnection(t *testing.T) {
	startEventLoop(quietLog())
	h := New(quietLog())
	h.stateDir = t.TempDir()
	h.conn.configure(testURI)
	if err := h.conn.connect(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.close)
	// The test reads the raw events: it stands in for the dispatcher,
	// whose resynchronisations (after reconnecting) it answers at once.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case done := <-h.events.resyncs:
				if done != nil {
					close(done)
				}
			case <-stop:
				return
			}
		}
	}()
	for range 3 {
		old, _ := h.conn.current()
		h.conn.onClose(old, libvirt.CONNECT_CLOSE_REASON_EOF)
		deadline := time.Now().Add(10 * time.Second)
		for {
			h.conn.mu.Lock()
			now := h.conn.open
			h.conn.mu.Unlock()
			if now != nil && now != old {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no new connection")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Closing what the adapter closed is an error: a connection freed.
		if refs, err := old.Close(); err == nil {
			t.Fatalf("the old connection was still open (%d references left after one more close)", refs)
		}
	}
	// One lifecycle event, seen once.
	for len(h.events.queued) > 0 {
		<-h.events.queued
	}
	conn := testConn(t)
	dom, err := conn.DomainDefineXML(`<domain type='test'><name>virtlet-reconnect-test</name><memory>131072</memory><vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os></domain>`)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		dom.Destroy()
		dom.Undefine()
		dom.Free()
	}()
	uuid := uuidOf(dom)
	if err := dom.Create(); err != nil {
		t.Fatal(err)
	}
	started := 0
	timeout := time.After(time.Second)
	for done := false; !done; {
		select {
		case e := <-h.events.queued:
			if strings.EqualFold(e.uuid, uuid) && e.kind == libvirt.DOMAIN_EVENT_STARTED {
				started++
			}
		case <-timeout:
			done = true
		}
	}
	if started != 1 {
		t.Fatalf("one domain start reached the adapter %d times", started)
	}
}

// While libvirt cannot say what a VM does (libvirtd died during the stop),
// Stop does not report the VM stopped: it fails as unavailable, and the
// record stays running, so that the caller retries.
func TestStopNeverReportsAVMItCannotSeeAsStopped(t *testing.T) {
	h := configured(t, t.TempDir(), quietLog())
	a := addVM(t, h, ports.VMRunning, true)
	var calls atomic.Int32
	h.domainState = func(d *libvirt.Domain) (libvirt.DomainState, int, error) {
		if uuidOf(d) == a.Spec.UUID && calls.Add(1) > 1 {
			return 0, 0, libvirt.Error{Code: libvirt.ERR_SYSTEM_ERROR, Domain: libvirt.FROM_RPC, Message: "Cannot recv data: Connection reset by peer"}
		}
		return d.GetState()
	}
	// The test driver ignores ACPI: the stop waits for the VM to go until
	// the caller gives up, with the VM unseen all along.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	st, err := h.Stop(ctx, a.Spec.ID, time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop while libvirt cannot see the VM: %+v, %v", st, err)
	}
	if st, _ := h.Status(context.Background(), a.Spec.ID); st.State != ports.VMRunning {
		t.Fatalf("the record after a stop libvirt could not confirm: %+v", st)
	}
}

// A plugin killed in the middle of Define leaves the VM's overlay (and
// perhaps its console log and a half-written record) with no record naming
// them; the core's undo, an Undefine of a VM the plugin does not know,
// removes them, and nothing of another VM.
func TestUndefineRemovesWhatAnInterruptedDefineLeft(t *testing.T) {
	h := configured(t, t.TempDir(), quietLog())
	id := strings.Repeat("ab", 32)
	other := addVM(t, h, ports.VMDefined, false)
	left := []string{
		filepath.Join(h.vmDir, id+"-root.qcow2"),
		filepath.Join(h.vmDir, id+".console"),
		filepath.Join(h.vmDir, id+".console.1"),
		h.store.path(id) + atomicfile.TempSuffix,
	}
	kept := []string{filepath.Join(h.vmDir, other.Spec.ID+"-root.qcow2"), h.store.path(other.Spec.ID)}
	for _, p := range append(left, kept...) {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
			t.Fatal(err)
		}
	}
	if err := h.Undefine(context.Background(), id); !errors.Is(err, ports.ErrNotFound) {
		t.Fatalf("Undefine of a VM without record or domain: %v", err)
	}
	for _, p := range left {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left: %v", p, err)
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("another VM's %s: %v", p, err)
		}
	}
	if err := h.Undefine(context.Background(), "../../etc"); !errors.Is(err, ports.ErrInvalidArgument) {
		t.Errorf("Undefine of a bad ID: %v", err)
	}
}

// A node short of space (keepFreeSpace) makes no more overlays, naming
// the bound, and leaves no file.
func TestOverlayKeepsFreeSpace(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "16M").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	overlay := filepath.Join(dir, "vm-root.qcow2")
	_, err := createOverlay(context.Background(), overlay, ports.DiskOverlay{BasePath: base, BaseFormat: "qcow2", KeepFreeBytes: 1 << 62}, "root")
	if !errors.Is(err, ports.ErrUnavailable) || !strings.Contains(err.Error(), "the node keeps 4611686018427387904 free (keepFreeSpace)") {
		t.Fatalf("err %v", err)
	}
	if _, err := os.Stat(overlay); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused overlay exists: %v", err)
	}
	if _, err := createOverlay(context.Background(), overlay, ports.DiskOverlay{BasePath: base, BaseFormat: "qcow2", KeepFreeBytes: 1 << 20}, "root"); err != nil {
		t.Fatal(err)
	}
}

// A VM's root overlay holds what the guest writes: root's alone until
// libvirt hands it to QEMU's user for the VM's run.
func TestOverlayIsPrivate(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "16M").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	overlay := filepath.Join(dir, "vm-root.qcow2")
	if _, err := createOverlay(context.Background(), overlay, ports.DiskOverlay{BasePath: base, BaseFormat: "qcow2"}, "root"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(overlay); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("overlay mode %v %v, want 0600", st.Mode(), err)
	}
}
