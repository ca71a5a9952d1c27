// Command virtlet-installer makes a Kubernetes node a Virtlet node and
// back: the entrypoint of the node image that deploy/installer-daemonset.yaml
// runs, privileged, with the host's root at /host, on every node labelled
// extraRuntime=virtlet.
//
// Started, it copies the tree `make install` staged into the image onto
// the host, recording every file it writes and keeping a copy of each it
// replaces; points the daemon's forwardRuntime at the runtime kubelet uses
// now (so container pods keep running there); starts virtlet.service
// through the host's systemd; and points kubelet's KubeletConfiguration at
// the daemon (containerRuntimeEndpoint, PodAndContainerStatsFromCRI) and
// restarts kubelet. Then it waits. On SIGTERM (the DaemonSet or its pod
// deleted) it undoes exactly what it recorded, kubelet first: the node is a
// containerd node again, and nothing of Virtlet is left on it.
//
//	virtlet-installer            install, wait for SIGTERM, uninstall
//	virtlet-installer status     exit 0 when the node is installed (readiness)
//	virtlet-installer uninstall  undo a recorded install
//	virtlet-installer --version
//
// Settings come from the environment (the DaemonSet's env):
//
//	VIRTLET_HOST_ROOT       where the host's / is mounted (/host)
//	KUBELET_CONFIG          kubelet's KubeletConfiguration file on the host (/var/lib/kubelet/config.yaml)
//	KUBELET_KUBECONFIG      kubelet's kubeconfig on the host, which the daemon reads the cluster with (/etc/kubernetes/kubelet.conf)
//	VIRTLET_HOST_SYSTEMCTL  the host's systemctl, run with the host's root as / (systemctl)
//	VIRTLET_INSTALL_PREFIX  a directory of the host every Virtlet file goes below ("", the real places; tests set it)
//	VIRTLET_STAGE           the staged tree in the image (/opt/virtlet/stage)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	log "github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/plugins/buildinfo"
)

func main() {
	log.SetFormatter(&log.TextFormatter{FullTimestamp: true})
	cmd := "run"
	if len(os.Args) > 1 {
		cmd = os.Args[1]
	}
	in := fromEnv()
	ctx := context.Background()
	switch cmd {
	case "--version", "version":
		fmt.Println("virtlet-installer", buildinfo.Version())
	case "run":
		os.Exit(run(ctx, in))
	case "status":
		rec, err := in.load()
		if err != nil || rec == nil || !rec.Complete {
			fmt.Fprintln(os.Stderr, "virtlet-installer: the node is not installed", err)
			os.Exit(1)
		}
		fmt.Println("installed", rec.Version)
	case "uninstall":
		rec, err := in.load()
		if err != nil {
			log.Fatal(err)
		}
		if rec == nil {
			log.Info("nothing recorded: nothing to undo")
			return
		}
		if err := in.uninstall(ctx, rec); err != nil {
			log.Fatal(err)
		}
	default:
		fmt.Fprintf(os.Stderr, "virtlet-installer: unknown command %q (want run, status, uninstall or --version)\n", cmd)
		os.Exit(2)
	}
}

// run installs, waits for SIGTERM and uninstalls; its result is the
// process's exit status.
func run(ctx context.Context, in *installer) int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	if err := in.install(ctx); err != nil {
		log.WithError(err).Error("install failed; what it did is undone")
		return 1
	}
	log.WithField("version", buildinfo.Version()).Info("this node runs Virtlet; waiting for SIGTERM to uninstall")
	sig := <-term
	log.WithField("signal", sig.String()).Info("uninstalling")
	rec, err := in.load()
	if err != nil {
		log.WithError(err).Error("read the install record")
		return 1
	}
	if rec == nil {
		log.Warn("no install record: nothing to undo")
		return 0
	}
	if err := in.uninstall(ctx, rec); err != nil {
		log.WithError(err).Error("uninstall incomplete")
		return 1
	}
	log.Info("uninstalled: kubelet is back on its runtime, Virtlet's files are gone")
	return 0
}

func fromEnv() *installer {
	get := func(key, def string) string {
		if v := os.Getenv(key); v != "" {
			return v
		}
		return def
	}
	return &installer{
		chroot:            true,
		hostRoot:          get("VIRTLET_HOST_ROOT", "/host"),
		prefix:            strings.TrimRight(os.Getenv("VIRTLET_INSTALL_PREFIX"), "/"),
		stage:             get("VIRTLET_STAGE", "/opt/virtlet/stage"),
		kubeletConfig:     get("KUBELET_CONFIG", "/var/lib/kubelet/config.yaml"),
		kubeletKubeconfig: get("KUBELET_KUBECONFIG", "/etc/kubernetes/kubelet.conf"),
		systemctl:         strings.Fields(get("VIRTLET_HOST_SYSTEMCTL", "systemctl")),
		version:           buildinfo.Version(),
	}
}
