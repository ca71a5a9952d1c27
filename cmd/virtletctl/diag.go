package main

import (
	"bytes"
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
about that pod, and the daemon's records of the pod. It writes one directory
per pod (DIR/<node>/<namespace>_<pod>/) or, with --json, one JSON document to
stdout. Pods that are not running are listed with the reason they were
skipped.`,
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
			report := dumpReport{}
			for i := range pods.Items {
				pod := &pods.Items[i]
				if !isVMPod(pod) {
					continue
				}
				id := pod.Namespace + "/" + pod.Name
				if pod.Status.Phase != corev1.PodRunning {
					report.Skipped = append(report.Skipped, fmt.Sprintf("%s: %s", id, pod.Status.Phase))
					continue
				}
				var out, errOut bytes.Buffer
				if err := k.exec(ctx, pod, []string{vmtools.Diag}, nil, &out, &errOut); err != nil {
					report.Skipped = append(report.Skipped, fmt.Sprintf("%s: %v %s", id, err, strings.TrimSpace(errOut.String())))
					continue
				}
				var d vmtools.Diagnostics
				if err := json.Unmarshal(out.Bytes(), &d); err != nil {
					report.Skipped = append(report.Skipped, fmt.Sprintf("%s: the daemon's answer is not diagnostics: %v", id, err))
					continue
				}
				report.Pods = append(report.Pods, podDiag{Namespace: pod.Namespace, Pod: pod.Name, Node: pod.Spec.NodeName, Diagnostics: d})
			}
			sort.Strings(report.Skipped)
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
written: DIR/<node>/<namespace>_<pod>/ with diag.json, each VM's domain XML
and the plugins' log lines.`,
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

type podDiag struct {
	Namespace   string              `json:"namespace"`
	Pod         string              `json:"pod"`
	Node        string              `json:"node"`
	Diagnostics vmtools.Diagnostics `json:"diagnostics"`
}

type dumpReport struct {
	Pods    []podDiag `json:"pods"`
	Skipped []string  `json:"skipped,omitempty"`
}

// write lays the report out as files: per pod diag.json, one domain XML
// per VM, and the plugin log lines as text.
func (r dumpReport) write(dir string, w io.Writer) error {
	for _, p := range r.Pods {
		// A dump read back by unpack is a file anyone may have written:
		// its names become path components only when they are names.
		for _, part := range []string{p.Node, p.Namespace, p.Pod} {
			if !pathSafe(part) {
				return fmt.Errorf("pod %s/%s on node %s: %q cannot name a directory", p.Namespace, p.Pod, p.Node, part)
			}
		}
		for id := range p.Diagnostics.VMs {
			if !pathSafe(short(id)) {
				return fmt.Errorf("pod %s/%s: VM ID %q cannot name a file", p.Namespace, p.Pod, id)
			}
		}
		pd := filepath.Join(dir, p.Node, p.Namespace+"_"+p.Pod)
		if err := os.MkdirAll(pd, 0o755); err != nil {
			return err
		}
		b, _ := json.MarshalIndent(p.Diagnostics, "", "  ")
		files := map[string][]byte{"diag.json": b}
		for id, vm := range p.Diagnostics.VMs {
			files["domain-"+short(id)+".xml"] = []byte(vm.Definition)
		}
		var logs strings.Builder
		for _, l := range p.Diagnostics.PluginLogs {
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
		files["plugin-logs.txt"] = []byte(logs.String())
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(pd, name), data, 0o644); err != nil {
				return err
			}
		}
		fmt.Fprintf(w, "%s/%s: %s\n", p.Namespace, p.Pod, pd)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "skipped %s\n", s)
	}
	if len(r.Pods) == 0 {
		return fmt.Errorf("no running VM pod answered (%d skipped)", len(r.Skipped))
	}
	return nil
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
