package deploy

import "embed"

// Paths of the manifests in FS.
const (
	// Policy is the admission policy that refuses stale fencing tokens.
	Policy = "admission/policy.yaml"
	// LiveLease is the opt-in live-Lease admission policy.
	LiveLease = "admission/live-lease.yaml"
	// Role is the RBAC Role of fencer's Kubernetes library.
	Role = "rbac/role.yaml"
)

// FS holds, read-only, every YAML file of admission/ and rbac/ here,
// among them Policy, LiveLease and Role.
//
//go:embed admission/*.yaml rbac/*.yaml
var FS embed.FS
