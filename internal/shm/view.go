package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Align is the alignment of slices returned by Heap: one cache line.
const Align = 64

// Heap returns a zeroed, 64-byte-aligned byte slice of len and cap size from the Go heap,
// for regions shared between goroutines of one process. It panics if size < 0.
func Heap(size int) []byte {
	if size < 0 {
		panic(fmt.Sprintf("knit/shm: Heap: negative size %d", size))
	}
	// Back the bytes with []uint64 so the base is 8-aligned and the GC never scans them,
	// then skip ahead to the next 64-byte boundary.
	words := make([]uint64, (size+Align+7)/8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	off := int((Align - uintptr(unsafe.Pointer(&b[0]))%Align) % Align)
	return b[off : off+size : off+size]
}

// view returns a pointer to the size-byte word at b[off], panicking unless it lies
// inside b and its address is size-aligned.
func view(fn string, b []byte, off, size int) unsafe.Pointer {
	if off < 0 || off > len(b)-size {
		panic(fmt.Sprintf("knit/shm: %s: offset %d out of range for %d-byte word in %d-byte region", fn, off, size, len(b)))
	}
	p := unsafe.Pointer(&b[off])
	if uintptr(p)%uintptr(size) != 0 {
		panic(fmt.Sprintf("knit/shm: %s: offset %d is not %d-byte aligned", fn, off, size))
	}
	return p
}

// U32 returns an atomic view of the 4 bytes at b[off]. off must lie within b and be
// 4-byte aligned; otherwise U32 panics (callers validate layouts first).
func U32(b []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(view("U32", b, off, 4))
}

// U64 returns an atomic view of the 8 bytes at b[off]. off must lie within b and be
// 8-byte aligned; otherwise U64 panics.
func U64(b []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(view("U64", b, off, 8))
}

// I64 returns an atomic view of the 8 bytes at b[off]. off must lie within b and be
// 8-byte aligned; otherwise I64 panics.
func I64(b []byte, off int) *atomic.Int64 {
	return (*atomic.Int64)(view("I64", b, off, 8))
}
