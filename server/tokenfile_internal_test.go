package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
)

// TestTokenFileStreamsRegisteringDuringReloadsEnd opens streams while the
// token file is reloaded over and over, then removes their token: every
// stream ends, whichever reload it raced with, and none ends before. The
// streams start no goroutine of their own.
func TestTokenFileStreamsRegisteringDuringReloadsEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	const tok = "erin-token-0123456789a"
	write := func(content string) {
		require.NoError(t, os.WriteFile(path+".tmp", []byte(content), 0o600))
		require.NoError(t, os.Rename(path+".tmp", path))
	}
	write(tok + " erin\n")
	f, err := NewTokenFile(path, nil)
	require.NoError(t, err)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))

	before := runtime.NumGoroutine()
	var mu sync.Mutex
	var valid []context.Context
	var stops []func()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				v, stop := f.whileValid(ctx, "erin")
				mu.Lock()
				valid, stops = append(valid, v), append(stops, stop)
				mu.Unlock()
			}
		}()
	}
	for i := range 50 { // the same tokens, in files that differ
		write(tok + " erin\n" + "other-token-0123456789 o" + string(rune('a'+i%26)) + "\n")
		_, err := f.Reload()
		require.NoError(t, err)
	}
	wg.Wait()
	require.Less(t, runtime.NumGoroutine(), before+100, "800 open streams, as many goroutines")
	for _, v := range valid {
		require.NoError(t, v.Err(), "a stream whose token stays ended")
	}

	write("other-token-0123456789 other\n")
	_, err = f.Reload()
	require.NoError(t, err)
	for _, v := range valid {
		require.Error(t, v.Err(), "a stream outlived its token")
		require.True(t, errors.Is(context.Cause(v), ErrUnauthenticated))
	}
	for _, stop := range stops {
		stop()
	}
	require.Empty(t, f.streams, "stop forgets its stream")
}
