//go:build race

package fencertest_test

// raceFlags are the flags that build the consumer module as this test
// binary was built, so that it reuses the packages already compiled.
var raceFlags = []string{"-race"}
