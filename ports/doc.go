// Package ports holds the interfaces through which the core talks to the
// outside world (hypervisor, image sources, volumes, cloud-init datasources,
// pod networking, persistent state, Kubernetes objects) and the plain data
// types that cross them.
//
// Nothing here knows about gRPC, CRI, libvirt or any other concrete
// technology: adapters implement these interfaces, plugins carry them across
// process boundaries, and the core uses them without caring which is which.
package ports
