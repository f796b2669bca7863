package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fencer-dev/fencer/token"
)

// validNames accepts any number of arguments that are valid UTF-8.
func validNames(_ *cobra.Command, args []string) error {
	for _, arg := range args {
		if err := validUTF8("NAME", arg); err != nil {
			return err
		}
	}
	return nil
}

// filterLeases keeps the leases of list named in names (or, with prefix,
// whose names start with one of them); no names keeps them all. It also
// returns an error with exit code 3 naming the names that matched no
// lease, or nil. fencer status filters here, on the pages the server
// sent: the service's ListLeases has no filter.
func filterLeases(list []token.Status, names []string, prefix bool) ([]token.Status, error) {
	if len(names) == 0 {
		return list, nil
	}
	matched := make([]bool, len(names))
	var out []token.Status
	for _, st := range list {
		keep := false
		for i, n := range names {
			if st.Name == n || prefix && strings.HasPrefix(st.Name, n) {
				keep, matched[i] = true, true
			}
		}
		if keep {
			out = append(out, st)
		}
	}
	var none []string
	for i, n := range names {
		if !matched[i] {
			none = append(none, fmt.Sprintf("%q", n))
		}
	}
	if len(none) == 0 {
		return out, nil
	}
	what := "no lease named"
	if prefix {
		what = "no lease whose name starts with"
	}
	return out, &exitStatus{code: exitNotFound, msg: fmt.Sprintf("%s %s has ever been acquired", what, strings.Join(none, " or "))}
}
