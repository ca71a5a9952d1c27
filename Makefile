# Virtlet: a CRI runtime that runs Kubernetes pods as VMs.
#
#   make demo    the main job: daemon up, a VM pod booted, its console shown
#   make check   everything CI runs: set-up, lint, unit, integration, e2e, e2e-k8s and
#                critest, each phase timed, ending with a table of the phases' wall time
#                and the 20 slowest tests (testing/check.sh)
#   make test    unit and integration tests (fake hypervisor plugin, real crictl), with -race
#   make e2e     real-VM suites (real libvirtd + QEMU), driven by crictl
#   make e2e-k8s real-VM suites behind a real kubelet and API server (TestKube*)
#   make critest cri-tools' CRI conformance suite; writes docs/critest.md
#   make bench   benchmarks, printing their figures
#   make bench-check  make bench, failing when a benchmark misses its target
#   make fuzz    every fuzz target for FUZZTIME each (default 20s); not in make check,
#                but the corpora they commit (testdata/fuzz) run as seeds in make test
#   make build   every binary into bin/

SHELL := /bin/bash
GO ?= go
export GONOSUMDB := k8s.io,sigs.k8s.io
# go-ceph is built against the node's Ceph release: Debian 12's Ceph 16 (pacific).
export GOFLAGS := -tags=pacific
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
PKG := github.com/virtlet/virtlet
BUILDINFO := $(PKG)/plugins/buildinfo

# Plugins shipped with the daemon (the embedded default manifests name them).
DEFAULT_PLUGINS := $(shell sed -n 's/^command: *//p' plugins/manifest/defaults/*.yaml 2>/dev/null)
# Test-only plugins.
TEST_PLUGINS := bin/virtlet-fake-plugin bin/virtlet-example-scratch

.PHONY: all build deps tools proto test unit integration e2e e2e-k8s e2e-cluster cluster-up cluster-down critest e2e-all bench bench-check bench-smoke fuzz check demo lint clean install uninstall image

all: build

deps:
	testing/setup.sh

tools:
	testing/tools/build.sh

proto:
	proto/generate.sh

# Every binary carries the build's version (the plugins report it).
STAMP := -ldflags "-X $(BUILDINFO).version=$(VERSION)"

bin/virtlet-fake-plugin: FORCE
	$(GO) build $(STAMP) -o $@ ./testing/fakeplugin
bin/virtlet-example-scratch: FORCE
	$(GO) build $(STAMP) -o $@ ./examples/scratch-volume
bin/virtlet-plugin-%: FORCE
	$(GO) build $(STAMP) -o $@ ./cmd/virtlet-plugin-$*

# The daemon embeds the checksums of the default plugins built with it.
bin/virtlet: FORCE $(addprefix bin/,$(DEFAULT_PLUGINS))
	@sums=""; for f in plugins/manifest/defaults/*.yaml; do [ -e "$$f" ] || continue; \
	  name=$$(sed -n 's/^name: *//p' $$f); cmd=$$(sed -n 's/^command: *//p' $$f); \
	  sums="$$sums$$name=$$(sha256sum bin/$$cmd | cut -d' ' -f1),"; done; \
	$(GO) build -ldflags "-X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).pluginChecksums=$$sums" -o $@ ./cmd/virtlet

bin/virtlet-flexvolume-driver: FORCE
	$(GO) build $(STAMP) -o $@ ./cmd/virtlet-flexvolume-driver

# virtletctl; as bin/kubectl-virtlet it is the kubectl plugin `kubectl virtlet`.
bin/virtletctl: FORCE
	$(GO) build $(STAMP) -o $@ ./cmd/virtletctl
	ln -sf virtletctl bin/kubectl-virtlet

build: bin/virtlet bin/virtlet-flexvolume-driver bin/virtletctl $(TEST_PLUGINS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# make check runs every suite through gotestsum (CHECK_DIR set by
# testing/check.sh): go test's usual output, and each test's events kept
# as JSON for the closing table. A plain `make e2e` runs go test itself.
ifdef CHECK_DIR
GOTEST = bin/tools/gotestsum --format standard-quiet --jsonfile $(CHECK_DIR)/$@.json --
# gotestsum counts every benchmark as failed ("unknown": test2json ends no
# benchmark with pass): bench-smoke shows go test's own verbose output,
# which names a real failure, without gotestsum's summary of failures and
# its closing count ("DONE 13 tests, 13 failures").
GOBENCH = bin/tools/gotestsum --format standard-verbose --hide-summary=failed --jsonfile $(CHECK_DIR)/$@.json --
BENCH_OUTPUT = | sed -u '/^DONE [0-9]* tests/d'
else
GOTEST = $(GO) test
GOBENCH = $(GO) test
BENCH_OUTPUT =
endif

# Packages whose tests start the daemon as a process: go's test cache cannot
# see the binaries they build, so they always run.
PROCESS_TESTS := ./testing/integration/... ./plugins/host/...

unit:
	$(GOTEST) -race -timeout 5m $$($(GO) list ./... | grep -v -e /testing/integration -e /testing/e2e -e /testing/bench -e /plugins/host)

integration:
	$(GOTEST) -race -count=1 -timeout 5m $(PROCESS_TESTS)

test: deps lint unit integration

# The real-VM suites run E2E_PARALLEL tests at a time, the longest first
# (testing/e2e's parallel and its slots): a TCG guest keeps one core busy,
# but a test also waits (kubelet, cloud-init, its daemon): with two at a
# time the 2-core machine was 80 % busy, with three e2e-all took 1770 s
# instead of 2005 s (2026-11-28). go test's own -parallel is above the
# number of tests, so that it does not choose the order.
E2E_PARALLEL ?= 3
E2E_GOTEST = VIRTLET_E2E_PARALLEL=$(E2E_PARALLEL) $(GOTEST) -count=1 -parallel 256

e2e: deps
	$(E2E_GOTEST) -timeout 40m -skip '^TestKube|^TestCritest' ./testing/e2e/...

# The Kubernetes binaries are built once per pinned version and cached
# (testing/k8s/build.sh).
e2e-k8s: deps
	testing/k8s/build.sh >/dev/null
	$(E2E_GOTEST) -timeout 20m -run '^TestKube' ./testing/e2e/...

# Nodes on this one machine, each in its own network and mount namespaces
# with its own libvirtd, daemon and kubelet (testing/harness/node.go), and
# a cluster of three, a node of it failing, and a StatefulSet's VM drained
# from node to node on its Ceph root, and make cluster-up and cluster-down
# themselves (issue 28). make check runs them in
# e2e-all.
e2e-cluster: deps
	testing/k8s/build.sh >/dev/null
	$(E2E_GOTEST) -timeout 20m -run '^TestNodesAreIsolated$$|^TestKubeCluster$$|^TestMakeClusterUpAndDown$$|^TestKubeNodeFailure$$|^TestKubeStatefulVMDrain$$|^TestKubeMigration$$|^TestKubeMigrationOfACephRoot$$' ./testing/e2e/...

# The test cluster of e2e-cluster (three Virtlet nodes, each with its own
# kube-proxy, and a control plane), left running for a person to try:
# cluster-up prints its KUBECONFIG; cluster-down removes everything.
cluster-up: deps
	testing/k8s/build.sh >/dev/null
	testing/images/build.sh tiny >/dev/null
	testing/cluster.sh up

cluster-down:
	testing/cluster.sh down

# cri-tools' conformance suite against VM pods and forwarded container
# pods; regenerates docs/critest.md.
critest: deps
	CRITEST_REPORT=$(CURDIR)/docs/critest.md $(GOTEST) -count=1 -timeout 20m -run '^TestCritest$$' ./testing/e2e/...

# make check's: the three suites above in one run, so that the
# kubelet-driven tests and critest pack beside the VM tests.
e2e-all: deps
	testing/k8s/build.sh >/dev/null
	CRITEST_REPORT=$(CURDIR)/docs/critest.md $(E2E_GOTEST) -timeout 55m ./testing/e2e/...

check:
	testing/check.sh

# Every benchmark also appends its figures to BENCH_TABLE; the last step
# prints them as one table (figure, ours, floor or peer, ratio, target, met).
BENCH_TABLE ?= $(CURDIR)/.cache/bench-table.jsonl
bench: export BENCH_TABLE := $(BENCH_TABLE)
bench: deps
	mkdir -p $(dir $(BENCH_TABLE)) && rm -f $(BENCH_TABLE)
	$(GO) test -run '^$$' -bench 'PluginRoundTrip|List|CloudInitISO' -benchtime 3000x ./testing/bench/
	$(GO) test -run '^$$' -bench 'P1BootOverhead|P1PoolPrimitives|P6PullVsCurl|P2SecondRootDisk|FilesFromDataSource|PodNetwork20|ReachTheVM|P5Density|Checkpoint|VMOverhead|TCGTranslationCache' -benchtime 1x -timeout 40m ./testing/bench/
	$(GO) test -run '^$$' -bench 'P5HundredVMPods' -benchtime 1x -timeout 60m ./testing/bench/
	testing/k8s/build.sh >/dev/null
	$(GO) test -run '^$$' -bench 'KubeApply|Cluster|Migration' -benchtime 1x -timeout 30m ./testing/bench/
	@echo "targets: PluginRoundTrip p50 overhead above bare gRPC on the same connection (grpc-floor-*, no Virtlet code) <= 10 %;"
	@echo "         List*500 server p99 <= 2000 µs (e2e-* adds the client's own decoding);"
	@echo "         P1 (its table): RunPodSandbox -> first console line through the daemon, claimed from the libvirt plugin's pool, <= 1.5 x bare QEMU; StartContainer <= 50 ms;"
	@echo "         the cold path (no pool) and the memory of a paused pool domain beside them"
	@echo "         P1PoolPrimitives: libvirt alone, cold define+start vs hot-plug into a pre-launched paused domain + resume, vs bare QEMU (the pool design's evidence)"
	@echo "         P6 256 MiB pull / curl -o ratio <= 1.1; P2 second root disk <= 50 ms and <= 1 MiB written;"
	@echo "         FilesFromDataSource: 3 files into a fresh overlay of the cloud image without a host mount (no target)"
	@echo "         PodNetwork20: pod network setup (RunPodSandbox) and teardown (StopPodSandbox), p50 over 20 pods"
	@echo "         P5Density: 50 tiny VM pods at once: all ready, QEMU RSS/VM, daemon+plugins RSS growth/pod <= 1 MiB, list p99 <= 2 ms, plugin RPCs/start <= 20"
	@echo "         P5HundredVMPods: 100 tiny VM pods (128 MiB, pod network) at once: all ready, host memory in use at rest <= 8 GiB (KSM off and on), list p99 <= 2 ms, RunPodSandbox p99 <= 100 ms; the limit found by adding pods"
	@echo "         VMOverhead: what a running VM's QEMU costs beyond its guest's touched memory (own, TCG cache, page tables) <= 40 MiB per tiny VM; a 1 GiB VM's node cost with the daemon's share <= 100 MiB"
	@echo "         TCGTranslationCache: bare QEMU's boot and RSS per translation cache size, the tiny guest and the cloud guest (systemd)"
	@echo "         ReachTheVM: ExecSync through qemu-guest-agent p50/p99; port-forward throughput / direct TCP to the VM (no target set)"
	@echo "         Checkpoint: CheckpointContainer of an idle tiny guest (128 MiB, 1 GiB) beside its cold boot; archive size, guest pause, heartbeat gap; 1 GiB <= 3 s; its restore in a new pod <= 2 s"
	@echo "         KubeApply: kubectl apply -> Running / -> guest ready (p50 of 5) beside bare QEMU, <= bare + 1 s; 10 at once -> Running p50/p99; VIRTLET_BENCH_TB_CACHE_MIB=N sets the libvirt plugin's tcgTranslationCacheMiB"
	@echo; $(GO) run ./testing/bench/table $(BENCH_TABLE)

# Every benchmark once at its smallest size (testing/bench/size.go), so
# that none rots: make check runs it; its figures judge nothing.
bench-smoke: deps
	testing/k8s/build.sh >/dev/null
	set -o pipefail; VIRTLET_BENCH_SMOKE=1 $(GOBENCH) -count=1 -run '^$$' -bench . -benchtime 1x -timeout 15m ./testing/bench/ $(BENCH_OUTPUT)

# make bench, then fail when a target was missed (naming each).
bench-check: bench
	$(GO) run ./testing/bench/table -check $(BENCH_TABLE)

# go test -fuzz takes one target per run: every func FuzzX of the tracked
# tests runs in turn, and a failure (its input written to
# <package>/testdata/fuzz/FuzzX/) fails the run once all have had their time.
FUZZTIME ?= 20s
fuzz:
	@failed=""; \
	for hit in $$(git ls-files '*_test.go' | xargs grep -Ho '^func Fuzz[A-Za-z0-9_]*' | sed 's/:func /:/'); do \
	  pkg=./$$(dirname $${hit%%:*}); fn=$${hit##*:}; \
	  echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg || failed="$$failed $$pkg:$$fn"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz targets failed:$$failed"; exit 1; fi

demo: deps build
	@if [ -x testing/demo/run.sh ]; then testing/demo/run.sh; else echo "the demo boots a real VM pod: it needs the libvirt hypervisor plugin, which is not built yet" >&2; exit 1; fi

# make install [DESTDIR=...] [PREFIX=/usr/local] [SYSCONFDIR=/etc] [PLUGINDIR=...] [KUBELET_VOLUME_PLUGIN_DIR=...]:
# a node install. The daemon and virtletctl under $(PREFIX)/bin, the
# plugins in $(PLUGINDIR) ($(PREFIX)/bin unless set; the node image puts
# them in /usr/libexec/virtlet);
# the shipped plugins' manifests, pinned by checksum, in
# $(SYSCONFDIR)/virtlet/plugins.d; the config (kept if present) and an empty
# image translations directory under $(SYSCONFDIR)/virtlet; the flexvolume
# driver where kubelet looks for it; the systemd unit and kubelet's
# drop-in. `virtletctl gen` prints the cluster side (README: "Installing a
# node").
PREFIX ?= /usr/local
SYSCONFDIR ?= /etc
PLUGINDIR ?= $(PREFIX)/bin
KUBELET_VOLUME_PLUGIN_DIR ?= /usr/libexec/kubernetes/kubelet-plugins/volume/exec
SYSTEMD_DIR ?= $(SYSCONFDIR)/systemd/system
# systemd-tmpfiles reads /usr/local/lib/tmpfiles.d as well as /usr/lib's.
TMPFILES_DIR ?= $(PREFIX)/lib/tmpfiles.d
# virtletctl's shell completions (bash-completion, zsh and fish read these).
COMPLETIONS = $(DESTDIR)$(PREFIX)/share/bash-completion/completions/virtletctl \
	$(DESTDIR)$(PREFIX)/share/zsh/vendor-completions/_virtletctl \
	$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/virtletctl.fish
PATHS_SED := sed -e 's|/usr/local/bin|$(PREFIX)/bin|g' -e 's|/etc/virtlet|$(SYSCONFDIR)/virtlet|g'
install: build
	install -D -m 0755 bin/virtlet $(DESTDIR)$(PREFIX)/bin/virtlet
	install -D -m 0755 bin/virtletctl $(DESTDIR)$(PREFIX)/bin/virtletctl
	ln -sf virtletctl $(DESTDIR)$(PREFIX)/bin/kubectl-virtlet
# An older install named the plugin kubectl-virt, which is KubeVirt's:
# ours (a link to virtletctl) goes, theirs stays.
	[ "$$(readlink $(DESTDIR)$(PREFIX)/bin/kubectl-virt 2>/dev/null)" != virtletctl ] || rm -f $(DESTDIR)$(PREFIX)/bin/kubectl-virt
	for p in $(DEFAULT_PLUGINS); do install -D -m 0755 bin/$$p $(DESTDIR)$(PLUGINDIR)/$$p; done
	install -d -m 0755 $(DESTDIR)$(SYSCONFDIR)/virtlet/plugins.d $(DESTDIR)$(SYSCONFDIR)/virtlet/images
	for f in plugins/manifest/defaults/*.yaml; do \
	  cmd=$$(sed -n 's/^command: *//p' $$f); \
	  { sed "s|^command: .*|command: $(PLUGINDIR)/$$cmd|" $$f; echo "sha256: $$(sha256sum bin/$$cmd | cut -d' ' -f1)"; } \
	    > $(DESTDIR)$(SYSCONFDIR)/virtlet/plugins.d/$$(basename $$f); \
	  chmod 0644 $(DESTDIR)$(SYSCONFDIR)/virtlet/plugins.d/$$(basename $$f); done
	[ -e $(DESTDIR)$(SYSCONFDIR)/virtlet/virtlet.yaml ] || $(PATHS_SED) -e 's|^pluginBinDir: .*|pluginBinDir: $(PLUGINDIR)|' deploy/node/virtlet.yaml > $(DESTDIR)$(SYSCONFDIR)/virtlet/virtlet.yaml
	install -D -m 0755 bin/virtlet-flexvolume-driver "$(DESTDIR)$(KUBELET_VOLUME_PLUGIN_DIR)/virtlet~flexvolume_driver/flexvolume_driver"
	install -d -m 0755 $(DESTDIR)$(SYSTEMD_DIR)/kubelet.service.d
	$(PATHS_SED) deploy/node/virtlet.service > $(DESTDIR)$(SYSTEMD_DIR)/virtlet.service
	install -m 0644 deploy/node/10-virtlet.conf $(DESTDIR)$(SYSTEMD_DIR)/kubelet.service.d/10-virtlet.conf
	install -D -m 0644 deploy/node/virtlet-ksm.conf $(DESTDIR)$(TMPFILES_DIR)/virtlet-ksm.conf
	set -e; for sh in bash zsh fish; do \
	  case $$sh in bash) f=$(word 1,$(COMPLETIONS));; zsh) f=$(word 2,$(COMPLETIONS));; fish) f=$(word 3,$(COMPLETIONS));; esac; \
	  install -d -m 0755 $$(dirname $$f); bin/virtletctl completion $$sh > $$f; chmod 0644 $$f; done

# make uninstall removes what make install put, the config too. The
# daemon leaves nothing else on the node once its VM pods are gone: the
# ACL entries it gives VM users go with their VMs (ARCHITECTURE.md). Stop
# the daemon first (systemctl disable --now virtlet).
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/virtlet $(DESTDIR)$(PREFIX)/bin/virtletctl $(DESTDIR)$(PREFIX)/bin/kubectl-virtlet
	[ "$$(readlink $(DESTDIR)$(PREFIX)/bin/kubectl-virt 2>/dev/null)" != virtletctl ] || rm -f $(DESTDIR)$(PREFIX)/bin/kubectl-virt
	for p in $(DEFAULT_PLUGINS); do rm -f $(DESTDIR)$(PLUGINDIR)/$$p; done
	-[ "$(PLUGINDIR)" = "$(PREFIX)/bin" ] || rmdir $(DESTDIR)$(PLUGINDIR) 2>/dev/null
	rm -rf $(DESTDIR)$(SYSCONFDIR)/virtlet
	rm -rf "$(DESTDIR)$(KUBELET_VOLUME_PLUGIN_DIR)/virtlet~flexvolume_driver"
	rm -f $(DESTDIR)$(SYSTEMD_DIR)/virtlet.service $(DESTDIR)$(SYSTEMD_DIR)/kubelet.service.d/10-virtlet.conf
	-rmdir $(DESTDIR)$(SYSTEMD_DIR)/kubelet.service.d 2>/dev/null
	rm -f $(COMPLETIONS) $(DESTDIR)$(TMPFILES_DIR)/virtlet-ksm.conf

# make image [IMAGE=docker://REGISTRY/virtlet/virtlet-node:TAG] [IMAGE_INSECURE=1]:
# the node installer's OCI image, built without docker: one layer holding
# what `make install` stages for a node (plugins in /usr/libexec/virtlet)
# and the static installer, its entrypoint (deploy/installer-daemonset.yaml
# runs it; docs/operator.md, "Installing with a DaemonSet"). IMAGE is where
# it goes: an OCI layout (the default) or a registry (IMAGE_INSECURE=1 for
# plain HTTP). The node's libvirt and QEMU stay its Debian packages.
IMAGE ?= oci:bin/image:$(VERSION)
bin/virtlet-installer: FORCE
	CGO_ENABLED=0 $(GO) build $(STAMP) -o $@ ./cmd/virtlet-installer

image: build bin/virtlet-installer
	rm -rf bin/image-stage
	$(MAKE) -s install DESTDIR=$(CURDIR)/bin/image-stage PREFIX=/usr/local SYSCONFDIR=/etc PLUGINDIR=/usr/libexec/virtlet
	$(GO) run ./cmd/virtlet-image-build --stage bin/image-stage --installer bin/virtlet-installer --image-version $(VERSION) --dest $(IMAGE) $(if $(IMAGE_INSECURE),--insecure)

clean:
	rm -rf bin

FORCE:
