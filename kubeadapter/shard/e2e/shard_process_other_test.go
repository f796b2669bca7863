//go:build !linux

package e2e_test

import (
	"fmt"
	"os"
)

// shardMemberEnv is the environment variable that makes the test binary
// a member process of TestShardProcesses, which runs on Linux only.
const shardMemberEnv = "FENCER_SHARD_MEMBER"

// shardMember refuses: member processes need Linux (SIGSTOP, /proc).
func shardMember(string) int {
	fmt.Fprintln(os.Stderr, "shard member: runs on linux only")
	return 2
}
