package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// outputFlags are -o and --no-headers, on every command that prints data.
type outputFlags struct {
	format    string
	noHeaders bool
}

func (o *outputFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	o.format = "text"
	fs.VarP(&checkedString{p: &o.format, want: "text, table, json or yaml", example: "json", check: checkFormat}, "output", "o", "output format: text, table, json or yaml")
	fs.BoolVar(&o.noHeaders, "no-headers", false, "print tables without their header line")
	envFlag(fs, "output", "FENCER_OUTPUT")
	aliasFlag(fs, "write-out", "w", "output")
	for _, name := range []string{"output", "write-out"} {
		_ = cmd.RegisterFlagCompletionFunc(name, cobra.FixedCompletions([]string{"text", "table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	}
}

// checkFormat refuses an --output that is not one of fencer's formats.
func checkFormat(format string) error {
	switch format {
	case "text", "table", "json", "yaml":
		return nil
	}
	return errors.New("unknown output format")
}

// view is one command's result in every form fencer prints: data for json
// and yaml (its fields' json tags name them), a table, and text, the
// default, for scripts and people (nil: the table).
type view struct {
	data    any
	headers []string
	rows    [][]string
	text    func(w io.Writer)
}

// print writes v to w in the chosen format.
func (o *outputFlags) print(w io.Writer, v view) error {
	switch o.format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v.data)
	case "yaml":
		b, err := yaml.Marshal(v.data)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "text":
		if v.text != nil {
			v.text(w)
			return nil
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !o.noHeaders {
		fmt.Fprintln(tw, strings.Join(v.headers, "\t"))
	}
	for _, r := range v.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}
