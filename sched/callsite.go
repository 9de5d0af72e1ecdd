package sched

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
)

// callerSite returns file:line of the first caller outside this module's
// library packages, as seen from a parked fiber.
func callerSite() string {
	var pcs [64]uintptr
	n := runtime.Callers(3, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	first := ""
	for {
		fr, more := frames.Next()
		loc := fmt.Sprintf("%s:%d", filepath.Base(fr.File), fr.Line)
		if first == "" {
			first = loc
		}
		if !isLibraryFrame(fr) {
			return loc
		}
		if !more {
			return first
		}
	}
}

// modulePath is this module's import path, read from this function's own
// symbol: a deadlock report looks past every frame of the module's library
// packages (any package of the module, outside its tests), so a new package
// needs no list to be kept up to date.
var modulePath = func() string {
	pc, _, _, _ := runtime.Caller(0)
	name := runtime.FuncForPC(pc).Name() // "<module>/sched.init.func1"
	return name[:strings.LastIndex(name, "/")]
}()

func isLibraryFrame(fr runtime.Frame) bool {
	if strings.HasPrefix(fr.Function, "runtime.") || strings.HasPrefix(fr.Function, "iter.") {
		return true
	}
	if strings.HasSuffix(fr.File, "_test.go") {
		return false
	}
	// A program's own functions are named main.*, never by module path.
	return strings.HasPrefix(fr.Function, modulePath+"/")
}
