// Package waitq is the intrusive FIFO list of parked callers under
// queue.Queue, the one parking core that semaphore, ticker and
// ratelimiter share: a doubly linked list threaded through the waiters
// themselves, so queueing allocates nothing and a cancelled waiter leaves
// from the middle in O(1).
//
// A Queue is not safe for concurrent use: its owner guards it with the same
// lock as the state it hands out.
package waitq

// Links are the fields an element embeds to be queued.
type Links[T any] struct {
	prev, next *T
	queued     bool
}

// QueueLinks returns the element's links; embedding Links provides it.
func (l *Links[T]) QueueLinks() *Links[T] { return l }

// Queued reports whether the element is in a queue.
func (l *Links[T]) Queued() bool { return l.queued }

// Element is a pointer to a type that embeds Links.
type Element[T any] interface {
	*T
	QueueLinks() *Links[T]
}

// A Queue is a FIFO of elements. The zero value is an empty queue.
type Queue[T any, P Element[T]] struct {
	head, tail *T
	n          int
}

// Push appends e, which must not be queued.
func (q *Queue[T, P]) Push(e P) {
	l := e.QueueLinks()
	l.prev, l.next, l.queued = q.tail, nil, true
	if q.tail != nil {
		P(q.tail).QueueLinks().next = e
	} else {
		q.head = e
	}
	q.tail = e
	q.n++
}

// Remove takes e, which must be in q, out of it.
func (q *Queue[T, P]) Remove(e P) {
	l := e.QueueLinks()
	if l.prev != nil {
		P(l.prev).QueueLinks().next = l.next
	} else {
		q.head = l.next
	}
	if l.next != nil {
		P(l.next).QueueLinks().prev = l.prev
	} else {
		q.tail = l.prev
	}
	l.prev, l.next, l.queued = nil, nil, false
	q.n--
}

// Front returns the element at the head, or nil.
func (q *Queue[T, P]) Front() P { return q.head }

// Len returns the number of queued elements.
func (q *Queue[T, P]) Len() int { return q.n }
