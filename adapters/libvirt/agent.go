package libvirt

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// Exec through qemu-guest-agent: guest-exec starts the program (argv,
// stdin as base64, output captured), guest-exec-status is polled until it
// ended. The agent buffers the output until the program ends. On timeout
// the program and its descendants are killed by a shell script the agent
// runs too (killTree).

// agentCallTimeout bounds one agent command that should answer at once.
const agentCallTimeout = 5 * time.Second

// agentOutputTimeout bounds one guest-exec-status, whose reply carries the
// command's whole output once it has ended (up to libvirt's 4 MiB, as
// base64): a slow guest takes seconds to encode and send that much, and
// within agentCallTimeout libvirt would give up on it as an agent that
// does not answer. The caller's deadline still bounds the exec.
const agentOutputTimeout = time.Minute

// guestAgent runs commands in guests through their qemu-guest-agent
// (GuestExec, GuestInfo), on a libvirt connection of its own (see
// domain). Its lock guards that connection; the connection's lock may be
// taken inside it, h.mu never is.
type guestAgent struct {
	log   logrus.FieldLogger
	vms   vmSource
	dial  func(what string) (*libvirt.Connect, string, error)
	ready func() bool

	mu   sync.Mutex
	conn *libvirt.Connect
}

// domain returns the VM's domain on the connection that carries
// guest-agent commands, opened on first use and again once libvirtd has
// dropped it. libvirtd serves at most max_client_requests (5 by default)
// calls of one connection at a time, and an agent command holds its slot
// until the guest answers: on the main connection, a few execs in busy
// guests queue every stats, status and lifecycle call behind them (under
// 50 concurrent CRI calls over 20 VMs, stats took 3 s at p95, 1.7 s with
// libvirtd allowing 50). On a connection of their own, agent commands
// queue only behind each other.
func (a *guestAgent) domain(r *record) (*libvirt.Domain, error) {
	conn, err := a.connection()
	if err != nil {
		return nil, err
	}
	// The lookup may wait behind agent commands on that connection: it
	// runs outside a.mu, with a reference of its own on it.
	defer conn.Close()
	dom, err := conn.LookupDomainByUUIDString(r.Spec.UUID)
	if err != nil {
		return nil, libvirtError("look up domain "+r.Spec.Name+" for its guest agent", err)
	}
	return dom, nil
}

// connection returns the guest-agent connection, opening it when needed,
// with a reference the caller releases with Close.
func (a *guestAgent) connection() (*libvirt.Connect, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		if alive, err := a.conn.IsAlive(); err != nil || !alive {
			a.conn.Close()
			a.conn = nil
		}
	}
	if a.conn == nil {
		// A call that began before close opens nothing after it.
		if !a.ready() {
			return nil, fmt.Errorf("the libvirt plugin is not configured or is closing: %w", ports.ErrUnavailable)
		}
		conn, uri, err := a.dial("guest agent")
		if err != nil {
			return nil, fmt.Errorf("connect to libvirtd at %s for guest-agent commands: %v: %w", uri, err, ports.ErrUnavailable)
		}
		a.conn = conn
	}
	if err := a.conn.Ref(); err != nil {
		return nil, libvirtError("reference the guest-agent connection", err)
	}
	return a.conn, nil
}

// hangUp closes the guest-agent connection (the adapter is closing);
// calls still in flight hold their domains' references.
func (a *guestAgent) hangUp() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		a.conn.Close()
		a.conn = nil
	}
}

// agentState is what the live domain tells of the guest agent's channel.
type agentState int

const (
	agentNoChannel    agentState = iota // the domain has no agent channel
	agentDisconnected                   // nothing in the guest opened it
	agentConnected                      // a program in the guest opened it
)

func (s agentState) String() string {
	return [...]string{"no channel", "disconnected", "connected"}[s]
}

// DefaultAgentWait is how long after its start a VM's exec waits for the
// guest agent: a cloud image under TCG starts it about a minute into its
// boot.
const DefaultAgentWait = 2 * time.Minute

// waitAgent waits until the guest agent's channel is connected, while
// the VM is in its first wait after startedAt and ctx lasts: an exec
// right after StartContainer (kubelet's probes, kubectl exec, critest)
// meets a guest that is still booting. It returns the last state seen.
func waitAgent(ctx context.Context, dom *libvirt.Domain, startedAt time.Time, wait time.Duration) (agentState, error) {
	delay := 50 * time.Millisecond
	for {
		s, err := agentStateOf(dom)
		if err != nil || s != agentDisconnected {
			return s, err
		}
		left := time.Until(startedAt.Add(wait))
		if left <= 0 {
			return s, nil
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(min(delay, left)):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// noAgent explains a guest whose agent cannot be reached.
func noAgent(name string, s agentState) error {
	if s == agentNoChannel {
		return fmt.Errorf("the VM %s has no guest agent channel (%s) in its domain, which an older Virtlet defined: "+
			"recreate the pod to get one, or use `virtletctl ssh`: %w", name, AgentChannel, ports.ErrFailedPrecondition)
	}
	return fmt.Errorf("the VM %s has no guest agent (nothing in the guest listens on its channel %s): "+
		"install and start qemu-guest-agent in the guest, or use `virtletctl ssh`: %w", name, AgentChannel, ports.ErrFailedPrecondition)
}

// agentNotYet explains an exec that ended while the booting guest's agent
// had not connected yet.
func agentNotYet(name string, startedAt time.Time, wait time.Duration, err error) error {
	return fmt.Errorf("the guest agent of VM %s has not connected yet (the VM started %s ago; an exec waits for it up to %s after the start): %w",
		name, time.Since(startedAt).Round(time.Second), wait, err)
}

// agentStateOf reads the agent channel's state from the live domain:
// libvirt knows whether a program in the guest opened it.
func agentStateOf(dom *libvirt.Domain) (agentState, error) {
	raw, err := dom.GetXMLDesc(0)
	if err != nil {
		return agentNoChannel, err
	}
	var d libvirtxml.Domain
	if err := xml.Unmarshal([]byte(raw), &d); err != nil {
		return agentNoChannel, err
	}
	if d.Devices == nil {
		return agentNoChannel, nil
	}
	for _, ch := range d.Devices.Channels {
		if t := ch.Target; t != nil && t.VirtIO != nil && t.VirtIO.Name == AgentChannel {
			if t.VirtIO.State == "connected" {
				return agentConnected, nil
			}
			return agentDisconnected, nil
		}
	}
	return agentNoChannel, nil
}

// agent sends one command that should answer at once (agentCallTimeout)
// and decodes its "return" into out.
func agent(ctx context.Context, dom *libvirt.Domain, name string, cmd map[string]interface{}, out interface{}) error {
	return agentWithin(ctx, agentCallTimeout, dom, name, cmd, out)
}

// agentWithin sends one command, waiting at most limit for its reply, and
// decodes its "return" into out. It never waits past ctx: libvirt's own
// wait is given the time left (at least a second, libvirt counts in
// seconds) and the call is abandoned at ctx's end.
func agentWithin(ctx context.Context, limit time.Duration, dom *libvirt.Domain, name string, cmd map[string]interface{}, out interface{}) error {
	wait := limit
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl))
	}
	if wait <= 0 {
		// The deadline has passed and ctx is about to say so (its timer
		// runs apart): wait for it, so that callers asking ctx.Err()
		// whether they timed out are not told no.
		<-ctx.Done()
		return fmt.Errorf("guest agent: %w", ctx.Err())
	}
	raw, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	seconds := libvirt.DomainQemuAgentCommandTimeout(max(1, int(math.Ceil(wait.Seconds()))))
	type result struct {
		reply string
		err   error
	}
	done := make(chan result, 1)
	// The call may outlive this function (abandoned at ctx's end): it
	// holds its own reference to the domain.
	if err := dom.Ref(); err != nil {
		return libvirtError("reference domain "+name, err)
	}
	go func() {
		defer dom.Free()
		reply, err := dom.QemuAgentCommand(string(raw), seconds, 0)
		done <- result{reply, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		return fmt.Errorf("the guest agent of VM %s did not answer %s in time: %w", name, cmd["execute"], ctx.Err())
	}
	if r.err != nil {
		var le libvirt.Error
		if errors.As(r.err, &le) && (le.Code == libvirt.ERR_AGENT_UNRESPONSIVE || le.Code == libvirt.ERR_AGENT_UNSYNCED) {
			return fmt.Errorf("the guest agent of VM %s does not answer (%s): %w", name, le.Message, ports.ErrUnavailable)
		}
		if errors.As(r.err, &le) && strings.Contains(le.Message, "Unable to encode message payload") {
			// libvirt carries at most 4 MiB per reply; the agent sends a
			// command's whole output, base64-encoded, in one.
			return fmt.Errorf("the reply of the guest agent of VM %s to %s is larger than libvirt carries (4 MiB, about 3 MiB of stdout and stderr together): "+
				"write the output to a file in the guest and read it in parts, or use `virtletctl ssh`", name, cmd["execute"])
		}
		return libvirtError(fmt.Sprintf("guest agent %s in VM %s", cmd["execute"], name), r.err)
	}
	var envelope struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal([]byte(r.reply), &envelope); err != nil {
		return fmt.Errorf("guest agent %s in VM %s: bad reply: %w", cmd["execute"], name, err)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(envelope.Return, out)
}

type execStatus struct {
	Exited       bool   `json:"exited"`
	ExitCode     *int   `json:"exitcode"`
	Signal       *int   `json:"signal"`
	OutData      string `json:"out-data"`
	ErrData      string `json:"err-data"`
	OutTruncated bool   `json:"out-truncated"`
	ErrTruncated bool   `json:"err-truncated"`
}

// startExec starts argv in the guest and returns its pid.
func startExec(ctx context.Context, dom *libvirt.Domain, name string, argv []string, stdin []byte) (int64, error) {
	args := map[string]interface{}{"path": argv[0], "arg": argv[1:], "capture-output": true}
	if len(stdin) > 0 {
		args["input-data"] = base64.StdEncoding.EncodeToString(stdin)
	}
	var started struct {
		PID int64 `json:"pid"`
	}
	if err := agent(ctx, dom, name, map[string]interface{}{"execute": "guest-exec", "arguments": args}, &started); err != nil {
		return 0, err
	}
	return started.PID, nil
}

// GuestExec runs a command in the guest through its agent.
func (a *guestAgent) GuestExec(ctx context.Context, id string, req ports.GuestExecRequest) (ports.GuestExecResult, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return ports.GuestExecResult{}, &ports.InvalidError{Field: "argv", Reason: "empty command"}
	}
	r, dom, err := a.vms.lookup(id)
	if err != nil {
		return ports.GuestExecResult{}, err
	}
	defer dom.Free()
	name := r.Spec.Name
	if state, _, err := dom.GetState(); err != nil || state != libvirt.DOMAIN_RUNNING {
		return ports.GuestExecResult{}, fmt.Errorf("exec in VM %s: the VM is not running: %w", name, ports.ErrFailedPrecondition)
	}
	// The timeout bounds the wait for a booting guest's agent, and then,
	// counted afresh from the command's start, its run. The start itself
	// is bounded by the caller and the agent call's own limit only: one
	// that ended at the timeout would leave a command running whose pid
	// no one knows.
	within := func(ctx context.Context) (context.Context, context.CancelFunc) {
		if req.Timeout > 0 {
			return context.WithTimeout(ctx, req.Timeout)
		}
		return context.WithCancel(ctx)
	}
	var startedAt time.Time
	a.vms.locked(func() { startedAt = r.StartedAt })
	wait := a.vms.settings().cfg.agentWait
	waitCtx, cancelWait := within(ctx)
	defer cancelWait()
	channel, err := waitAgent(waitCtx, dom, startedAt, wait)
	if err != nil {
		if expired(waitCtx) {
			return ports.GuestExecResult{}, agentNotYet(name, startedAt, wait, cmp.Or(waitCtx.Err(), context.DeadlineExceeded))
		}
		return ports.GuestExecResult{}, libvirtError("read the agent channel of "+name, err)
	}
	if channel != agentConnected {
		return ports.GuestExecResult{}, noAgent(name, channel)
	}
	adom, err := a.domain(r)
	if err != nil {
		return ports.GuestExecResult{}, err
	}
	defer adom.Free()
	pid, err := startExec(ctx, adom, name, req.Argv, req.Stdin)
	if err != nil {
		// An agent that holds its channel but does not answer ends here,
		// at the caller's deadline or the call's limit.
		return ports.GuestExecResult{}, fmt.Errorf("start %q: %w", req.Argv[0], err)
	}
	res := ports.GuestExecResult{PID: pid}
	runCtx, cancelRun := within(ctx)
	defer cancelRun()
	st, err := waitExec(runCtx, adom, name, pid)
	if err != nil {
		if !expired(runCtx) {
			return ports.GuestExecResult{}, err
		}
		// Timed out (or the caller left, or its deadline passed): kill
		// the guest process, with a context of its own.
		res.TimedOut = !expired(ctx)
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), agentCallTimeout)
		defer cancel()
		if kerr := killGuestProcess(kctx, adom, name, pid); kerr != nil {
			res.KillError = kerr.Error()
		} else {
			res.Killed = true
		}
		a.log.WithField("vm", name).WithField("pid", pid).WithField("killed", res.Killed).Info("guest command killed after its timeout")
		if !res.TimedOut {
			return res, cmp.Or(ctx.Err(), context.DeadlineExceeded)
		}
		return res, nil
	}
	switch {
	case st.ExitCode != nil:
		res.ExitCode = int32(*st.ExitCode)
	case st.Signal != nil:
		res.ExitCode = int32(128 + *st.Signal)
	}
	max := req.MaxOutputBytes
	if res.Stdout, res.StdoutTruncated, err = decodeOutput(st.OutData, max); err != nil {
		return ports.GuestExecResult{}, fmt.Errorf("exec in VM %s: stdout: %w", name, err)
	}
	if res.Stderr, res.StderrTruncated, err = decodeOutput(st.ErrData, max); err != nil {
		return ports.GuestExecResult{}, fmt.Errorf("exec in VM %s: stderr: %w", name, err)
	}
	res.StdoutTruncated = res.StdoutTruncated || st.OutTruncated
	res.StderrTruncated = res.StderrTruncated || st.ErrTruncated
	return res, nil
}

// expired tells whether ctx has ended or its deadline has passed: its
// timer runs apart, so a call that failed at the deadline (libvirt's own
// wait ends there too) may see ctx.Err() still nil.
func expired(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(dl)
}

// waitExec polls the command's status until it ends.
func waitExec(ctx context.Context, dom *libvirt.Domain, name string, pid int64) (execStatus, error) {
	delay := 10 * time.Millisecond
	for {
		var st execStatus
		err := agentWithin(ctx, agentOutputTimeout, dom, name, map[string]interface{}{"execute": "guest-exec-status", "arguments": map[string]interface{}{"pid": pid}}, &st)
		if err != nil {
			return st, err
		}
		if st.Exited {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// killTree is the guest shell script that kills the process $1 and all
// its descendants. The agent runs commands in its own process group, so
// a group kill would take the agent with it; and killing the command
// alone leaves the children it started holding its output pipes, so the
// agent would never report it ended. Each generation is stopped before
// its children are looked for (a stopped process forks no more), then
// all are killed. It reads /proc with one cat per generation and no other
// tool, so that it works in busybox guests too.
const killTree = `level=$1 all=
while [ -n "$level" ]; do
	kill -STOP $level 2>/dev/null
	all="$all $level"
	next=
	snapshot=$(cat /proc/[0-9]*/stat 2>/dev/null)
	while read -r line; do
		pid=${line%% *}
		set -- ${line##*) }
		for p in $level; do
			[ "$2" = "$p" ] && next="$next $pid"
		done
	done <<EOF
$snapshot
EOF
	level=$next
done
kill -9 $all 2>/dev/null
exit 0
`

// killGuestProcess kills pid and its descendants in the guest (the agent
// has no kill command: it runs the guest's shell) and collects both
// processes' status, so that the agent forgets them.
func killGuestProcess(ctx context.Context, dom *libvirt.Domain, name string, pid int64) error {
	killer, err := startExec(ctx, dom, name, []string{"/bin/sh", "-c", killTree, "virtlet-kill", strconv.FormatInt(pid, 10)}, nil)
	if err != nil {
		return fmt.Errorf("run kill in the guest: %w", err)
	}
	st, err := waitExec(ctx, dom, name, killer)
	if err != nil {
		return fmt.Errorf("kill in the guest: %w", err)
	}
	if st.ExitCode != nil && *st.ExitCode != 0 {
		msg, _ := base64.StdEncoding.DecodeString(st.ErrData)
		return fmt.Errorf("killing process %d and its children in the guest failed (exit code %d): %s", pid, *st.ExitCode, msg)
	}
	if _, err := waitExec(ctx, dom, name, pid); err != nil {
		return fmt.Errorf("the killed process did not end: %w", err)
	}
	return nil
}

// decodeOutput decodes the agent's base64 output, keeping at most max bytes.
func decodeOutput(data string, max int) ([]byte, bool, error) {
	if data == "" {
		return nil, false, nil
	}
	b, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return nil, false, err
	}
	if max > 0 && len(b) > max {
		return b[:max], true, nil
	}
	return b, false, nil
}

var (
	_ ports.GuestExecer   = (*Hypervisor)(nil)
	_ ports.GuestInformer = (*Hypervisor)(nil)
)

// GuestInfo asks the guest agent about the guest: its OS, kernel, host
// name, time zone and network interfaces (libvirt's virDomainGetGuestInfo).
func (a *guestAgent) GuestInfo(ctx context.Context, id string) (ports.GuestInfo, error) {
	r, dom, err := a.vms.lookup(id)
	if err != nil {
		return ports.GuestInfo{}, err
	}
	defer dom.Free()
	var name string
	var startedAt time.Time
	a.vms.locked(func() { name, startedAt = r.Spec.Name, r.StartedAt })
	if state, _, err := dom.GetState(); err != nil || state != libvirt.DOMAIN_RUNNING {
		return ports.GuestInfo{}, fmt.Errorf("VM %s is not running: %w", name, ports.ErrFailedPrecondition)
	}
	// Asked right after a start, the guest may still be booting: no wait
	// here (a status answers at once), only the channel's state.
	channel, err := waitAgent(ctx, dom, startedAt, 0)
	if err != nil {
		return ports.GuestInfo{}, libvirtError("read the agent channel of "+name, err)
	}
	if channel != agentConnected {
		return ports.GuestInfo{}, noAgent(name, channel)
	}
	adom, err := a.domain(r)
	if err != nil {
		return ports.GuestInfo{}, err
	}
	defer adom.Free()
	gi, err := adom.GetGuestInfo(libvirt.DOMAIN_GUEST_INFO_OS|libvirt.DOMAIN_GUEST_INFO_HOSTNAME|
		libvirt.DOMAIN_GUEST_INFO_TIMEZONE|libvirt.DOMAIN_GUEST_INFO_INTERFACES, 0)
	if err != nil {
		return ports.GuestInfo{}, libvirtError("ask the guest agent of "+name, err)
	}
	info := ports.GuestInfo{Hostname: gi.Hostname}
	if os := gi.OS; os != nil {
		info.OS, info.Kernel = os.PrettyName, os.KernelRelease
		if info.OS == "" {
			info.OS = strings.TrimSpace(os.Name + " " + os.Version)
		}
	}
	if tz := gi.TimeZone; tz != nil {
		info.TimeZone = tz.Name
	}
	for _, i := range gi.Interfaces {
		gif := ports.GuestInterface{Name: i.Name, MAC: i.Hwaddr}
		for _, a := range i.Addrs {
			gif.Addresses = append(gif.Addresses, fmt.Sprintf("%s/%d", a.Addr, a.Prefix))
		}
		info.Interfaces = append(info.Interfaces, gif)
	}
	return info, nil
}
