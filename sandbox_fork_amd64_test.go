package knit_test

import "golang.org/x/sys/unix"

// sysFork is fork(2), which arm64 and other newer ABIs do not have.
var sysFork = int(unix.SYS_FORK)
