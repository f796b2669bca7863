package etcdstore_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"jobs", "", "a/b", "with space", "ctl\x01", "\xff", strings.Repeat("n", 254)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := etcdstore.ValidateName("name", name)
		if err != nil {
			if !errors.Is(err, etcdstore.ErrInvalidArgument) {
				t.Fatalf("ValidateName(%q) = %v, not ErrInvalidArgument", name, err)
			}
			return
		}
		if name == "" || len(name) > etcdstore.MaxNameLen || strings.Contains(name, "/") || !utf8.ValidString(name) {
			t.Fatalf("ValidateName accepted %q", name)
		}
		// Every accepted name makes a valid token lease.
		if err := (token.Token{Lease: name, Revision: 1}).Validate(); err != nil {
			t.Fatalf("accepted name %q is not a valid token lease: %v", name, err)
		}
	})
}

func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"k", "", "a/b/c", "ctl\n", "\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := etcdstore.ValidateKey(key)
		if err != nil {
			if !errors.Is(err, etcdstore.ErrInvalidArgument) {
				t.Fatalf("ValidateKey(%q) = %v, not ErrInvalidArgument", key, err)
			}
			return
		}
		if key == "" || len(key) > etcdstore.MaxKeyLen || !utf8.ValidString(key) {
			t.Fatalf("ValidateKey accepted %q", key)
		}
	})
}
