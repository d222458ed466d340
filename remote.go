package knit

import (
	"crypto/tls"
	"fmt"
	"net"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/logging"
	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/remote"
)

// RemoteConfig configures remote lanes (Config.Runtime: Remote): lanes that run on other
// machines, each a process lane of a node that runs ServeNode in the same binary, reached
// through protoactor-go's remote (gRPC). docs/remote.md has the deployment, the guarantees
// and the figures.
type RemoteConfig struct {
	// Nodes are the nodes' addresses, host:port, as this host reaches them (at least one).
	// Lane i's home is Nodes[i % len(Nodes)], so a pool's lanes spread evenly: a lane
	// starts on its home node, or, while that node is lost, on the live node holding the
	// fewest of the pool's lanes; when its home node answers again, it moves back there
	// (a recycle: no call fails or runs twice).
	Nodes []string
	// TLS, if set, makes every connection mutual TLS: the pool presents its certificate
	// (TLS.Certificates) to nodes and verifies theirs against TLS.RootCAs, and nodes must
	// present certificates it verifies (against TLS.ClientCAs, or RootCAs). Each
	// certificate needs both the server and client auth usages (every side dials and is
	// dialled) and names for the addresses the other side dials. Nil: plaintext, for a
	// trusted network only: anyone who reaches a port can talk to it.
	TLS *tls.Config
	// Listen is where the pool listens for its nodes' results (default ":0": every
	// interface, a free port).
	Listen string
	// Advertise is the host name or IP the nodes reach this pool at (default: for each
	// node, this host's address on the route to it).
	Advertise string
}

// openRemote readies a pool of remote lanes: its endpoint, and a link to each node.
func (p *Pool) openRemote() (lifecycle.Runtime, error) {
	cfg := &p.cfg
	rc := cfg.Remote
	bad := func(msg string) error {
		return &Error{Code: CodeInvalidArgument, Lane: -1, Message: msg}
	}
	switch {
	case len(rc.Nodes) == 0:
		return nil, bad("Config.Remote.Nodes: no node (Runtime: Remote)")
	case cfg.Liveness < 0:
		return nil, bad("Config.Liveness: negative, but remote lanes always have a heartbeat")
	}
	seen := map[string]bool{}
	for _, n := range rc.Nodes {
		if _, _, err := net.SplitHostPort(n); err != nil || seen[n] {
			return nil, bad(fmt.Sprintf("Config.Remote.Nodes: %q is not a host:port listed once", n))
		}
		seen[n] = true
	}
	// A value crosses the network in one frame: at most remote.MaxPayload.
	cfg.Payload.MaxCall = min(cfg.Payload.MaxCall, remote.MaxPayload)
	var flags uint32
	if cfg.Propagator != nil {
		flags |= remote.OpenCarry
	}
	if cfg.PanicCrashesLane {
		flags |= remote.OpenPanicCrash
	}
	tasks := make([]remote.TaskRef, 0, len(p.defs))
	for _, d := range p.defs {
		tasks = append(tasks, remote.TaskRef{Name: d.Name(), Fingerprint: d.Fingerprint(), Index: d.Index()})
	}
	nodes, err := remote.NewNodes(remote.HostConfig{
		Nodes: rc.Nodes, TLS: rc.TLS, Listen: rc.Listen, Advertise: rc.Advertise,
		Lanes: cfg.Lanes, MaxCall: cfg.Payload.MaxCall,
		Liveness: cfg.Liveness, StartupTimeout: cfg.StartupTimeout,
		Layout: fastpath.Layout{Inline: cfg.Payload.Inline, Arena: cfg.Payload.Arena, AbortBits: fastpath.DefaultAbortBits},
		Epoch:  p.epoch.UnixNano(), Tasks: tasks, Flags: flags,
		Log: p.root.Named(logging.Remote),
		Move: func(lane, inc int, reason string) {
			// p.tree is set before up: a node that answers during NewPool moves nothing.
			if p.up.Load() && p.tree != nil && !p.closing.Load() {
				p.tree.Recycle(lane, inc, reason)
			}
		},
	})
	if err != nil {
		return nil, &Error{Code: CodePoolUnavailable, Lane: -1, Message: "remote lanes", Cause: err}
	}
	p.memory = "heap"
	return nodes, nil
}

// closeRuntime releases what the pool's runtime holds beyond its lanes (a remote pool's
// endpoint and links), once the lanes have stopped.
func (p *Pool) closeRuntime() {
	if c, ok := p.runtime.(interface{ Close() }); ok {
		c.Close()
	}
}

// nodeOf is the node an incarnation runs on ("" for a local one).
func nodeOf(run lifecycle.Incarnation) string {
	if n, ok := run.(interface{ Node() string }); ok {
		return n.Node()
	}
	return ""
}
