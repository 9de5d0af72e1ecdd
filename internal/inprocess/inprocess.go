// Package inprocess marks the stores whose Allow never waits on I/O (the
// memory and shm stores), so that callers can skip a per-call timeout for
// them: a context.WithTimeout costs a timer per request for nothing.
//
// Why a marker embedded through an unexported alias and not an exported
// method: the mark is machinery of this module, not a promise to users. An
// interface whose one method is unexported here is met only by types that
// embed Marker, and embedding it through an unexported alias keeps the field
// out of the store's exported fields and documentation.
package inprocess

// Marker marks the struct that embeds it as an in-process store. Embed it
// through an unexported alias (type inProcess = inprocess.Marker), first in
// the struct, where a zero-size field takes no room.
type Marker struct{}

func (Marker) inProcess() {}

// Is reports whether s is marked (embeds a Marker).
func Is(s any) bool {
	_, ok := s.(interface{ inProcess() })
	return ok
}
