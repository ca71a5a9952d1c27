package nodeinspect

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// process is one line of the process list.
type process struct {
	pid, ppid  int
	uid        string
	state      string
	rssKiB     int64
	cpuSeconds float64
	command    string
}

// clockTicks is the kernel's USER_HZ, in which /proc/<pid>/stat counts
// CPU time: 100 on every Linux architecture Virtlet runs on.
const clockTicks = 100

// processList lists the node's processes as `ps` would, read from procfs:
// PID, parent, user ID, state, resident memory, CPU time, and the command
// line (the kernel thread's name in brackets when it has none).
func processList(ctx context.Context, procDir string) (string, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", procDir, err)
	}
	var procs []process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if p, ok := readProcess(filepath.Join(procDir, e.Name()), pid); ok {
			procs = append(procs, p)
		}
	}
	sort.Slice(procs, func(i, j int) bool { return procs[i].pid < procs[j].pid })
	return formatProcesses(procs), nil
}

// readProcess reads one process; one that ended meanwhile is left out.
func readProcess(dir string, pid int) (process, bool) {
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return process{}, false
	}
	p, ok := parseStat(pid, string(stat))
	if !ok {
		return process{}, false
	}
	p.uid = "?"
	if status, err := os.ReadFile(filepath.Join(dir, "status")); err == nil {
		p.uid = statusUID(string(status))
	}
	if cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil && len(cmdline) > 0 {
		p.command = strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
	}
	return p, true
}

// parseStat reads /proc/<pid>/stat: "pid (comm) state ppid …", where comm
// may hold spaces and parentheses, so the fields start after the last ')'.
func parseStat(pid int, stat string) (process, bool) {
	open, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return process{}, false
	}
	f := strings.Fields(stat[end+1:]) // f[0] is field 3 (state)
	if len(f) < 22 {
		return process{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	rssPages, _ := strconv.ParseInt(f[21], 10, 64)
	return process{pid: pid, ppid: ppid, state: f[0], rssKiB: rssPages * int64(os.Getpagesize()) / 1024,
		cpuSeconds: float64(utime+stime) / clockTicks, command: "[" + stat[open+1:end] + "]"}, true
}

// statusUID is the real user ID of /proc/<pid>/status's Uid line.
func statusUID(status string) string {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return f[0]
			}
		}
	}
	return "?"
}

func formatProcesses(procs []process) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%7s %7s %10s %1s %10s %10s %s\n", "PID", "PPID", "UID", "S", "RSS_KIB", "CPU_S", "COMMAND")
	for _, p := range procs {
		fmt.Fprintf(&b, "%7d %7d %10s %1s %10d %10.2f %s\n", p.pid, p.ppid, p.uid, p.state, p.rssKiB, p.cpuSeconds, p.command)
	}
	return b.String()
}
