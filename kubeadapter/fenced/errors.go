package fenced

import (
	"errors"
	"fmt"
)

// Sentinel errors of this package. Match them with errors.Is. Errors about
// tokens and holding are the token package's: token.ErrStale,
// token.ErrNotHeld, token.ErrForeignLease and token.ErrMalformed.
var (
	// ErrInvalidConfig means NewClient, UpdateFenced or DeleteFenced
	// rejected an argument or an option before any I/O. A *ConfigError
	// wraps it.
	ErrInvalidConfig = errors.New("fenced: invalid config")
	// ErrUnsupported means the fenced client refuses an operation it cannot
	// fence, such as DeleteAllOf or an unknown patch type. Nothing was
	// written.
	ErrUnsupported = errors.New("fenced: unsupported")
	// ErrInvalidPatch means the fenced client refuses a patch it cannot
	// parse, or one that would write the whole object or its metadata, or
	// move a fencer annotation. Nothing was written.
	ErrInvalidPatch = errors.New("fenced: invalid patch")
	// ErrInvalidObject means the fenced client refuses an object whose
	// metadata it cannot read exactly: an unstructured object whose
	// metadata.annotations is not a map of strings, or whose
	// metadata.resourceVersion is not a string. Writing fencer's stamp over
	// such an object would drop the caller's annotations or version
	// instead of failing as a plain write does. Nothing was written.
	ErrInvalidObject = errors.New("fenced: invalid object")
	// ErrDeleted means the fenced client refuses an apply that would
	// create an object its reads saw existing: the object was deleted
	// after fencer, or the caller, read it, and recreating it could undo a
	// newer holder's delete. It is returned with the API server's NotFound
	// error, so apierrors.IsNotFound matches too. Nothing was written.
	ErrDeleted = errors.New("fenced: object deleted since it was read")
)

// ConfigError reports an invalid argument or option of NewClient,
// UpdateFenced or DeleteFenced. It wraps ErrInvalidConfig.
type ConfigError struct {
	// Field names the offending argument or option, such as
	// "WithMaxAttempts".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// Error describes the error for people; match it with errors.Is or
// errors.As, never by its text.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("fenced: invalid config: %s %s", e.Field, e.Reason)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }
