//go:build !unix

package embedetcd

import "os"

// tryLock does nothing on this platform: a second member on a data
// directory waits on etcd's own lock instead of failing.
func tryLock(*os.File) (locked bool, err error) { return false, nil }
