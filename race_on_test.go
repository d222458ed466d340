//go:build race

package knit_test

const raceEnabled = true
