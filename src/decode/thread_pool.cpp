#include "decode/thread_pool.hpp"

namespace ikv {

ThreadPool::ThreadPool(unsigned n_threads) {
    try {
        for (unsigned i = 1; i < n_threads; ++i) workers_.emplace_back(&ThreadPool::worker_main, this, i);
    } catch (...) {
        stop_and_join();  // join what started, then let the caller see the failure
        throw;
    }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    for (std::thread &t : workers_)
        if (t.joinable()) t.join();
    workers_.clear();
}

void ThreadPool::drain(unsigned worker) {
    for (;;) {
        const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
        if (i >= n_) return;
        fn_(ctx_, i, worker);
    }
}

void ThreadPool::worker_main(unsigned id) {
    unsigned long seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
        }
        drain(id);
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (--busy_ == 0) done_.notify_one();
        }
    }
}

void ThreadPool::run(std::size_t n, TaskFn fn, void *ctx) {
    if (n == 0) return;
    if (workers_.empty() || n == 1) {
        for (std::size_t i = 0; i < n; ++i) fn(ctx, i, 0);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        fn_ = fn;
        ctx_ = ctx;
        n_ = n;
        next_.store(0, std::memory_order_relaxed);
        busy_ = unsigned(workers_.size());
        ++generation_;
    }
    wake_.notify_all();
    drain(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return busy_ == 0; });
}

}  // namespace ikv
