package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// TestConnectionFlagsFromEnvironment: every connection flag reads its
// variable, a flag given on the command line wins, and a variable that
// does not parse is a usage error naming it.
func TestConnectionFlagsFromEnvironment(t *testing.T) {
	env := map[string]string{
		"FENCER_SERVER": "10.0.0.1:7890", "FENCER_AUTH_TOKEN_FILE": "/run/token", "FENCER_TLS_CA": "/ca.pem",
		"FENCER_TLS_CERT": "/c.pem", "FENCER_TLS_KEY": "/k.pem", "FENCER_TIMEOUT": "3s", "FENCER_INSECURE": "true",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	var c connFlags
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	c.register(fs)
	require.NoError(t, fs.Parse([]string{"--server", "127.0.0.1:1"}))
	require.NoError(t, applyEnv(fs))
	require.Equal(t, connFlags{server: "127.0.0.1:1", authTokenFile: "/run/token", tlsCA: "/ca.pem", tlsCert: "/c.pem", tlsKey: "/k.pem", timeout: 3 * time.Second, insecure: true}, c)
	for flag, v := range connEnv {
		require.Contains(t, fs.Lookup(flag).Usage, "[$"+v+"]")
		require.Contains(t, env, v, "a variable this test does not set")
	}

	t.Setenv("FENCER_INSECURE", "maybe")
	fs = pflag.NewFlagSet("test", pflag.ContinueOnError)
	c.register(fs)
	require.NoError(t, fs.Parse(nil))
	err := applyEnv(fs)
	var use *usageError
	require.ErrorAs(t, err, &use)
	require.Contains(t, err.Error(), `$FENCER_INSECURE="maybe"`)
}
