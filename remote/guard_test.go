package remote

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
)

// Admit lets through what knit sends, and nothing else.
func TestAdmit(t *testing.T) {
	agent := func() *actor.PID { return &actor.PID{Address: "10.0.0.9:7400", Id: AgentName} }
	batch := func(mod func(b *remote.MessageBatch)) *remote.RemoteMessage {
		b := &remote.MessageBatch{TypeNames: []string{frameType}, Targets: []*actor.PID{agent()},
			Senders:   []*actor.PID{{Address: "h:1", Id: "x"}},
			Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, Sender: 1, MessageData: []byte("kn")}}}
		if mod != nil {
			mod(b)
		}
		return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}
	}
	ok := batch(nil)
	if err := Admit(ok); err != nil {
		t.Fatalf("a batch of frames for the agent: %v", err)
	}
	if a := ok.GetMessageBatch().Targets[0].Address; a != localAddress {
		t.Errorf("target address %q, want it delivered here (%q)", a, localAddress)
	}
	if err := Admit(batch(func(b *remote.MessageBatch) { b.Targets[0].Id = HostName + "-7" })); err != nil {
		t.Errorf("a batch for a pool's actor: %v", err)
	}
	connect := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
		ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "s", Address: "a"}}}}}
	if err := Admit(connect); err != nil {
		t.Errorf("a connect request: %v", err)
	}
	refused := map[string]*remote.RemoteMessage{
		"no message":                  {},
		"a nil batch":                 {MessageType: &remote.RemoteMessage_MessageBatch{}},
		"a nil connect request":       {MessageType: &remote.RemoteMessage_ConnectRequest{}},
		"a client connection":         {MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{ConnectionType: &remote.ConnectRequest_ClientConnection{ClientConnection: &remote.ClientConnection{}}}}},
		"a disconnect request":        {MessageType: &remote.RemoteMessage_DisconnectRequest{DisconnectRequest: &remote.DisconnectRequest{}}},
		"another type":                batch(func(b *remote.MessageBatch) { b.TypeNames[0] = "actor.Stop" }),
		"a type index out of range":   batch(func(b *remote.MessageBatch) { b.Envelopes[0].TypeId = 1 }),
		"a negative type index":       batch(func(b *remote.MessageBatch) { b.Envelopes[0].TypeId = -1 }),
		"a target index out of range": batch(func(b *remote.MessageBatch) { b.Envelopes[0].Target = 1 }),
		"a sender index out of range": batch(func(b *remote.MessageBatch) { b.Envelopes[0].Sender = 2 }),
		"a nil target":                batch(func(b *remote.MessageBatch) { b.Targets[0] = nil }),
		"a nil sender":                batch(func(b *remote.MessageBatch) { b.Senders[0] = nil }),
		"a nil envelope":              batch(func(b *remote.MessageBatch) { b.Envelopes[0] = nil }),
		"another actor":               batch(func(b *remote.MessageBatch) { b.Targets[0].Id = "activator" }),
		"a host actor's look-alike":   batch(func(b *remote.MessageBatch) { b.Targets[0].Id = HostName }),
		"another serializer":          batch(func(b *remote.MessageBatch) { b.Envelopes[0].SerializerId = 1 }),
		"an oversized message":        batch(func(b *remote.MessageBatch) { b.Envelopes[0].MessageData = make([]byte, MaxFrame+64) }),
	}
	for what, m := range refused {
		if err := Admit(m); err == nil {
			t.Errorf("%s: admitted", what)
		}
	}
}
