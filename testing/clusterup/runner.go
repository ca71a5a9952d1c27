package main

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
)

// errFatal ends up (main recovers it) when the harness calls Fatal.
var errFatal = errors.New("fatal")

// runner is the testing.TB the harness runs under outside go test: its
// messages go to stderr, Fatal unwinds to main, and its clean-ups run, last
// first, when the cluster goes down. The embedded testing.TB is nil: a
// method the harness does not use here panics rather than pretends.
type runner struct {
	testing.TB
	name string

	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

func (r *runner) Helper()      {}
func (r *runner) Name() string { return r.name }

func (r *runner) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func (r *runner) Errorf(format string, args ...any) {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	r.Logf(format, args...)
}

func (r *runner) Error(args ...any) { r.Errorf("%s", fmt.Sprint(args...)) }

func (r *runner) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(errFatal)
}

func (r *runner) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

func (r *runner) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *runner) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// TempDir is a new directory, removed at clean-up.
func (r *runner) TempDir() string {
	dir, err := os.MkdirTemp("", "virtlet-cluster-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// cleanUp runs the clean-ups, last first; a Fatal in one ends that one
// only.
func (r *runner) cleanUp() {
	r.mu.Lock()
	fs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		func() {
			defer func() {
				if p := recover(); p != nil && p != errFatal {
					panic(p)
				}
			}()
			fs[i]()
		}()
	}
}
