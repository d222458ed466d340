package knit

// abortBits hands a bitmap's abort bits to cancellable calls: a lane's own bits, or a
// stealing pool's shared ones. Its owner's mutex guards it.
type abortBits struct {
	owner []uint64 // owner[bit] names the call holding it (abortOwner), 0 when free
	free  []int32
}

func newAbortBits(n int) abortBits {
	a := abortBits{owner: make([]uint64, n)}
	for i := range n {
		a.free = append(a.free, int32(n-1-i))
	}
	return a
}

// abortOwner names a call by task and record: record ids are per task.
func abortOwner(fn, id uint32) uint64 { return uint64(fn)<<32 | uint64(id) + 1 }

// alloc gives call id of task fn a bit, or -1 when all are taken (the call can then be
// settled by its caller but not interrupted on its lane).
func (a *abortBits) alloc(fn, id uint32) int32 {
	n := len(a.free)
	if n == 0 {
		return -1
	}
	bit := a.free[n-1]
	a.free = a.free[:n-1]
	a.owner[bit] = abortOwner(fn, id)
	return bit
}

// holds reports whether bit belongs to call id of task fn.
func (a *abortBits) holds(bit int32, fn, id uint32) bool {
	return bit >= 0 && int(bit) < len(a.owner) && a.owner[bit] == abortOwner(fn, id)
}

// release frees bit, whoever held it; it reports whether it was held.
func (a *abortBits) release(bit int32) bool {
	if bit < 0 || int(bit) >= len(a.owner) || a.owner[bit] == 0 {
		return false
	}
	a.owner[bit] = 0
	a.free = append(a.free, bit)
	return true
}
