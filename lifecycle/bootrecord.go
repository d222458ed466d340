package lifecycle

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// The boot record as it travels to a lane: the settings in JSON (small, and open to new
// fields), then the task table in binary, which for 100,000 tasks is about 4 MB and decodes
// in milliseconds where JSON took 130 ms per lane start. It travels in a sealed memfd
// (shm.SealedFile) inherited on FDBoot, collected from a rendezvous, or sent to a spare with
// its other descriptors; an environment variable, where it used to travel, cannot carry more
// than 128 KiB (about 1,900 tasks).
//
//	"KNITBOOT"                 8 bytes
//	settings length S          uint32, little-endian; S <= maxBootSettings
//	settings                   S bytes of JSON: Boot without Tasks
//	task count N               uint32
//	N tasks, each:
//	  index                    uint32; < MaxTaskIndex
//	  fingerprint              uint64
//	  name length L            uint16; >= 1
//	  name                     L bytes
//
// and nothing after. The lane reads it as hostile input: DecodeBoot checks every length
// against what is left before it allocates, so that it allocates no more than the record's
// own size, and never panics.
const bootMagic = "KNITBOOT"

// Bounds of a boot record.
const (
	// MaxBootRecord is the largest record a lane reads: a million tasks with names of 40
	// bytes fit.
	MaxBootRecord = 64 << 20
	// MaxTaskIndex bounds a task's registry index in a record: the lane's task table has
	// one entry per index up to the largest (16 bytes each: 64 MiB at most).
	MaxTaskIndex = 1 << 22
	// MaxTaskName is the longest task name that can cross to a process lane.
	MaxTaskName     = 1<<16 - 1
	maxBootSettings = 1 << 20
	bootTaskFixed   = 4 + 8 + 2 // index, fingerprint, name length
)

// EncodeBoot encodes b for a lane (DecodeBoot). It fails for a record a lane would refuse:
// a task index or name out of bounds, or more than MaxBootRecord bytes in all.
func EncodeBoot(b Boot) ([]byte, error) {
	settings, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("boot record: %w", err)
	}
	if len(settings) > maxBootSettings {
		return nil, fmt.Errorf("boot record: settings of %d bytes, at most %d", len(settings), maxBootSettings)
	}
	size := len(bootMagic) + 4 + len(settings) + 4
	for _, t := range b.Tasks {
		switch {
		case t.Name == "" || len(t.Name) > MaxTaskName:
			return nil, fmt.Errorf("boot record: task name of %d bytes (1 to %d cross to a process lane)", len(t.Name), MaxTaskName)
		case t.Index >= MaxTaskIndex:
			return nil, fmt.Errorf("boot record: task %q has registry index %d, at most %d cross to a process lane", t.Name, t.Index, MaxTaskIndex-1)
		}
		size += bootTaskFixed + len(t.Name)
	}
	if size > MaxBootRecord {
		return nil, fmt.Errorf("boot record: %d tasks make %d bytes, at most %d", len(b.Tasks), size, MaxBootRecord)
	}
	out := make([]byte, 0, size)
	out = append(out, bootMagic...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(settings)))
	out = append(out, settings...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(b.Tasks)))
	for _, t := range b.Tasks {
		out = binary.LittleEndian.AppendUint32(out, t.Index)
		out = binary.LittleEndian.AppendUint64(out, t.Fingerprint)
		out = binary.LittleEndian.AppendUint16(out, uint16(len(t.Name)))
		out = append(out, t.Name...)
	}
	return out, nil
}

// DecodeBoot decodes a record EncodeBoot made and checks what the lane would apply from it
// (ParseBoot). Whatever data holds, it returns an error or a record within the bounds above,
// allocating no more than about len(data) bytes.
func DecodeBoot(data []byte) (Boot, error) {
	if len(data) > MaxBootRecord {
		return Boot{}, fmt.Errorf("boot record of %d bytes, at most %d", len(data), MaxBootRecord)
	}
	rest, ok := cutPrefix(data, bootMagic)
	if !ok {
		return Boot{}, errors.New("not a boot record (no KNITBOOT magic)")
	}
	n, rest, ok := cutUint32(rest)
	if !ok || n > maxBootSettings || int(n) > len(rest) {
		return Boot{}, errors.New("boot record: settings truncated or too long")
	}
	b, err := ParseBoot(rest[:n])
	if err != nil {
		return Boot{}, err
	}
	rest = rest[n:]
	count, rest, ok := cutUint32(rest)
	if !ok || uint64(count)*(bootTaskFixed+1) > uint64(len(rest)) {
		return Boot{}, errors.New("boot record: task count truncated or larger than the record holds")
	}
	if count > 0 {
		b.Tasks = make([]BootTask, count)
	}
	for i := range b.Tasks {
		if len(rest) < bootTaskFixed {
			return Boot{}, fmt.Errorf("boot record: task %d truncated", i)
		}
		t := &b.Tasks[i]
		t.Index = binary.LittleEndian.Uint32(rest)
		t.Fingerprint = binary.LittleEndian.Uint64(rest[4:])
		l := int(binary.LittleEndian.Uint16(rest[12:]))
		rest = rest[bootTaskFixed:]
		switch {
		case t.Index >= MaxTaskIndex:
			return Boot{}, fmt.Errorf("boot record: task %d has index %d, at most %d", i, t.Index, MaxTaskIndex-1)
		case l == 0 || l > len(rest):
			return Boot{}, fmt.Errorf("boot record: task %d has a name of %d bytes, %d left", i, l, len(rest))
		}
		t.Name, rest = string(rest[:l]), rest[l:]
	}
	if len(rest) != 0 {
		return Boot{}, fmt.Errorf("boot record: %d bytes after its last task", len(rest))
	}
	return b, nil
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return nil, false
	}
	return b[len(prefix):], true
}

func cutUint32(b []byte) (uint32, []byte, bool) {
	if len(b) < 4 {
		return 0, nil, false
	}
	return binary.LittleEndian.Uint32(b), b[4:], true
}
