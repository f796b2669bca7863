package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/fencer-dev/fencer/client"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

const txnFormat = `The transaction is read from FILE, or standard input without FILE (or
with -). Like etcdctl txn, it has three sections, each ended by an empty
line: compares, the operations run when every compare holds (success),
and those run otherwise (failure). A section may be empty (an empty line
at once); lines starting with # are comments.

  compare:    value(KEY) OP VALUE | version(KEY) OP N | create(KEY) OP N | mod(KEY) OP N
              OP is = != > <; version 0 means the key does not exist
  operation:  put KEY VALUE | del KEY | get KEY

KEY and VALUE are a word without spaces or quotes, or a double-quoted Go
string ("with spaces\n"). N is a whole number, quoted or not. The whole
transaction runs in one etcd Txn that commits only if the token is current
(exit code 4 otherwise, and neither branch runs).`

const txnExample = `  fencer txn <<'EOF'
  value(orders/state) = open

  put orders/state closed
  put orders/total "250"

  get orders/state
  EOF`

// txnError is a transaction text that does not parse: the line and why.
type txnError struct {
	line int
	msg  string
}

// Error is "line N: why": fencer prints it after "fencer txn: ", which
// names the command.
func (e *txnError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

// errTxnSyntax is wrapped by every *txnError.
var errTxnSyntax = errors.New("txn: syntax")

func (e *txnError) Unwrap() error { return errTxnSyntax }

// txnRequest is a parsed transaction.
type txnRequest struct {
	compares         []*fencerv1.Compare
	success, failure []*fencerv1.Op
}

var compareTargets = map[string]fencerv1.Compare_Target{
	"value":   fencerv1.Compare_TARGET_VALUE,
	"version": fencerv1.Compare_TARGET_VERSION,
	"create":  fencerv1.Compare_TARGET_CREATE_REVISION,
	"mod":     fencerv1.Compare_TARGET_MOD_REVISION,
}

var compareResults = map[string]fencerv1.Compare_Result{
	"=":  fencerv1.Compare_RESULT_EQUAL,
	"!=": fencerv1.Compare_RESULT_NOT_EQUAL,
	">":  fencerv1.Compare_RESULT_GREATER,
	"<":  fencerv1.Compare_RESULT_LESS,
}

// parseTxn parses the transaction text format (txnFormat). It returns a
// *txnError for text that does not parse; it does not check what the
// server checks (key rules, sizes).
func parseTxn(text string) (txnRequest, error) {
	var req txnRequest
	section := 0
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		line = strings.TrimRightFunc(line, unicode.IsSpace)
		trimmed := strings.TrimLeftFunc(line, unicode.IsSpace)
		switch {
		case strings.HasPrefix(trimmed, "#"):
			continue
		case trimmed == "":
			section++ // each empty line ends a section
			continue
		}
		if section > 2 {
			return txnRequest{}, &txnError{n, "more than three sections (compares, success, failure)"}
		}
		if section == 0 {
			c, err := parseCompare(trimmed)
			if err != nil {
				return txnRequest{}, &txnError{n, err.Error()}
			}
			req.compares = append(req.compares, c)
			continue
		}
		op, err := parseOp(trimmed)
		if err != nil {
			return txnRequest{}, &txnError{n, err.Error()}
		}
		if section == 1 {
			req.success = append(req.success, op)
		} else {
			req.failure = append(req.failure, op)
		}
	}
	return req, nil
}

// words splits s into words and double-quoted Go strings, unquoted.
func words(s string) ([]string, error) {
	var out []string
	for {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
		if s == "" {
			return out, nil
		}
		if s[0] == '"' {
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				return nil, fmt.Errorf("unterminated or invalid quoted string at %.20q", s)
			}
			u, _ := strconv.Unquote(q)
			out = append(out, u)
			s = s[len(q):]
			if s != "" && !unicode.IsSpace(rune(s[0])) {
				return nil, fmt.Errorf("no space after the quoted string %s", q)
			}
			continue
		}
		end := strings.IndexFunc(s, unicode.IsSpace)
		if end < 0 {
			end = len(s)
		}
		w := s[:end]
		if strings.Contains(w, `"`) {
			return nil, fmt.Errorf("a quote inside the word %q: quote the whole word", w)
		}
		out = append(out, w)
		s = s[end:]
	}
}

// parseCompare parses TARGET(KEY) OP OPERAND.
func parseCompare(line string) (*fencerv1.Compare, error) {
	open := strings.IndexByte(line, '(')
	if open < 0 {
		return nil, fmt.Errorf("want a compare such as value(KEY) = VALUE, got %q", line)
	}
	target, ok := compareTargets[strings.TrimSpace(line[:open])]
	if !ok {
		return nil, fmt.Errorf("unknown compare target %q: want value, version, create or mod", strings.TrimSpace(line[:open]))
	}
	rest := line[open+1:]
	var key string
	if strings.HasPrefix(rest, `"`) {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return nil, errors.New("invalid quoted key")
		}
		key, _ = strconv.Unquote(q)
		rest = rest[len(q):]
		if !strings.HasPrefix(rest, ")") {
			return nil, errors.New("want ) after the key")
		}
	} else {
		end := strings.IndexByte(rest, ')')
		if end < 0 {
			return nil, errors.New("want ) after the key")
		}
		key = rest[:end]
		if strings.ContainsAny(key, "\" \t") {
			return nil, fmt.Errorf("key %q: quote a key with spaces or quotes", key)
		}
		rest = rest[end:]
	}
	if key == "" {
		return nil, errors.New("empty key")
	}
	if !utf8.ValidString(key) {
		return nil, fmt.Errorf("key %q: not valid UTF-8", key)
	}
	w, err := words(rest[1:])
	if err != nil {
		return nil, err
	}
	if len(w) != 2 {
		return nil, errors.New("want an operator (= != > <) and an operand after the key")
	}
	result, ok := compareResults[w[0]]
	if !ok {
		return nil, fmt.Errorf("unknown operator %q: want =, !=, > or <", w[0])
	}
	c := &fencerv1.Compare{Key: key, Target: target, Result: result}
	if target == fencerv1.Compare_TARGET_VALUE {
		c.Value = []byte(w[1])
		return c, nil
	}
	if c.Number, err = strconv.ParseInt(w[1], 10, 64); err != nil || c.Number < 0 {
		return nil, fmt.Errorf("operand %q: want a whole number, at least 0", w[1])
	}
	return c, nil
}

// parseOp parses put KEY VALUE, del KEY or get KEY.
func parseOp(line string) (*fencerv1.Op, error) {
	w, err := words(line)
	if err != nil {
		return nil, err
	}
	want := map[string]int{"put": 3, "del": 2, "get": 2}
	n, ok := want[w[0]]
	switch {
	case !ok:
		return nil, fmt.Errorf("unknown operation %q: want put, del or get", w[0])
	case len(w) != n:
		return nil, fmt.Errorf("%s takes %d argument(s), got %d", w[0], n-1, len(w)-1)
	case w[1] == "":
		return nil, errors.New("empty key")
	case !utf8.ValidString(w[1]):
		return nil, fmt.Errorf("key %q: not valid UTF-8", w[1])
	}
	switch w[0] {
	case "put":
		return &fencerv1.Op{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: w[1], Value: []byte(w[2])}}}, nil
	case "del":
		return &fencerv1.Op{Op: &fencerv1.Op_Delete{Delete: &fencerv1.DeleteOp{Key: w[1]}}}, nil
	}
	return &fencerv1.Op{Op: &fencerv1.Op_Get{Get: &fencerv1.GetOp{Key: w[1]}}}, nil
}

// format writes req in the text format, every key and value quoted, so
// that parseTxn reads it back as it is.
func (req txnRequest) format() string {
	var b strings.Builder
	names := map[fencerv1.Compare_Target]string{}
	for n, t := range compareTargets {
		names[t] = n
	}
	ops := map[fencerv1.Compare_Result]string{}
	for n, r := range compareResults {
		ops[r] = n
	}
	for _, c := range req.compares {
		operand := strconv.FormatInt(c.GetNumber(), 10)
		if c.GetTarget() == fencerv1.Compare_TARGET_VALUE {
			operand = strconv.Quote(string(c.GetValue()))
		}
		fmt.Fprintf(&b, "%s(%s) %s %s\n", names[c.GetTarget()], strconv.Quote(c.GetKey()), ops[c.GetResult()], operand)
	}
	for _, branch := range [][]*fencerv1.Op{req.success, req.failure} {
		b.WriteString("\n")
		for _, op := range branch {
			switch o := op.GetOp().(type) {
			case *fencerv1.Op_Put:
				fmt.Fprintf(&b, "put %s %s\n", strconv.Quote(o.Put.GetKey()), strconv.Quote(string(o.Put.GetValue())))
			case *fencerv1.Op_Delete:
				fmt.Fprintf(&b, "del %s\n", strconv.Quote(o.Delete.GetKey()))
			case *fencerv1.Op_Get:
				fmt.Fprintf(&b, "get %s\n", strconv.Quote(o.Get.GetKey()))
			}
		}
	}
	return b.String()
}

// txnView is what txn prints.
type txnView struct {
	Succeeded bool          `json:"succeeded"`
	Results   []txnOpResult `json:"results"`
}

// txnOpResult is the result of one operation of the branch that ran. A
// get's Value is set (to an empty slice when the key is absent), and json
// and yaml print it as base64, like get's.
type txnOpResult struct {
	Op       string  `json:"op"`
	Key      string  `json:"key"`
	Revision int64   `json:"revision,omitempty"`
	Deleted  *bool   `json:"deleted,omitempty"`
	Found    *bool   `json:"found,omitempty"`
	Value    *[]byte `json:"value,omitempty"`
}

func (a *app) txnCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "txn [FILE]",
		Short:   "run a guarded compare-then-else transaction on data keys",
		Long:    txnFormat,
		Example: txnExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("txn takes at most one FILE, got %d arguments", len(args))
			}
			return nil
		},
	}
	return a.tokenVerb(cmd, "keys", func(ctx context.Context, c *client.Client, tok token.Token, opts []client.WriteOption, args []string) (*view, error) {
		var text []byte
		var err error
		if len(args) == 0 || args[0] == "-" {
			text, err = io.ReadAll(a.stdin)
		} else {
			text, err = os.ReadFile(args[0])
		}
		if err != nil {
			return nil, err
		}
		req, err := parseTxn(string(text))
		if err != nil {
			return nil, usagef("%v", err)
		}
		resp, err := c.Txn(ctx, tok, req.compares, req.success, req.failure, opts...)
		if err != nil {
			return nil, err
		}
		branch := req.failure
		if resp.GetSucceeded() {
			branch = req.success
		}
		return txnResultView(resp, branch), nil
	})
}

// txnResultView pairs each result of resp with the operation of branch
// that produced it.
func txnResultView(resp *fencerv1.TxnResponse, branch []*fencerv1.Op) *view {
	v := txnView{Succeeded: resp.GetSucceeded(), Results: []txnOpResult{}}
	var rows [][]string
	for i, r := range resp.GetResults() {
		var res txnOpResult
		var detail string
		switch {
		case r.GetPut() != nil:
			res = txnOpResult{Op: "put", Revision: r.GetPut().GetRevision()}
			detail = fmt.Sprintf("revision %d", res.Revision)
		case r.GetDelete() != nil:
			deleted := r.GetDelete().GetDeleted()
			res = txnOpResult{Op: "del", Deleted: &deleted}
			detail = fmt.Sprintf("deleted %t", deleted)
		case r.GetGet() != nil:
			found := r.GetGet().GetFound()
			value := nonNil(r.GetGet().GetValue())
			res = txnOpResult{Op: "get", Found: &found, Value: &value}
			detail = "not found"
			if found {
				detail = strconv.Quote(string(value))
			}
		}
		if i < len(branch) {
			res.Key = opKey(branch[i])
		}
		v.Results = append(v.Results, res)
		rows = append(rows, []string{res.Op, res.Key, detail})
	}
	outcome := "FAILURE"
	if v.Succeeded {
		outcome = "SUCCESS"
	}
	return &view{data: v, headers: []string{"OP", "KEY", "RESULT"}, rows: rows, text: func(w io.Writer) {
		fmt.Fprintln(w, outcome)
		for _, r := range rows {
			fmt.Fprintln(w, strings.Join(r, " "))
		}
	}}
}

func opKey(op *fencerv1.Op) string {
	switch o := op.GetOp().(type) {
	case *fencerv1.Op_Put:
		return o.Put.GetKey()
	case *fencerv1.Op_Delete:
		return o.Delete.GetKey()
	case *fencerv1.Op_Get:
		return o.Get.GetKey()
	}
	return ""
}
