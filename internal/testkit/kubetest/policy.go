package kubetest

import (
	"context"

	"github.com/fencer-dev/fencer/fencertest/kubefencertest"
)

// PolicyPath is the admission policy fencer ships, relative to the
// repository root (deploy.Policy in package deploy).
const PolicyPath = "deploy/admission/policy.yaml"

// InstallPolicy creates the objects of PolicyPath as the admin and returns
// once the API server enforces them (kubefencertest.InstallPolicy, which
// probes in its ProbeNamespace). It returns an error if the policy is not
// enforced before ctx ends.
func (e *Env) InstallPolicy(ctx context.Context) error {
	return kubefencertest.InstallPolicy(ctx, e.Admin())
}
