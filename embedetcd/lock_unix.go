//go:build unix

package embedetcd

import (
	"os"
	"syscall"
)

// tryLock takes an exclusive flock on f without waiting. flock locks
// belong to the open file, so a second open of the same file cannot take
// it, even within one process.
func tryLock(f *os.File) (locked bool, err error) {
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == syscall.EWOULDBLOCK {
		return true, nil
	}
	return false, err
}
