package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/token"
)

// remote builds a client command: connection and output flags, one
// connection, and do called with a client under the call timeout; do
// returns what to print, and an error that sets the exit code (printed
// after the view, when the view has data).
func (a *app) remote(cmd *cobra.Command, do func(ctx context.Context, c *client.Client, cc *grpc.ClientConn, args []string) (*view, error)) *cobra.Command {
	var out outputFlags
	a.conn.register(cmd.Flags())
	out.register(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return a.withClient(cmd.Context(), func(ctx context.Context, cc *grpc.ClientConn) error {
			ctx, cancel := context.WithTimeout(ctx, a.conn.timeout)
			defer cancel()
			v, err := do(ctx, client.New(cc), cc, args)
			if v != nil {
				if perr := out.print(a.stdout, *v); perr != nil {
					return perr
				}
			}
			return err
		})
	}
	return cmd
}

// withClient dials the server with the connection flags and calls do.
func (a *app) withClient(ctx context.Context, do func(ctx context.Context, cc *grpc.ClientConn) error) error {
	cc, err := a.conn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	return do(ctx, cc)
}

// nArgs accepts exactly n arguments, refusing others with a usage error
// that shows the command's use line; the first len(names) must be valid
// UTF-8, and are named so in the error.
func nArgs(n int, names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("want %d argument(s), got %d: fencer %s", n, len(args), cmd.Use)
		}
		for i, name := range names {
			if err := validUTF8(name, args[i]); err != nil {
				return err
			}
		}
		return nil
	}
}

// validUTF8 refuses an argument that is not valid UTF-8, such as a name or
// key, which the service's protobuf strings cannot carry: gRPC would fail
// the call before the server could say why.
func validUTF8(name, arg string) error {
	if !utf8.ValidString(arg) {
		return usagef("invalid %s %q: not valid UTF-8", name, arg)
	}
	return nil
}

// tokenFlag adds --token, read from $FENCER_TOKEN as set by fencer
// acquire, to cmd.
func tokenFlag(cmd *cobra.Command) *string {
	s := cmd.Flags().String("token", "", "fencing token, as fencer acquire sets it")
	envFlag(cmd.Flags(), "token", "FENCER_TOKEN")
	return s
}

func parseTokenFlag(s string) (token.Token, error) {
	if s == "" {
		return token.Token{}, usagef("no token: pass --token or run under fencer acquire (which sets $FENCER_TOKEN)")
	}
	return token.Parse(s)
}

// takeOverFlag adds --take-over to cmd and returns the write options it
// selects.
func takeOverFlag(cmd *cobra.Command, what string) func() []client.WriteOption {
	b := cmd.Flags().Bool("take-over", false, "write the "+what+" even if another lease owns it, making this token's lease its owner")
	return func() []client.WriteOption {
		if *b {
			return []client.WriteOption{client.TakeOver()}
		}
		return nil
	}
}

// tokenVerb adds --token (and, when takeOver names what a take-over
// writes, --take-over) to cmd and runs run against the server with the
// parsed token and the write options the flags select.
func (a *app) tokenVerb(cmd *cobra.Command, takeOver string, run func(ctx context.Context, c *client.Client, tok token.Token, opts []client.WriteOption, args []string) (*view, error)) *cobra.Command {
	tokStr := tokenFlag(cmd)
	opts := func() []client.WriteOption { return nil }
	if takeOver != "" {
		opts = takeOverFlag(cmd, takeOver)
	}
	return a.remote(cmd, func(ctx context.Context, c *client.Client, _ *grpc.ClientConn, args []string) (*view, error) {
		tok, err := parseTokenFlag(*tokStr)
		if err != nil {
			return nil, err
		}
		return run(ctx, c, tok, opts(), args)
	})
}

// writeView is what put, delete and advance print.
type writeView struct {
	Key      string `json:"key,omitempty"`
	Resource string `json:"resource,omitempty"`
	Revision int64  `json:"revision,omitempty"`
	Deleted  *bool  `json:"deleted,omitempty"`
	Token    string `json:"token"`
}

func (a *app) putCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "put KEY VALUE",
		Short: "write a data key with a guarded put (VALUE - reads standard input)",
		Long: `Writes KEY if and only if the token is its lease's current token and KEY
belongs to that lease or to none; otherwise nothing is written (exit code
4 for a stale token, 8 for a key of another lease). The token comes from
--token or $FENCER_TOKEN, which fencer acquire sets for its command.`,
		Args: nArgs(2, "KEY"),
	}
	return a.tokenVerb(cmd, "key", func(ctx context.Context, c *client.Client, tok token.Token, opts []client.WriteOption, args []string) (*view, error) {
		value := []byte(args[1])
		if args[1] == "-" {
			var err error
			if value, err = io.ReadAll(a.stdin); err != nil {
				return nil, err
			}
		}
		rev, err := c.Put(ctx, tok, args[0], value, opts...)
		if err != nil {
			return nil, err
		}
		v := writeView{Key: args[0], Revision: rev, Token: tok.String()}
		return &view{data: v, headers: []string{"KEY", "REVISION"}, rows: [][]string{{v.Key, strconv.FormatInt(rev, 10)}},
			text: func(w io.Writer) { fmt.Fprintf(w, "revision %d\n", rev) }}, nil
	})
}

func (a *app) deleteCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete KEY",
		Short: "delete a data key, guarded like put",
		Long: `Deletes KEY if and only if the token is current and KEY belongs to the
token's lease or to none, like put. Deleting a key that does not exist
succeeds, and says so (deleted: false).`,
		Aliases: []string{"del"},
		Args:    nArgs(1, "KEY"),
	}
	return a.tokenVerb(cmd, "key", func(ctx context.Context, c *client.Client, tok token.Token, opts []client.WriteOption, args []string) (*view, error) {
		deleted, err := c.Delete(ctx, tok, args[0], opts...)
		if err != nil {
			return nil, err
		}
		v := writeView{Key: args[0], Deleted: &deleted, Token: tok.String()}
		return &view{data: v, headers: []string{"KEY", "DELETED"}, rows: [][]string{{v.Key, strconv.FormatBool(deleted)}},
			text: func(w io.Writer) {
				if deleted {
					fmt.Fprintln(w, "deleted")
				} else {
					fmt.Fprintln(w, "not found (nothing deleted)")
				}
			}}, nil
	})
}

func (a *app) advanceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "advance RESOURCE",
		Short: "record the token as the highest that has passed for an external resource",
		Long: `Records the token as the highest token that has passed for RESOURCE, if it
is current and not lower than the one recorded (exit code 4 otherwise): the
sequencer check for a store that cannot run a transaction. A resource
advanced by another lease is refused (exit code 8) unless --take-over.`,
		Args: nArgs(1, "RESOURCE"),
	}
	return a.tokenVerb(cmd, "resource", func(ctx context.Context, c *client.Client, tok token.Token, opts []client.WriteOption, args []string) (*view, error) {
		if err := c.Advance(ctx, args[0], tok, opts...); err != nil {
			return nil, err
		}
		v := writeView{Resource: args[0], Token: tok.String()}
		return &view{data: v, headers: []string{"RESOURCE", "TOKEN"}, rows: [][]string{{v.Resource, v.Token}},
			text: func(w io.Writer) { fmt.Fprintf(w, "%s advanced to %s\n", v.Resource, v.Token) }}, nil
	})
}

func (a *app) releaseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release",
		Short: "release the lease of a token, if it is still current",
		Long: `Releases the acquisition whose token is --token (or $FENCER_TOKEN), if and
only if it is still current, so a late or repeated release never ends a
newer holder's lease. Releasing a token that has already ended succeeds.`,
		Args: nArgs(0),
	}
	return a.tokenVerb(cmd, "", func(ctx context.Context, c *client.Client, tok token.Token, _ []client.WriteOption, _ []string) (*view, error) {
		released, err := c.Release(ctx, tok)
		if err != nil {
			return nil, err
		}
		v := struct {
			Token    string `json:"token"`
			Released bool   `json:"released"`
		}{tok.String(), released}
		return &view{data: v, headers: []string{"TOKEN", "RELEASED"}, rows: [][]string{{v.Token, strconv.FormatBool(released)}},
			text: func(w io.Writer) {
				if released {
					fmt.Fprintf(w, "released %s\n", tok)
				} else {
					fmt.Fprintf(w, "%s had already ended\n", tok)
				}
			}}, nil
	})
}

// getView is what get prints. Value is bytes, which json and yaml print
// as base64, as etcdctl and a Kubernetes Secret's data do: a value may be
// any bytes, and JSON strings carry only UTF-8.
type getView struct {
	Key            string `json:"key"`
	Found          bool   `json:"found"`
	Value          []byte `json:"value"`
	CreateRevision int64  `json:"create_revision"`
	ModRevision    int64  `json:"mod_revision"`
}

func (a *app) getCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "read a data key (exit code 3 if it does not exist), or every key under a prefix",
		Long: `Prints KEY's value (text), or the key with its revisions (table, json, yaml;
json and yaml print the value in base64). Reads are not guarded.

With --prefix, as etcdctl get --prefix, reads every key that starts with
KEY ("" for every key) that the caller may read, in key order: text
prints each key on a line, then its value; none found is no error.`,
		Args: nArgs(1, "KEY"),
	}
	prefix := cmd.Flags().Bool("prefix", false, "read every key that starts with KEY, with its value")
	return a.remote(cmd, func(ctx context.Context, c *client.Client, _ *grpc.ClientConn, args []string) (*view, error) {
		if *prefix {
			kvs, err := c.ListKeys(ctx, args[0])
			if err != nil {
				return nil, err
			}
			return getPrefixView(kvs), nil
		}
		v, found, err := c.Get(ctx, args[0])
		if err != nil {
			return nil, err
		}
		g := newGetView(args[0], found, v)
		var notFound error
		if !found {
			notFound = &exitStatus{code: exitNotFound, msg: fmt.Sprintf("key %q not found", args[0])}
		}
		return &view{data: g, headers: getHeaders, rows: [][]string{g.row()},
			text: func(w io.Writer) {
				if found {
					writeValue(w, v.Data)
				}
			}}, notFound
	})
}

// getPrefixView is what get --prefix prints: every key with its value,
// and in text, as etcdctl prints them, each key on a line, then its value.
func getPrefixView(kvs []client.KeyValue) *view {
	data := make([]getView, len(kvs))
	rows := make([][]string, len(kvs))
	for i, kv := range kvs {
		data[i] = newGetView(kv.Key, true, kv.Value)
		rows[i] = data[i].row()
	}
	return &view{data: data, headers: getHeaders, rows: rows, text: func(w io.Writer) {
		for _, kv := range kvs {
			fmt.Fprintln(w, kv.Key)
			writeValue(w, kv.Data)
			if len(kv.Data) == 0 {
				fmt.Fprintln(w) // the empty value's line
			}
		}
	}}
}

var getHeaders = []string{"KEY", "VALUE", "CREATE_REVISION", "MOD_REVISION"}

func newGetView(key string, found bool, v token.Value) getView {
	return getView{Key: key, Found: found, Value: nonNil(v.Data), CreateRevision: v.CreateRevision, ModRevision: v.ModRevision}
}

// row is g as a table row, its value quoted.
func (g getView) row() []string {
	return []string{g.Key, strconv.Quote(string(g.Value)), strconv.FormatInt(g.CreateRevision, 10), strconv.FormatInt(g.ModRevision, 10)}
}

// writeValue writes a value's raw bytes, and a newline if they end
// without one; an empty value is nothing.
func writeValue(w io.Writer, value []byte) {
	_, _ = w.Write(value)
	if len(value) > 0 && value[len(value)-1] != '\n' {
		fmt.Fprintln(w)
	}
}

// checkView is what check prints.
type checkView struct {
	Token      string `json:"token"`
	Current    bool   `json:"current"`
	NewerToken string `json:"newer_token,omitempty"`
}

func (a *app) checkCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check",
		Short: "report whether a token is current (exit code 4 if stale)",
		Args:  nArgs(0),
	}
	return a.tokenVerb(cmd, "", func(ctx context.Context, c *client.Client, tok token.Token, _ []client.WriteOption, _ []string) (*view, error) {
		err := c.Check(ctx, tok)
		var stale *token.StaleError
		if err != nil && !errors.As(err, &stale) {
			return nil, err
		}
		v := checkView{Token: tok.String(), Current: err == nil}
		text := fmt.Sprintf("%s is current", tok)
		if stale != nil {
			text = fmt.Sprintf("%s is no longer current", tok)
			if !stale.Newer.IsZero() {
				v.NewerToken = stale.Newer.String()
				text = fmt.Sprintf("%s is superseded by %s", tok, stale.Newer)
			}
			err = &exitStatus{code: exitStale}
		}
		return &view{data: v, headers: []string{"TOKEN", "CURRENT", "NEWER"}, rows: [][]string{{v.Token, strconv.FormatBool(v.Current), dash(v.NewerToken)}},
			text: func(w io.Writer) { fmt.Fprintln(w, text) }}, err
	})
}

// statusRow is one lease in fencer status --output json.
type statusRow struct {
	Name   string `json:"name"`
	Epoch  uint64 `json:"epoch"`
	Held   bool   `json:"held"`
	Holder string `json:"holder,omitempty"`
	Token  string `json:"token,omitempty"`
	// LockDelay is the lease's lock-delay (Go duration syntax), and
	// LockDelayState says what it does now: "armed" (held: applies if the
	// acquisition ends without a clean release), "pending" (free: the next
	// acquirer starts it and is refused) or "running" (free: refusing
	// acquirers until it has passed).
	LockDelay      string `json:"lock_delay,omitempty"`
	LockDelayState string `json:"lock_delay_state,omitempty"`
}

// lockDelayState is statusRow.LockDelayState of st.
func lockDelayState(st token.Status) string {
	switch {
	case st.LockDelay == 0:
		return ""
	case !st.Token.IsZero():
		return "armed"
	case st.LockDelayStarted:
		return "running"
	}
	return "pending"
}

func (a *app) statusCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status [NAME...]",
		Short: "list leases with their holders and tokens",
		Long: `Lists the leases that have ever been acquired, with their holders,
tokens and lock-delays: all of them, those named NAME, or with --prefix
those whose names start with a NAME (exit code 3 if a NAME matches none).
A lock-delay is "armed" on a held lease (it applies if the acquisition ends
without a clean release), "pending" on a free lease (the next acquirer
starts it and is refused) and "running" until it has passed.`,
		Example: `  fencer status orders
  fencer status --prefix bench-`,
		Aliases: []string{"list", "ls"},
		Args:    validNames,
	}
	prefix := cmd.Flags().Bool("prefix", false, "list the leases whose names start with a NAME, as etcdctl get --prefix")
	return a.remote(cmd, func(ctx context.Context, c *client.Client, _ *grpc.ClientConn, names []string) (*view, error) {
		if *prefix && len(names) == 0 {
			return nil, usagef("--prefix needs a NAME prefix: fencer status --prefix PREFIX")
		}
		list, unmatched, err := listLeases(ctx, c, names, *prefix)
		if err != nil {
			return nil, err
		}
		if len(list) == 0 && len(unmatched) > 0 {
			// Nothing matched: the error alone, as kubectl get prints
			// for a name it does not find, rather than an empty table.
			return nil, unmatchedError(unmatched, *prefix)
		}
		rows := make([]statusRow, len(list))
		table := make([][]string, len(list))
		for i, st := range list {
			rows[i] = statusRow{Name: st.Name, Epoch: st.Epoch, Held: !st.Token.IsZero(), Holder: st.Holder, LockDelayState: lockDelayState(st)}
			if rows[i].Held {
				rows[i].Token = st.Token.String()
			}
			delay := ""
			if st.LockDelay > 0 {
				rows[i].LockDelay = st.LockDelay.String()
				delay = rows[i].LockDelay + " " + rows[i].LockDelayState
			}
			table[i] = []string{st.Name, strconv.FormatUint(st.Epoch, 10), dash(rows[i].Holder), dash(rows[i].Token), dash(delay)}
		}
		return &view{data: rows, headers: []string{"LEASE", "EPOCH", "HOLDER", "TOKEN", "LOCK-DELAY"}, rows: table}, unmatchedError(unmatched, *prefix)
	})
}

// nonNil is b, or an empty slice for nil, so that json and yaml print an
// empty value as "" rather than null.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// dash is s, or "-" for a table cell with no value.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
