package main

import (
	"testing"

	"github.com/fencer-dev/fencer/internal/etcdtest"
)

func TestMain(m *testing.M) { etcdtest.Main(m) }
