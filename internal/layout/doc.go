// Package layout holds the tests of fencer's layout: which package may
// import what, and that a gRPC user's module graph stays light. It has no
// code of its own.
//
// fencer is these Go modules:
//
//   - github.com/fencer-dev/fencer/token: the token, its encodings, the
//     shared errors and the lease contract (token.Holder). Standard
//     library only.
//   - github.com/fencer-dev/fencer/proto: the fencer.v1 messages and gRPC
//     stubs. grpc and protobuf only.
//   - github.com/fencer-dev/fencer/client: the Go client of the service,
//     on token and proto. No etcd, no Kubernetes module.
//   - github.com/fencer-dev/fencer/internal/mutant, .../internal/freeport
//     and .../internal/rendezvous: small plumbing that the root and the
//     Kubernetes module share (standard library only).
//   - github.com/fencer-dev/fencer/kubeadapter: the Kubernetes library
//     (election, the watcher, fenced writes, sharding, its test kit), on
//     token and the three small modules; never the root module, so no
//     etcd server, porcupine or kustomize (TestKubeModuleGraph).
//   - github.com/fencer-dev/fencer/kubeadapter/shard/e2e: the Sharder's
//     end-to-end tests, a test-only module that may require the root.
//   - github.com/fencer-dev/fencer: everything else (the etcd store, the
//     server, the binary, the test kit), which requires the others through
//     replace directives to their directories.
//
// The import rules are one table, rules() in layout_test.go: for each
// package, what it owns and what it must not import, directly or not.
// Production packages never import a test harness: the public kit
// (fencertest) or the project's own harnesses (internal/testkit), and the
// harnesses the kit is built on never import it back. TestImportRules
// enforces the table, and TestRuleBites shows that each kind of rule
// refuses what it names; TestReadmeLayout checks the README's Layout
// tree against the checkout's directories and packages;
// TestLightModuleGraph builds a consumer of the client module alone and
// checks its module graph; TestModulesTidy checks that go mod tidy would
// change nothing in any module. TestCheckoutConsumer builds
// a consumer with the go.mod lines that the README gives for requiring
// the modules from a checkout; TestRelease cuts a release with make
// release in a clone and builds a consumer of its tags, with no replace
// directive, from a GOPROXY directory.
package layout
