// Error reporting shared by every handle: a thread-local sentence for
// ikv_last_error() and the optional log sink. Internal code returns
// ikv_status and calls fail() to record why.
#pragma once

#include "intentkv.h"

namespace ikv {

// Record status and a printf-style sentence as the calling thread's last
// error, forward it to the log sink if one is installed, and return status so
// callers can write `return fail(IKV_E_RANGE, "...", ...);`.
ikv_status fail(ikv_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// Log a message through the installed sink (no-op without one).
void log(ikv_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// Clear the calling thread's last error.
void clear_error();

// The calling thread's last error sentence ("" if none yet).
const char *last_error();

// Install (or with fn == nullptr remove) the process-wide log sink.
void set_log_sink(ikv_log_fn fn, void *user, ikv_log_level min_level);

// The public call this thread is inside, for sentences written below the API
// layer by code that serves several calls (page stores, slab memory): the
// name a CallName set, or "intentkv" outside any.
const char *current_call();

// What the caller calls the argument struct the sentences below the API
// layer name fields of: "args" (ikv_append in ikv_pool_append), or the name a
// CallName gave it ("args->append" where ikv_decode appends).
const char *current_args();

// Names the public call, and the caller's name of its argument struct (null:
// "args"), for its extent (nests: the outer names come back).
class CallName {
public:
    explicit CallName(const char *fn, const char *args = nullptr);
    ~CallName();
    CallName(const CallName &) = delete;
    CallName &operator=(const CallName &) = delete;

private:
    const char *prev_, *prev_args_;
};

}  // namespace ikv

// Argument-check helpers for the API layer. `fn` is the public function name
// so every message starts with the call that failed.
#define IKV_CHECK_NULL(ptr, fn)                                                   \
    do {                                                                          \
        if ((ptr) == nullptr) return ::ikv::fail(IKV_E_NULL, "%s: %s is NULL", fn, #ptr); \
    } while (0)
// The same for a pointer the caller knows by another name (a field of the
// struct it passed: name "args->q" where the code holds a copy `a`).
#define IKV_CHECK_NULL_AS(ptr, name, fn)                                            \
    do {                                                                            \
        if ((ptr) == nullptr) return ::ikv::fail(IKV_E_NULL, "%s: %s is NULL", fn, name); \
    } while (0)

// Reject a config struct whose struct_size is smaller than the first
// published version of that struct (minsize). A larger struct_size, from a
// newer header, is accepted: fields this library does not know are ignored.
#define IKV_CHECK_STRUCT(ptr, minsize, fn)                                                  \
    do {                                                                                    \
        if ((ptr)->struct_size < (minsize))                                                 \
            return ::ikv::fail(IKV_E_INVALID, "%s: %s->struct_size is %u, expected at least %u", \
                               fn, #ptr, (unsigned)(ptr)->struct_size, (unsigned)(minsize)); \
    } while (0)
