package procfs

import (
	"errors"
	"os"
	"testing"
)

func TestRSSOfThisProcess(t *testing.T) {
	n, err := RSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if n <= 0 || n%int64(os.Getpagesize()) != 0 {
		t.Fatalf("RSS = %d, want a positive multiple of the page size", n)
	}
}

func TestRSSOfNoProcess(t *testing.T) {
	for _, pid := range []int{0, -1, 1 << 30} {
		if _, err := RSS(pid); err == nil {
			t.Errorf("RSS(%d): no error", pid)
		}
	}
}

func TestResidentPages(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"1024 356 200 10 0 300 0\n", 356, false},
		{"1 2", 2, false},
		{"", 0, true},
		{"1024", 0, true},
		{"1024 -5 1", 0, true},
		{"1024 x 1", 0, true},
		{"1024 99999999999999999999 1", 0, true},
	} {
		got, err := residentPages([]byte(c.in))
		if (err != nil) != c.err || got != c.want {
			t.Errorf("residentPages(%q) = %d, %v; want %d, error %v", c.in, got, err, c.want, c.err)
		}
		if err != nil && !errors.Is(err, ErrFormat) {
			t.Errorf("residentPages(%q): %v is not ErrFormat", c.in, err)
		}
	}
}

func FuzzResidentPages(f *testing.F) {
	f.Add([]byte("1024 356 200 10 0 300 0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := residentPages(b); err == nil && n < 0 {
			t.Fatalf("negative page count %d", n)
		}
	})
}

func TestStatOfThisProcess(t *testing.T) {
	state, ppid, err := Stat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if ppid != os.Getppid() || state != 'R' && state != 'S' {
		t.Fatalf("Stat = %q, %d; want running or sleeping, parent %d", state, ppid, os.Getppid())
	}
}

func TestParseStat(t *testing.T) {
	for _, c := range []struct {
		in    string
		state byte
		ppid  int
		ok    bool
	}{
		{"42 (sh) S 7 42 42 0", 'S', 7, true},
		{"42 (a) b) (c) T 9 1", 'T', 9, true}, // the command holds parentheses and spaces
		{"42 (sh)", 0, 0, false},
		{"42 (sh) S x", 0, 0, false},
		{"42 sh S 7", 0, 0, false},
		{"", 0, 0, false},
	} {
		state, ppid, err := parseStat([]byte(c.in))
		if (err == nil) != c.ok || state != c.state || ppid != c.ppid {
			t.Errorf("parseStat(%q) = %q, %d, %v", c.in, state, ppid, err)
		}
	}
}
