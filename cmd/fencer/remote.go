package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/token"
)

// remoteCmd is the shared shape of put, get, check and status: flags, one
// connection, one call with a timeout.
type remoteCmd struct {
	name   string
	fs     *flag.FlagSet
	conn   connFlags
	output string
}

func newRemoteCmd(name string) *remoteCmd {
	r := &remoteCmd{name: name, fs: flag.NewFlagSet("fencer "+name, flag.ContinueOnError)}
	r.conn.register(r.fs)
	r.fs.StringVar(&r.output, "output", "text", `output format: "text" or "json"`)
	return r
}

// run parses args, checks their count and calls do with a client. It
// returns the exit code: do's, 2 for usage errors, 1 for other errors.
func (r *remoteCmd) run(ctx context.Context, args []string, nargs int, usage string, stderr io.Writer, do func(ctx context.Context, c *client.Client, args []string) (int, error)) int {
	r.fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: fencer %s [flags] %s\n", r.name, usage)
		r.fs.PrintDefaults()
	}
	if code := parseFlags(r.fs, args, stderr); code >= 0 {
		return code
	}
	if r.output != "text" && r.output != "json" {
		fmt.Fprintf(stderr, "fencer %s: --output must be text or json\n", r.name)
		return 2
	}
	if r.fs.NArg() != nargs {
		r.fs.Usage()
		return 2
	}
	cc, err := r.conn.dial()
	if err != nil {
		fmt.Fprintf(stderr, "fencer %s: %v\n", r.name, err)
		return 1
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, r.conn.timeout)
	defer cancel()
	code, err := do(ctx, client.New(cc), r.fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "fencer %s: %v\n", r.name, err)
		return 1
	}
	return code
}

func (r *remoteCmd) printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// tokenFlag reads --token, defaulting to $FENCER_TOKEN as set by
// fencer acquire.
func tokenFlag(fs *flag.FlagSet) *string {
	return fs.String("token", os.Getenv("FENCER_TOKEN"), "fencing token ($FENCER_TOKEN, as set by fencer acquire)")
}

func parseTokenFlag(s string) (token.Token, error) {
	if s == "" {
		return token.Token{}, errors.New("no token: pass --token or run under fencer acquire")
	}
	return token.Parse(s)
}

// runPut writes a data key with a guarded Put. --take-over takes the key
// over from another lease (fenced like any write); without it, a key of
// another lease is refused with token: foreign lease.
func runPut(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	r := newRemoteCmd("put")
	tokStr := tokenFlag(r.fs)
	takeOver := r.fs.Bool("take-over", false, "write the key even if another lease owns it, making this token's lease its owner")
	return r.run(ctx, args, 2, `KEY VALUE   (VALUE "-" reads standard input)`, stderr, func(ctx context.Context, c *client.Client, args []string) (int, error) {
		tok, err := parseTokenFlag(*tokStr)
		if err != nil {
			return 0, err
		}
		value := []byte(args[1])
		if args[1] == "-" {
			if value, err = io.ReadAll(os.Stdin); err != nil {
				return 0, err
			}
		}
		var opts []client.WriteOption
		if *takeOver {
			opts = append(opts, client.TakeOver())
		}
		rev, err := c.Put(ctx, tok, args[0], value, opts...)
		if err != nil {
			return 0, err
		}
		if r.output == "json" {
			r.printJSON(stdout, map[string]any{"key": args[0], "revision": rev})
		} else {
			fmt.Fprintf(stdout, "revision %d\n", rev)
		}
		return 0, nil
	})
}

// runGet reads a data key. It exits 3 when the key does not exist.
func runGet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	r := newRemoteCmd("get")
	return r.run(ctx, args, 1, "KEY", stderr, func(ctx context.Context, c *client.Client, args []string) (int, error) {
		v, found, err := c.Get(ctx, args[0])
		if err != nil {
			return 0, err
		}
		if r.output == "json" {
			r.printJSON(stdout, map[string]any{"key": args[0], "found": found, "value": string(v.Data), "create_revision": v.CreateRevision, "mod_revision": v.ModRevision})
		} else if found {
			_, _ = stdout.Write(v.Data)
			if len(v.Data) > 0 && v.Data[len(v.Data)-1] != '\n' {
				fmt.Fprintln(stdout)
			}
		}
		if !found {
			if r.output == "text" {
				fmt.Fprintf(stderr, "fencer get: %q not found\n", args[0])
			}
			return 3, nil
		}
		return 0, nil
	})
}

// runCheck reports whether a token is current. It exits 0 if it is and 3
// if it is stale.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	r := newRemoteCmd("check")
	tokStr := tokenFlag(r.fs)
	return r.run(ctx, args, 0, "", stderr, func(ctx context.Context, c *client.Client, _ []string) (int, error) {
		tok, err := parseTokenFlag(*tokStr)
		if err != nil {
			return 0, err
		}
		err = c.Check(ctx, tok)
		var stale *token.StaleError
		if err != nil && !errors.As(err, &stale) {
			return 0, err
		}
		out := map[string]any{"token": tok.String(), "current": err == nil}
		if stale != nil && !stale.Newer.IsZero() {
			out["newer_token"] = stale.Newer.String()
		}
		switch {
		case r.output == "json":
			r.printJSON(stdout, out)
		case err == nil:
			fmt.Fprintf(stdout, "%s is current\n", tok)
		default:
			fmt.Fprintln(stdout, stale.Error())
		}
		if err != nil {
			return 3, nil
		}
		return 0, nil
	})
}

// statusRow is one lease in fencer status --output json.
type statusRow struct {
	Name   string `json:"name"`
	Epoch  uint64 `json:"epoch"`
	Held   bool   `json:"held"`
	Holder string `json:"holder,omitempty"`
	Token  string `json:"token,omitempty"`
}

// runStatus lists leases with their holders and tokens.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	r := newRemoteCmd("status")
	return r.run(ctx, args, 0, "", stderr, func(ctx context.Context, c *client.Client, _ []string) (int, error) {
		list, err := c.List(ctx)
		if err != nil {
			return 0, err
		}
		rows := make([]statusRow, len(list))
		for i, st := range list {
			rows[i] = statusRow{Name: st.Name, Epoch: st.Epoch, Held: !st.Token.IsZero(), Holder: st.Holder}
			if rows[i].Held {
				rows[i].Token = st.Token.String()
			}
		}
		if r.output == "json" {
			r.printJSON(stdout, rows)
			return 0, nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LEASE\tEPOCH\tHOLDER\tTOKEN")
		for _, row := range rows {
			holder, tok := row.Holder, row.Token
			if !row.Held {
				holder, tok = "-", "-"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", row.Name, row.Epoch, holder, tok)
		}
		return 0, tw.Flush()
	})
}
