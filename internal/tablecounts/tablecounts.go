// Package tablecounts lets the shm store (store/shmstore) read a
// sharedbucket table handle's event counts without walking the table and
// without the read being part of sharedbucket's API: package sharedbucket
// sets Of when it is initialised.
//
// Why not an exported method: the shm store needs a cheap read for its
// metrics (Table.Stats walks every slot), but users have Stats, and one
// call that reports a table is enough for them.
package tablecounts

// Counts are one table handle's event counts since it was opened (see
// sharedbucket.Stats for their meaning).
type Counts struct {
	Allowed, Denied, Evicted, Contended, Duplicates, Recovered, Corrupt uint64
}

// Of returns the counts of t, a *sharedbucket.Table. It is set by package
// sharedbucket's init, so it is non-nil in any program that holds a table.
var Of func(t any) Counts
