package kubefencertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/fencer-dev/fencer/internal/freeport"
)

// etcdProc is the one-member etcd cluster behind an APIServer, a child
// process, so that this module needs no etcd server code of its own.
type etcdProc struct {
	cmd      *exec.Cmd
	endpoint string
	logPath  string
	exited   chan struct{}
	waitErr  error
}

// startEtcd runs bin as a one-member cluster with its data under dir, on
// two free loopback ports, and returns once it reports itself healthy. If
// ctx ends first or etcd exits, the process is stopped and the error has
// the end of its log.
func startEtcd(ctx context.Context, bin, dir string) (*etcdProc, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("kubefencertest: etcd: %w", err)
	}
	ports, release, err := freeport.Take(2)
	if err != nil {
		return nil, fmt.Errorf("kubefencertest: etcd: %w", err)
	}
	release()
	client := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	peer := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	p := &etcdProc{endpoint: client, logPath: dir + ".log", exited: make(chan struct{})}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		return nil, fmt.Errorf("kubefencertest: etcd: %w", err)
	}
	defer logFile.Close()
	p.cmd = exec.Command(bin,
		"--name=kube",
		"--data-dir="+dir,
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=kube="+peer,
		"--log-level=warn",
	)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("kubefencertest: start %s: %w", bin, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	if err := p.waitHealthy(ctx); err != nil {
		p.stop()
		return nil, fmt.Errorf("kubefencertest: etcd did not become healthy: %w\n%s", err, logTail("etcd", p.logPath))
	}
	return p, nil
}

// healthClient asks etcd for its health on a new connection each time, so
// that no idle connection outlives the wait (the tests check for leaked
// goroutines).
var healthClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// waitHealthy polls etcd's /health until it says true.
func (p *etcdProc) waitHealthy(ctx context.Context) error {
	last := fmt.Errorf("no answer yet")
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.endpoint+"/health", nil)
		if err != nil {
			return err
		}
		if resp, err := healthClient.Do(req); err != nil {
			last = err
		} else {
			var health struct{ Health string }
			err := json.NewDecoder(resp.Body).Decode(&health)
			resp.Body.Close()
			if err == nil && health.Health == "true" {
				return nil
			}
			last = fmt.Errorf("/health: %s %q (%v)", resp.Status, health.Health, err)
		}
		t := time.NewTimer(pollInterval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
		case <-p.exited:
			t.Stop()
			return fmt.Errorf("etcd exited: %w", p.waitErr)
		}
	}
}

// stop kills etcd and waits for it to exit.
func (p *etcdProc) stop() {
	// Kill fails only if the process has already exited.
	_ = p.cmd.Process.Kill()
	<-p.exited
}
