// Command virtlet-flexvolume-driver is Virtlet's flexvolume driver, which
// kubelet runs for volumes of driver virtlet/flexvolume_driver. Install it
// as <kubelet volume plugin dir>/virtlet~flexvolume_driver/flexvolume_driver
// (kubelet's default plugin dir is
// /usr/libexec/kubernetes/kubelet-plugins/volume/exec). It reaches the
// daemon on its admin socket: VIRTLET_ADMIN_SOCKET, or /run/virtlet/admin.sock.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/virtlet/virtlet/adapters/admin"
	"github.com/virtlet/virtlet/adapters/flexvolume"
	"github.com/virtlet/virtlet/plugins/buildinfo"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println("virtlet-flexvolume-driver", buildinfo.Version())
		return
	}
	socket := os.Getenv("VIRTLET_ADMIN_SOCKET")
	if socket == "" {
		socket = admin.DefaultSocket
	}
	var res flexvolume.Result
	client, err := admin.Dial(socket)
	if err != nil {
		res = flexvolume.Result{Status: flexvolume.Failure, Message: err.Error()}
	} else {
		defer client.Close()
		res = (&flexvolume.Driver{Daemon: client, Mounter: flexvolume.Tmpfs{}}).Run(os.Args[1:])
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	// kubelet reads the status from the JSON; the exit code says the same.
	if res.Status == flexvolume.Failure {
		os.Exit(1)
	}
}
