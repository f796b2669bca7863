package main

import (
	"context"
	"io"
)

// The commands, run in process as fencer would run them with these
// arguments: each returns the exit code.

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return dispatch(ctx, append([]string{"serve"}, args...), stdout, stderr)
}

func runAcquire(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return dispatch(ctx, append([]string{"acquire"}, args...), stdout, stderr)
}

func runPut(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return dispatch(ctx, append([]string{"put"}, args...), stdout, stderr)
}

func runGet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return dispatch(ctx, append([]string{"get"}, args...), stdout, stderr)
}

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return dispatch(ctx, append([]string{"check"}, args...), stdout, stderr)
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return dispatch(ctx, append([]string{"status"}, args...), stdout, stderr)
}
