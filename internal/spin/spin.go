// Package spin holds what a busy-wait loop issues between polls: the CPU pause hint, and an
// OS-level yield. Neither ever blocks: callers decide how long to spin and when to park.
package spin
