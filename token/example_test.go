package token_test

import (
	"errors"
	"fmt"

	"github.com/fencer-dev/fencer/token"
)

func ExampleParse() {
	t, err := token.Parse("v1:3:1042:team-a/fence")
	if err != nil {
		panic(err)
	}
	fmt.Println(t.Lease, t.Epoch, t.Revision)
	// Output: team-a/fence 3 1042
}

func ExampleToken_Compare() {
	older := token.Token{Lease: "jobs", Epoch: 1, Revision: 10}
	newer := token.Token{Lease: "jobs", Epoch: 2, Revision: 17}
	c, _ := older.Compare(newer)
	fmt.Println(c)
	_, err := older.Compare(token.Token{Lease: "other", Revision: 3})
	fmt.Println(errors.Is(err, token.ErrForeignLease))
	// Output:
	// -1
	// true
}

func ExampleCheckStamp() {
	held := token.Token{Lease: "ns/fence", Epoch: 4, Revision: 900}
	// The object was last written by a newer holder of the same lease.
	existing := token.Token{Lease: "ns/fence", Epoch: 5, Revision: 950}.Stamp(nil)
	err := token.CheckStamp(held, existing, false)
	fmt.Println(errors.Is(err, token.ErrStale))
	fmt.Println(err)
	// Output:
	// true
	// token: stale: v1:4:900:ns/fence is superseded by v1:5:950:ns/fence
}
