package etcdproc

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

const canIsolate = true

// sysProcAttr makes the kernel kill a member when the test binary that
// started it dies, so that a test killed mid-run leaks no etcd.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// dialer returns which of pids holds the other end of conn, an accepted
// loopback TCP connection, or 0 if none does: it finds the socket whose
// local address is conn's remote one (and whose remote address is conn's
// local one) in /proc/net/tcp and tcp6, then the process with a descriptor
// for that socket.
func dialer(conn net.Conn, pids map[int]string) int {
	local, ok1 := conn.RemoteAddr().(*net.TCPAddr)
	remote, ok2 := conn.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return 0
	}
	inode := socketInode(local, remote)
	if inode == "" {
		return 0
	}
	link := "socket:[" + inode + "]"
	for pid := range pids {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name())); err == nil && l == link {
				return pid
			}
		}
	}
	return 0
}

// socketInode returns the inode of the TCP socket from local to remote, or
// "" if there is none.
func socketInode(local, remote *net.TCPAddr) string {
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		l, r := procAddr(local, table), procAddr(remote, table)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
			fields := strings.Fields(sc.Text())
			if len(fields) >= 10 && fields[1] == l && fields[2] == r {
				f.Close()
				return fields[9]
			}
		}
		f.Close()
	}
	return ""
}

// procAddr formats a as the kernel does in table: the address in host
// byte order, 32 bits at a time, then the port, in upper-case hex.
func procAddr(a *net.TCPAddr, table string) string {
	ip := a.IP.To16()
	if !strings.HasSuffix(table, "6") {
		ip = a.IP.To4()
	}
	if ip == nil {
		return ""
	}
	var b strings.Builder
	for i := 0; i < len(ip); i += 4 {
		fmt.Fprintf(&b, "%08X", binary.NativeEndian.Uint32(ip[i:i+4]))
	}
	fmt.Fprintf(&b, ":%04X", a.Port)
	return b.String()
}
