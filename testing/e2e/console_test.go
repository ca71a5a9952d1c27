package e2e

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/harness"
)

// A console stream has a libvirt connection of its own: when libvirtd
// drops it (as it rarely does when a console opens on a stopping domain),
// the viewers see the console end and nothing else is lost — the plugin
// keeps its main connection and answers at once, and the next viewer gets
// a new stream. The console's connection is told apart from the plugin's
// others by libvirtd's own client list (virt-admin), before and after
// the console opens.
func TestAConsoleLosingItsConnection(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	dir := harness.VMDir(t)
	p := libvirtPluginUnderTest(t, dir, "")
	hv := p.host.Hypervisor()
	co, ok := hv.(ports.ConsoleOpener)
	if !ok {
		t.Fatal("the libvirt plugin's hypervisor opens no console")
	}
	id := fmt.Sprintf("%064x", time.Now().UnixNano())
	spec := tinyVMSpec(dir, id, "console")
	spec.UUID, spec.RunAs = uuid.NewString(), p.runAs(0)
	if err := hv.Define(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		hv.Stop(context.Background(), id, 0)
		hv.Undefine(context.Background(), id)
	})
	if err := hv.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	pid := p.host.Supervisor("libvirt").Status().PID
	before := libvirtClientsOf(t, pid)

	v, err := co.OpenConsole(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	opened := newClients(libvirtClientsOf(t, pid), before)
	if len(opened) != 1 {
		t.Fatalf("opening the console made %d libvirt connections of the plugin (%v), want 1 of its own", len(opened), opened)
	}
	if out, err := exec.Command("virt-admin", "client-disconnect", "libvirtd", opened[0]).CombinedOutput(); err != nil {
		t.Fatalf("virt-admin client-disconnect %s: %v %s", opened[0], err, out)
	}

	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, v)
		ended <- err
	}()
	select {
	case err := <-ended:
		t.Logf("the viewer's console ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the viewer still reads a console whose connection libvirtd dropped")
	}
	// The plugin's other calls were not touched: they answer at once,
	// on the connection they had.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if st, err := hv.Status(sctx, id); err != nil || st.State != ports.VMRunning {
		t.Fatalf("Status after the console's connection dropped: %+v %v", st, err)
	}
	if log := p.log.String(); strings.Contains(log, "lost the libvirtd connection") {
		t.Fatalf("the plugin lost its main connection with the console's:\n%s", log)
	}
	// The next viewer gets a stream on a new connection, which goes when
	// the viewer leaves.
	again, err := co.OpenConsole(ctx, id)
	if err != nil {
		t.Fatalf("a console after the last one's connection dropped: %v", err)
	}
	if reopened := newClients(libvirtClientsOf(t, pid), before); len(reopened) != 1 || reopened[0] == opened[0] {
		t.Fatalf("the second console's connections %v (the first's: %s), want one new one", reopened, opened[0])
	}
	again.Close()
	deadline := time.Now().Add(10 * time.Second)
	for left := newClients(libvirtClientsOf(t, pid), before); len(left) > 0; left = newClients(libvirtClientsOf(t, pid), before) {
		if time.Now().After(deadline) {
			t.Fatalf("the console's connection %v stays open after its last viewer left", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// libvirtClientsOf lists the system libvirtd's clients (their ids) that
// the process pid connected.
func libvirtClientsOf(t *testing.T, pid int) []string {
	t.Helper()
	out, err := exec.Command("virt-admin", "client-list", "libvirtd").CombinedOutput()
	if err != nil {
		t.Fatalf("virt-admin client-list: %v %s", err, out)
	}
	var ids []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			continue // the header
		}
		info, err := exec.Command("virt-admin", "client-info", "libvirtd", f[0]).CombinedOutput()
		if err != nil {
			continue // gone meanwhile
		}
		for _, l := range strings.Split(string(info), "\n") {
			k, v, ok := strings.Cut(l, ":")
			if ok && strings.TrimSpace(k) == "unix_process_id" && strings.TrimSpace(v) == strconv.Itoa(pid) {
				ids = append(ids, f[0])
			}
		}
	}
	return ids
}

// newClients is what after holds that before did not.
func newClients(after, before []string) []string {
	var fresh []string
	for _, id := range after {
		if !slices.Contains(before, id) {
			fresh = append(fresh, id)
		}
	}
	return fresh
}
