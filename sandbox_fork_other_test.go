//go:build !amd64

package knit_test

// sysFork: this architecture has no fork(2) (the "fork" probe is run on amd64 only).
var sysFork = -1
