// Package mutant switches on deliberately wrong guards inside fencer, so
// that fencer's own tests can prove they catch each one. A mutant is a
// plausible bug (a dropped compare, a guard shared by two writers) that a
// test suite worth trusting must fail on.
//
// The switch exists only in builds with the fencer_mutants build tag. In
// every other build, On is a constant false that the compiler folds away,
// so a mutated branch is dead code and is not linked: release binaries
// contain no mutant (internal/layout tests this). In a fencer_mutants
// build, the environment variable FENCER_MUTANT names the one mutant that
// is on; unset, the build behaves as a release build.
//
// Package mutant imports the standard library only.
package mutant

// Name names one mutant. Each is a constant in names.go, and the mutant
// table (TestMutantsAreCaught, integration/mutants_test.go; make mutants)
// names the tests that must catch it.
type Name string

// Env is the environment variable that names the mutant switched on in a
// fencer_mutants build.
const Env = "FENCER_MUTANT"

// Tag is the build tag that compiles the switch in.
const Tag = "fencer_mutants"
