package sched

import "context"

// A watch is a wait on a standard context (context.WithCancel and the like
// over a loop context): a waiter parked on one, a loop context whose parent
// is one, or a sched.AfterFunc on one. The standard library reports such a
// context's end only on a goroutine of its own (context.AfterFunc), which
// reaches the loop whenever the Go scheduler runs it; so the loop does not
// wait for that report, and a cancel lands at a fixed point of the
// schedule: once cancel has returned on the loop's goroutine, the wait has
// ended before any other fiber runs; a cancel from another goroutine lands
// no later than the first scheduling decision after it returned.
//
// Two kinds of watch keep that promise:
//
//   - linked: the context is a standard child made directly from a loop
//     context (through value wrappers only), the usual
//     context.WithTimeout(ctx, d) in a fiber. Its every end runs this
//     package's code on the cancelling goroutine (see afterFunc), which
//     fires the watch there and then. The watch sits on its registration,
//     and costs nothing per scheduling decision.
//   - settled: any other standard context (one further down a chain of
//     standard contexts, one under context.WithoutCancel, a type of the
//     caller's). Nothing of ours runs when it ends, so before every
//     scheduling decision the loop checks each such watch (see settle):
//     O(settled watches) per decision. The standard library's goroutine
//     only wakes a sleeping loop.
type watch struct {
	ln   node // in a watchList, guarded as fired is; first, see list
	ctx  context.Context
	fire func()      // ends the wait; runs once
	stop func() bool // the context.AfterFunc that wakes the loop; settled watches only
	af   *afterFunc  // the registration a linked watch sits on; nil: settled
	// Guarded by loop.mu (settled) or af.c.mu (linked).
	fired  bool
	listed bool
}

// watchList is a doubly linked list of watches in registration order, the
// order in which they fire: deterministic, unlike a map's.
type watchList struct {
	list[watch]
	len int
}

func (q *watchList) push(n *watch) {
	q.pushBack(n)
	n.listed = true
	q.len++
}

func (q *watchList) remove(n *watch) {
	q.list.remove(n)
	n.listed = false
	q.len--
}

// takeAll empties q, marking every watch fired, and returns them, still
// chained in order, for fireAll (run without the list's lock).
func (q *watchList) takeAll() *watch {
	head := q.list.takeAll()
	for n := head; n != nil; n = next(n) {
		n.fired, n.listed = true, false
	}
	q.len = 0
	return head
}

// fireAll fires a chain returned by takeAll. Nobody else touches an
// unlisted watch's links, so the chain needs no lock.
func fireAll(head *watch) {
	for n := head; n != nil; {
		nx := next(n)
		unlink(n)
		n.fire()
		n = nx
	}
}

// watch registers a wait on ctx, ended by fire once ctx is done. The owner
// calls unwatch when the wait is over, whether fire ran or not.
func (l *loop) watch(ctx context.Context, fire func()) *watch {
	n := &watch{ctx: ctx, fire: fire}
	l.addWatch(n)
	return n
}

// addWatch links n to the registration of its context if it has one on
// this loop, and else lists it for settle.
func (l *loop) addWatch(n *watch) {
	if a := linkedAfterFunc(n.ctx); a != nil && a.c.l == l && a.link(n) {
		return
	}
	// Registered before n is published: a settle on another goroutine may
	// fire n, and its owner unwatch it (reading n.stop), at once.
	n.stop = context.AfterFunc(n.ctx, l.poke)
	l.mu.Lock()
	l.watched.push(n)
	l.nwatched.Store(int32(l.watched.len))
	l.mu.Unlock()
}

// link puts n on a's list, unless a has run or stopped (its child is done
// or ending: n is settled instead).
func (a *afterFunc) link(n *watch) bool {
	c := a.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !a.listed || c.Err() != nil {
		return false
	}
	n.af = a
	a.watches.push(n)
	return true
}

// unwatch ends the watch n; it may be called more than once.
func (l *loop) unwatch(n *watch) { l.removeWatch(n, false) }

// removeWatch unlinks n. With prevent, it also stops n from firing later,
// and reports whether it did (false: fire has started or n was removed).
func (l *loop) removeWatch(n *watch, prevent bool) bool {
	if a := n.af; a != nil {
		a.c.mu.Lock()
		defer a.c.mu.Unlock()
		if !n.listed || (prevent && n.fired) {
			return false
		}
		n.fired = n.fired || prevent
		a.watches.remove(n)
		return true
	}
	l.mu.Lock()
	if !n.listed || (prevent && n.fired) {
		l.mu.Unlock()
		return false
	}
	n.fired = n.fired || prevent
	l.watched.remove(n)
	l.nwatched.Store(int32(l.watched.len))
	l.mu.Unlock()
	n.stop()
	return true
}

// settle fires every settled watch (see watch) whose context is done, in
// registration order,
// and repeats while firing ends more contexts (a loop context whose watched
// parent ended cancels its own children). It runs before every scheduling
// decision, and also right where a cancel of a loop context (or of a
// standard context directly under one) returns, so most cancels land even
// before cancel returns. Safe on any goroutine; fire functions are.
func (l *loop) settle() {
	for l.nwatched.Load() > 0 {
		var buf [8]func()
		fire := buf[:0]
		l.mu.Lock()
		for n := l.watched.front(); n != nil; n = next(n) {
			if !n.fired && n.ctx.Err() != nil {
				n.fired = true
				fire = append(fire, n.fire)
			}
		}
		l.mu.Unlock()
		if len(fire) == 0 {
			return
		}
		for _, f := range fire {
			f()
		}
	}
}
