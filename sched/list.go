package sched

import "unsafe"

// A node is the pair of links an element keeps to sit in one list. It must
// be the element's first field: the list reads a *node back as the element
// (see elemOf), and the declarations below fail to compile otherwise.
type node struct{ prev, next *node }

var (
	_ [0]struct{} = [unsafe.Offsetof(Fiber{}.live)]struct{}{}
	_ [0]struct{} = [unsafe.Offsetof(waiter{}.ctxNode)]struct{}{}
	_ [0]struct{} = [unsafe.Offsetof(watch{}.ln)]struct{}{}
	_ [0]struct{} = [unsafe.Offsetof(afterFunc{}.ln)]struct{}{}
)

// list is an intrusive doubly linked list of *T, threaded through the node
// each T keeps as its first field: the loop's live fibers, a loop context's
// parked Waiters and AfterFunc registrations, and the watches on standard
// contexts. Why intrusive: adding allocates nothing, and an element leaves
// from the middle in O(1) (a cancelled wait, an ended fiber) without a
// search. Why a node at offset 0 rather than an accessor method on T (as in
// internal/waitq): a method call through a generic type parameter is an
// indirect call that is never inlined, costing several times these few
// pointer writes, on paths as hot as starting a fiber and parking on a
// context with a deadline. The conversions are the round trip
// of a pointer that was a *T: every *node in a list came from nodeOf.
//
// Iteration order is insertion order (reversed, with pushFront), which
// keeps the loop deterministic. The zero value is an empty list. A list is
// not safe for concurrent use: its owner guards it with the lock that
// guards the elements' nodes.
type list[T any] struct{ head, tail *node }

func nodeOf[T any](e *T) *node { return (*node)(unsafe.Pointer(e)) }
func elemOf[T any](n *node) *T { return (*T)(unsafe.Pointer(n)) }
func (q *list[T]) front() *T   { return elemOf[T](q.head) }
func next[T any](e *T) *T      { return elemOf[T](nodeOf(e).next) }
func unlink[T any](e *T)       { *nodeOf(e) = node{} }

// pushBack appends e, which must not be in a list.
func (q *list[T]) pushBack(e *T) {
	n := nodeOf(e)
	n.prev, n.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = n
	} else {
		q.head = n
	}
	q.tail = n
}

// pushFront prepends e, which must not be in a list.
func (q *list[T]) pushFront(e *T) {
	n := nodeOf(e)
	n.prev, n.next = nil, q.head
	if q.head != nil {
		q.head.prev = n
	} else {
		q.tail = n
	}
	q.head = n
}

// remove takes e, which must be in q, out of it.
func (q *list[T]) remove(e *T) {
	n := nodeOf(e)
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		q.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		q.tail = n.prev
	}
	n.prev, n.next = nil, nil
}

// takeAll empties q and returns its former head: the elements stay chained
// in order through their nodes, for the caller to walk with next (with or
// without q's lock: nobody else reaches them now) and to clear with unlink.
func (q *list[T]) takeAll() *T {
	head := q.front()
	*q = list[T]{}
	return head
}
