package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
)

// flagValueError turns pflag's error for a flag value that does not
// parse into a usage error naming the flag and the form it wants, without
// the parser's own text (strconv.ParseInt: ...). It returns nil for other
// errors.
func flagValueError(err error) error {
	var bad *pflag.InvalidValueError
	if !errors.As(err, &bad) {
		return nil
	}
	f := bad.GetFlag()
	want, example := flagForm(f.Value)
	sep := " "
	if f.NoOptDefVal != "" { // a bool: --insecure true would make true an argument
		sep = "="
	}
	return usagef("invalid --%s %q: want %s, e.g. --%s%s%s", f.Name, bad.GetValue(), want, f.Name, sep, example)
}

// envValueError is the usage error for value, of environment variable env,
// that its flag refused with err: it names the variable and the form the
// flag wants.
func envValueError(env, value string, err error) error {
	var bad *pflag.InvalidValueError
	if !errors.As(err, &bad) {
		return usagef("$%s=%q: %v", env, value, err)
	}
	f := bad.GetFlag()
	want, example := flagForm(f.Value)
	return usagef("$%s=%q: want %s, e.g. %s=%s (the variable of --%s)", env, value, want, env, example, f.Name)
}

// flagForm describes, for people, the values a flag's value takes, and
// gives one.
func flagForm(v pflag.Value) (want, example string) {
	switch v := v.(type) {
	case *checkedString:
		return v.want, v.example
	case alias:
		return flagForm(v.fs.Lookup(v.of).Value)
	}
	switch typ := v.Type(); typ {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "count":
		return "a whole number", "5"
	case "duration":
		return "a duration with its unit (ns, us, ms, s, m, h)", "10s"
	case "bool":
		return "true or false", "true"
	case "float32", "float64":
		return "a number", "0.5"
	}
	return fmt.Sprintf("a value of type %s", v.Type()), "..."
}

// checkedString is a string flag's value that refuses, when it is set,
// what check refuses: a bad value is then a usage error while the flags
// are parsed, naming the flag, or its variable when it came from the
// environment, and the form want describes (example is one).
type checkedString struct {
	p             *string
	want, example string
	check         func(string) error
}

func (v *checkedString) Set(s string) error {
	if err := v.check(s); err != nil {
		return err
	}
	*v.p = s
	return nil
}

func (v *checkedString) String() string { return *v.p }
func (v *checkedString) Type() string   { return "string" }
