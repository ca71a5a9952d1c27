package main

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/virtlet/virtlet/adapters/vmtools"
)

func newVNC(k *kube, name string) *cobra.Command {
	var address, novncDir string
	var web bool
	cmd := &cobra.Command{
		Use:   "vnc [flags] POD [PORT]",
		Short: "Forward a VM pod's VNC display to a local port",
		Long: `vnc listens on a local port and connects each VNC viewer that connects to it
to the VM's graphical console. The display listens on the node's loopback,
out of reach of kubectl port-forward (which reaches the pod's address), so
each connection goes through the pod's exec subresource to the daemon on the
VM's node, which connects it to the display. Stop with Ctrl-C.

With --web it serves noVNC (Debian's novnc package) instead, and prints the
URL of a page that shows the display in a browser; it ends when the page is
closed. The page and its WebSocket are under a random path that only the URL
names.`,
		Example: "  " + name + " vnc my-vm\n  " + name + " vnc my-vm 5901   # as Virtlet's: 127.0.0.1:5901; then: vncviewer 127.0.0.1::5901\n  " +
			name + " vnc my-vm --address 0.0.0.0:5901\n  " + name + " vnc my-vm --web   # open the printed URL in a browser",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			address, err := vncListenAddress(args[1:], address, cmd.Flags().Changed("address"))
			if err != nil {
				return err
			}
			pod, err := k.vmPod(ctx, args[0])
			if err != nil {
				return err
			}
			l, err := net.Listen("tcp", address)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", address, err)
			}
			defer l.Close()
			if web {
				w, err := newVNCWeb(k, pod, novncDir)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "VNC display of pod %s/%s in a browser: %s\n", pod.Namespace, pod.Name, w.url(l.Addr()))
				return w.serve(ctx, l)
			}
			go func() { <-ctx.Done(); l.Close() }()
			fmt.Fprintf(cmd.OutOrStdout(), "VNC display of pod %s/%s at %s (vncviewer %s)\n", pod.Namespace, pod.Name, l.Addr(), vncviewerAddress(l.Addr()))
			for {
				conn, err := l.Accept()
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				go func() {
					defer conn.Close()
					if err := k.exec(ctx, pod, []string{vmtools.VNC}, conn, conn, nil); err != nil {
						fmt.Fprintf(os.Stderr, "VNC connection from %s: %v\n", conn.RemoteAddr(), err)
					}
				}()
			}
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1:0", "local address to listen on (port 0: a free port)")
	cmd.Flags().BoolVar(&web, "web", false, "serve the display as a web page (noVNC) and print its URL; end when the page closes")
	cmd.Flags().StringVar(&novncDir, "novnc-dir", DefaultNoVNCDir, "noVNC's directory, for --web")
	return cmd
}

// vncListenAddress is where vnc listens: the loopback port given after the
// pod (Virtlet's form), else the --address flag.
func vncListenAddress(port []string, address string, addressSet bool) (string, error) {
	if len(port) == 0 {
		return address, nil
	}
	if addressSet {
		return "", fmt.Errorf("give the local port either after the pod or as --address, not both")
	}
	n, err := strconv.ParseUint(port[0], 10, 16)
	if err != nil {
		return "", fmt.Errorf("local port %q: want a number from 0 to 65535 (0: a free port)", port[0])
	}
	return net.JoinHostPort("127.0.0.1", strconv.FormatUint(n, 10)), nil
}

// vncviewerAddress writes host::port, the form VNC viewers take for a
// port (host:N means display N, port 5900+N).
func vncviewerAddress(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return fmt.Sprintf("%s::%d", ta.IP, ta.Port)
	}
	return a.String()
}
