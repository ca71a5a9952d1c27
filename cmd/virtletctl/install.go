package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"
)

// pluginName is the name kubectl finds its virtlet plugin by on PATH
// (kubectl-virt is KubeVirt's virtctl).
const pluginName = "kubectl-virtlet"

func newInstall(name string) *cobra.Command {
	return &cobra.Command{
		Use:   "install [DIR]",
		Short: "Install this binary as the kubectl plugin kubectl-virtlet",
		Long: `install copies this binary into DIR (default: ~/.local/bin) as ` + pluginName + `,
which kubectl runs for "kubectl virtlet ..." when DIR is on your PATH.
An earlier copy there is replaced.`,
		Example: "  " + name + " install\n  kubectl virtlet version --client",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := ""
			if len(args) == 1 {
				dir = args[0]
			} else {
				home, err := os.UserHomeDir()
				if err != nil {
					return fmt.Errorf("no home directory to install into (name a DIR): %w", err)
				}
				dir = filepath.Join(home, ".local", "bin")
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find this binary: %w", err)
			}
			target, err := installAs(self, dir)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "installed %s\n", target)
			if !onPath(dir) {
				fmt.Fprintf(cmd.OutOrStdout(), "%s is not on your PATH: add it for kubectl to find the plugin\n", dir)
			}
			return nil
		},
	}
}

// installAs copies the binary self into dir as the kubectl plugin, whole
// or not at all, and returns its path.
func installAs(self, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("install into %s: %w", dir, err)
	}
	target := filepath.Join(dir, pluginName)
	in, err := os.Open(self)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", self, err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(dir, "."+pluginName+"-*")
	if err != nil {
		return "", fmt.Errorf("install into %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return "", fmt.Errorf("install %s: %w", target, err)
	}
	return target, nil
}

// onPath reports whether dir is on the PATH.
func onPath(dir string) bool {
	abs, _ := filepath.Abs(dir)
	return slices.ContainsFunc(filepath.SplitList(os.Getenv("PATH")), func(p string) bool {
		q, _ := filepath.Abs(p)
		return q == abs
	})
}
