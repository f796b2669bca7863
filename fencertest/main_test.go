package fencertest_test

import (
	"testing"

	"github.com/fencer-dev/fencer/fencertest"
)

// TestMain runs Cluster's members and checks that nothing the kit starts
// outlives the tests.
func TestMain(m *testing.M) { fencertest.Main(m) }
