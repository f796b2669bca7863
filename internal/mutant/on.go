//go:build fencer_mutants

package mutant

import "os"

// Enabled reports whether this build has the fencer_mutants tag. It is
// true here: On reads FENCER_MUTANT.
const Enabled = true

// active is the mutant named by FENCER_MUTANT when the process started.
var active = Name(os.Getenv(Env))

// On reports whether mutant n is the one FENCER_MUTANT names.
func On(n Name) bool { return n != "" && n == active }
