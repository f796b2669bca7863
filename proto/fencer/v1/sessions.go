package fencerv1

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SessionsErrorOf carries st, the status a call would end with, in a
// Sessions message: its code and message, and the reason and metadata of
// its google.rpc.ErrorInfo in ErrorDomain, if it has one. Other details
// (a google.rpc.BadRequest) are not carried.
func SessionsErrorOf(st *status.Status) *SessionsError {
	e := &SessionsError{Code: int32(st.Code()), Message: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			e.Reason, e.Metadata = info.GetReason(), info.GetMetadata()
		}
	}
	return e
}

// Status is the status e carries, as a call would end with it: its code
// and message, with an ErrorInfo in ErrorDomain when e has a reason. A
// code of OK, which a SessionsError never carries, reads as UNKNOWN.
func (e *SessionsError) Status() *status.Status {
	if e.GetCode() == int32(codes.OK) {
		return status.New(codes.Unknown, "fencerv1: a Sessions message carried an error with code OK")
	}
	st := status.New(codes.Code(e.GetCode()), e.GetMessage())
	if e.GetReason() == "" {
		return st
	}
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: e.GetReason(), Domain: ErrorDomain, Metadata: e.GetMetadata()})
	if err != nil {
		return st
	}
	return withInfo
}
