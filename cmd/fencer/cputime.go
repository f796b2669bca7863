package main

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of the CPU times in /proc/PID/stat (USER_HZ),
// which Linux fixes at 100 per second for user space.
const clockTick = 10 * time.Millisecond

// processCPU returns the CPU time (user and system) that process pid has
// used, read from /proc/PID/stat. It returns -1 when pid is not positive
// or the time cannot be read (no /proc, or the process is gone); the
// resolution is clockTick.
func processCPU(pid int) time.Duration {
	if pid <= 0 {
		return -1
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count the fields after its closing one. utime and stime are
	// fields 14 and 15.
	end := strings.LastIndexByte(string(b), ')')
	if end < 0 {
		return -1
	}
	fields := strings.Fields(string(b[end+1:]))
	if len(fields) < 13 {
		return -1
	}
	utime, uerr := strconv.ParseInt(fields[11], 10, 64)
	stime, serr := strconv.ParseInt(fields[12], 10, 64)
	if uerr != nil || serr != nil {
		return -1
	}
	return time.Duration(utime+stime) * clockTick
}
