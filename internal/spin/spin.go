// Package spin holds the CPU hint a busy-wait loop issues between polls. It must never
// block or yield: callers decide when to hand the processor back to the scheduler.
package spin
