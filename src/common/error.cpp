#include "common/error.hpp"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace ikv {
namespace {

thread_local char t_last_error[512] = "";

struct LogSink {
    std::mutex mu;
    ikv_log_fn fn = nullptr;
    void *user = nullptr;
    ikv_log_level min_level = IKV_LOG_WARN;
};

LogSink &sink() {
    static LogSink s;
    return s;
}

void deliver(ikv_log_level level, const char *msg) {
    LogSink &s = sink();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.fn != nullptr && level >= s.min_level) s.fn(level, msg, s.user);
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
    std::lock_guard<std::mutex> lock(s.mu);
    s.fn = fn;
    s.user = user;
    s.min_level = min_level;
}

}  // namespace ikv

