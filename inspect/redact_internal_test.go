package inspect

import (
	"slices"
	"testing"
)

// TestRedactPrefix: the values of environment assignments in a prefix are redacted, in each
// way a wrapper takes them; everything else is shown as it is.
func TestRedactPrefix(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{nil, nil},
		{[]string{"env", "TOKEN=secret", "nice", "-n", "10"}, []string{"env", "TOKEN=[redacted]", "nice", "-n", "10"}},
		{[]string{"env", "-i", "A=1", "http_proxy=http://u:p@h:3128"}, []string{"env", "-i", "A=[redacted]", "http_proxy=[redacted]"}},
		{[]string{"sudo", "-u", "lane", "KEY=a=b"}, []string{"sudo", "-u", "lane", "KEY=[redacted]"}},
		{[]string{"systemd-run", "--setenv=TOKEN=secret", "-E", "B=2", "--scope"}, []string{"systemd-run", "--setenv=TOKEN=[redacted]", "-E", "B=[redacted]", "--scope"}},
		{[]string{"docker", "run", "-e", "TOKEN=secret", "img"}, []string{"docker", "run", "-e", "TOKEN=[redacted]", "img"}},
		{[]string{"bwrap", "--setenv", "TOKEN", "secret", "--ro-bind", "/", "/"}, []string{"bwrap", "--setenv", "TOKEN", "[redacted]", "--ro-bind", "/", "/"}},
		{[]string{"sh", "-c", `TOKEN="a secret" B='c d' exec "$@"`, "sh"}, []string{"sh", "-c", `TOKEN=[redacted] B=[redacted] exec "$@"`, "sh"}},
		{[]string{"taskset", "-c", "2,3", "--memory=512M", "/opt/x=y"}, []string{"taskset", "-c", "2,3", "--memory=512M", "/opt/x=y"}},
	} {
		if got := redactPrefix(c.in); !slices.Equal(got, c.want) {
			t.Errorf("redactPrefix(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
