package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestOutputValuesAreBase64 puts a value that is not UTF-8 and one that
// is, through the built binary against fencer serve: get and txn print
// each value as base64 in json and yaml, which decode back to exactly the
// bytes put, and as the raw bytes in text.
func TestOutputValuesAreBase64(t *testing.T) {
	s := startServeProc(t)
	holder, tok := rtHold(t, s, "orders")
	defer func() { _ = holder.cmd.Process.Kill() }()
	env := []string{"FENCER_TOKEN=" + tok}

	for _, c := range []struct {
		key, value, base64, text string
	}{
		{"orders/bin", "\xff\xfebin", "//5iaW4=", "\xff\xfebin\n"},
		{"orders/utf8", "Grüße\n", "R3LDvMOfZQo=", "Grüße\n"},
	} {
		t.Run(c.key, func(t *testing.T) {
			p := s.startFencerIn(strings.NewReader(c.value), env, "put", c.key, "-")
			require.Equal(t, 0, p.wait(t, printBound), p.stderr.String())

			code, stdout, stderr := s.fencer(nil, "get", c.key)
			require.Equal(t, 0, code, stderr)
			require.Equal(t, c.text, stdout, "text prints the raw bytes, and a newline if they end without one")

			code, stdout, stderr = s.fencer(nil, "get", c.key, "-o", "json")
			require.Equal(t, 0, code, stderr)
			require.Contains(t, stdout, `"value": "`+c.base64+`"`)
			var got struct{ Value []byte }
			require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
			require.Equal(t, []byte(c.value), got.Value)

			code, stdout, stderr = s.fencer(nil, "get", c.key, "-o", "yaml")
			require.Equal(t, 0, code, stderr)
			require.Contains(t, stdout, "value: "+c.base64+"\n")
			got.Value = nil
			require.NoError(t, yaml.Unmarshal([]byte(stdout), &got), stdout)
			require.Equal(t, []byte(c.value), got.Value)

			p = s.startFencerIn(strings.NewReader("\n"+"get "+c.key+"\n"), env, "txn", "-o", "json")
			require.Equal(t, 0, p.wait(t, printBound), p.stderr.String())
			var txn struct{ Results []struct{ Value []byte } }
			require.NoError(t, json.Unmarshal([]byte(p.stdout.String()), &txn), p.stdout.String())
			require.Len(t, txn.Results, 1)
			require.Equal(t, []byte(c.value), txn.Results[0].Value)
		})
	}
}
