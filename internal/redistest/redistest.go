// Package redistest starts a real redis-server for tests, on a free loopback
// port, with persistence off.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is a redis-server child process.
type Server struct {
	t       testing.TB
	Port    int
	cmd     *exec.Cmd
	cluster bool
	extra   []string // more redis-server arguments
	dir     string   // its working directory (snapshots a replica saves go here)
	conf    string   // a sentinel's config file ("" for a server)
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
func Start(t testing.TB) *Server { return start(t, false) }

// StartWith is Start with more redis-server arguments, for example
// "--requirepass", "pw", or "--replicaof", "127.0.0.1", "6379".
func StartWith(t testing.TB, args ...string) *Server { return startServer(t, &Server{extra: args}) }

// StartSentinel starts a Redis Sentinel that monitors master under name with
// a quorum of 1, deems it down after 500 ms without an answer and gives a
// failover 2 s. password, if not empty, is the master's (and replicas')
// AUTH password.
func StartSentinel(t testing.TB, name string, master *Server, password string) *Server {
	t.Helper()
	dir := t.TempDir()
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %s 500\n"+
		"sentinel failover-timeout %s 2000\n", name, master.Port, name, name)
	if password != "" {
		conf += fmt.Sprintf("sentinel auth-pass %s %s\n", name, password)
	}
	path := dir + "/sentinel.conf"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return startServer(t, &Server{conf: path})
}

// StartCluster starts a one-node Redis Cluster that owns all 16384 slots:
// enough to exercise cluster routing, hash slots and the cluster client.
func StartCluster(t testing.TB) *Server { return start(t, true) }

func start(t testing.TB, cluster bool) *Server { return startServer(t, &Server{cluster: cluster}) }

func startServer(t testing.TB, s *Server) *Server {
	t.Helper()
	if Binary() == "" {
		if os.Getenv("SLUICE_REQUIRE_REDIS") != "" {
			t.Fatal("redis-server not found and SLUICE_REQUIRE_REDIS is set")
		}
		t.Skip("redis-server not found (set SLUICE_REQUIRE_REDIS=1 to make this a failure)")
	}
	s.t = t
	// Why a directory of its own: a replica saves the master's snapshot
	// (dump.rdb) in its working directory, which is otherwise the test's.
	s.dir = t.TempDir()
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

// Pid is the redis-server's process id (0 while it is killed), for tests
// that read its CPU time.
func (s *Server) Pid() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

func (s *Server) start() error {
	args := []string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning"}
	if s.conf != "" { // a sentinel: its config file first, and no persistence flags
		args = []string{s.conf, "--sentinel", "--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
			"--protected-mode", "no", "--loglevel", "warning"}
	}
	args = append(args, s.extra...)
	if !s.cluster {
		args = append(args, "--dir", s.dir)
	} else {
		dir, err := os.MkdirTemp("", "redistest-cluster-")
		if err != nil {
			return err
		}
		s.t.Cleanup(func() { _ = os.RemoveAll(dir) })
		args = append(args, "--cluster-enabled", "yes", "--dir", dir,
			"--cluster-config-file", "nodes-"+strconv.Itoa(s.Port)+".conf")
	}
	cmd := exec.Command(Binary(), args...)
	if err := cmd.Start(); err != nil {
		return err
	}
	// Wait until it accepts connections (a real process: nothing to drive).
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err == nil {
			s.cmd = cmd
			if s.cluster {
				err = assignAllSlots(c)
			}
			_ = c.Close()
			return err
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

// assignAllSlots gives the single node every hash slot and waits until the
// cluster reports ok.
func assignAllSlots(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	do := func(args ...string) (string, error) { return command(c, r, args...) }
	if _, err := do("CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil {
		return err
	}
	for {
		info, err := do("CLUSTER", "INFO")
		if err != nil {
			return err
		}
		if strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// command sends one command on c and reads its answer from r: a simple or
// integer reply as its text, a bulk string as its body, an error as an error.
func command(c net.Conn, r *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(line, "$") { // bulk string: read its body
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	if strings.HasPrefix(line, "-") {
		return "", fmt.Errorf("redis: %s", strings.TrimSpace(line[1:]))
	}
	return strings.TrimSpace(line), nil
}

// Do sends one command to the server on a new connection and returns its
// answer as text (a bulk string's body, a simple reply's text).
func (s *Server) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return command(c, bufio.NewReader(c), args...)
}
