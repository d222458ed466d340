//go:build !race

package steal

const raceEnabled = false
