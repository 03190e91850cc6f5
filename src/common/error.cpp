#include "common/error.hpp"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace ikv {
namespace {

thread_local char t_last_error[512] = "";

// The sink runs under mu, so that once ikv_set_log_callback returns no other
// thread is still inside the sink it replaced. Recursive, and a flag per
// thread: a sink that calls ikv_set_log_callback does not deadlock, and one
// that calls what the header forbids does not recurse at least (what such
// nested calls raise is not delivered, and is gone from ikv_last_error once
// the sink returns). Other calls may still deadlock on the locks the library
// holds while it logs: the header forbids them.
struct LogSink {
    std::recursive_mutex mu;
    ikv_log_fn fn = nullptr;
    void *user = nullptr;
    ikv_log_level min_level = IKV_LOG_WARN;
};

LogSink &sink() {
    static LogSink s;
    return s;
}

thread_local bool t_in_sink = false;
thread_local const char *t_call = nullptr;  // CallName's
thread_local const char *t_args = nullptr;  // CallName's name of the argument struct

void deliver(ikv_log_level level, const char *msg) {
    if (t_in_sink) return;
    LogSink &s = sink();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    if (s.fn == nullptr || level < s.min_level) return;
    // The sentence this thread's caller will read: what the sink's own calls
    // write there is undone when it returns (and the sink reads a copy).
    struct InSink {
        char saved[sizeof t_last_error];
        InSink() {
            std::memcpy(saved, t_last_error, sizeof saved);
            t_in_sink = true;
        }
        ~InSink() {
            t_in_sink = false;
            std::memcpy(t_last_error, saved, sizeof saved);
        }
    } in_sink;
    s.fn(level, msg == t_last_error ? in_sink.saved : msg, s.user);
}

}  // namespace

ikv_status fail(ikv_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
    va_end(ap);
    deliver(IKV_LOG_ERROR, t_last_error);
    return status;
}

void log(ikv_log_level level, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    deliver(level, buf);
}

void clear_error() { t_last_error[0] = '\0'; }

const char *last_error() { return t_last_error; }

void set_log_sink(ikv_log_fn fn, void *user, ikv_log_level min_level) {
    LogSink &s = sink();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    s.fn = fn;
    s.user = user;
    s.min_level = min_level;
}

const char *current_call() { return t_call ? t_call : "intentkv"; }

const char *current_args() { return t_args ? t_args : "args"; }

CallName::CallName(const char *fn, const char *args) : prev_(t_call), prev_args_(t_args) {
    t_call = fn;
    t_args = args;
}
CallName::~CallName() {
    t_call = prev_;
    t_args = prev_args_;
}

}  // namespace ikv
