package cni

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/vishvananda/netns"
)

// NetNSDir is where named network namespaces are bind-mounted, as
// iproute2 and containerd do.
const NetNSDir = "/var/run/netns"

// createNetNS makes a named network namespace in NetNSDir. The thread
// that creates it ends inside it, so the work runs on a throwaway locked
// thread that exits with its goroutine.
func createNetNS(name string) (string, error) {
	path := filepath.Join(NetNSDir, name)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return "", fmt.Errorf("create network namespace %s: %w", path, err)
	}
	return path, nil
}

// deleteNetNS unmounts and removes a named network namespace; a missing
// one is not an error, nor is a file that was never mounted (a creation
// cut short by the plugin's death, between the file and its bind mount).
func deleteNetNS(name string) error {
	path := filepath.Join(NetNSDir, name)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	err := netns.DeleteNamed(name)
	if errors.Is(err, syscall.EINVAL) { // not a mount point
		err = os.Remove(path)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete network namespace %s: %w", name, err)
	}
	return nil
}

// inNetNS runs fn on a thread inside the namespace at path. The thread is
// thrown away afterwards, so no goroutine ever runs in the wrong namespace.
func inNetNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		h, err := netns.GetFromPath(path)
		if err != nil {
			errc <- fmt.Errorf("open network namespace %s: %w", path, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
