package etcdstore

import (
	"github.com/fencer-dev/fencer/token"
)

// Checked is the input of one guarded write after the store's checks: a
// token this store could have issued and, as the write needs them, a data
// key and value or a resource name. Put, Delete, Txn, Release, ReleaseOn
// and Advance check their arguments on every call and are what most callers want. A caller
// that must refuse bad input before work of its own, as the service does
// before it reads a token's holder to authorize the write, checks once
// with CheckPut, CheckDelete, CheckToken or CheckAdvance and passes the
// result to PutChecked, DeleteChecked, TxnChecked, ReleaseChecked or
// AdvanceChecked, which do not check it again.
//
// A Checked holds the value slice it was checked with, not a copy: a
// caller that changes the slice's contents before the write writes what
// is there then (a longer value cannot be made by changing contents).
// The zero Checked, and one checked for another kind of write, are
// refused with an *ArgumentError.
type Checked struct {
	kind  checkedKind
	tok   token.Token
	name  string // the data key of a Put or Delete, the resource of an Advance
	value []byte
}

type checkedKind uint8

const (
	unchecked checkedKind = iota
	checkedPut
	checkedDelete
	checkedToken
	checkedAdvance
)

var checkedKinds = [...]string{"unchecked", "put", "delete", "txn or release", "advance"}

// Token returns the checked token.
func (c Checked) Token() token.Token { return c.tok }

// CheckPut checks the arguments of a Put in the order Put does: the
// token (a *token.MalformedError), then the key and the value (an
// *ArgumentError naming "key" or "value").
func CheckPut(tok token.Token, key string, value []byte) (Checked, error) {
	if err := validToken(tok); err != nil {
		return Checked{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Checked{}, err
	}
	if err := ValidateValue(value); err != nil {
		return Checked{}, err
	}
	return Checked{kind: checkedPut, tok: tok, name: key, value: value}, nil
}

// CheckDelete checks the arguments of a Delete in the order Delete does:
// the token, then the key.
func CheckDelete(tok token.Token, key string) (Checked, error) {
	if err := validToken(tok); err != nil {
		return Checked{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Checked{}, err
	}
	return Checked{kind: checkedDelete, tok: tok, name: key}, nil
}

// CheckToken checks the token of a Txn or a release, the only argument
// of theirs the store checks before it builds the etcd Txn (TxnChecked
// refuses a delete of a range of data keys itself, as Txn does).
func CheckToken(tok token.Token) (Checked, error) {
	if err := validToken(tok); err != nil {
		return Checked{}, err
	}
	return Checked{kind: checkedToken, tok: tok}, nil
}

// CheckAdvance checks the arguments of an Advance in the order Advance
// does: the resource name (an *ArgumentError naming "resource"), then the
// token.
func CheckAdvance(resource string, tok token.Token) (Checked, error) {
	if err := ValidateName("resource", resource); err != nil {
		return Checked{}, err
	}
	if err := validToken(tok); err != nil {
		return Checked{}, err
	}
	return Checked{kind: checkedAdvance, tok: tok, name: resource}, nil
}

// checkedFor returns nil if c was checked for a write of kind, and an
// *ArgumentError otherwise.
func (c Checked) checkedFor(kind checkedKind) error {
	if c.kind == kind {
		return nil
	}
	return invalid("checked", checkedKinds[c.kind], "not checked for "+checkedKinds[kind])
}
