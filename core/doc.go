// Package core is the domain of Virtlet: VM pods (CRI sandboxes) and the
// single VM each of them runs (the CRI container), their images, and the use
// cases that move them through their lifecycles.
//
// The core talks to the world only through the interfaces of package ports
// and never imports adapters, plugins, gRPC, CRI, libvirt or storage
// libraries; a test enforces it. Every use case is idempotent because kubelet
// retries: running the same pod twice returns the same sandbox, removing what
// is gone succeeds. Slow operations keep going after the caller's deadline so
// that kubelet's retry picks up their result instead of starting a second VM.
package core
