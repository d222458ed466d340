// Package procfs reads what knit needs to know about a process from /proc: its resident
// memory (the inspector, MaxLaneMemory), its state and its parent (spares, rendezvous
// peers). It only reads; it never signals or changes a process, and it never panics on
// what it reads (a process may end, and its pid be reused, between any two reads).
package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// ErrFormat is returned for a statm file that does not read as one.
var ErrFormat = errors.New("procfs: malformed statm")

// RSS is the resident set size of process pid in bytes: the second field of
// /proc/<pid>/statm (resident pages) times the page size.
func RSS(pid int) (int64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("procfs: pid %d", pid)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0, err
	}
	pages, err := residentPages(b)
	if err != nil {
		return 0, err
	}
	return pages * int64(os.Getpagesize()), nil
}

// residentPages parses statm ("size resident shared text lib data dt", in pages).
func residentPages(b []byte) (int64, error) {
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, ErrFormat
	}
	n, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: resident %q", ErrFormat, f[1])
	}
	return n, nil
}

// Stat is the state letter and parent pid of process pid, from /proc/<pid>/stat.
func Stat(pid int) (state byte, ppid int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseStat(b)
}

// parseStat reads "pid (comm) state ppid ...": comm may hold anything, spaces and
// parentheses included, but ends at the last ')'.
func parseStat(b []byte) (state byte, ppid int, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("procfs: malformed stat: no command")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("procfs: malformed stat: %d fields after the command", len(f))
	}
	if ppid, err = strconv.Atoi(string(f[1])); err != nil {
		return 0, 0, fmt.Errorf("procfs: malformed stat: ppid %q", f[1])
	}
	return f[0][0], ppid, nil
}
