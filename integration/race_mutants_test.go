//go:build race

package integration_test

// mutantBuildFlags build the mutant table's test binaries as this test
// binary was built, so that they reuse the packages it compiled (the
// fencer_mutants tag changes only fencer's own).
var mutantBuildFlags = []string{"-race"}
