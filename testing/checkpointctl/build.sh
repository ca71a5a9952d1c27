#!/usr/bin/env bash
# Builds checkpointctl, the checkpoint-restore project's tool that reads
# container checkpoint archives, at one pinned version from the Go module
# proxy (testing/gotool.sh, cached): the checkpoint tests show Virtlet's
# VM checkpoints with it. Prints the binary's path.
#   testing/checkpointctl/build.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../gotool.sh" checkpointctl github.com/checkpoint-restore/checkpointctl 1.4.0 "$here/build.sh"
