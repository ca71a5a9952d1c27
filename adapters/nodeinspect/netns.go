package nodeinspect

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/virtlet/virtlet/ports"
)

// netnsList lists the named network namespaces (`ip netns list`), marking
// those of Virtlet's pods, then Virtlet's pods' namespaces kept elsewhere.
func netnsList(dir string, pods []ports.PodNetNS) (string, error) {
	podOf := map[string]string{}
	for _, p := range pods {
		podOf[filepath.Clean(p.Path)] = p.Pod
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# network namespaces in %s; Virtlet's pods' name their pod\n", dir)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		err = fmt.Errorf("list network namespaces: %w", err)
	} else {
		err = nil
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, name := range names {
		path := filepath.Join(dir, name)
		b.WriteString(name)
		if pod, ok := podOf[path]; ok {
			fmt.Fprintf(&b, "\tpod %s", pod)
			delete(podOf, path)
		}
		b.WriteString("\n")
	}
	if len(podOf) > 0 {
		b.WriteString("# Virtlet's pods' network namespaces elsewhere\n")
		paths := make([]string, 0, len(podOf))
		for path := range podOf {
			paths = append(paths, path)
		}
		sort.Strings(paths)
		for _, path := range paths {
			fmt.Fprintf(&b, "%s\tpod %s\n", path, podOf[path])
		}
	}
	return b.String(), err
}
