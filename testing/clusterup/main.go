// Command virtlet-cluster-up runs the test cluster of issue 28 for a
// person to try (make cluster-up): an API server, controller manager and
// scheduler on the host's address on a node bridge, and three Virtlet
// nodes (harness.Node: each its own network and mount namespaces,
// libvirtd, daemon, kubelet and kube-proxy; pod subnets routed by the
// host), with the tiny test guest as virtlet.cloud/tiny. It prints where
// the cluster's kubeconfig is, writes it to a file named by -ready, and
// runs until SIGTERM or SIGINT (make cluster-down), when it removes
// everything it made, as the tests' clean-ups do.
//
// Everything it makes carries its run's tag (VIRTLET_RUN, harness.RunEnv),
// and hostcheck leaves a running cluster's objects alone.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/virtlet/virtlet/testing/harness"
	"github.com/virtlet/virtlet/testing/imageserver"
)

func main() {
	ready := flag.String("ready", "", "file to write the cluster's kubeconfig path to once it is up")
	nodes := flag.Int("nodes", 3, "Virtlet nodes (1 to 9)")
	flag.Parse()
	if *nodes < 1 || *nodes > 9 {
		fmt.Fprintln(os.Stderr, "virtlet-cluster-up: -nodes must be 1 to 9")
		os.Exit(2)
	}
	t := &runner{name: "virtlet-cluster-up"}
	code := 0
	func() {
		defer func() {
			if r := recover(); r != nil && r != errFatal {
				panic(r)
			} else if r == errFatal {
				code = 1
			}
		}()
		kubeconfig := up(t, *nodes)
		fmt.Printf("cluster up: %d Virtlet nodes\n  export KUBECONFIG=%s\n  kubectl get nodes -o wide\n", *nodes, kubeconfig)
		if *ready != "" {
			if err := os.WriteFile(*ready, []byte(kubeconfig+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		signals := make(chan os.Signal, 1)
		signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
		fmt.Printf("cluster down on %s\n", <-signals)
	}()
	t.cleanUp()
	if t.failed {
		code = 1
	}
	os.Exit(code)
}

// up starts the cluster and returns its admin kubeconfig.
func up(t *runner, nodes int) string {
	bins := t.TempDir()
	build := map[string]string{}
	for k, v := range harness.ShippedPlugins {
		build[k] = v
	}
	fmt.Println("building the daemon and its plugins…")
	if err := harness.Build(bins, build); err != nil {
		t.Fatal(err)
	}
	tiny, err := harness.GuestImage("tiny")
	if err != nil {
		t.Fatal(err)
	}
	www := t.TempDir()
	if err := os.Symlink(tiny, filepath.Join(www, "tiny.qcow2")); err != nil {
		t.Fatal(err)
	}
	if err := harness.EnsureLibvirt(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("starting the control plane…")
	nodeNet, k := harness.StartCluster(t, 240)
	srv, err := imageserver.Start(www, nodeNet.HostIP+":0", www)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	translation, err := srv.Translation(map[string]string{"tiny": "tiny.qcow2"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < nodes; i++ {
		node, d := nodeNet.StartVirtletNode(t, bins, 241+i, translation)
		k.StartNodeKubelet(node, d)
		k.StartNodeKubeProxy(node)
		fmt.Printf("%s up: address %s, pods %s, daemon log %s\n", node.Name, node.IP, node.PodNet, d.LogFile)
	}
	return k.Kubeconfig
}
