package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtlet/virtlet/adapters/vmtools"
)

func newDiag(k *kube, name string) *cobra.Command {
	diag := &cobra.Command{Use: "diag", Short: "Collect diagnostics of VM pods and their nodes' daemons"}
	var asJSON, all bool
	dump := &cobra.Command{
		Use:   "dump [flags] [DIR]",
		Short: "Dump the diagnostics of the VM pods in the namespace",
		Long: `dump asks the daemon on each running VM pod's node, through the pod's exec
subresource, for: the daemon's version and status, its plugins with their
versions and health, the VM's live domain XML, the plugins' recent log lines
about that pod, the daemon's records of the pod, the interfaces and routes in
the pod's network namespace (ip a, ip r) and the end of its VM's QEMU log. It
writes one directory per pod (DIR/<node>/<namespace>_<pod>/) or, with --json,
one JSON document to stdout. Pods that are not running are listed with the
reason they were skipped.

It also asks each node, once, for its own data, in DIR/<node>/node/: the
node's ip a, ip r and process list, its network namespaces, libvirtd's log,
and every VM pod's namespace (ip a, ip r) and QEMU log. That data shows every
pod of the node, so a daemon gives it only when its operator set
diagNodeData; otherwise node/withheld.txt says so. Each file holds at most
the last MiB of a log (the first MiB of a listing) and says where it was
cut; secrets (libvirt's secret objects' data, passwords and tokens in
command lines) are redacted.`,
		Example: "  " + name + " diag dump ./virtlet-diag\n  " + name + " diag dump --json -A > diag.json",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !asJSON && len(args) == 0 {
				return fmt.Errorf("name a directory to write to, or pass --json to print to stdout")
			}
			ctx := cmd.Context()
			if err := k.connect(); err != nil {
				return err
			}
			ns := k.ns
			if all {
				ns = ""
			}
			pods, err := k.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return fmt.Errorf("list pods: %w", err)
			}
			report := collect(ctx, pods.Items, k.exec)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(report)
			}
			return report.write(args[0], cmd.OutOrStdout())
		},
	}
	dump.Flags().BoolVar(&asJSON, "json", false, "print one JSON document to stdout instead of writing a directory")
	dump.Flags().BoolVarP(&all, "all-namespaces", "A", false, "the VM pods of all namespaces")
	unpack := &cobra.Command{
		Use:   "unpack [FILE] DIR",
		Short: "Lay a JSON dump (diag dump --json) out as dump writes a directory",
		Long: `unpack reads a JSON document diag dump --json printed, from FILE or, without
one (or with -), from stdin, and writes the directory dump would have
written: DIR/<node>/<namespace>_<pod>/ with diag.json, each VM's domain XML,
the plugins' log lines, the pod's netns/<name>/ip-{a,r}.txt and
libvirt/qemu/<domain>.log, and DIR/<node>/node/ with node.json, ip-a.txt,
ip-r.txt, ps.txt, netns.txt, netns/<name>/ip-{a,r}.txt, libvirt/libvirtd.log
and libvirt/qemu/<domain>.log (or withheld.txt).`,
		Example: "  " + name + " diag unpack diag.json ./virtlet-diag\n  " + name + " diag dump --json -A | " + name + " diag unpack ./virtlet-diag",
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, dir := cmd.InOrStdin(), args[len(args)-1]
			if len(args) == 2 && args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			var report dumpReport
			if err := json.NewDecoder(in).Decode(&report); err != nil {
				return fmt.Errorf("read the dump: %w", err)
			}
			return report.write(dir, cmd.OutOrStdout())
		},
	}
	diag.AddCommand(dump, unpack)
	return diag
}

// execFunc runs a command in a pod (kube.exec).
type execFunc func(ctx context.Context, pod *corev1.Pod, cmd []string, stdin io.Reader, stdout, stderr io.Writer) error

// collect asks each running VM pod's daemon for the pod's diagnostics,
// and each node's, through the first of its pods that answered, for the
// node's.
func collect(ctx context.Context, pods []corev1.Pod, exec execFunc) dumpReport {
	report := dumpReport{}
	nodePod := map[string]*corev1.Pod{}
	var nodes []string
	for i := range pods {
		pod := &pods[i]
		if !isVMPod(pod) {
			continue
		}
		id := pod.Namespace + "/" + pod.Name
		if pod.Status.Phase != corev1.PodRunning {
			report.Skipped = append(report.Skipped, fmt.Sprintf("%s: %s", id, pod.Status.Phase))
			continue
		}
		var d vmtools.Diagnostics
		if err := execJSON(ctx, exec, pod, vmtools.Diag, &d); err != nil {
			report.Skipped = append(report.Skipped, fmt.Sprintf("%s: %v", id, err))
			continue
		}
		report.Pods = append(report.Pods, podDiag{Namespace: pod.Namespace, Pod: pod.Name, Node: pod.Spec.NodeName, Diagnostics: d})
		if _, ok := nodePod[pod.Spec.NodeName]; !ok {
			nodePod[pod.Spec.NodeName] = pod
			nodes = append(nodes, pod.Spec.NodeName)
		}
	}
	sort.Strings(report.Skipped)
	sort.Strings(nodes)
	for _, node := range nodes {
		nd := nodeDiag{Node: node}
		var d vmtools.NodeDiagnostics
		if err := execJSON(ctx, exec, nodePod[node], vmtools.DiagNode, &d); err != nil {
			nd.Withheld = err.Error()
		} else {
			nd.Diagnostics = &d
		}
		report.Nodes = append(report.Nodes, nd)
	}
	return report
}

// execJSON runs one of Virtlet's commands in the pod and decodes its
// JSON answer.
func execJSON(ctx context.Context, exec execFunc, pod *corev1.Pod, command string, v interface{}) error {
	var out, errOut bytes.Buffer
	if err := exec(ctx, pod, []string{command}, nil, &out, &errOut); err != nil {
		if msg := strings.TrimSpace(errOut.String()); msg != "" {
			return fmt.Errorf("%w %s", err, msg)
		}
		return err
	}
	if err := json.Unmarshal(out.Bytes(), v); err != nil {
		return fmt.Errorf("the daemon's answer to %s is not what was asked: %w", command, err)
	}
	return nil
}

type podDiag struct {
	Namespace   string              `json:"namespace"`
	Pod         string              `json:"pod"`
	Node        string              `json:"node"`
	Diagnostics vmtools.Diagnostics `json:"diagnostics"`
}

// nodeDiag is one node's own data, or why its daemon withheld it.
type nodeDiag struct {
	Node        string                   `json:"node"`
	Diagnostics *vmtools.NodeDiagnostics `json:"diagnostics,omitempty"`
	Withheld    string                   `json:"withheld,omitempty"`
}

type dumpReport struct {
	Pods    []podDiag  `json:"pods"`
	Nodes   []nodeDiag `json:"nodes,omitempty"`
	Skipped []string   `json:"skipped,omitempty"`
}

// write lays the report out as files: per pod (DIR/<node>/<ns>_<pod>/)
// diag.json, one domain XML per VM, the plugin log lines as text and the
// files the node showed of the pod; per node (DIR/<node>/node/) node.json
// and the node's files, or withheld.txt saying why there are none.
func (r dumpReport) write(dir string, w io.Writer) error {
	// A dump read back by unpack is a file anyone may have written: its
	// names become paths only when they are names, checked before any
	// file is written.
	podFiles, nodeFiles := make([]map[string][]byte, len(r.Pods)), make([]map[string][]byte, len(r.Nodes))
	for i, p := range r.Pods {
		var err error
		if podFiles[i], err = p.files(); err != nil {
			return err
		}
	}
	for i, n := range r.Nodes {
		var err error
		if nodeFiles[i], err = n.files(); err != nil {
			return err
		}
	}
	for i, p := range r.Pods {
		pd := filepath.Join(dir, p.Node, p.Namespace+"_"+p.Pod)
		if err := writeFiles(pd, podFiles[i]); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s/%s: %s\n", p.Namespace, p.Pod, pd)
	}
	for i, n := range r.Nodes {
		nd := filepath.Join(dir, n.Node, "node")
		if err := writeFiles(nd, nodeFiles[i]); err != nil {
			return err
		}
		if n.Diagnostics == nil {
			fmt.Fprintf(w, "node %s: its own data withheld (%s): %s\n", n.Node, filepath.Join(nd, "withheld.txt"), n.Withheld)
		} else {
			fmt.Fprintf(w, "node %s: %s\n", n.Node, nd)
		}
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "skipped %s\n", s)
	}
	if len(r.Pods) == 0 {
		return fmt.Errorf("no running VM pod answered (%d skipped)", len(r.Skipped))
	}
	return nil
}

// files are the pod's directory's files, by relative path.
func (p podDiag) files() (map[string][]byte, error) {
	for _, part := range []string{p.Node, p.Namespace, p.Pod} {
		if !pathSafe(part) {
			return nil, fmt.Errorf("pod %s/%s on node %s: %q cannot name a directory", p.Namespace, p.Pod, p.Node, part)
		}
	}
	d := p.Diagnostics
	d.Files = nil // they are files of their own beside diag.json
	b, _ := json.MarshalIndent(d, "", "  ")
	files := map[string][]byte{"diag.json": b, "plugin-logs.txt": []byte(pluginLogText(d.PluginLogs))}
	for id, vm := range d.VMs {
		if !pathSafe(short(id)) {
			return nil, fmt.Errorf("pod %s/%s: VM ID %q cannot name a file", p.Namespace, p.Pod, id)
		}
		files["domain-"+short(id)+".xml"] = []byte(vm.Definition)
	}
	if err := addNodeFiles(files, p.Diagnostics.Files); err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Pod, err)
	}
	return files, nil
}

// files are the node's directory's files, by relative path.
func (n nodeDiag) files() (map[string][]byte, error) {
	if !pathSafe(n.Node) {
		return nil, fmt.Errorf("node %q cannot name a directory", n.Node)
	}
	if n.Diagnostics == nil {
		return map[string][]byte{"withheld.txt": []byte("The daemon on node " + n.Node + " gave none of the node's own data:\n" + n.Withheld + "\n")}, nil
	}
	d := *n.Diagnostics
	d.Files = nil
	b, _ := json.MarshalIndent(d, "", "  ")
	files := map[string][]byte{"node.json": b}
	if err := addNodeFiles(files, n.Diagnostics.Files); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Node, err)
	}
	return files, nil
}

// maxFileDepth bounds a node file's path (libvirt/qemu/<domain>.log).
const maxFileDepth = 4

// addNodeFiles adds the files a node showed, each under the relative,
// slash-separated path it names, none in place of another.
func addNodeFiles(files map[string][]byte, add []vmtools.File) error {
	for _, f := range add {
		parts := strings.Split(f.Name, "/")
		ok := len(parts) <= maxFileDepth
		for _, part := range parts {
			ok = ok && pathSafe(part)
		}
		if _, taken := files[f.Name]; !ok || taken {
			return fmt.Errorf("%q cannot name a file", f.Name)
		}
		files[f.Name] = []byte(f.Content)
	}
	return nil
}

// writeFiles writes files below dir.
func writeFiles(dir string, files map[string][]byte) error {
	for name, data := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// pluginLogText prints plugin log lines one a line, their fields sorted.
func pluginLogText(lines []vmtools.LogLine) string {
	var logs strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&logs, "%s %s [%s] %s", l.Time.Format("2006-01-02T15:04:05.000Z07:00"), l.Plugin, l.Level, l.Message)
		keys := make([]string, 0, len(l.Fields))
		for k := range l.Fields {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&logs, " %s=%q", k, l.Fields[k])
		}
		logs.WriteString("\n")
	}
	return logs.String()
}

// pathSafe reports whether s can be one path component: a name, not
// empty, not . or .., without a slash or a NUL.
func pathSafe(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00")
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}
