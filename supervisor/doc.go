// Package supervisor holds the protoactor-go actors that own lane lifecycles: the pool
// supervisor, one lane actor per lane, and the restart strategies. It must never carry call
// data: calls move through fastpath, not through actor mailboxes.
package supervisor
