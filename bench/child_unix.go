//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
)

// unixMsgSize is the fixed size of every message on the socket rows.
const unixMsgSize = 8

// unixChildMain is the KNIT_BENCH_CHILD=unix role: fd 3 is one end of a
// unix socketpair. Echo every 8-byte message back, flushing whenever no
// complete message is buffered (so one-in-flight round trips are answered
// at once and pipelined bursts are answered in batches). Exit 0 when the
// parent closes its end.
func unixChildMain() int {
	sock := os.NewFile(3, "bench-socket")
	if sock == nil {
		fmt.Fprintln(os.Stderr, "unix child: fd 3 missing")
		return 2
	}
	r := bufio.NewReaderSize(sock, 64<<10)
	w := bufio.NewWriterSize(sock, 64<<10)
	var msg [unixMsgSize]byte
	for {
		if _, err := io.ReadFull(r, msg[:]); err != nil {
			if err == io.EOF {
				return 0 // parent closed its end
			}
			fmt.Fprintln(os.Stderr, "unix child: read:", err)
			return 1
		}
		if _, err := w.Write(msg[:]); err != nil {
			fmt.Fprintln(os.Stderr, "unix child: write:", err)
			return 1
		}
		if r.Buffered() < unixMsgSize {
			if err := w.Flush(); err != nil {
				fmt.Fprintln(os.Stderr, "unix child: flush:", err)
				return 1
			}
		}
	}
}
