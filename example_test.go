package knit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/knitgo/knit"
)

func ExampleDefine() {
	// At package level:
	//
	//	var Add = knit.Define("add", func(_ context.Context, in [2]int64) (int64, error) {
	//		return in[0] + in[1], nil
	//	})
	//
	// and in main (after knit.Main()), serve it from a pool:
	p, err := knit.NewPool(knit.Config{Lanes: 2}, exampleAdd)
	if err != nil {
		panic(err)
	}
	defer p.Close(context.Background())
	sum, err := exampleAdd.Call(context.Background(), p, [2]int64{40, 2})
	fmt.Println(exampleAdd.Name(), sum, err)
	// Output: example.add 42 <nil>
}

func ExampleTask_Call() {
	p, err := knit.NewPool(knit.Config{}, exampleAdd)
	if err != nil {
		panic(err)
	}
	defer p.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := exampleAdd.Call(ctx, p, [2]int64{1, 2})
	fmt.Println(sum, err)
	// Output: 3 <nil>
}

func ExampleTask_Go() {
	p, err := knit.NewPool(knit.Config{}, exampleAdd)
	if err != nil {
		panic(err)
	}
	defer p.Close(context.Background())
	// Start many calls, then collect them: the lanes work while the caller goes on.
	var futures []*knit.Future[int64]
	for i := range int64(4) {
		futures = append(futures, exampleAdd.Go(context.Background(), p, [2]int64{i, i}))
	}
	for _, f := range futures {
		v, err := f.Wait()
		fmt.Println(v, err)
	}
	// Output:
	// 0 <nil>
	// 2 <nil>
	// 4 <nil>
	// 6 <nil>
}

// Process lanes run tasks in child processes of the same binary, whose main (or TestMain)
// starts with knit.Main(). The zero Config is a pool of GOMAXPROCS goroutine lanes.
func ExampleNewPool() {
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 2}, exampleAdd)
	if err != nil {
		panic(err)
	}
	defer p.Close(context.Background())
	sum, err := exampleAdd.Call(context.Background(), p, [2]int64{20, 22})
	fmt.Println(sum, err, p.Stats().Lanes[0].PID != 0)
	// Output: 42 <nil> true
}

// A lane that ends by itself fails only the call it was running; the supervisor restarts
// it, with backoff, as its restart policy says.
func ExampleConfig() {
	p, err := knit.NewPool(knit.Config{
		Runtime: knit.Process,
		Lanes:   1,
		Restart: knit.Restart{Type: knit.Transient, Strategy: knit.OneForOne, MaxRestarts: 3, Period: time.Minute},
	}, exampleAdd, exampleExit)
	if err != nil {
		panic(err)
	}
	defer p.Close(context.Background())
	_, err = exampleExit.Call(context.Background(), p, 0)
	var ke *knit.Error
	if errors.As(err, &ke) {
		fmt.Println(ke.Code, "started:", ke.Started)
	}
	sum, err := exampleAdd.Call(context.Background(), p, [2]int64{1, 1}) // on the restarted lane
	fmt.Println(sum, err)
	// Output:
	// WORKER_EXITED started: true
	// 2 <nil>
}

func ExamplePool_Events() {
	p, err := knit.NewPool(knit.Config{Lanes: 1}, exampleAdd)
	if err != nil {
		panic(err)
	}
	events := p.Events()
	if err := p.Close(context.Background()); err != nil {
		panic(err)
	}
	for e := range events {
		if e.Lane == 0 {
			fmt.Println(e.From, "→", e.To)
		}
	}
	// Output:
	// new → booting
	// booting → ready
	// ready → stopping
	// stopping → closed
}

// Resize adds lanes, which boot before it returns, or retires the highest ones, which
// finish the calls they hold first; no call is lost either way.
func ExamplePool_Resize() {
	p, err := knit.NewPool(knit.Config{Lanes: 2}, exampleAdd)
	if err != nil {
		panic(err)
	}
	defer p.Close(context.Background())
	ctx := context.Background()
	if err := p.Resize(ctx, 4); err != nil {
		panic(err)
	}
	fmt.Println(len(p.Stats().Lanes), "lanes")
	if err := p.Resize(ctx, 1); err != nil {
		panic(err)
	}
	sum, err := exampleAdd.Call(ctx, p, [2]int64{2, 3})
	fmt.Println(len(p.Stats().Lanes), "lane:", sum, err)
	// Output:
	// 4 lanes
	// 1 lane: 5 <nil>
}

// Map runs a task over a slice, across the pool's lanes, and returns the results in order;
// a *MapError names each element that failed.
func ExampleTask_Map() {
	p, err := knit.NewPool(knit.Config{Lanes: 2}, exampleAdd)
	if err != nil {
		panic(err)
	}
	defer p.Close(context.Background())
	pairs := [][2]int64{{1, 2}, {3, 4}, {5, 6}}
	sums, err := exampleAdd.Map(context.Background(), p, pairs)
	fmt.Println(sums, err)
	// Output: [3 7 11] <nil>
}

// One binary, two modes: on each node machine the program runs ServeNode (here selected by
// an address, in a real program by a flag such as -node :7400), and on the host a pool of
// Runtime Remote lists the nodes. Both define the same tasks and call knit.Main() first:
// a node's lanes are process lanes of the binary. Here node and host share one process,
// which works too: they share its protoactor remote endpoint, and so its listen address.
func ExampleServeNode() {
	ctx, stop := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() {
		served <- knit.ServeNode(ctx, knit.NodeConfig{
			Addr:  ":0", // every interface, a free port; a node machine: ":7400"
			Ready: func(addr string) { ready <- addr },
		})
	}()
	var node string // the address the host reaches the node at
	select {
	case addr := <-ready:
		_, port, _ := net.SplitHostPort(addr)
		node = net.JoinHostPort("127.0.0.1", port) // a node machine: "a.internal:7400"
	case err := <-served:
		panic(err)
	}

	// The host: 4 lanes spread over the nodes (here the one), with mutual TLS when
	// Remote.TLS and NodeConfig.TLS are set.
	p, err := knit.NewPool(knit.Config{
		Runtime: knit.Remote,
		Lanes:   4,
		Remote:  knit.RemoteConfig{Nodes: []string{node}},
	}, exampleAdd)
	if err != nil {
		panic(err)
	}
	sum, err := exampleAdd.Call(context.Background(), p, [2]int64{40, 2})
	fmt.Println(sum, err, p.Stats().Lanes[0].Node == node)
	if err := p.Close(context.Background()); err != nil {
		panic(err)
	}

	stop() // ServeNode returns after stopping the lanes it runs
	fmt.Println(<-served)
	// Output:
	// 42 <nil> true
	// <nil>
}
