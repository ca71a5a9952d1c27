// Command virtlet-plugin-ceph is the volume plugin of Virtlet's ceph
// flexvolumes (Ceph RBD images through go-ceph), shipped with Virtlet.
// Build it with the go-ceph tag of the node's Ceph release (pacific for
// Debian 12's Ceph 16).
package main

import (
	"github.com/virtlet/virtlet/adapters/volume/ceph"
	"github.com/virtlet/virtlet/plugins/sdk"
)

func main() { sdk.Serve(ceph.New(sdk.Log)) }
