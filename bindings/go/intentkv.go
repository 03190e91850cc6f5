// Package intentkv is the Go binding of intentkv (include/intentkv.h): page
// selection and decode over a paged KV cache, linked through pkg-config.
//
// Handles (Layout, Router, Plan, Pool, Decoder, QueryMemory, PageFeedback)
// are closed with Close; a finalizer closes a forgotten one, as a leak guard
// only. A closed handle is passed to the library as NULL, so its calls fail
// with ErrNull (or, where the binding would otherwise read a closed handle
// as "none", ErrState). Errors are values of type *Error carrying the
// status, its name and the library's sentence, read on the OS thread of the
// failing call; errors.Is(err, ErrRange) and friends test the status.
// Slices passed to the library are copied into C memory for the call (cgo
// forbids C memory that holds Go pointers), so large appends cost one copy
// of their K/V.
//
// The wrappers pass host memory. CPU pools are served completely; a CUDA
// pool can be created, appended to from host memory, read and edited, but
// Decoder.Step refuses it (its queries and outputs would have to be device
// pointers) and the CUDA stream fields of the header are not exposed.
package intentkv

/*
#cgo pkg-config: intentkv
#include <stdlib.h>
#include <intentkv.h>

// The log trampoline: the library calls it with a const message; the Go
// function exported in log.go takes a plain char pointer.
extern void ikvGoLog(ikv_log_level level, char *message, void *user);
static void ikv_go_log(ikv_log_level level, const char *message, void *user) {
	ikvGoLog(level, (char *)message, user);
}
static void ikv_go_set_log(int on, void *user, ikv_log_level min_level) {
	ikv_set_log_callback(on ? ikv_go_log : NULL, user, min_level);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// ---------------------------------------------------------------- status and errors

// Status is an ikv_status. It implements error so that errors.Is(err,
// ErrRange) tests the status of an *Error.
type Status int

const (
	StatusOK       Status = C.IKV_OK
	ErrInvalid     Status = C.IKV_E_INVALID     // an argument is outside its documented domain
	ErrNull        Status = C.IKV_E_NULL        // a required pointer or handle is NULL (e.g. a closed handle)
	ErrRange       Status = C.IKV_E_RANGE       // a token, page, layer, head or index is out of range
	ErrNoMem       Status = C.IKV_E_NOMEM       // pool capacity exhausted or allocation failed
	ErrBudget      Status = C.IKV_E_BUDGET      // mandatory blocks alone exceed the router's token budget
	ErrOverlap     Status = C.IKV_E_OVERLAP     // a layout block overlaps another block
	ErrUnsupported Status = C.IKV_E_UNSUPPORTED // valid request this build or machine cannot serve
	ErrNoDevice    Status = C.IKV_E_NO_DEVICE   // CUDA requested but not built in, or no GPU present
	ErrDevice      Status = C.IKV_E_DEVICE      // a CUDA call failed
	ErrShared      Status = C.IKV_E_SHARED      // the page is shared by several sequences (fork)
	ErrEvicted     Status = C.IKV_E_EVICTED     // the tokens asked for were evicted
	ErrNotFound    Status = C.IKV_E_NOT_FOUND   // no such block id or sequence id
	ErrState       Status = C.IKV_E_STATE       // the object is not in a state that allows the call
	ErrInternal    Status = C.IKV_E_INTERNAL    // a bug in intentkv
)

// String is ikv_status_name, e.g. "IKV_E_RANGE" ("IKV_UNKNOWN_STATUS" for others).
func (s Status) String() string { return C.GoString(C.ikv_status_name(C.ikv_status(s))) }

// Error makes a Status usable as an errors.Is target.
func (s Status) Error() string { return s.String() }

// Error is a failed call: the ikv_status, its name and ikv_last_error() (or,
// for checks the binding makes before calling, a sentence naming the Go
// method and the argument).
type Error struct {
	Status  Status
	Name    string
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Name, e.Message) }

// Is reports whether target is this error's Status (errors.Is(err, ErrNotFound)).
func (e *Error) Is(target error) bool {
	s, ok := target.(Status)
	return ok && s == e.Status
}

// call runs f with its goroutine locked to its OS thread, so that the error
// sentence (thread-local in the library) is the one of this call.
func call(f func() C.ikv_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st == C.IKV_OK {
		return nil
	}
	return &Error{Status: Status(st), Name: C.GoString(C.ikv_status_name(st)), Message: C.GoString(C.ikv_last_error())}
}

// bindErr is an error found by the binding before it calls the library.
func bindErr(s Status, format string, args ...interface{}) error {
	return &Error{Status: s, Name: s.String(), Message: fmt.Sprintf(format, args...)}
}

// ---------------------------------------------------------------- C memory helpers

// cAlloc is C memory for n elements of size bytes (at least one element, so
// that an empty buffer is still a valid pointer); freed by the caller.
func cAlloc(n int, size uintptr) unsafe.Pointer {
	if n < 1 {
		n = 1
	}
	return C.malloc(C.size_t(uintptr(n) * size))
}

// cFloats copies xs into C memory (freed by the caller with C.free; never NULL).
func cFloats(xs []float32) *C.float {
	p := (*C.float)(cAlloc(len(xs), 4))
	copy(unsafe.Slice((*float32)(unsafe.Pointer(p)), len(xs)), xs)
	return p
}

// cHalves copies 16-bit elements (F16/BF16 bits) into C memory (never NULL).
func cHalves(xs []uint16) unsafe.Pointer {
	p := cAlloc(len(xs), 2)
	copy(unsafe.Slice((*uint16)(p), len(xs)), xs)
	return p
}

func goFloats(p *C.float, n int) []float32 {
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p)), n)...)
}

func goUint32s(p *C.uint32_t, n int) []uint32 {
	if n == 0 {
		return []uint32{}
	}
	return append([]uint32(nil), unsafe.Slice((*uint32)(unsafe.Pointer(p)), n)...)
}

func goChars(p *C.char) string { return C.GoString(p) }

// ---------------------------------------------------------------- version and runtime

// HeaderVersion is IKV_VERSION_NUMBER of the header this binding compiled
// against (MAJOR*10000 + MINOR*100 + PATCH); compare with VersionNumber.
const HeaderVersion = C.IKV_VERSION_NUMBER

// Version is the linked library's "MAJOR.MINOR.PATCH" (ikv_version_string).
func Version() string { return C.GoString(C.ikv_version_string()) }

// VersionNumber is the linked library's MAJOR*10000 + MINOR*100 + PATCH (ikv_version).
func VersionNumber() uint { return uint(C.ikv_version()) }

// RuntimeInfo is ikv_runtime_info: what the linked library runs on.
type RuntimeInfo struct {
	Version         uint     // ikv_version()
	CUDABuilt       bool     // compiled with the CUDA backend
	CUDADeviceCount int      // GPUs visible now
	CUDADeviceName  string   // name of device 0, "" if none
	CPUISA          string   // SIMD path in use: "avx512", "avx2", "neon" or "scalar"
	CPUISAAvailable []string // paths this CPU supports
	CUDAArchs       string   // SM architectures compiled in, e.g. "80,90"; "" without CUDA
}

// GetRuntimeInfo is ikv_runtime_info_get.
func GetRuntimeInfo() (RuntimeInfo, error) {
	var info C.ikv_runtime_info
	info.struct_size = C.uint32_t(C.sizeof_ikv_runtime_info)
	if err := call(func() C.ikv_status { return C.ikv_runtime_info_get(&info) }); err != nil {
		return RuntimeInfo{}, err
	}
	avail := goChars(&info.cpu_isa_available[0])
	var list []string
	if avail != "" {
		list = strings.Split(avail, ",")
	}
	return RuntimeInfo{
		Version:         uint(info.version),
		CUDABuilt:       info.cuda_built != 0,
		CUDADeviceCount: int(info.cuda_device_count),
		CUDADeviceName:  goChars(&info.cuda_device_name[0]),
		CPUISA:          goChars(&info.cpu_isa[0]),
		CPUISAAvailable: list,
		CUDAArchs:       goChars(&info.cuda_archs[0]),
	}, nil
}

// ---------------------------------------------------------------- shared vocabulary

// Format is the storage format of a KV page (ikv_format).
type Format uint8

const (
	FormatF16     Format = C.IKV_FMT_F16
	FormatBF16    Format = C.IKV_FMT_BF16
	FormatFP8E4M3 Format = C.IKV_FMT_FP8_E4M3
	FormatINT8    Format = C.IKV_FMT_INT8
	FormatINT4    Format = C.IKV_FMT_INT4
	// FormatAuto is "no preference" (a block's precision hint).
	FormatAuto Format = C.IKV_FMT_AUTO
)

// FormatCount is the number of storage formats (the length of the *ByFormat arrays).
const FormatCount = C.IKV_FMT_COUNT

// String is ikv_format_name, e.g. "int8".
func (f Format) String() string { return C.GoString(C.ikv_format_name(C.ikv_format(f))) }

// Hint returns a pointer to f, for Block.PrecisionHint.
func Hint(f Format) *Format { return &f }

// DType is the element type of engine-side arrays (ikv_dtype): K/V input,
// queries, outputs. F16 and BF16 arrays are passed as []uint16 raw bits.
type DType int

const (
	DTypeF32  DType = C.IKV_DTYPE_F32
	DTypeF16  DType = C.IKV_DTYPE_F16
	DTypeBF16 DType = C.IKV_DTYPE_BF16
)

func (d DType) String() string {
	switch d {
	case DTypeF32:
		return "F32"
	case DTypeF16:
		return "F16"
	case DTypeBF16:
		return "BF16"
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// Backend is where a pool stores its pages (ikv_backend).
type Backend int

const (
	BackendCPU  Backend = C.IKV_BACKEND_CPU
	BackendCUDA Backend = C.IKV_BACKEND_CUDA
)

// TokenRange is a half-open token range [Begin, End).
type TokenRange struct{ Begin, End uint32 }

// ---------------------------------------------------------------- struct sizes

// structSizes reports, per config struct, the struct_size its default sets
// and the size of the struct this binding compiled against (the tests
// compare them: a binding built with another header would differ).
func structSizes() map[string][2]uintptr {
	return map[string][2]uintptr{
		"ikv_decode_args":          {uintptr(C.ikv_decode_args_default_v3().struct_size), C.sizeof_ikv_decode_args},
		"ikv_pool_config":          {uintptr(C.ikv_pool_default_config_v2().struct_size), C.sizeof_ikv_pool_config},
		"ikv_router_config":        {uintptr(C.ikv_router_default_config().struct_size), C.sizeof_ikv_router_config},
		"ikv_block_desc":           {uintptr(C.ikv_block_desc_default().struct_size), C.sizeof_ikv_block_desc},
		"ikv_synth_config":         {uintptr(C.ikv_synth_default_config().struct_size), C.sizeof_ikv_synth_config},
		"ikv_model_shape":          {uintptr(C.ikv_model_shape_default().struct_size), C.sizeof_ikv_model_shape},
		"ikv_decoder_config":       {uintptr(C.ikv_decoder_default_config().struct_size), C.sizeof_ikv_decoder_config},
		"ikv_query_memory_config":  {uintptr(C.ikv_query_memory_default_config_v2().struct_size), C.sizeof_ikv_query_memory_config},
		"ikv_page_feedback_config": {uintptr(C.ikv_page_feedback_default_config().struct_size), C.sizeof_ikv_page_feedback_config},
	}
}

// appendStructSize is ikv_append_default's struct_size for p and sizeof(ikv_append)
// (the header's ikv_append_default() is a macro naming ikv_append_default_v2).
func appendStructSize(p *Pool) [2]uintptr {
	defer runtime.KeepAlive(p)
	return [2]uintptr{uintptr(C.ikv_append_default_v2(p.raw, 1).struct_size), C.sizeof_ikv_append}
}

// plainStructSizes are the sizes of the structs without a *_default
// function this binding compiled against (the tests compare them with the
// header's field lists).
func plainStructSizes() map[string]uintptr {
	return map[string]uintptr{
		"ikv_token_range":      C.sizeof_ikv_token_range,
		"ikv_block_info":       C.sizeof_ikv_block_info,
		"ikv_plan_page":        C.sizeof_ikv_plan_page,
		"ikv_block_decision":   C.sizeof_ikv_block_decision,
		"ikv_plan_summary":     C.sizeof_ikv_plan_summary,
		"ikv_plan_cost":        C.sizeof_ikv_plan_cost,
		"ikv_precision_policy": C.sizeof_ikv_precision_policy,
		"ikv_pool_stats":       C.sizeof_ikv_pool_stats,
		"ikv_decoder_stats":    C.sizeof_ikv_decoder_stats,
		"ikv_runtime_info":     C.sizeof_ikv_runtime_info,
		"ikv_tier_policy":      C.sizeof_ikv_tier_policy,
		"ikv_tier_step_report": C.sizeof_ikv_tier_step_report,
	}
}

// runtimeInfoWithSize calls ikv_runtime_info_get with an explicit
// struct_size (the tests check that a too small one is refused).
func runtimeInfoWithSize(size uint32) error {
	var info C.ikv_runtime_info
	info.struct_size = C.uint32_t(size)
	return call(func() C.ikv_status { return C.ikv_runtime_info_get(&info) })
}

// setLogSink installs or removes the C trampoline (log.go holds the Go side).
func setLogSink(on bool, user unsafe.Pointer, min LogLevel) {
	flag := C.int(0)
	if on {
		flag = 1
	}
	C.ikv_go_set_log(flag, user, C.ikv_log_level(min))
}
