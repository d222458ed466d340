// Package steal will hold the shared submit ring that several consumer lanes claim from
// (ticket and dekker claim disciplines) and its death handling. It builds on fastpath and
// must never know about actors, lifecycles or supervision.
package steal
