package lifecycle

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// manyTasks is a task table of n entries, with indexes from 7 on (a host serving a subset of
// its registry).
func manyTasks(n int) []BootTask {
	tasks := make([]BootTask, n)
	for i := range tasks {
		tasks[i] = BootTask{Name: fmt.Sprintf("knit.test.task.%d", i), Index: uint32(7 + i), Fingerprint: uint64(i) * 0x9e3779b97f4a7c15}
	}
	return tasks
}

func testBoot(tasks []BootTask) Boot {
	return Boot{Version: 3, Lane: 2, Incarnation: 5, Shm: "knit-1-00", Tasks: tasks, MaxCall: 1 << 20, Spin: 50,
		Park: 1e10, Epoch: 42, Debug: "lifecycle", Beat: 7, Steal: true, Consumer: 1,
		Limits:  &BootLimits{Version: LimitsVersion, Data: 256 << 20, Files: 64},
		Sandbox: &Sandbox{}}
}

// TestBootRecordRoundTrip: what EncodeBoot writes, DecodeBoot reads back, from no task to
// 100,000 (3.5 MB: the environment variable it replaced held 128 KiB).
func TestBootRecordRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 100_000} {
		b := testBoot(manyTasks(n))
		if n == 0 {
			b.Tasks = nil
		}
		record, err := EncodeBoot(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeBoot(record)
		if err != nil {
			t.Fatalf("%d tasks: %v", n, err)
		}
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("%d tasks: decoded %+v, want %+v", n, got, b)
		}
		if n == 100_000 && len(record) > 4<<20 {
			t.Errorf("100,000 tasks take %d bytes", len(record))
		}
	}
}

// TestEncodeBootRefuses: a record a lane would refuse is refused at the host, saying why.
func TestEncodeBootRefuses(t *testing.T) {
	for _, c := range []struct {
		task BootTask
		want string
	}{
		{BootTask{Name: ""}, "task name of 0 bytes"},
		{BootTask{Name: strings.Repeat("x", MaxTaskName+1)}, "task name of 65536 bytes"},
		{BootTask{Name: "far", Index: MaxTaskIndex}, `task "far" has registry index 4194304`},
	} {
		if _, err := EncodeBoot(Boot{Tasks: []BootTask{c.task}}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("EncodeBoot(%.20q): %v, want %q", c.task.Name, err, c.want)
		}
	}
	long := make([]BootTask, MaxBootRecord/(MaxTaskName+bootTaskFixed)+1)
	name := strings.Repeat("x", MaxTaskName)
	for i := range long {
		long[i] = BootTask{Name: name, Index: uint32(i)}
	}
	if _, err := EncodeBoot(Boot{Tasks: long}); err == nil || !strings.Contains(err.Error(), "at most 67108864") {
		t.Errorf("a record over MaxBootRecord: %v", err)
	}
}

// TestDecodeBootRefuses: corrupt records fail with an error, before allocating what they
// claim.
func TestDecodeBootRefuses(t *testing.T) {
	good, err := EncodeBoot(testBoot(manyTasks(3)))
	if err != nil {
		t.Fatal(err)
	}
	settings := int(binary.LittleEndian.Uint32(good[8:]))
	count := 12 + settings // offset of the task count
	with := func(off int, v uint32) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	for _, c := range []struct {
		name string
		bad  []byte
		want string
	}{
		{"empty", nil, "no KNITBOOT magic"},
		{"JSON (the old format)", []byte(`{"version":1,"tasks":[]}`), "no KNITBOOT magic"},
		{"magic only", []byte(bootMagic), "settings truncated or too long"},
		{"settings too long", with(8, 1<<30), "settings truncated or too long"},
		{"settings not JSON", with(8, 3), "JSON"},
		{"count too large", with(count, 1<<31), "task count truncated or larger than the record holds"},
		{"index out of range", with(count+4, MaxTaskIndex), "task 0 has index 4194304"},
		{"truncated task", good[:len(good)-1], "task 2 has a name of 16 bytes, 15 left"},
		{"trailing bytes", append(bytes.Clone(good), 0), "1 bytes after its last task"},
		{"empty name", append(with(count, 4), make([]byte, bootTaskFixed+1)...), "task 3 has a name of 0 bytes"},
		{"bad limits", bytes.Replace(good, []byte(`"nofile":64`), []byte(`"nofile":-1`), 1), "open-files limit -1"},
	} {
		if b, err := DecodeBoot(c.bad); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: decoded %+v, %v; want an error saying %q", c.name, b, err, c.want)
		}
	}
}

// FuzzDecodeBoot: a boot record is a lane's first input; whatever it holds, DecodeBoot
// returns an error or a record within bounds that encodes back to itself.
func FuzzDecodeBoot(f *testing.F) {
	for _, n := range []int{0, 2} {
		good, err := EncodeBoot(testBoot(manyTasks(n)))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(good)
	}
	f.Add([]byte(bootMagic + "\x02\x00\x00\x00{}\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00x"))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeBoot(data)
		if err != nil {
			return
		}
		for _, bt := range b.Tasks {
			if bt.Name == "" || len(bt.Name) > MaxTaskName || bt.Index >= MaxTaskIndex {
				t.Fatalf("accepted task %+v", bt)
			}
		}
		if b.Limits != nil && b.Limits.Check() != nil {
			t.Fatalf("accepted limits %+v", b.Limits)
		}
		again, err := EncodeBoot(b)
		if err != nil {
			t.Fatalf("a decoded record does not encode: %v", err)
		}
		b2, err := DecodeBoot(again)
		if err != nil || !reflect.DeepEqual(b, b2) {
			t.Fatalf("re-decoded %+v, %v; want %+v", b2, err, b)
		}
	})
}
