package core

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// RunPodSandbox's and CreateContainer's failpoints are their tables', in the order the crash
// matrix meets them.
func TestCreateStepsAreTheCrashMatrix(t *testing.T) {
	for _, tc := range []struct {
		recorded string
		steps    []string
	}{
		{FPSandboxRecorded, stepFailpoints(runSandboxSteps)},
		{FPCreateRecorded, stepFailpoints(createSteps)},
	} {
		got := append([]string{tc.recorded}, tc.steps...)
		i := slices.Index(Failpoints, tc.recorded)
		if i < 0 || i+len(got) > len(Failpoints) || !slices.Equal(Failpoints[i:i+len(got)], got) {
			t.Errorf("Failpoints %v do not list %v in order", Failpoints, got)
		}
	}
}

type phaseRecorder struct {
	ports.Observer
	phases []ports.VMPhase
}

func (p *phaseRecorder) VMPhase(phase ports.VMPhase, _ time.Duration) {
	p.phases = append(p.phases, phase)
}

type run struct{ log []string }

func note(what string) func(context.Context, *run) error {
	return func(_ context.Context, r *run) error { r.log = append(r.log, what); return nil }
}

func fail(what string) func(context.Context, *run) error {
	return func(_ context.Context, r *run) error {
		r.log = append(r.log, what)
		return errors.New(what + " failed")
	}
}

// A table's steps run in order, each reporting its phase and reaching its
// failpoint; a failure undoes the failed step and those before it in
// reverse, and an undo that fails stops the undo there.
func TestRunSteps(t *testing.T) {
	table := func(second, undoFirst func(context.Context, *run) error) []step[run] {
		return []step[run]{
			{name: "a", do: note("do a"), undo: undoFirst, failpoint: "fp-a", phase: fixedPhase[run](ports.PhaseVolumes)},
			{name: "skipped", do: note("do skipped"), undo: note("undo skipped"), skip: func(*run) bool { return true }},
			{name: "b", do: second, undo: note("undo b"), failpoint: "fp-b", phase: fixedPhase[run](ports.PhaseDefine)},
			{name: "c", do: note("do c"), undo: note("undo c")},
		}
	}
	for _, tc := range []struct {
		name           string
		second, undoA  func(context.Context, *run) error
		wantLog        []string
		wantFailpoints []string
		wantPhases     []ports.VMPhase
		wantErr, undo  bool
	}{
		{name: "all done", second: note("do b"), undoA: note("undo a"),
			wantLog: []string{"do a", "do b", "do c"}, wantFailpoints: []string{"fp-a", "fp-b"}, wantPhases: []ports.VMPhase{ports.PhaseVolumes, ports.PhaseDefine}},
		{name: "b fails", second: fail("do b"), undoA: note("undo a"), wantErr: true,
			wantLog: []string{"do a", "do b", "undo b", "undo a"}, wantFailpoints: []string{"fp-a"}, wantPhases: []ports.VMPhase{ports.PhaseVolumes}},
		{name: "b fails, a's undo too", second: fail("do b"), undoA: fail("undo a"), wantErr: true, undo: true,
			wantLog: []string{"do a", "do b", "undo b", "undo a"}, wantFailpoints: []string{"fp-a"}, wantPhases: []ports.VMPhase{ports.PhaseVolumes}},
	} {
		var failpoints []string
		obs := &phaseRecorder{}
		r := &shared{deps: Deps{Observer: obs}, opts: Options{Failpoint: func(name string) { failpoints = append(failpoints, name) }}}
		var s run
		err, undoErr := runSteps(context.Background(), r, table(tc.second, tc.undoA), &s, logrus.New())
		if (err != nil) != tc.wantErr || (undoErr != nil) != tc.undo {
			t.Errorf("%s: error %v, undo error %v", tc.name, err, undoErr)
		}
		if !slices.Equal(s.log, tc.wantLog) || !slices.Equal(failpoints, tc.wantFailpoints) || !slices.Equal(obs.phases, tc.wantPhases) {
			t.Errorf("%s: ran %v, failpoints %v, phases %v; want %v, %v, %v", tc.name, s.log, failpoints, obs.phases, tc.wantLog, tc.wantFailpoints, tc.wantPhases)
		}
	}
	// An undo from a record undoes every step, the last first.
	var s run
	if err := undoSteps(context.Background(), table(note("do b"), note("undo a")), &s, logrus.New()); err != nil || !slices.Equal(s.log, []string{"undo c", "undo b", "undo a"}) {
		t.Errorf("undo of every step: %v, %v", s.log, err)
	}
}
