package kubetest

import (
	"context"

	"github.com/fencer-dev/fencer/fencertest/kubefencertest"
)

// LiveLeasePath is the opt-in live-Lease admission policy fencer ships,
// relative to the repository root (deploy.LiveLease in package deploy).
const LiveLeasePath = "deploy/admission/live-lease.yaml"

// LiveLeasePolicy is the name of the ValidatingAdmissionPolicy, and of its
// binding, in LiveLeasePath (kubefencertest.LiveLeasePolicy).
const LiveLeasePolicy = kubefencertest.LiveLeasePolicy

// InstallLiveLeasePolicy creates the objects of LiveLeasePath as the admin
// and returns once the API server enforces them
// (kubefencertest.InstallLiveLeasePolicy). It does not install PolicyPath.
func (e *Env) InstallLiveLeasePolicy(ctx context.Context) error {
	return kubefencertest.InstallLiveLeasePolicy(ctx, e.Admin())
}
