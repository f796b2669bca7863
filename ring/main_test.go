package ring_test

import (
	"testing"

	"github.com/fencer-dev/fencer/fencertest"
)

func TestMain(m *testing.M) { fencertest.Main(m, fencertest.IgnoreInProcessPeers()) }
