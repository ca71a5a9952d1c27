package core

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// step is one side effect of a use case, as a row of its table: what it
// does, how it is undone, the failpoint the crash-matrix tests kill the
// daemon at once it is done, and the phase its time is reported under.
// The undo, the crash matrix and the per-phase metrics and logs of a use
// case all come from its table.
type step[S any] struct {
	name string
	// skip, if set, says the step has nothing to do for this run.
	skip func(*S) bool
	do   func(context.Context, *S) error
	// undo reverses do. It is called for the step that failed as well as
	// for those done (a failed step may have done part of its work), and
	// for every step when the reconciler undoes an interrupted run, so it
	// tolerates what was never made or is already gone. nil: nothing to
	// undo.
	undo func(context.Context, *S) error
	// failpoint is called after do succeeded ("": none).
	failpoint string
	// phase names the step's time in the VM phase metrics, a func of the
	// run as the phase may depend on the path taken (nil, or "": not
	// reported).
	phase func(*S) ports.VMPhase
}

// fixedPhase is a step's phase that does not depend on the run.
func fixedPhase[S any](p ports.VMPhase) func(*S) ports.VMPhase {
	return func(*S) ports.VMPhase { return p }
}

// runSteps does the steps in order. When one fails, it undoes it and
// those before it, in reverse order, and returns the step's error; an
// error of the undo is returned as undoErr (the caller leaves the record
// for the reconciler to finish the undo).
func runSteps[S any](ctx context.Context, r *shared, steps []step[S], s *S, log logrus.FieldLogger) (err, undoErr error) {
	for i, st := range steps {
		if st.skip != nil && st.skip(s) {
			continue
		}
		start := time.Now()
		if err := st.do(ctx, s); err != nil {
			log.WithError(err).WithField("step", st.name).Debug("step failed; undoing")
			return err, undoSteps(ctx, steps[:i+1], s, log)
		}
		took := time.Since(start)
		if st.phase != nil {
			if p := st.phase(s); p != "" {
				r.phaseDone(p, start)
			}
		}
		log.WithFields(logrus.Fields{"step": st.name, "took": took.Round(time.Millisecond)}).Debug("step done")
		if st.failpoint != "" {
			r.failpoint(st.failpoint)
		}
	}
	return nil, nil
}

// undoSteps undoes steps in reverse order, and stops at the first undo
// that fails: what a later step made may still use what an earlier one
// made (a defined domain its volumes), so the rest waits for the retry.
func undoSteps[S any](ctx context.Context, steps []step[S], s *S, log logrus.FieldLogger) error {
	for i := len(steps) - 1; i >= 0; i-- {
		st := steps[i]
		if st.undo == nil || (st.skip != nil && st.skip(s)) {
			continue
		}
		if err := st.undo(ctx, s); err != nil {
			log.WithError(err).WithField("step", st.name).Warn("undo step")
			return err
		}
	}
	return nil
}

// stepFailpoints lists the failpoints of a table, in order.
func stepFailpoints[S any](steps []step[S]) []string {
	var out []string
	for _, st := range steps {
		if st.failpoint != "" {
			out = append(out, st.failpoint)
		}
	}
	return out
}
