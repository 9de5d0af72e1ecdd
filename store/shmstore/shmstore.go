// Package shmstore is a store.Store over package sharedbucket: buckets live in
// memory-mapped files, so every `sluice serve` process on a host (and any
// other program using the same files) shares one limit per key, at the cost
// of a CAS and no syscall.
//
//	s, err := shmstore.Open(sharedbucket.DefaultDir()) // every process opening it shares the limits
//	if err != nil { ... }
//	defer s.Close()
//	r, err := s.Allow(ctx, clientIP, 1, store.Policy{Rate: 10, Burst: 20})
//
// Each distinct policy (rate, burst) gets its own table file in one directory,
// named after the policy ("p-100000000ns-b10.sbt"), so processes started with
// the same flags attach to the same tables and a process with other numbers
// can never count against somebody else's policy.
//
// Files do not pile up: a Store holds a shared flock on each table file it
// has open, and Open removes the table files that no Store holds and whose
// every bucket is full (they hold no information: a new file is the same
// table); Release (a reload dropping a rule's limit) closes a table and
// removes its file unless another process holds it. So the files in the
// directory are those of the policies that running processes use, plus
// those whose buckets still carry debt.
package shmstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/selfbound"
	"github.com/sluice-go/sluice/internal/tablecounts"
	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
)

// Store is a store.Store over a sharedbucket.Arena. Safe for concurrent use;
// the zero value is not usable (use Open). Allow never blocks.
type Store struct {
	//lint:ignore U1000 used through selfbound.Of's interface, which staticcheck cannot follow across packages
	inProcess // Allow never waits: callers skip per-call timeouts

	arena  *sharedbucket.Arena // the directory; tables are opened with openHeld
	opts   []sharedbucket.Option
	closed atomic.Bool

	mu     sync.RWMutex
	tables map[tableID]*sharedbucket.Table // guarded by mu
	held   map[tableID]io.Closer           // guarded by mu: the flocks on the tables' files
	refs   map[tableID]int                 // guarded by mu: Prepare calls not yet Released
	// dropped are the tables the last Release closed. A decision already
	// under way when they closed may open one again (see Allow); the next
	// Release closes those no Prepare took since.
	dropped []tableID // guarded by mu
}

// inProcess marks Store for internal/selfbound.Of.
//
//lint:ignore U1000 used through selfbound.Of's interface, which staticcheck cannot follow across packages
type inProcess = selfbound.InProcess

type tableID struct {
	interval time.Duration
	burst    int64
}

// Open returns a Store whose tables live in dir (created 0700 if missing;
// "" means sharedbucket.DefaultDir(), a tmpfs directory private to the user).
// opts (for example sharedbucket.WithSlots) apply to every table.
//
// Open first removes the table files (named as this package names them)
// that no Store in any process holds and whose every bucket is full: a
// table nobody uses and that holds no debt says nothing a new file would not.
// That holds for files of another slot count too, so a restart with more
// slots (sharedbucket.WithSlots; sluice serve's -shm-slots) starts on new
// tables; one another process holds or that still owes tokens stays, and
// using its policy fails with an error wrapping sharedbucket.ErrPolicyMismatch
// that says what to do. Files of another format are left alone.
func Open(dir string, opts ...sharedbucket.Option) (*Store, error) {
	a, err := sharedbucket.NewArena(dir)
	if err != nil {
		return nil, fmt.Errorf("shmstore: %w", err)
	}
	s := &Store{arena: a, opts: opts, tables: make(map[tableID]*sharedbucket.Table),
		held: make(map[tableID]io.Closer), refs: make(map[tableID]int)}
	sweep(a.Dir(), opts)
	return s, nil
}

// Dir is the directory holding the table files.
func (s *Store) Dir() string { return s.arena.Dir() }

func (s *Store) table(p store.Policy) (*sharedbucket.Table, error) {
	id := tableID{p.Interval(), p.Burst}
	s.mu.RLock()
	t := s.tables[id]
	s.mu.RUnlock()
	if t != nil {
		return t, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t = s.tables[id]; t != nil {
		return t, nil
	}
	if s.closed.Load() {
		return nil, store.ErrClosed
	}
	path := filepath.Join(s.arena.Dir(), id.fileName())
	t, hold, err := openHeld(path, id.policy(), s.opts)
	if errors.Is(err, sharedbucket.ErrPolicyMismatch) {
		// The name fixes the policy, so the slot count differs. Open has
		// already replaced such a table if nobody held it and it owed
		// nothing; say what is left to do.
		return nil, fmt.Errorf("shmstore: %w. "+
			"The table %s was made with another slot count, and another process holds it or it still owes tokens "+
			"(its buckets are full again at most %v after their last spend). "+
			"Stop every process using it (sluice serve: those with -store shm:%s) and start again once the debt has run out, "+
			"or use its slot count; removing the file while no process holds it ends the debt at once "+
			"(each key it held may then get up to one more burst)",
			err, path, p.Tolerance(), s.arena.Dir())
	}
	if err != nil {
		return nil, fmt.Errorf("shmstore: %w", err)
	}
	s.tables[id] = t
	s.held[id] = hold
	return t, nil
}

// fileName is the name of id's table file.
func (id tableID) fileName() string {
	return "p-" + strconv.FormatInt(int64(id.interval), 10) + "ns-b" + strconv.FormatInt(id.burst, 10) + sharedbucket.TableExt
}

// policy is id's sharedbucket policy. Why Limit 1 per Window T:
// sharedbucket's interval is ceil(Window/Limit), so this gives exactly the
// store.Policy interval every other store uses.
func (id tableID) policy() sharedbucket.Policy {
	return sharedbucket.Policy{Limit: 1, Window: id.interval, Burst: id.burst}
}

// parseFileName is the inverse of fileName; ok is false for any other name.
func parseFileName(name string) (id tableID, ok bool) {
	rest, ok := strings.CutPrefix(name, "p-")
	if !ok {
		return id, false
	}
	rest, ok = strings.CutSuffix(rest, sharedbucket.TableExt)
	if !ok {
		return id, false
	}
	iv, b, ok := strings.Cut(rest, "ns-b")
	if !ok {
		return id, false
	}
	interval, err1 := strconv.ParseInt(iv, 10, 64)
	burst, err2 := strconv.ParseInt(b, 10, 64)
	id = tableID{time.Duration(interval), burst}
	if err1 != nil || err2 != nil || interval < 1 || burst < 1 || id.fileName() != name {
		return tableID{}, false
	}
	return id, true
}

// opened returns p's table if it is open, else nil.
func (s *Store) opened(p store.Policy) *sharedbucket.Table {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tables[tableID{p.Interval(), p.Burst}]
}

// Allow implements store.Store. It never blocks and ignores ctx.
func (s *Store) Allow(_ context.Context, key string, cost int64, p store.Policy) (store.Result, error) {
	if s.closed.Load() {
		return store.Result{}, store.ErrClosed
	}
	if err := store.Check(cost, p); err != nil {
		return store.Result{}, err
	}
	if len(key) == 0 || len(key) > sharedbucket.MaxKeyLen {
		return store.Result{}, fmt.Errorf("shmstore: key of %d bytes: want 1 to %d", len(key), sharedbucket.MaxKeyLen)
	}
	var d sharedbucket.Decision
	for range 2 {
		t, err := s.table(p)
		if err != nil {
			return store.Result{}, err
		}
		// One call: the decision and its figures come from the same read
		// of the bucket (and, when allowed, the same CAS).
		if d = t.DecideN(key, cost); d.RetryAfter != sharedbucket.Never {
			break
		}
		// Only a closed table says never here: the store's, or a table
		// Release closed after this call found it. Why once more: a
		// decision under way through a reload that dropped its policy
		// still gets an answer, from the table opened again (which the
		// next Release closes, unless prepared meanwhile).
	}
	if d.RetryAfter == sharedbucket.Never {
		return store.Result{}, store.ErrClosed
	}
	return store.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}, nil
}

// Evictions reports, for p's table, the live buckets this store evicted to
// make room for new keys (each one let its key start over with a full
// bucket: the limit loosened) and the decisions given up under contention
// (answered per sharedbucket.WithFailMode), since the store was opened. Zeros
// if p's table is not open. Policies with the same rate and burst share one
// table, and so these counts. Counts are this process's: other processes
// sharing the tables count their own.
func (s *Store) Evictions(p store.Policy) (evicted, contended uint64) {
	t := s.opened(p)
	if t == nil {
		return 0, 0
	}
	c := tablecounts.Of(t) // not Stats: no walk of the table
	return c.Evicted, c.Contended
}

// SlotHealth reports, for p's table: the slots locked right now (a claim
// under way, or a process that died or stopped while it moved a slot to a
// new key less than sharedbucket.LockTimeout ago; all processes), the locks
// this store took over from such processes (each may let one key start
// over with a full bucket), and the impossible words it found in the table
// and reset (damage; see sharedbucket.Stats). Zeros if p's table is not
// open. It walks the table (sharedbucket.Table.Stats: a load or two per
// slot) and on the way takes over the locks LockTimeout old, so a scrape
// keeps dead locks from lingering. Policies with the same rate and burst
// share one table, and so these figures.
func (s *Store) SlotHealth(p store.Policy) (locked int, recovered, corrupt uint64) {
	t := s.opened(p)
	if t == nil {
		return 0, 0, 0
	}
	st := t.Stats()
	return st.Locked, st.Recovered, st.Corrupt
}

// Slots returns the slot count of the store's tables: what -shm-slots set.
func (s *Store) Slots() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, t := range s.tables {
		return t.Slots()
	}
	return 0
}

// Keys implements store.Store: keys whose bucket is not full, summed over
// this store's tables (all processes' keys, since the tables are shared).
func (s *Store) Keys(context.Context) (int64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var n int64
	for _, t := range s.tables {
		n += int64(t.Stats().Keys)
	}
	return n, nil
}

// Ping implements store.Store: it fails once the store is closed or its
// directory has gone.
func (s *Store) Ping(context.Context) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	if _, err := os.Stat(s.arena.Dir()); err != nil {
		return fmt.Errorf("shmstore: %w", err)
	}
	return nil
}

// Name implements store.Store.
func (s *Store) Name() string { return "shm" }

// Close unmaps every table and lets go of their files. The files stay for
// other processes (and for the next Open, which removes those nobody holds
// whose buckets are all full).
func (s *Store) Close() error {
	s.closed.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	var first error
	for id, t := range s.tables {
		if err := t.Close(); err != nil && first == nil {
			first = err
		}
		delete(s.tables, id)
	}
	for id, h := range s.held {
		_ = h.Close()
		delete(s.held, id)
	}
	if err := s.arena.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

// Prepare opens (creating if needed) the tables of the given policies now
// rather than at their first request, so a mismatch with tables other
// processes created (another slot count: sharedbucket.ErrPolicyMismatch)
// shows at start-up instead of as failing requests. Each policy prepared
// holds its table open until Release is called for it as many times (see
// Release). On error, the policies before the one that failed stay
// prepared: the error names the policy.
func (s *Store) Prepare(policies ...store.Policy) error {
	for _, p := range policies {
		// Why count before opening: a Release racing with this call then
		// sees the table wanted and leaves it open.
		id := tableID{p.Interval(), p.Burst}
		s.mu.Lock()
		s.refs[id]++
		s.mu.Unlock()
		if _, err := s.table(p); err != nil {
			s.mu.Lock()
			if s.refs[id]--; s.refs[id] <= 0 {
				delete(s.refs, id)
			}
			s.mu.Unlock()
			return fmt.Errorf("policy %q (rate %v/s, burst %d): %w", p.Name, p.Rate, p.Burst, err)
		}
	}
	return nil
}

// Release undoes one Prepare of each policy. A table no Prepare holds any
// more is closed and its file removed, unless another process (another
// Store, another `sluice serve`) holds it: then the file stays for it, with
// its buckets. Policies with the same rate and burst share one table, which
// closes only once none of them is prepared. Releasing a policy that was not
// prepared does nothing.
//
// Why remove the file: a reload that changes a rule's limit moves its keys
// to a new table, and the old one would otherwise stay for the life of the
// process, a file and a descriptor each, however many reloads come. A table
// removed loses its buckets' state; a limit the rules bring back starts
// with full buckets, as a changed limit does.
//
// A decision under way on a table as it closes is answered from the table
// opened again (Allow); so is a later decision on a released policy, as
// before any Prepare. A table so opened after a Release is closed by the
// next Release unless prepared meanwhile. A process that mixes Release
// with policies it never prepares should therefore Prepare them.
func (s *Store) Release(policies ...store.Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Tables a decision opened again since the last Release.
	for _, id := range s.dropped {
		if s.refs[id] == 0 {
			s.closeTable(id)
		}
	}
	s.dropped = s.dropped[:0]
	for _, p := range policies {
		id := tableID{p.Interval(), p.Burst}
		n, ok := s.refs[id]
		if !ok {
			continue
		}
		if n > 1 {
			s.refs[id] = n - 1
			continue
		}
		delete(s.refs, id)
		if s.closeTable(id) {
			s.dropped = append(s.dropped, id)
		}
	}
}

// closeTable closes id's table, if open, and removes its file unless
// another process holds it. The caller holds s.mu.
func (s *Store) closeTable(id tableID) bool {
	t := s.tables[id]
	if t == nil {
		return false
	}
	delete(s.tables, id)
	h := s.held[id]
	delete(s.held, id)
	_ = t.Close()
	release(h, t.Path())
	return true
}
