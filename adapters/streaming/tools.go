package streaming

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// Tools serves virtletctl's commands (vmtools) arriving as exec commands
// of a VM pod: about that pod's VM and its node's daemon only.
type Tools struct {
	RT      *core.Runtime
	Version string
	// Plugins reports the plugins' status (name, kind, version, state).
	Plugins func() interface{}
	// PluginLogs returns the plugins' recent log lines.
	PluginLogs func() []vmtools.LogLine
	// NodeData serves DiagNode. The node's diagnostics show every pod of
	// the node to whoever may exec into any VM pod on it: the operator
	// turns them on (diagNodeData) where those are the node's admins.
	NodeData bool
	Log      logrus.FieldLogger
}

// Run serves one command; it returns the exit code of the command (virsh's).
func (t *Tools) Run(ctx context.Context, containerID string, cmd []string, in io.Reader, out, errw io.Writer) (int32, error) {
	if out == nil {
		out = io.Discard
	}
	if errw == nil {
		errw = io.Discard
	}
	log := t.Log.WithFields(logrus.Fields{"container": short(containerID), "command": cmd[0]})
	switch cmd[0] {
	case vmtools.Version:
		if _, err := t.RT.ContainerStatus(ctx, containerID); err != nil {
			return 0, err
		}
		return 0, json.NewEncoder(out).Encode(vmtools.VersionInfo{Version: t.Version})
	case vmtools.Diag:
		d, err := t.diagnose(ctx, containerID)
		if err != nil {
			return 0, err
		}
		log.Info("diagnostics collected")
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return 0, enc.Encode(d)
	case vmtools.DiagNode:
		d, err := t.diagnoseNode(ctx, containerID)
		if err != nil {
			return 0, err
		}
		log.WithField("files", len(d.Files)).Info("node diagnostics collected")
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return 0, enc.Encode(d)
	case vmtools.Virsh:
		res, err := t.RT.InspectVM(ctx, containerID, cmd[1:])
		if err != nil {
			return 0, err
		}
		log.WithField("args", strings.Join(cmd[1:], " ")).Info("virsh for virtletctl")
		out.Write(res.Stdout)
		errw.Write(res.Stderr)
		return res.ExitCode, nil
	case vmtools.VNC:
		return 0, t.vnc(ctx, containerID, in, out, log)
	case vmtools.Status:
		c, err := t.RT.ContainerStatus(ctx, containerID)
		if err != nil {
			return 0, err
		}
		st := vmtools.VMStatus{Pod: c.Spec.PodNamespace + "/" + c.Spec.PodName, VM: c.Spec.Name, State: string(c.State),
			StartedAt: c.StartedAt, VCPUs: c.Spec.VCPUs, MemoryBytes: c.Spec.MemoryBytes}
		if !c.BootedAt.IsZero() {
			st.StartedAt = c.BootedAt // the VM's last boot (virtletctl start or restart)
		}
		if c.Halted() {
			st.State, st.HaltedAt, st.GuestError = "halted", c.HaltedAt, "the VM is halted"
		} else if gi, err := t.RT.GuestInfo(ctx, containerID); err != nil {
			st.GuestError = err.Error()
		} else {
			st.Guest = &gi
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return 0, enc.Encode(st)
	case vmtools.Stop, vmtools.Restart:
		grace, err := gracePeriod(cmd[0], cmd[1:])
		if err != nil {
			return 0, err
		}
		op, done := t.RT.HaltVM, "halted: its container and disks are kept; virtletctl start boots it"
		if cmd[0] == vmtools.Restart {
			op, done = t.RT.RebootVM, "restarted"
		}
		if err := op(ctx, containerID, grace); err != nil {
			return 0, err
		}
		return 0, t.powerDone(ctx, containerID, done, out, log)
	case vmtools.Start:
		if len(cmd) > 1 {
			return 0, fmt.Errorf("%s takes no arguments", vmtools.Start)
		}
		if err := t.RT.BootVM(ctx, containerID); err != nil {
			return 0, err
		}
		return 0, t.powerDone(ctx, containerID, "started", out, log)
	case vmtools.MigrationSource:
		src, err := t.RT.MigrationSource(ctx, containerID)
		if err != nil {
			return 0, err
		}
		return 0, json.NewEncoder(out).Encode(src)
	case vmtools.Migrate:
		if len(cmd) != 4 {
			return 0, fmt.Errorf("%s takes the receiving pod's UID, its node and the node's address", vmtools.Migrate)
		}
		log.WithFields(logrus.Fields{"receivingPod": cmd[1], "node": cmd[2], "address": cmd[3]}).Info("live migration asked for")
		st, err := t.RT.MigrateVM(ctx, containerID, ports.MigrationPeer{Node: cmd[2], Address: cmd[3]}, cmd[1])
		if err != nil {
			return 0, err
		}
		return 0, json.NewEncoder(out).Encode(st)
	default:
		return 0, fmt.Errorf("unknown Virtlet command %q (known: %s); is virtletctl newer than the daemon?", cmd[0], strings.Join(vmtools.Commands, ", "))
	}
}

// gracePeriod reads Stop's and Restart's optional argument: whole seconds.
func gracePeriod(command string, args []string) (time.Duration, error) {
	switch len(args) {
	case 0:
		return vmtools.DefaultGracePeriod, nil
	case 1:
		s, err := strconv.Atoi(args[0])
		if err != nil || s < 0 {
			return 0, &ports.InvalidError{Field: "grace period", Value: args[0], Allowed: "whole seconds, 0 or more"}
		}
		return time.Duration(s) * time.Second, nil
	}
	return 0, fmt.Errorf("%s takes at most one argument, the grace period in seconds", command)
}

// powerDone tells the user what a power operation did.
func (t *Tools) powerDone(ctx context.Context, containerID, done string, out io.Writer, log logrus.FieldLogger) error {
	c, err := t.RT.ContainerStatus(ctx, containerID)
	if err != nil {
		return err
	}
	log.Info("VM " + strings.SplitN(done, ":", 2)[0] + " for virtletctl")
	_, err = fmt.Fprintf(out, "VM %s of pod %s/%s %s\n", c.Spec.Name, c.Spec.PodNamespace, c.Spec.PodName, done)
	return err
}

// vnc pipes the exec's stdin and stdout to the VM's VNC display.
func (t *Tools) vnc(ctx context.Context, containerID string, in io.Reader, out io.Writer, log logrus.FieldLogger) error {
	if in == nil {
		return fmt.Errorf("%s needs stdin (exec -i): it carries the VNC client's bytes", vmtools.VNC)
	}
	d, conn, err := t.RT.OpenDisplay(ctx, containerID)
	if err != nil {
		return err
	}
	defer conn.Close()
	log.WithField("display", d.Address).Info("VNC viewer connected")
	fromVM := make(chan error, 1)
	go func() {
		_, err := io.Copy(out, conn)
		fromVM <- err
	}()
	go func() {
		io.Copy(conn, in)
		conn.CloseWrite()
	}()
	select {
	case <-fromVM:
	case <-ctx.Done():
	}
	log.Info("VNC viewer disconnected")
	return nil
}

func (t *Tools) diagnose(ctx context.Context, containerID string) (vmtools.Diagnostics, error) {
	d, err := t.RT.Diagnose(ctx, containerID)
	if err != nil {
		return vmtools.Diagnostics{}, err
	}
	node, _ := os.Hostname()
	out := vmtools.Diagnostics{Node: node, Version: t.Version, Collected: time.Now().UTC(), VMs: map[string]vmtools.VMInfo{}, Problems: d.Problems}
	out.Status = mustJSON(t.RT.Status(ctx))
	if t.Plugins != nil {
		out.Plugins = withheldErrors(mustJSON(t.Plugins()))
	}
	out.Records = mustJSON(map[string]interface{}{"sandbox": d.Sandbox, "containers": d.Containers})
	for id, vm := range d.VMs {
		out.VMs[id] = vmtools.VMInfo{Definition: vm.Definition, Details: vm.Details}
	}
	if t.PluginLogs != nil {
		out.PluginLogs = aboutPod(t.PluginLogs(), d)
	}
	out.Files = vmtools.FilesOf(d.Node.Files)
	out.Problems = append(out.Problems, d.Node.Problems...)
	return out, nil
}

// diagnoseNode answers DiagNode, when the operator allows it, through any
// VM pod of the node.
func (t *Tools) diagnoseNode(ctx context.Context, containerID string) (vmtools.NodeDiagnostics, error) {
	if _, err := t.RT.ContainerStatus(ctx, containerID); err != nil {
		return vmtools.NodeDiagnostics{}, err
	}
	node, _ := os.Hostname()
	if !t.NodeData {
		return vmtools.NodeDiagnostics{}, fmt.Errorf("the node's diagnostics are off on node %s: they show every pod of the node, "+
			"and the right to exec into one pod is no right to see them; the node's operator turns them on with diagNodeData: %w",
			node, ports.ErrFailedPrecondition)
	}
	r, err := t.RT.DiagnoseNode(ctx)
	if err != nil {
		return vmtools.NodeDiagnostics{}, err
	}
	return vmtools.NodeDiagnostics{Node: node, Version: t.Version, Collected: time.Now().UTC(),
		Files: vmtools.FilesOf(r.Files), Problems: r.Problems}, nil
}

// podFields are the log fields that name a pod or its VM; plugins tag
// their lines about a VM with one of them.
var podFields = []string{"pod", "sandbox", "vm", "container", "id", "domain"}

// aboutPod keeps the log lines that name this pod or its VM, and no other:
// a line that names no pod (a plugin's start, a restart) may still quote
// another pod's data in its message, and other pods are not this pod
// user's business. The plugins' health is in the diagnostics' plugin list.
func aboutPod(lines []vmtools.LogLine, d core.Diagnosis) []vmtools.LogLine {
	mine := map[string]bool{d.Sandbox.ID: true, short(d.Sandbox.ID): true, d.Sandbox.Namespace + "/" + d.Sandbox.Name: true}
	for _, c := range d.Containers {
		mine[c.ID], mine[short(c.ID)] = true, true
		if c.Spec.Name != "" {
			mine[c.Spec.Name] = true
		}
	}
	delete(mine, "")
	delete(mine, "/")
	var out []vmtools.LogLine
	for _, l := range lines {
		for _, k := range podFields {
			if mine[l.Fields[k]] {
				out = append(out, l)
				break
			}
		}
	}
	return out
}

// lastErrorWithheld replaces a plugin's last error in a pod's diagnostics:
// the text is node-wide (a crash's output may quote any pod's data), as
// the log lines that name no pod are.
const lastErrorWithheld = "withheld: a plugin's error is the node's, not the pod's; the node's operator finds it in the daemon's log"

// withheldErrors replaces the lastError of each plugin in a plugin list
// (name → status).
func withheldErrors(plugins json.RawMessage) json.RawMessage {
	var byName map[string]map[string]json.RawMessage
	if err := json.Unmarshal(plugins, &byName); err != nil {
		return mustJSON(map[string]string{"error": "plugin list withheld: " + err.Error()})
	}
	for _, st := range byName {
		if _, ok := st["lastError"]; ok {
			st["lastError"] = mustJSON(lastErrorWithheld)
		}
	}
	return mustJSON(byName)
}

func mustJSON(v interface{}) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	return b
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}
