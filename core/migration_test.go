package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// migrateFrom is a receiving pod's VirtletMigrateFrom.
func migrateFrom(t *testing.T, src annotations.MigrationSource) map[string]string {
	t.Helper()
	b, err := json.Marshal(src)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{annotations.MigrateFrom: string(b)}
}

var source = annotations.MigrationSource{Pod: "default/src", UID: "uid-src", Node: "node-1",
	Domain: "virtlet-0123456789ab-src", UUID: "9b1f4a52-5a6e-4c3e-9d55-3a4f0c2b1e7d", MACs: []string{"52:54:00:aa:bb:cc"}}

func offerOf(src annotations.MigrationSource, receiving string) ports.MigrationOffer {
	return ports.MigrationOffer{ReceivingPodUID: receiving, SourcePod: src.Pod, SourcePodUID: src.UID,
		VM: ports.VMIncoming{Name: src.Domain, UUID: src.UUID}}
}

func TestAReceivingPodTakesOnlyTheVMItsAnnotationNames(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "recv", migrateFrom(t, source))
	id := e.createVM(t, sb)
	c, err := e.rt.ContainerStatus(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if in := c.Spec.Incoming; in == nil || in.Name != source.Domain || in.UUID != source.UUID {
		t.Fatalf("the receiving VM's spec waits for %+v, want %s %s", c.Spec.Incoming, source.Domain, source.UUID)
	}
	if mac := c.Spec.NICs[0].MAC; mac != source.MACs[0] {
		t.Errorf("the receiving VM's NIC has the MAC %s, want the migrating guest's %s", mac, source.MACs[0])
	}
	if got := e.net.Active[sb].Interfaces[0].MAC; got != source.MACs[0] {
		t.Errorf("the pod's network serves the MAC %s, want %s", got, source.MACs[0])
	}

	// Offers of another node, pod or VM are refused, naming both.
	for name, tc := range map[string]struct {
		from  string
		offer func(*ports.MigrationOffer)
	}{
		"another node":  {"node-3", func(*ports.MigrationOffer) {}},
		"another pod":   {"node-1", func(o *ports.MigrationOffer) { o.SourcePod = "default/other" }},
		"another UID":   {"node-1", func(o *ports.MigrationOffer) { o.SourcePodUID = "uid-other" }},
		"another VM":    {"node-1", func(o *ports.MigrationOffer) { o.VM.Name = "virtlet-ffffffffffff-other" }},
		"another UUID":  {"node-1", func(o *ports.MigrationOffer) { o.VM.UUID = "00000000-0000-4000-8000-000000000000" }},
		"another pod's": {"node-1", func(o *ports.MigrationOffer) { o.ReceivingPodUID = "uid-nobody" }},
	} {
		o := offerOf(source, "uid-recv")
		tc.offer(&o)
		if _, err := e.rt.ReceiveMigration(ctx, tc.from, o); err == nil {
			t.Errorf("%s: an offer from %s of %+v was accepted", name, tc.from, o)
		} else if name == "another pod's" && !errors.Is(err, ports.ErrNotFound) {
			t.Errorf("an offer for a pod that is not here: %v, want ErrNotFound (the sender retries)", err)
		} else if name == "another node" && !strings.Contains(err.Error(), "not the VM "+source.Domain+" of pod default/src on node node-3") {
			t.Errorf("an offer from node-3: %v", err)
		}
	}

	in, err := e.rt.ReceiveMigration(ctx, "node-1", offerOf(source, "uid-recv"))
	if err != nil || in.Endpoint.DomainXML == "" || in.Domain != source.Domain {
		t.Fatalf("the named VM's offer: %v (%+v)", err, in)
	}
	if _, err := in.Check(ctx, "<domain><name>virtlet-ffffffffffff-other</name></domain>"); err == nil {
		t.Error("the definition of another domain passed the receiving VM's check")
	}
	if x, err := in.Check(ctx, in.Endpoint.DomainXML); err != nil || x == "" {
		t.Errorf("the receiving VM's own definition: %q, %v", x, err)
	}
	done := in.Done
	if _, err := e.rt.ReceiveMigration(ctx, "node-1", offerOf(source, "uid-recv")); !errors.Is(err, ports.ErrAlreadyExists) {
		t.Errorf("a second offer while the first runs: %v, want ErrAlreadyExists", err)
	}
	started := make(chan error, 1)
	go func() { started <- e.rt.StartContainer(ctx, id) }()
	select {
	case err := <-started:
		t.Fatalf("StartContainer returned (%v) before the migration ended", err)
	case <-time.After(100 * time.Millisecond):
	}
	done(nil)
	if err := <-started; err != nil {
		t.Fatalf("StartContainer after the migration: %v", err)
	}
	if c, _ := e.rt.ContainerStatus(ctx, id); c.State != core.ContainerRunning {
		t.Errorf("the receiving container is %s, want running", c.State)
	}
}

func TestAFailedMigrationFailsTheReceivingStart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "recv", migrateFrom(t, source))
	id := e.createVM(t, sb)
	in, err := e.rt.ReceiveMigration(ctx, "node-1", offerOf(source, "uid-recv"))
	if err != nil {
		t.Fatal(err)
	}
	in.Done(errors.New("node node-1's daemon went away during the migration"))
	err = e.rt.StartContainer(ctx, id)
	if err == nil || !strings.Contains(err.Error(), "went away") || !strings.Contains(err.Error(), "runs on at its source") {
		t.Errorf("StartContainer after a failed migration: %v", err)
	}
}

func TestAReceivingPodRefusesWhatAMigrationDoesNotMove(t *testing.T) {
	e := newEnv(t)
	img := e.pull(t)
	two := source
	two.MACs = append(two.MACs, "52:54:00:aa:bb:cd")
	sb := e.runPod(t, "two-nics", migrateFrom(t, two))
	_, err := e.rt.CreateContainer(context.Background(), sb, vmContainer(img))
	if err == nil || !strings.Contains(err.Error(), "annotation VirtletMigrateFrom") || !strings.Contains(err.Error(), "2 NIC MACs") {
		t.Errorf("a receiving pod with one interface for two MACs: %v", err)
	}
	sb = e.runPod(t, "uefi", map[string]string{annotations.MigrateFrom: migrateFrom(t, source)[annotations.MigrateFrom], annotations.Firmware: "uefi"})
	_, err = e.rt.CreateContainer(context.Background(), sb, vmContainer(img))
	if err == nil || !strings.Contains(err.Error(), "VirtletFirmware: uefi") || !errors.Is(err, ports.ErrFailedPrecondition) {
		t.Errorf("a UEFI receiving pod: %v", err)
	}
}

// peers is a sending daemon's link that accepts every offer.
type peers struct {
	offers []ports.MigrationOffer
	to     []ports.MigrationPeer
	ended  []error
}

func (p *peers) Offer(ctx context.Context, to ports.MigrationPeer, o ports.MigrationOffer, _ *ports.ProcessIdentity) (ports.MigrationSession, error) {
	p.offers, p.to = append(p.offers, o), append(p.to, to)
	return session{p}, nil
}

type session struct{ p *peers }

func (s session) Endpoint() ports.MigrationEndpoint {
	return ports.MigrationEndpoint{DomainXML: "<domain/>"}
}
func (s session) Finish(err error) { s.p.ended = append(s.p.ended, err) }

func TestAMigratedVMEndsItsPod(t *testing.T) {
	e := newEnv(t)
	p := &peers{}
	e.peers = p
	e.start(t)
	ctx := context.Background()
	sb, id := e.runningVM(t, "src")
	src, err := e.rt.MigrationSource(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if src.Pod != "default/src" || src.UID != "uid-src" || len(src.MACs) != 1 {
		t.Errorf("MigrationSource: %+v", src)
	}
	st, err := e.rt.MigrateVM(ctx, id, ports.MigrationPeer{Node: "node-2", Address: "198.18.0.12"}, "uid-recv")
	if err != nil {
		t.Fatal(err)
	}
	if st.Downtime != 50*time.Millisecond || len(p.offers) != 1 || p.offers[0].ReceivingPodUID != "uid-recv" || p.offers[0].VM.Name != src.Domain ||
		len(p.ended) != 1 || p.ended[0] != nil {
		t.Errorf("the migration: %+v; offers %+v; outcomes %v", st, p.offers, p.ended)
	}
	c, _ := e.rt.ContainerStatus(ctx, id)
	if c.State != core.ContainerExited || c.Reason != ports.ReasonMigrated || c.ExitCode != 0 || !strings.Contains(c.Message, "node-2") {
		t.Errorf("the source container: %s %s (%d) %q, want exited Migrated (0) naming node-2", c.State, c.Reason, c.ExitCode, c.Message)
	}
	if _, err := e.rt.CreateContainer(ctx, sb, core.ContainerConfig{Name: "vm", Attempt: 1, Image: c.Image.ID, UserImage: testImage, LogPath: "vm/1.log"}); err == nil ||
		!strings.Contains(err.Error(), "moved to another node by live migration") {
		t.Errorf("a new container in the pod whose VM left: %v", err)
	}
}

func TestStoppingAReceivingPodEndsItsWait(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "recv", migrateFrom(t, source))
	id := e.createVM(t, sb)
	started := make(chan error, 1)
	go func() { started <- e.rt.StartContainer(ctx, id) }()
	time.Sleep(100 * time.Millisecond) // waiting, without the pod's lock
	if err := e.rt.StopSandbox(ctx, sb); err != nil {
		t.Fatalf("StopSandbox while the VM waits for its migration: %v", err)
	}
	select {
	case err := <-started:
		if err == nil || !strings.Contains(err.Error(), "the receiving pod was stopped") {
			t.Errorf("StartContainer of a stopped receiving pod: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("StartContainer still waits after its pod stopped")
	}
	if _, err := e.rt.ReceiveMigration(ctx, "node-1", offerOf(source, "uid-recv")); err == nil {
		t.Error("a stopped receiving pod accepted an offer")
	}
}

func TestAMigrationThatOutlivesStartContainerStillEndsInTheContainer(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "recv", migrateFrom(t, source))
	id := e.createVM(t, sb)
	in, err := e.rt.ReceiveMigration(ctx, "node-1", offerOf(source, "uid-recv"))
	if err != nil {
		t.Fatal(err)
	}
	// kubelet gives up on StartContainer before the migration ends.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := e.rt.StartContainer(short, id); err == nil {
		t.Fatal("StartContainer returned before the migration ended")
	}
	in.Done(nil)
	eventually(t, "the receiving container running with the arrived guest", func() bool {
		c, err := e.rt.ContainerStatus(ctx, id)
		return err == nil && c.State == core.ContainerRunning
	})
	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Errorf("kubelet's next StartContainer: %v", err)
	}
}
