// Package stamp times a call hop by hop across the processes it crosses (host, node, lane):
// each point a call passes records the monotonic clock, which every process on a machine
// shares, so that one process's stamps line up with another's. It is for measuring where a
// sequential call's time goes (docs/benchmarks.md, "A sequential remote call, hop by hop"),
// and exists only in builds tagged knitstamp: without the tag S is empty and costs nothing.
//
// With the tag, a process stamps when KNIT_STAMP names a directory; it appends its stamps,
// a buffer at a time, to a file there named by its pid. The report command
// (go run ./internal/stamp/report DIR) lines them up call by call. It must never be
// enabled in a build that serves users: it takes a lock on every stamp.
package stamp

// A Point is a place on a call's path.
type Point uint8

// The points of a remote call, in the order a sequential call passes them.
const (
	CallStart     Point = 1  // host: Task.Call entered
	ForwarderWoke Point = 2  // host: the remote lane's forwarder runs a step
	CallsSending  Point = 3  // host: the forwarder hands a Calls frame to the endpoint
	CallsSent     Point = 4  // host: … and the endpoint took it
	NodeFrame     Point = 10 // node: the agent's actor has a frame
	NodeSubmitted Point = 11 // node: its calls are on the lane's ring, the lane rung
	NodeDrained   Point = 12 // node: the reaper drained results
	ResultsSend   Point = 13 // node: a Results frame goes to the endpoint
	ResultsSent   Point = 14 // node: … and the endpoint took it
	HostFrame     Point = 7  // host: the endpoint's actor has a frame
	HostPublished Point = 8  // host: results are on the lane's return ring, the caller rung
	CallerWoke    Point = 30 // host: the caller asleep on the direct doorbell woke
	CallEnd       Point = 9  // host: Task.Call returns
	LaneTook      Point = 20 // lane process: the executor looks at its ring after a wait
	LaneRan       Point = 21 // lane process: its batch has run and its results are out
)

// Path is the order a sequential remote call passes the points.
var Path = []Point{CallStart, ForwarderWoke, CallsSending, CallsSent, NodeFrame, NodeSubmitted,
	LaneTook, LaneRan, NodeDrained, ResultsSend, ResultsSent, HostFrame, HostPublished, CallerWoke, CallEnd}

// Names are the points' names, for the report.
var Names = map[Point]string{
	CallStart: "Call", ForwarderWoke: "forwarder woke", CallsSending: "calls to endpoint",
	CallsSent: "endpoint took calls", NodeFrame: "node actor has frame", NodeSubmitted: "node lane rung",
	LaneTook: "lane took call", LaneRan: "lane ran it", NodeDrained: "node reaper drained",
	ResultsSend: "results to endpoint", ResultsSent: "endpoint took results", HostFrame: "host actor has frame",
	HostPublished: "host published, caller rung", CallerWoke: "caller woke", CallEnd: "Call returned",
}
