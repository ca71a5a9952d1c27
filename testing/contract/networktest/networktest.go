// Package networktest is the contract every ports.Network must meet.
package networktest

import (
	"context"
	"net"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

// Run checks the contract against n.
func Run(t *testing.T, n ports.Network) {
	ctx := context.Background()
	r, err := n.Ready(ctx)
	if err != nil || !r.Ready {
		t.Fatalf("Ready %+v %v", r, err)
	}
	req := func(id string) ports.NetworkRequest {
		return ports.NetworkRequest{SandboxID: id, PodName: "p-" + id, PodNamespace: "ns", PodUID: "uid-" + id}
	}
	a, err := n.Setup(ctx, req("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.Setup(ctx, req("b"))
	if err != nil {
		t.Fatal(err)
	}
	addr := func(att ports.NetworkAttachment) string {
		if len(att.Interfaces) == 0 || len(att.Interfaces[0].IPs) == 0 {
			t.Fatalf("attachment without an address: %+v", att)
		}
		ip, _, err := net.ParseCIDR(att.Interfaces[0].IPs[0].Address)
		if err != nil {
			t.Fatalf("address %q is not CIDR: %v", att.Interfaces[0].IPs[0].Address, err)
		}
		if _, err := net.ParseMAC(att.Interfaces[0].MAC); err != nil {
			t.Fatalf("MAC %q: %v", att.Interfaces[0].MAC, err)
		}
		return ip.String()
	}
	if addr(a) == addr(b) {
		t.Fatal("two pods got one address")
	}
	for _, id := range []string{"a", "b", "a"} { // teardown is idempotent
		if err := n.Teardown(ctx, req(id)); err != nil {
			t.Fatalf("teardown %s: %v", id, err)
		}
	}
}
