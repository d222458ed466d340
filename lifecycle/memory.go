package lifecycle

import (
	"fmt"
	"os"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/futex"
	"github.com/knitgo/knit/internal/shm"
)

// Memory is what a process lane shares with its host: its region, in a memfd sealed against
// resizing (shm.CreateMemfd: a lane can write it but never resize it, so nothing a lane does
// to the file can make the host's mapping fault), and the completion doorbell, an eventfd.
type Memory struct {
	Region *fastpath.Region
	mp     *shm.Mapping
	efd    *futex.EventFD
}

// NewMemory creates lane's region for incarnation, and its doorbell. Its errors name the
// step that failed.
func NewMemory(layout fastpath.Layout, lane, incarnation uint32, epoch int64) (*Memory, error) {
	mp, err := shm.CreateMemfd(fmt.Sprintf("knit-lane-%d", lane), layout.Size())
	if err != nil {
		return nil, fmt.Errorf("shared memory: %v", err)
	}
	r, err := fastpath.NewRegion(mp.Bytes(), layout, lane, incarnation, epoch)
	if err != nil {
		mp.Close()
		return nil, fmt.Errorf("region: %v", err)
	}
	efd, err := futex.NewEventFD()
	if err != nil {
		mp.Close()
		return nil, fmt.Errorf("eventfd: %v", err)
	}
	return &Memory{Region: r, mp: mp, efd: efd}, nil
}

// Files are the region's memfd and the eventfd, in the order a lane takes them (FDRegion,
// FDDone).
func (m *Memory) Files() []*os.File { return []*os.File{m.mp.File(), m.efd.File()} }

// DoneBell is the completion doorbell the host sleeps on.
func (m *Memory) DoneBell() fastpath.Bell { return fastpath.EventBell{FD: m.efd} }

// Close closes the doorbell and unmaps the region: nothing may read it after.
func (m *Memory) Close() {
	_ = m.efd.Close()
	_ = m.mp.Close()
}
