package fencerv1

import "strings"

// ErrorDomain is the google.rpc.ErrorInfo domain of every error fencer's
// service returns.
const ErrorDomain = "fencer.dev"

// reasonPrefix is what an ErrorReason's name has and its reason string has
// not (fencer.proto states the rule).
const reasonPrefix = "ERROR_REASON_"

// Reason returns the string that a google.rpc.ErrorInfo carries for r:
// r's name without the "ERROR_REASON_" prefix, "STALE_TOKEN" for
// ErrorReason_ERROR_REASON_STALE_TOKEN. This is the one place where the
// service's reason strings come from; they are the wire contract and do
// not change. It returns "" for ErrorReason_ERROR_REASON_UNSPECIFIED,
// which is never sent, and for a number the enum does not name.
func (r ErrorReason) Reason() string {
	if r == ErrorReason_ERROR_REASON_UNSPECIFIED {
		return ""
	}
	s, _ := strings.CutPrefix(ErrorReason_name[int32(r)], reasonPrefix)
	return s
}

// ParseReason returns the ErrorReason whose Reason is s. It returns
// ErrorReason_ERROR_REASON_UNSPECIFIED for "" (an error without a
// fencer.dev ErrorInfo) and for a string that names no value of this
// version of the enum, such as a reason a newer server added: a caller
// then acts on the gRPC code alone. It does not accept the enum's own
// names ("ERROR_REASON_STALE_TOKEN"), which are never sent.
func ParseReason(s string) ErrorReason {
	if s == "" || strings.HasPrefix(s, reasonPrefix) {
		return ErrorReason_ERROR_REASON_UNSPECIFIED
	}
	return ErrorReason(ErrorReason_value[reasonPrefix+s])
}
