package waitq_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/waitq"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type item struct {
	waitq.Links[item]
	id int
}

func ids(q *waitq.Queue[item, *item]) []int {
	var out []int
	// Drain a copy's worth by walking from the front and re-pushing.
	n := q.Len()
	for i := 0; i < n; i++ {
		e := q.Front()
		out = append(out, e.id)
		q.Remove(e)
		q.Push(e)
	}
	return out
}

func TestFIFOAndRemoveFromAnywhere(t *testing.T) {
	var q waitq.Queue[item, *item]
	require.Nil(t, q.Front())
	items := make([]*item, 5)
	for i := range items {
		items[i] = &item{id: i}
		q.Push(items[i])
	}
	assert.Equal(t, 5, q.Len())
	assert.Equal(t, []int{0, 1, 2, 3, 4}, ids(&q))

	q.Remove(items[2]) // middle
	assert.False(t, items[2].Queued())
	q.Remove(items[0]) // head
	q.Remove(items[4]) // tail
	assert.Equal(t, []int{1, 3}, ids(&q))
	assert.True(t, items[1].Queued())

	q.Push(items[2])
	assert.Equal(t, []int{1, 3, 2}, ids(&q))
	for q.Front() != nil {
		q.Remove(q.Front())
	}
	assert.Equal(t, 0, q.Len())
}
