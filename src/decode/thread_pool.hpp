// A small persistent worker pool owned by one decoder: n_threads - 1 workers
// plus the calling thread. No global state; workers sleep on a condition
// variable between calls and are joined by the destructor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

namespace ikv {

class ThreadPool {
public:
    using TaskFn = void (*)(void *ctx, std::size_t index, unsigned worker);

    // n_threads >= 1 threads in all, the caller included. Throws
    // std::system_error if a thread cannot start (the caller maps it).
    explicit ThreadPool(unsigned n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    unsigned size() const { return unsigned(workers_.size()) + 1; }

    // Run fn(ctx, i, worker) for every i in [0, n); worker is in [0, size()),
    // 0 = the caller. Returns when all are done.
    void run(std::size_t n, TaskFn fn, void *ctx);

    template <class F>
    void parallel_for(std::size_t n, F &f) {
        run(n, [](void *c, std::size_t i, unsigned w) { (*static_cast<F *>(c))(i, w); }, &f);
    }

private:
    void worker_main(unsigned id);
    void drain(unsigned worker);
    void stop_and_join();

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable wake_, done_;
    unsigned long generation_ = 0;
    unsigned busy_ = 0;
    bool stop_ = false;
    // the current job
    TaskFn fn_ = nullptr;
    void *ctx_ = nullptr;
    std::size_t n_ = 0;
    std::atomic<std::size_t> next_{0};
};

}  // namespace ikv
