package kubeadapter_test

import (
	"errors"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-dev/fencer/kubeadapter"
)

func ExampleTokenOf() {
	transitions := int32(3)
	// The Lease as returned by the write that acquired it.
	acquired := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "fence", ResourceVersion: "48213"},
		Spec:       coordinationv1.LeaseSpec{LeaseTransitions: &transitions},
	}
	tok, err := kubeadapter.TokenOf(acquired)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(tok)
	// Output: v1:3:48213:team-a/fence
}

func ExampleConfig_Validate() {
	cfg := kubeadapter.DefaultConfig("team-a", "fence", "controller-0")
	fmt.Println(cfg.Validate())
	cfg.RenewDeadline = cfg.LeaseDuration
	err := cfg.Validate()
	fmt.Println(errors.Is(err, kubeadapter.ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// <nil>
	// true
	// kubeadapter: invalid config: RenewDeadline must be less than LeaseDuration
}
