//go:build linux

package main

import (
	"net/rpc"

	"github.com/hashicorp/go-plugin"
)

// pluginHandshake is shared by the go-plugin host and the plugin (this same
// binary re-executed with KNIT_BENCH_CHILD=plugin).
var pluginHandshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "KNIT_BENCH_PLUGIN",
	MagicCookieValue: "incrementer",
}

const pluginName = "inc"

// pluginSet is the plugin map used on both sides.
var pluginSet = plugin.PluginSet{pluginName: incPlugin{}}

// incrementer is the interface the host dispenses.
type incrementer interface {
	Inc(in int64) (int64, error)
}

// incPlugin is a plugin.Plugin (net/rpc protocol).
type incPlugin struct{}

func (incPlugin) Server(*plugin.MuxBroker) (any, error) { return &IncRPCServer{}, nil }

func (incPlugin) Client(_ *plugin.MuxBroker, c *rpc.Client) (any, error) {
	return &incRPCClient{c: c}, nil
}

// IncRPCServer is the net/rpc receiver served in the plugin process.
type IncRPCServer struct{}

// Inc replies in+1.
func (*IncRPCServer) Inc(in int64, out *int64) error {
	*out = in + 1
	return nil
}

type incRPCClient struct{ c *rpc.Client }

func (c *incRPCClient) Inc(in int64) (int64, error) {
	var out int64
	err := c.c.Call("Plugin.Inc", in, &out)
	return out, err
}

// pluginChildMain is the KNIT_BENCH_CHILD=plugin role. plugin.Serve exits
// the process when the host closes the client (Kill) or goes away.
func pluginChildMain() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: pluginHandshake,
		Plugins:         pluginSet,
	})
}
