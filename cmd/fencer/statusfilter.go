package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/token"
)

// validNames accepts any number of arguments that are lease names, or
// (with --prefix) the start of one: the check is the same.
func validNames(_ *cobra.Command, args []string) error {
	for _, arg := range args {
		if err := token.ValidateName("NAME", arg); err != nil {
			return err
		}
	}
	return nil
}

// listLeases lists the leases named in names (or, with prefix, whose
// names start with one of them), ordered by name, and the names that
// matched none; no names lists them all. The server reads only the range
// of each name.
func listLeases(ctx context.Context, c *client.Client, names []string, prefix bool) (list []token.Status, unmatched []string, err error) {
	if len(names) == 0 {
		list, err = c.List(ctx)
		return list, nil, err
	}
	byName := map[string]token.Status{}
	for _, n := range names {
		page, err := c.List(ctx, client.WithNamePrefix(n))
		if err != nil {
			return nil, nil, err
		}
		found := false
		for _, st := range page {
			if prefix || st.Name == n {
				byName[st.Name], found = st, true
			}
		}
		if !found {
			unmatched = append(unmatched, n)
		}
	}
	for _, st := range byName {
		list = append(list, st)
	}
	slices.SortFunc(list, func(a, b token.Status) int { return strings.Compare(a.Name, b.Name) })
	return list, unmatched, nil
}

// unmatchedError is the error, with exit code 3, of fencer status when
// names (prefixes, with prefix) matched no lease; nil when none.
func unmatchedError(names []string, prefix bool) error {
	if len(names) == 0 {
		return nil
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = strconv.Quote(n)
	}
	what := "no lease named"
	if prefix {
		what = "no lease whose name starts with"
	}
	return &exitStatus{code: exitNotFound, msg: fmt.Sprintf("%s %s has ever been acquired", what, strings.Join(quoted, " or "))}
}
