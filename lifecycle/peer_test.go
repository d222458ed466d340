package lifecycle

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/knitgo/knit/internal/shm"
)

func TestPeerCheck(t *testing.T) {
	me, parent := os.Getpid(), os.Getppid()
	if err := peerCheck(parent)(shm.Peer{PID: me, UID: os.Geteuid()}); err != nil {
		t.Errorf("a descendant of the lane process was refused: %v", err)
	}
	if err := peerCheck(me)(shm.Peer{PID: me, UID: os.Geteuid()}); err != nil {
		t.Errorf("the lane process itself was refused: %v", err)
	}
	if err := peerCheck(me)(shm.Peer{PID: parent, UID: os.Geteuid()}); err == nil || !strings.Contains(err.Error(), "not lane process") {
		t.Errorf("the lane's parent was admitted: %v", err)
	}
	if err := peerCheck(me)(shm.Peer{PID: me, UID: os.Geteuid() + 1}); err == nil || !strings.Contains(err.Error(), "uid") {
		t.Errorf("another user was admitted: %v", err)
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err == nil {
		if err := peerCheck(me)(shm.Peer{PID: cmd.Process.Pid, UID: os.Geteuid()}); err == nil {
			t.Errorf("a process that is gone was admitted")
		}
	}
	if err := peerCheck(me)(shm.Peer{PID: 0, UID: os.Geteuid()}); err == nil {
		t.Errorf("a peer in a pid namespace out of sight was admitted because it runs as this user")
	}
}
