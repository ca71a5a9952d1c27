package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

func newSSH(k *kube, name string) *cobra.Command {
	var identity string
	var port int
	cmd := &cobra.Command{
		Use:   "ssh [flags] [user@]POD [-- SSH-ARGS...]",
		Short: "Open an ssh session to a VM pod's VM through a port-forward",
		Long: `ssh forwards a local port to port 22 of the VM (through the API server, as
kubectl port-forward does) and runs your ssh client against it. The VM's
sshd must accept your key: the pod's VirtletSSHKeys / VirtletSSHKeySource
annotations put public keys into the VM. Without -i, virtletctl picks the
private key in ~/.ssh whose .pub is one of the pod's keys (any file name),
and warns when none is (ssh then tries your agent's keys). Without user@,
ssh uses your local user name. Arguments after -- go to ssh (options, then a command).
Host keys are not checked: a VM pod's host key is new with every pod.`,
		Example: "  " + name + " ssh debian@my-vm -i ~/.ssh/vm_key\n  " + name + " ssh -n prod root@db-0 -- uptime",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			user, podName, err := splitTarget(args[0])
			if err != nil {
				return err
			}
			if identity != "" {
				if _, err := os.Stat(identity); err != nil {
					return fmt.Errorf("-i %s: %w", identity, err)
				}
			}
			sshBin, err := exec.LookPath("ssh")
			if err != nil {
				return errors.New("the ssh client is not installed (Debian: apt-get install openssh-client)")
			}
			ctx := cmd.Context()
			pod, err := k.vmPod(ctx, podName)
			if err != nil {
				return err
			}
			local, stop, err := k.forward(ctx, pod, port)
			if err != nil {
				return err
			}
			defer stop()
			dest := "127.0.0.1"
			if user != "" {
				dest = user + "@" + dest
			}
			sshArgs := []string{"-p", strconv.Itoa(local), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
				"-o", "LogLevel=ERROR", "-o", "HostKeyAlias=" + pod.Namespace + "/" + pod.Name}
			keys, note := k.podKeys(ctx, pod)
			if note != "" {
				fmt.Fprintln(os.Stderr, "virtletctl ssh:", note)
			}
			sshDir := ""
			if home, err := os.UserHomeDir(); err == nil {
				sshDir = filepath.Join(home, ".ssh")
			}
			if id := chooseIdentity(identity, sshDir, keys, func(msg string) { fmt.Fprintln(os.Stderr, "virtletctl ssh:", msg) }); id != "" {
				sshArgs = append(sshArgs, "-i", id)
			}
			sshArgs = append(append(sshArgs, dest), args[1:]...)
			run := exec.CommandContext(ctx, sshBin, sshArgs...)
			run.Stdin, run.Stdout, run.Stderr = os.Stdin, os.Stdout, os.Stderr
			if err := run.Run(); err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					return exitError{ee.ExitCode()}
				}
				return fmt.Errorf("run ssh: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&identity, "identity", "i", "", "private key file for ssh (default: the key in ~/.ssh that the pod accepts, else ssh's own choice)")
	cmd.Flags().IntVar(&port, "port", 22, "the VM's ssh port")
	return cmd
}

// splitTarget splits [user@]pod.
func splitTarget(s string) (user, pod string, err error) {
	if i := strings.LastIndex(s, "@"); i >= 0 {
		user, pod = s[:i], s[i+1:]
		if user == "" {
			return "", "", fmt.Errorf("%q: empty user name before @ (want [user@]pod)", s)
		}
	} else {
		pod = s
	}
	if pod == "" {
		return "", "", fmt.Errorf("%q: no pod name (want [user@]pod)", s)
	}
	return user, pod, nil
}

// forward opens a port-forward from a free local port to the pod's port
// and returns the local port; stop ends it.
func (k *kube) forward(ctx context.Context, pod *corev1.Pod, remote int) (int, func(), error) {
	transport, upgrader, err := spdy.RoundTripperFor(k.config)
	if err != nil {
		return 0, nil, err
	}
	url := k.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	stopCh, readyCh := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(remote)}, stopCh, readyCh, io.Discard, os.Stderr)
	if err != nil {
		return 0, nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	select {
	case <-readyCh:
	case err := <-errc:
		return 0, nil, fmt.Errorf("port-forward to %s/%s: %w", pod.Namespace, pod.Name, err)
	case <-ctx.Done():
		close(stopCh)
		return 0, nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) == 0 {
		close(stopCh)
		return 0, nil, fmt.Errorf("port-forward to %s/%s: no local port: %v", pod.Namespace, pod.Name, err)
	}
	var once bool
	return int(ports[0].Local), func() {
		if !once {
			once = true
			close(stopCh)
		}
	}, nil
}
