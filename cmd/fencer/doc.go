// Command fencer is fencer's command-line tool: the service (serve), a
// lock wrapper that fences what it runs (acquire), guarded writes and
// reads for scripts, a load generator (bench) and a demo.
//
// Usage:
//
//	fencer <command> [flags] [args]
//
// Run "fencer --help" for the commands and exit codes; docs/cli.md is the
// reference.
//
// Layout: main.go builds the command tree (cobra) and runs it; exit.go is
// the one place errors become exit codes and messages; conn.go and
// output.go are the flags every client command shares; acquire.go,
// watchdog.go, terminal.go and pdeathsig_*.go keep a wrapped command inside
// its lease; remote.go, txn.go, watch.go and bench.go are the client
// commands; serve.go and demo.go run etcd and the service.
package main
