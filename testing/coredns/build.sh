#!/usr/bin/env bash
# Builds CoreDNS, the cluster DNS of the multi-node tests' mixed node, at
# one pinned version from the Go module proxy (testing/gotool.sh, cached;
# static: it runs in a container image of the tests' own,
# harness.CoreDNSImage). Prints the binary's path.
#   testing/coredns/build.sh
# A cold build takes about 3 minutes on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../gotool.sh" coredns github.com/coredns/coredns 1.12.4 "$here/build.sh"
