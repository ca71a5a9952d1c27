package bench

import "os"

// SmokeEnv, set to anything, runs every benchmark once at its smallest
// size, as `make check` does so that none rots: the figures then prove
// nothing and no target is judged (make bench-smoke).
const SmokeEnv = "VIRTLET_BENCH_SMOKE"

// smoke is whether this run is a smoke run (SmokeEnv).
var smoke = os.Getenv(SmokeEnv) != ""

// networkPods is how many pods PodNetwork20 sets up and tears down a round.
var networkPods = size(20, 2)

// manyPods is how many VM pods KubeApply applies at once.
var manyPods = size(10, 2)

// size is full in a real run and smallest in a smoke run.
func size(full, smallest int) int {
	if smoke {
		return smallest
	}
	return full
}
