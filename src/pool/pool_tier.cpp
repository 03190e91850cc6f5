// The host tier of CUDA pools: ikv_seq_offload / ikv_seq_fetch move whole
// pages between device memory and pinned host memory, and
// ikv_seq_page_tier says where one is.
//
// A page keeps its record (format, references, block-table slot) and only
// its bytes move, so the table's generation changes (decoders rebuild their
// page lists with the new addresses) and nothing else does. Decode reads a
// host-tier page in place through the mapped pinned memory, so what it
// computes does not depend on where a page is.
//
// Order of work, so that a refused move changes nothing:
//   1. under state_mu: choose the pages (this sequence's alone, complete in
//      every layer, live, in the other tier), check the target tier's room,
//      allocate every destination (undo all on failure);
//   2. outside the lock: the store enqueues the copies on the engine's stream
//      (and releases each source once its copy is done);
//   3. under state_mu: the records take their new bytes and tier; accounting.
#include <algorithm>
#include <new>
#include <vector>

#include "pool/pool_internal.hpp"

namespace ikv {

uint32_t complete_pages(const ikv_pool *pool, const Seq &seq) {
    uint32_t full_len = seq.length;  // pages complete in every layer: below the shortest layer's last whole page
    for (const LayerState &ls : seq.layers) full_len = std::min(full_len, ls.length);
    return full_len / pool->shape.page_size;
}

ikv_status tier_moves_prepare_locked(ikv_pool *pool, std::vector<TierMove> &moves, bool to_host, uint64_t *extra,
                                     const char *fn) {
    *extra = 0;
    for (const TierMove &m : moves) *extra += pool->page_bytes[m.rec->format];
    if (moves.empty()) return IKV_OK;
    const ikv_status st = check_room_locked(pool, to_host, *extra, 0, fn);
    if (st != IKV_OK) return st;
    size_t preset = 0;  // fetches into an offload's memory come first, their destination set
    while (preset < moves.size() && moves[preset].dst != nullptr) ++preset;
    for (size_t i = preset; i < moves.size(); ++i) {
        const ikv_format f = moves[i].rec->format;
        const ikv_status a = to_host ? pool->store->alloc_host(f, &moves[i].dst) : pool->store->alloc(f, &moves[i].dst);
        if (a != IKV_OK) {
            for (size_t j = preset; j < i; ++j) {
                pool->store->release(moves[j].rec->format, moves[j].dst);
                moves[j].dst = nullptr;
            }
            return a;
        }
    }
    // The target tier is charged now, so moves and appends of other
    // sequences during the copies see the room as taken.
    (to_host ? pool->host_used_bytes : pool->used_bytes) += *extra;
    return IKV_OK;
}

namespace {

// Under state_mu: the moved pages' records take their new bytes and tier
// (each source is released by the store once copied, or became a fetched
// page's place); the source tier's accounting.
void apply_moves_locked(ikv_pool *pool, const std::vector<TierMove> &moves, bool to_host, uint64_t extra) {
    for (const TierMove &m : moves) {
        m.rec->bytes = m.dst;
        m.rec->on_host = to_host;
        table_changed(*m.seq);
    }
    const uint64_t n = moves.size();
    if (to_host) {
        pool->used_bytes -= extra;
        pool->host_pages += n;
        pool->bytes_offloaded += extra;
    } else {
        pool->host_used_bytes -= extra;
        pool->host_pages -= n;
        pool->bytes_fetched += extra;
    }
}

}  // namespace

ikv_status tier_moves_finish(ikv_pool *pool, const std::vector<TierMove> &moves, bool to_host, uint64_t extra,
                             void *stream) {
    if (moves.empty()) return IKV_OK;
    std::vector<PageStore::PageMove> copies;
    ikv_status st = IKV_OK;
    try {
        copies.reserve(moves.size());
    } catch (const std::bad_alloc &) {
        st = fail(IKV_E_NOMEM, "moving pages between tiers: out of host memory");
    }
    if (st == IKV_OK) {
        for (const TierMove &m : moves) copies.push_back(PageStore::PageMove{m.rec->format, m.dst, m.rec->bytes});
        st = pool->store->move_pages(copies.data(), copies.size(), stream);
    }
    std::lock_guard<std::mutex> lock(pool->state_mu);
    if (st != IKV_OK) {  // nothing was enqueued: the destinations go back, the pages stay
        tier_moves_unprepare_locked(pool, moves, 0, to_host, extra);
        return st;
    }
    apply_moves_locked(pool, moves, to_host, extra);
    return IKV_OK;
}

void tier_moves_unprepare_locked(ikv_pool *pool, const std::vector<TierMove> &moves, size_t n_preset, bool to_host,
                                 uint64_t extra) {
    for (size_t i = n_preset; i < moves.size(); ++i) pool->store->release(moves[i].rec->format, moves[i].dst);
    (to_host ? pool->host_used_bytes : pool->used_bytes) -= extra;
}

ikv_status tier_exchange_finish(ikv_pool *pool, const std::vector<TierMove> &offloads, uint64_t offload_bytes,
                                const std::vector<TierMove> &fetches, uint64_t fetch_bytes, size_t n_paired,
                                void *stream) {
    if (offloads.empty() && fetches.empty()) return IKV_OK;
    std::vector<PageStore::PageMove> off, fet;
    ikv_status st = IKV_OK;
    try {
        off.reserve(offloads.size());
        fet.reserve(fetches.size());
    } catch (const std::bad_alloc &) {
        st = fail(IKV_E_NOMEM, "moving pages between tiers: out of host memory");
    }
    if (st == IKV_OK) {
        for (const TierMove &m : offloads) off.push_back(PageStore::PageMove{m.rec->format, m.dst, m.rec->bytes});
        for (const TierMove &m : fetches) fet.push_back(PageStore::PageMove{m.rec->format, m.dst, m.rec->bytes});
        st = pool->store->exchange_pages(off.data(), off.size(), fet.data(), fet.size(), n_paired, stream);
    }
    std::lock_guard<std::mutex> lock(pool->state_mu);
    if (st != IKV_OK) {  // nothing moved: each list's preparation undone
        tier_moves_unprepare_locked(pool, fetches, n_paired, false, fetch_bytes);
        tier_moves_unprepare_locked(pool, offloads, 0, true, offload_bytes);
        return st;
    }
    apply_moves_locked(pool, offloads, true, offload_bytes);
    apply_moves_locked(pool, fetches, false, fetch_bytes);
    return IKV_OK;
}

ikv_status check_host_tier(const ikv_pool *pool, const char *fn) {
    if (pool->config.backend != IKV_BACKEND_CUDA || !pool->store->has_host_tier())
        return fail(IKV_E_UNSUPPORTED,
                    "%s: the pool has no host tier (a CUDA pool created with host_capacity_bytes > 0 has one)", fn);
    return IKV_OK;
}

ikv_status check_tier_call(const ikv_pool *pool, void *stream, const char *fn) {
    const ikv_status st = check_host_tier(pool, fn);
    return st != IKV_OK ? st : pool->store->check_move_stream(stream, fn);
}

ikv_status seq_move_tier(ikv_pool *pool, ikv_seq_id id, uint32_t begin, uint32_t end, bool to_host, void *stream,
                         uint32_t *moved_out, const char *fn) {
    // *moved_out is written on success only: on error nothing changes, the caller's variable included.
    ikv_status st = check_tier_call(pool, stream, fn);
    if (st != IKV_OK) return st;
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    Seq &seq = *seqp;
    if (begin > end || end > seq.length)
        return fail(IKV_E_RANGE, "%s: tokens [%u, %u) are not inside sequence %u of %u tokens", fn, begin, end,
                    (unsigned)id, seq.length);
    if (begin == end) {  // an empty range overlaps no page
        if (moved_out) *moved_out = 0;
        return IKV_OK;
    }
    const uint32_t P = pool->shape.page_size;
    const uint32_t p0 = begin / P, p1 = std::min((end + P - 1) / P, complete_pages(pool, seq));

    std::vector<TierMove> moves;
    uint64_t extra = 0;  // the moving pages' bytes
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        for (uint32_t p = p0; p < p1; ++p) {
            PageRec *rec = seq.pages[p];
            if (rec == nullptr || rec->refs > 1 || rec->on_host == to_host) continue;
            moves.push_back(TierMove{&seq, rec, nullptr});
        }
        st = tier_moves_prepare_locked(pool, moves, to_host, &extra, fn);
        if (st != IKV_OK) return st;
    }
    st = tier_moves_finish(pool, moves, to_host, extra, stream);
    if (st == IKV_OK && moved_out) *moved_out = uint32_t(moves.size());
    return st;
}

ikv_status seq_page_tier(const ikv_pool *pool, ikv_seq_id id, uint32_t page, int *on_host_out) {
    constexpr const char *fn = "ikv_seq_page_tier";
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    const Seq &seq = *seqp;
    if (page >= seq.pages.size())
        return fail(IKV_E_RANGE, "%s: page %u is beyond the %zu pages of sequence %u", fn, page, seq.pages.size(),
                    (unsigned)id);
    std::lock_guard<std::mutex> lock(pool->state_mu);
    const PageRec *rec = seq.pages[page];
    if (rec == nullptr) return fail(IKV_E_EVICTED, "%s: page %u of sequence %u was evicted", fn, page, (unsigned)id);
    *on_host_out = rec->on_host ? 1 : 0;
    return IKV_OK;
}

}  // namespace ikv
