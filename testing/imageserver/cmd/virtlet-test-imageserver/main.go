// Command virtlet-test-imageserver serves a directory of VM images over
// HTTPS on loopback, with a certificate from a fresh CA written to
// --ca-dir, for the demo and manual tests.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/virtlet/virtlet/testing/imageserver"
)

func main() {
	dir := flag.String("dir", ".", "directory to serve")
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on")
	caDir := flag.String("ca-dir", ".", "where to write image-server-ca.pem")
	flag.Parse()
	s, err := imageserver.Start(*dir, *addr, *caDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image server:", err)
		os.Exit(1)
	}
	fmt.Println(s.Host)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	s.Close()
}
