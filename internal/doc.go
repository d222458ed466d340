// Package internal holds what no knit user imports: the Linux syscalls behind the fast path
// (memfd, mmap, futex, eventfd), logging namespaces, process groups and /proc, each in its own
// sub-package behind small typed functions. Nothing here may know about tasks or pools.
package internal
