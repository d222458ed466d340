//go:build !linux

package cgroup

import (
	"fmt"
	"os"
	"runtime"
)

// Tree is one pool's cgroup directory; cgroups exist on Linux only.
type Tree struct{}

// Group is one lane process's cgroup; cgroups exist on Linux only.
type Group struct{}

// Open fails: cgroups exist on Linux only.
func Open(string, Options, Limits) (*Tree, error) {
	return nil, fmt.Errorf("%w: cgroups exist on Linux only, not %s", ErrUnavailable, runtime.GOOS)
}

// Sweep has nothing to sweep: cgroups exist on Linux only.
func Sweep(Options) ([]string, error) { return nil, nil }

func (t *Tree) Version() Version        { return Auto }
func (t *Tree) Name() string            { return "" }
func (t *Tree) New() (*Group, error)    { return nil, ErrUnavailable }
func (t *Tree) Close() error            { return nil }
func (g *Group) Version() Version       { return Auto }
func (g *Group) Dir() (*os.File, error) { return nil, nil }
func (g *Group) Add(int) error          { return ErrUnavailable }
func (g *Group) Pids() ([]int, error)   { return nil, ErrUnavailable }
func (g *Group) OOMKills() uint64       { return 0 }
func (g *Group) Kill() error            { return ErrUnavailable }
func (g *Group) Remove() error          { return nil }
