package remote

import (
	"fmt"
	"strings"

	"github.com/asynkron/protoactor-go/remote"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Whoever reaches an endpoint's port can send protoactor anything: a message type nobody
// registered (a nil dereference in protoactor's handler, which kills the process unless
// recovered), indices outside a batch's tables (an index panic), a system message that
// stops an actor, a spawn request for any kind, a message for any actor. The guard lets
// through only what knit sends — ConnectRequests and batches of BytesValue frames for the
// endpoint's own receiving actor — and recovers from anything that panics all the same.
// A stream that sends anything else is cut.

const protoactorReceive = "/remote.Remoting/Receive"

// localAddress is protoactor's name for "this actor system": a target rewritten to it is
// delivered here whatever address the peer dialled (a node reached through a name or a
// NAT would otherwise forward frames to the address they named, itself included).
const localAddress = "nonhost"

// guardStream is the endpoint's stream interceptor.
func guardStream(log *zap.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Warn("a peer's stream made the remote handler panic: cut", zap.Any("panic", r))
				err = status.Error(codes.Internal, "refused")
			}
		}()
		if info.FullMethod != protoactorReceive {
			return status.Error(codes.Unimplemented, knitEndpoint)
		}
		return handler(srv, &guarded{ServerStream: ss, log: log})
	}
}

type guarded struct {
	grpc.ServerStream
	log *zap.Logger
}

// RecvMsg receives the next message and refuses it, ending the stream, unless it is one
// knit sends.
func (g *guarded) RecvMsg(m any) error {
	if err := g.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	rm, ok := m.(*remote.RemoteMessage)
	if !ok {
		return status.Error(codes.InvalidArgument, "refused")
	}
	if err := Admit(rm); err != nil {
		g.log.Debug("refused a peer's message: stream cut", zap.Error(err))
		return status.Error(codes.InvalidArgument, "refused")
	}
	return nil
}

// Admit checks a message a peer sent on its stream: a ConnectRequest, or a batch of
// BytesValue messages, serialised by protobuf, for a node's agent or a pool's receiving
// actor, whose targets it rewrites to this actor system. Anything else is an error.
func Admit(rm *remote.RemoteMessage) error {
	switch t := rm.GetMessageType().(type) {
	case *remote.RemoteMessage_ConnectRequest:
		if t.ConnectRequest == nil || t.ConnectRequest.GetServerConnection() == nil {
			return fmt.Errorf("connect request without a server connection")
		}
		return nil
	case *remote.RemoteMessage_MessageBatch:
		return admitBatch(t.MessageBatch)
	}
	return fmt.Errorf("message %T", rm.GetMessageType())
}

// knitActor reports whether name is one of knit's receiving actors.
func knitActor(name string) bool {
	return name == AgentName || strings.HasPrefix(name, HostName+"-")
}

func admitBatch(b *remote.MessageBatch) error {
	if b == nil {
		return fmt.Errorf("empty batch")
	}
	for i, n := range b.TypeNames {
		if n != frameType {
			return fmt.Errorf("type %d is %q", i, n)
		}
	}
	for i, p := range b.Targets {
		if p == nil || !knitActor(p.Id) {
			return fmt.Errorf("target %d is no knit actor", i)
		}
		p.Address = localAddress
	}
	for i, p := range b.Senders {
		if p == nil {
			return fmt.Errorf("sender %d is nil", i)
		}
	}
	for i, e := range b.Envelopes {
		switch {
		case e == nil:
			return fmt.Errorf("envelope %d is nil", i)
		case e.TypeId < 0 || int(e.TypeId) >= len(b.TypeNames):
			return fmt.Errorf("envelope %d: type %d of %d", i, e.TypeId, len(b.TypeNames))
		case e.Target < 0 || int(e.Target) >= len(b.Targets):
			return fmt.Errorf("envelope %d: target %d of %d", i, e.Target, len(b.Targets))
		case e.Sender < 0 || int(e.Sender) > len(b.Senders):
			return fmt.Errorf("envelope %d: sender %d of %d", i, e.Sender, len(b.Senders))
		case e.SerializerId != 0:
			return fmt.Errorf("envelope %d: serializer %d", i, e.SerializerId)
		case len(e.MessageData) > MaxFrame+16:
			return fmt.Errorf("envelope %d: %d bytes", i, len(e.MessageData))
		}
	}
	return nil
}
