package sched

// fiberQueue is a FIFO ring of fibers.
type fiberQueue struct {
	buf        []*Fiber
	head, size int
}

func (q *fiberQueue) push(f *Fiber) {
	if q.size == len(q.buf) {
		n := 2 * len(q.buf)
		if n == 0 {
			n = 16
		}
		buf := make([]*Fiber, n)
		for i := 0; i < q.size; i++ {
			buf[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = buf, 0
	}
	q.buf[(q.head+q.size)%len(q.buf)] = f
	q.size++
}

// take removes and returns the i-th fiber from the head (0 ≤ i < size); the
// head takes its place.
func (q *fiberQueue) take(i int) *Fiber {
	j := (q.head + i) % len(q.buf)
	q.buf[q.head], q.buf[j] = q.buf[j], q.buf[q.head]
	return q.pop()
}

func (q *fiberQueue) pop() *Fiber {
	if q.size == 0 {
		return nil
	}
	f := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.size--
	return f
}
