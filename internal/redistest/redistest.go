// Package redistest starts a real redis-server for tests, on a free loopback
// port, with persistence off.
package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Server is a redis-server child process.
type Server struct {
	t    testing.TB
	Port int
	cmd  *exec.Cmd
}

// Binary is the redis-server executable looked up on PATH (and at
// /usr/bin/redis-server).
func Binary() string {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/redis-server"); err == nil {
		return "/usr/bin/redis-server"
	}
	return ""
}

// Start starts redis-server, or skips the test when the binary is missing and
// SLUICE_REQUIRE_REDIS is unset (fails it when set). The server is killed at
// test cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	if Binary() == "" {
		if os.Getenv("SLUICE_REQUIRE_REDIS") != "" {
			t.Fatal("redis-server not found and SLUICE_REQUIRE_REDIS is set")
		}
		t.Skip("redis-server not found (set SLUICE_REQUIRE_REDIS=1 to make this a failure)")
	}
	s := &Server{t: t}
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.Port = ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if err := s.start(); err == nil {
			break
		} else if attempt == 5 {
			t.Fatalf("starting redis-server: %v", err)
		}
	}
	t.Cleanup(s.Kill)
	return s
}

// Addr is "127.0.0.1:PORT".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is "redis://127.0.0.1:PORT/0".
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

func (s *Server) start() error {
	cmd := exec.Command(Binary(), "--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		return err
	}
	// Wait until it accepts connections (a real process: nothing to drive).
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
			s.cmd = cmd
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("redis-server on port %d did not come up: %v", s.Port, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Kill stops the server at once (SIGKILL). Safe to call twice.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts a fresh server on the same port after Kill.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("restarting redis-server: %v", err)
	}
}
