package fencerv1

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestSessionsErrorRoundTrip: a status with a fencer.dev ErrorInfo comes
// back from a SessionsError with its code, message, reason and metadata;
// another domain's ErrorInfo is not carried, and OK reads as UNKNOWN.
func TestSessionsErrorRoundTrip(t *testing.T) {
	info := &errdetails.ErrorInfo{Reason: ErrorReason_ERROR_REASON_SESSION_NOT_FOUND.Reason(), Domain: ErrorDomain, Metadata: map[string]string{"k": "v"}}
	st, err := status.New(codes.NotFound, "session not found").WithDetails(info)
	if err != nil {
		t.Fatal(err)
	}
	back := SessionsErrorOf(st).Status()
	if back.Code() != codes.NotFound || back.Message() != "session not found" {
		t.Fatalf("got %v", back)
	}
	if d := back.Details(); len(d) != 1 || !proto.Equal(d[0].(*errdetails.ErrorInfo), info) {
		t.Fatalf("details %v, want %v", d, info)
	}

	other, err := status.New(codes.Unavailable, "x").WithDetails(&errdetails.ErrorInfo{Reason: "R", Domain: "example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if e := SessionsErrorOf(other); e.GetReason() != "" || len(e.Status().Details()) != 0 {
		t.Fatalf("carried another domain's reason: %v", e)
	}
	if c := (&SessionsError{}).Status().Code(); c != codes.Unknown {
		t.Fatalf("code OK read as %v", c)
	}
}
