package intentkv

// This file exports ikvGoLog, so its preamble may only declare (cgo copies it
// into two C files); the trampoline that calls it lives in intentkv.go.

/*
#include <stdint.h>
#include <stdlib.h>
#include <intentkv.h>
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// LogLevel is the level of a library log message (ikv_log_level).
type LogLevel int

const (
	LogDebug LogLevel = C.IKV_LOG_DEBUG
	LogInfo  LogLevel = C.IKV_LOG_INFO
	LogWarn  LogLevel = C.IKV_LOG_WARN
	LogError LogLevel = C.IKV_LOG_ERROR
)

func (l LogLevel) String() string {
	switch l {
	case LogDebug:
		return "DEBUG"
	case LogInfo:
		return "INFO"
	case LogWarn:
		return "WARN"
	case LogError:
		return "ERROR"
	}
	return fmt.Sprintf("LogLevel(%d)", int(l))
}

// The installed Go sink: a cgo.Handle of the func, held in C memory whose
// address is the library's user pointer (so no Go pointer reaches C).
var logState struct {
	sync.Mutex
	user unsafe.Pointer // *C.uintptr_t holding the handle, nil when none
}

// SetLogCallback installs fn as the process-wide log sink
// (ikv_set_log_callback) for messages at or above minLevel; nil removes it.
// Every failing call also sends its error sentence at LogError, on the
// calling goroutine's thread, before the call returns; other messages may
// come from the library's worker threads, so fn must be safe for concurrent
// use. The library holds a lock while fn runs: fn must return promptly,
// must not call into intentkv (that would deadlock on a failing call) and
// must not panic. When SetLogCallback returns, no call of the previous sink
// is still running.
func SetLogCallback(fn func(level LogLevel, message string), minLevel LogLevel) {
	logState.Lock()
	defer logState.Unlock()
	old := logState.user
	logState.user = nil
	if fn != nil {
		user := C.malloc(C.size_t(unsafe.Sizeof(C.uintptr_t(0))))
		*(*C.uintptr_t)(user) = C.uintptr_t(cgo.NewHandle(fn))
		logState.user = user
		setLogSink(true, user, minLevel)
	} else {
		setLogSink(false, nil, minLevel)
	}
	// The library swaps sinks under the lock its deliveries hold: the old
	// handle can no longer be in use.
	if old != nil {
		cgo.Handle(*(*C.uintptr_t)(old)).Delete()
		C.free(old)
	}
}

//export ikvGoLog
func ikvGoLog(level C.ikv_log_level, message *C.char, user unsafe.Pointer) {
	if user == nil {
		return
	}
	fn, ok := cgo.Handle(*(*C.uintptr_t)(user)).Value().(func(LogLevel, string))
	if ok {
		fn(LogLevel(level), C.GoString(message))
	}
}
