// The automatic tier policy of CUDA pools with a host tier
// (ikv_pool_set_tier_policy, ikv_pool_tier_step).
//
// The pool counts steps (tier_clock) and each page remembers the last step
// that named it (PageRec::last_used; a new page starts at the current step).
// A step marks what its plans read, then relieves pressure by offloading the
// least recently used idle pages of any sequence (and, when the step's own
// pages lack room, pages it does not read though used recently), then
// fetches the marked pages that are on the host. The moves themselves are pool_tier.cpp's, with
// the same rules as ikv_seq_offload / ikv_seq_fetch.
//
// Why the plan is the unit of "use": the host knows a plan's pages before the
// decode (so they can be fetched ahead of it); query-aware top-k chooses
// among them on the device, and a step does not wait to learn its choice.
#include <algorithm>
#include <memory>
#include <vector>

#include "common/config.hpp"
#include "pool/pool_internal.hpp"

namespace ikv {

namespace {

constexpr const char *kStepFn = "ikv_pool_tier_step";

// A page a step wants in device memory: its sequence, its record, whether
// it may move, and whether it is only a prefetch hint (not read now).
struct Wanted {
    Seq *seq;
    PageRec *rec;
    bool movable;  // alone in its sequence and complete (the move rules)
    bool hint;
};

// Mark pages of one sequence as used now and list those on the host:
// hints == false: the pages the step reads (plan == nullptr: every page);
// hints == true: the plan's prefetch hints. A page marked already this step
// is not listed again.
void mark_seq_locked(ikv_pool *pool, Seq &seq, const ikv_plan *plan, bool hints, std::vector<Wanted> &on_host) {
    const uint64_t now = pool->tier_clock;
    const uint32_t complete = complete_pages(pool, seq);
    const uint32_t n_pages = uint32_t(seq.pages.size());
    auto mark = [&](uint32_t p) {
        if (p >= n_pages) return;  // a plan of a longer sequence: decode clips it the same way
        PageRec *rec = seq.pages[p];
        if (rec == nullptr || rec->last_used == now) return;  // evicted, or already marked this step
        rec->last_used = now;
        if (rec->on_host) on_host.push_back(Wanted{&seq, rec, rec->refs == 1 && p < complete, hints});
    };
    size_t n = 0;
    if (hints) {
        const uint32_t *pages = nullptr;
        if (plan != nullptr) ikv_plan_prefetch(plan, &pages, &n);
        for (size_t i = 0; i < n; ++i) mark(pages[i]);
    } else if (plan == nullptr) {
        for (uint32_t p = 0; p < n_pages; ++p) mark(p);
    } else {
        const ikv_plan_page *pages = nullptr;
        ikv_plan_pages(plan, &pages, &n);
        for (size_t i = 0; i < n; ++i) mark(pages[i].page);
    }
}

// Device pages of every sequence that this step does not read (the move
// rules hold), least recently used first, to offload: idle ones (unused for
// idle_steps steps) until `to_low` bytes are freed, and recently used ones
// only while the step's own pages still lack room (`to_high` bytes): what
// the step reads outranks what earlier steps did. All within `host_room`.
std::vector<TierMove> choose_offloads_locked(ikv_pool *pool, const std::vector<std::shared_ptr<Seq>> &all,
                                             uint64_t to_low, uint64_t to_high, uint64_t host_room) {
    const uint64_t now = pool->tier_clock, idle = pool->tier_policy.idle_steps;
    std::vector<TierMove> unused;
    for (const std::shared_ptr<Seq> &sp : all) {
        Seq &seq = *sp;
        const uint32_t complete = complete_pages(pool, seq);
        for (uint32_t p = 0; p < complete; ++p) {
            PageRec *rec = seq.pages[p];
            if (rec == nullptr || rec->on_host || rec->refs > 1 || rec->last_used == now) continue;
            unused.push_back(TierMove{&seq, rec, nullptr});
        }
    }
    std::stable_sort(unused.begin(), unused.end(),
                     [](const TierMove &a, const TierMove &b) { return a.rec->last_used < b.rec->last_used; });
    uint64_t freed = 0;
    size_t n = 0;
    for (; n < unused.size(); ++n) {
        const uint64_t b = pool->page_bytes[unused[n].rec->format];
        const bool is_idle = now - unused[n].rec->last_used >= idle;
        if (freed >= (is_idle ? to_low : to_high) || b > host_room) break;
        host_room -= b;
        freed += b;
    }
    unused.resize(n);
    return unused;
}

// Fetches that take an offload's device memory: in fetch order, each takes
// the first offload of its format not taken yet. Both lists are reordered so
// the pairs come first, in the same order (fetch i lands in offload i's
// memory, its destination set now); the count of pairs.
size_t pair_fetches_with_offloads(std::vector<TierMove> &fetches, std::vector<TierMove> &offloads) {
    size_t n = 0;
    for (size_t j = 0; j < fetches.size() && n < offloads.size(); ++j) {
        size_t k = n;
        while (k < offloads.size() && offloads[k].rec->format != fetches[j].rec->format) ++k;
        if (k == offloads.size()) continue;
        std::swap(offloads[n], offloads[k]);
        std::swap(fetches[n], fetches[j]);
        fetches[n].dst = offloads[n].rec->bytes;
        ++n;
    }
    return n;
}

uint64_t share_of(uint64_t capacity, double share) { return uint64_t(double(capacity) * share); }

}  // namespace

ikv_status pool_set_tier_policy(ikv_pool *pool, const TierPolicy &policy) {
    const ikv_status st = check_host_tier(pool, "ikv_pool_set_tier_policy");
    if (st != IKV_OK) return st;
    std::lock_guard<std::mutex> lock(pool->state_mu);
    pool->tier_policy = policy;
    return IKV_OK;
}

ikv_status pool_tier_step(ikv_pool *pool, const ikv_seq_id *ids, const ikv_plan *const *plans, uint32_t n_seqs,
                          void *stream, ikv_tier_step_report *report) {
    ikv_status st = check_tier_call(pool, stream, kStepFn);
    if (st != IKV_OK) return st;
    if (!pool->tier_policy.on)
        return fail(IKV_E_STATE, "%s: the pool has no tier policy; turn it on with ikv_pool_set_tier_policy", kStepFn);
    // Everything that can be refused is checked before the first change.
    std::vector<std::shared_ptr<Seq>> named(n_seqs), all;
    for (uint32_t i = 0; i < n_seqs; ++i) {
        named[i] = find_seq(pool, ids[i]);
        if (!named[i]) return seq_not_found(kStepFn, ids[i]);
        if (plans != nullptr && plans[i] != nullptr) {
            ikv_plan_summary sum;
            if (ikv_plan_get_summary(plans[i], &sum) != IKV_OK)
                return fail(IKV_E_INVALID, "%s: plans[%u] cannot be read", kStepFn, i);
            if (sum.page_size != pool->shape.page_size)
                return fail(IKV_E_INVALID, "%s: plans[%u] has page_size %u, the pool's page_size is %u", kStepFn, i,
                            sum.page_size, pool->shape.page_size);
        }
    }
    {
        std::shared_lock<std::shared_mutex> lock(pool->table_mu);
        all.reserve(pool->seqs.size());
        for (auto &kv : pool->seqs) all.push_back(kv.second);
    }
    const TierPolicy &policy = pool->tier_policy;

    // 1. Mark; 2. choose what pressure sends to the host; 3. what comes back;
    // 4. both at once (the fetches into the offloads' memory wait for them on
    // the device, so the bus carries both directions together).
    std::vector<Wanted> on_host;
    std::vector<TierMove> offloads, fetches;
    uint64_t offload_bytes = 0, fetch_bytes = 0;
    uint32_t stays = 0, fetched_read = 0;
    size_t n_paired = 0;
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        ++pool->tier_clock;
        // Every sequence's pages first, then every sequence's hints: plan
        // pages come before prefetch hints in the fetch order.
        for (bool hints : {false, true})
            for (uint32_t i = 0; i < n_seqs; ++i)
                mark_seq_locked(pool, *named[i], plans != nullptr ? plans[i] : nullptr, hints, on_host);
        uint64_t need = 0, need_read = 0;  // bytes to fetch: all marked, and those the step reads
        if (policy.prefetch)
            for (const Wanted &w : on_host)
                if (w.movable) {
                    need += pool->page_bytes[w.rec->format];
                    if (!w.hint) need_read += pool->page_bytes[w.rec->format];
                }
        const uint64_t cap = pool->config.capacity_bytes;
        const uint64_t high = share_of(cap, policy.device_high), low = share_of(cap, policy.device_low);
        if (pool->used_bytes + need > high) {
            // Idle pages go down to the low watermark; recently used ones only
            // as far as the pages this step reads need room below the high one.
            const uint64_t after = pool->used_bytes + need;
            offloads = choose_offloads_locked(pool, all, after - std::min(low, after),
                                              std::min(after - high, need_read),
                                              pool->config.host_capacity_bytes - pool->host_used_bytes);
            st = tier_moves_prepare_locked(pool, offloads, true, &offload_bytes, kStepFn);
            if (st != IKV_OK) return st;
        }
        if (policy.prefetch) {
            // The room below the high watermark once the offloads are gone
            // (what lies above it is the step's appends' headroom); the
            // marked pages in want order while they fit.
            uint64_t room = high - std::min(high, pool->used_bytes - offload_bytes);
            for (const Wanted &w : on_host) {
                const uint64_t b = pool->page_bytes[w.rec->format];
                if (!w.movable || b > room) continue;
                room -= b;
                fetches.push_back(TierMove{w.seq, w.rec, nullptr});
                fetched_read += w.hint ? 0 : 1;
            }
            n_paired = pair_fetches_with_offloads(fetches, offloads);
            pool->used_bytes -= offload_bytes;  // the room check sees the offloads gone, as the choice did
            st = tier_moves_prepare_locked(pool, fetches, false, &fetch_bytes, kStepFn);
            pool->used_bytes += offload_bytes;
            if (st != IKV_OK) {
                tier_moves_unprepare_locked(pool, offloads, 0, true, offload_bytes);
                return st;
            }
        }
    }
    st = tier_exchange_finish(pool, offloads, offload_bytes, fetches, fetch_bytes, n_paired, stream);
    if (st != IKV_OK) return st;
    for (const Wanted &w : on_host) stays += w.hint ? 0 : 1;  // the step's own pages left on the host
    stays -= fetched_read;
    if (report != nullptr) {
        ikv_tier_step_report r{};
        r.struct_size = sizeof r;
        r.pages_fetched = uint32_t(fetches.size());
        r.pages_offloaded = uint32_t(offloads.size());
        r.pages_on_host = stays;
        {
            std::lock_guard<std::mutex> lock(pool->state_mu);
            r.step = pool->tier_clock;
        }
        write_versioned(report, r);
    }
    return IKV_OK;
}

}  // namespace ikv
