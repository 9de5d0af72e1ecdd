package sched

import (
	"context"
	"reflect"
	"time"
	"unsafe"
)

// Linking a standard context to the loop.
//
// context.WithCancel (WithTimeout, WithDeadline, WithCancelCause, …) made
// directly from a loop context registers the child through the parent's
// AfterFunc method, because loopCtx has one, and keeps the stop function it
// returns: the child calls it when its own cancel function or its timer
// ends it, and the parent's cancel calls the registered function. Either
// way this package's code runs on the cancelling goroutine, so a wait on
// such a child can end right there, if the loop knows which registration
// the child holds. The standard library gives no way to ask a context for
// that, so linkedAfterFunc reads it from the child: the stop function kept
// in its parent field is a method value of one of our *afterFunc records.
//
// This reads unexported fields of package context. Why accept that: the
// alternative is checking every waited-on standard context before every
// scheduling decision, a cost that grows with the fibers parked. The reading
// is guarded: linkInit checks, on a context built for the purpose, that
// every step finds exactly what it must, and if anything differs (another
// Go release laid the types out otherwise) linking is off and every wait on
// a standard context is settled by checking, as it is for contexts that
// cannot be linked. Nothing is ever written through these pointers.
var link struct {
	ok bool
	// key is &context.cancelCtxKey: ctx.Value(key) returns ctx's nearest
	// *context.cancelCtx, as the standard library's own lookups do.
	key any
	// cancelCtx is the type *context.cancelCtx.
	cancelCtx reflect.Type
	// parentOff is the offset of cancelCtx's embedded Context field.
	parentOff uintptr
	// stopItab is the interface word of a Context holding a
	// context.stopCtx, the parent field of a child linked through an
	// AfterFunc method; stopOff is the offset of the stop func in it.
	stopItab unsafe.Pointer
	stopOff  uintptr
	// stopCode is the code pointer of the method value afterFunc.stop.
	stopCode unsafe.Pointer
}

// linkedAfterFunc returns the registration ctx's standard child holds on a
// loop context, when ctx is that child or a value wrapper of it; else nil.
func linkedAfterFunc(ctx context.Context) *afterFunc {
	if !link.ok {
		return nil
	}
	k := ctx.Value(link.key)
	if k == nil || reflect.TypeOf(k) != link.cancelCtx {
		return nil
	}
	// ctx must end exactly when k does: k is ctx's own cancelCtx, not one
	// further up (ctx may be a custom type that forwards Value).
	if kc, ok := k.(context.Context); !ok || kc.Done() != ctx.Done() {
		return nil
	}
	return afterFuncOf(k)
}

// eface is the layout of an interface value: its type (or itab) word and
// its data word.
type eface struct {
	typ  unsafe.Pointer
	data unsafe.Pointer
}

// afterFuncOf reads the registration from k, a *context.cancelCtx, when
// its parent field holds a stopCtx whose stop is an afterFunc.stop.
func afterFuncOf(k any) *afterFunc {
	kp := (*eface)(unsafe.Pointer(&k)).data // the *cancelCtx
	parent := (*eface)(unsafe.Add(kp, link.parentOff))
	if parent.typ != link.stopItab {
		return nil
	}
	fv := *(*unsafe.Pointer)(unsafe.Add(parent.data, link.stopOff)) // the stop func's closure
	if fv == nil || *(*unsafe.Pointer)(fv) != link.stopCode {
		return nil
	}
	// A method value's closure is its code pointer and then the receiver.
	return *(**afterFunc)(unsafe.Add(fv, unsafe.Sizeof(uintptr(0))))
}

// probeCtx is the parent linkInit builds a child on: it implements
// AfterFunc, hands out a known stop function, and records the key the
// standard library looks its nearest cancelCtx up with.
type probeCtx struct {
	done chan struct{}
	stop func() bool
	key  any
}

func (p *probeCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (p *probeCtx) Done() <-chan struct{}       { return p.done }
func (p *probeCtx) Err() error                  { return nil }
func (p *probeCtx) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}
func (p *probeCtx) AfterFunc(func()) func() bool { return p.stop }

func init() { link.ok = linkInit() }

// linkInit learns the layout linkedAfterFunc reads from a child built on a
// probe, and reports whether every step checked out.
func linkInit() (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	probe := &afterFunc{c: &loopCtx{}}
	p := &probeCtx{done: make(chan struct{}), stop: probe.stop}
	child, cancel := context.WithCancel(p)
	defer cancel()
	if p.key == nil {
		return false
	}
	k := child.Value(p.key)
	kt := reflect.TypeOf(k)
	if k == nil || k != any(child) || kt.Kind() != reflect.Pointer || kt.Elem().Kind() != reflect.Struct {
		return false
	}
	f, found := kt.Elem().FieldByName("Context")
	if !found || !f.Anonymous || f.Type != reflect.TypeFor[context.Context]() {
		return false
	}
	parent := (*eface)(unsafe.Add((*eface)(unsafe.Pointer(&k)).data, f.Offset))
	// The parent's dynamic type, and the offset of its stop field.
	pv := reflect.ValueOf(k).Elem().FieldByIndex(f.Index).Elem()
	if pv.Kind() != reflect.Struct || pv.NumField() != 2 {
		return false
	}
	sf, found := pv.Type().FieldByName("stop")
	if !found || sf.Type != reflect.TypeFor[func() bool]() {
		return false
	}
	if pv.Type().Field(0).Type != reflect.TypeFor[context.Context]() {
		return false
	}
	stop := probe.stop
	link.key, link.cancelCtx, link.parentOff = p.key, kt, f.Offset
	link.stopItab, link.stopOff = parent.typ, sf.Offset
	link.stopCode = **(**unsafe.Pointer)(unsafe.Pointer(&stop))
	// The whole read, end to end, must find the probe's record, and only
	// for a child of an AfterFunc parent.
	if afterFuncOf(k) != probe {
		return false
	}
	plain, cancelPlain := context.WithCancel(context.Background())
	defer cancelPlain()
	if kp := plain.Value(p.key); kp == nil || afterFuncOf(kp) != nil {
		return false
	}
	return true
}

// ending reports whether ctx has ended, or is ending: ctx is done, or an
// ancestor it inherits its end from is, and the standard library (or this
// package, on the goroutine that cancelled) is carrying that end down to
// ctx. Either way something will end ctx, and the waits on it, without the
// loop doing anything: an idle loop that finds a wait on such a context
// waits for that wake instead of moving time or reporting a deadlock.
//
// Why look at ancestors: a standard child of a parent the standard library
// cannot see through (a wrapper type that hides the parent's AfterFunc,
// struct{ context.Context }{ctx}, a caller's own type) learns of its
// parent's end on a goroutine the standard library starts for it, whenever
// the Go scheduler runs that goroutine; until then the child is not done,
// though nothing can stop it from ending.
//
// The walk goes up only through links whose end is certain to propagate:
// the parent a standard cancelCtx was made from (read as linkedAfterFunc
// reads it), the parent of a loop context, and through value wrappers of
// either (same Done channel). It stops at a context whose Done is nil
// (context.WithoutCancel: nothing above it reaches ctx) or one it cannot see
// through. It calls the contexts' own methods: never under a lock of ours.
func ending(ctx context.Context) bool {
	for ctx != nil {
		if ctx.Done() == nil {
			return false
		}
		if ctx.Err() != nil {
			return true
		}
		ctx = parentOf(ctx)
	}
	return false
}

// parentOf returns the context ctx inherits its end from, when ctx is (a
// value wrapper of) a loop context or a standard cancelCtx; else nil.
func parentOf(ctx context.Context) context.Context {
	done := ctx.Done()
	if c, _ := ctx.Value(ctxKey{}).(*loopCtx); c != nil && c.done == done {
		return c.parent
	}
	if !link.ok {
		return nil
	}
	k := ctx.Value(link.key)
	if k == nil || reflect.TypeOf(k) != link.cancelCtx {
		return nil
	}
	if kc, ok := k.(context.Context); !ok || kc.Done() != done {
		return nil
	}
	// The cancelCtx's embedded Context: its parent, set once as it was
	// made. A parent with an AfterFunc method (a loop context) is held
	// inside a stopCtx, which embeds it too: walking on from the stopCtx
	// reaches that context through its Value (same Done).
	kp := (*eface)(unsafe.Pointer(&k)).data
	return *(*context.Context)(unsafe.Add(kp, link.parentOff))
}
