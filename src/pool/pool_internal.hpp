// Helpers shared by the pool's core files: sequence lookup, page
// allocation and release with accounting, staging buffers, input loading.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "common/error.hpp"
#include "common/quant.hpp"
#include "pool/host_codec.hpp"
#include "pool/pool.hpp"

namespace ikv {

// The sequence, or nullptr. Takes table_mu shared for the lookup only.
std::shared_ptr<Seq> find_seq(const ikv_pool *pool, ikv_seq_id id);

inline ikv_status seq_not_found(const char *fn, ikv_seq_id id) {
    return fail(IKV_E_NOT_FOUND, "%s: sequence %u does not exist in this pool", fn, (unsigned)id);
}

// The sequences of ids[0, n), each of which must exist and be listed once
// (IKV_E_NOT_FOUND, IKV_E_INVALID naming fn). Throws nothing: IKV_E_NOMEM.
ikv_status find_seqs_once(const ikv_pool *pool, const ikv_seq_id *ids, uint32_t n, const char *fn,
                          std::vector<std::shared_ptr<Seq>> *out);

// ---- under state_mu ----
// IKV_E_NOMEM with a sentence when `extra` more bytes of pages would exceed capacity.
// host_tier: the same for the host tier of a CUDA pool (host_capacity_bytes).
ikv_status check_room_locked(const ikv_pool *pool, bool host_tier, uint64_t extra, uint64_t freed, const char *fn);
inline ikv_status check_capacity_locked(const ikv_pool *pool, uint64_t extra, uint64_t freed, const char *fn) {
    return check_room_locked(pool, false, extra, freed, fn);
}
// Allocate page bytes of format f into rec (refs = 1) and charge them.
ikv_status alloc_page_locked(ikv_pool *pool, ikv_format f, PageRec *rec);
// Drop one reference; the last one releases the bytes, uncharges and deletes rec.
void unref_page_locked(ikv_pool *pool, PageRec *rec);
// Release a page's bytes and uncharge them (rec itself stays).
void free_page_bytes_locked(ikv_pool *pool, PageRec *rec);
// Parts of one call (Part: a `seq` and `copies` of (page index, record)) that
// each plan to copy the same shared page: where every holder of the page is
// among them (a fork and its parent in one batch), the last of them keeps the
// page instead, as that many single calls would (the earlier ones copy it, the
// last finds it no longer shared and writes it in place). Its copy entry is
// removed after drop(entry, original page) (a record to free, a charge to take
// back). The callers make every copy before any write. Allocates nothing.
template <class Part, class Drop>
void keep_last_shared_copy_locked(std::vector<Part> &parts, Drop drop) {
    for (Part &pt : parts)
        for (auto &e : pt.copies) ++pt.seq->pages[e.first]->call_copies;
    for (size_t i = parts.size(); i-- > 0;) {
        auto &copies = parts[i].copies;
        for (size_t j = copies.size(); j-- > 0;) {
            PageRec *old = parts[i].seq->pages[copies[j].first];
            if (old->call_copies != old->refs) continue;
            old->call_copies = 0;  // the earlier parts copy it
            drop(copies[j], old);
            copies.erase(copies.begin() + std::ptrdiff_t(j));
        }
    }
    for (Part &pt : parts)
        for (auto &e : pt.copies) pt.seq->pages[e.first]->call_copies = 0;
}
// Undo of a call's staging allocations: the staging of seq's `layers` freed
// and their pointers cleared; `layers` emptied (append, truncate, reserve).
// seq is read only when `layers` is not empty (a part that never found its
// sequence has none).
void free_new_staging(ikv_pool *pool, Seq *seq, std::vector<uint32_t> &layers);

// ---- the host tier (pool_tier.cpp) ----
// Pages of seq complete in every layer (only those move between tiers).
uint32_t complete_pages(const ikv_pool *pool, const Seq &seq);
// One page changing tier: its sequence, its record, its new bytes.
struct TierMove {
    Seq *seq;
    PageRec *rec;
    uint8_t *dst;
};
// IKV_E_UNSUPPORTED without a host tier.
ikv_status check_host_tier(const ikv_pool *pool, const char *fn);
// IKV_E_UNSUPPORTED without a host tier; IKV_E_INVALID for a capturing stream.
ikv_status check_tier_call(const ikv_pool *pool, void *stream, const char *fn);
// Under state_mu: check the target tier's room for every move and allocate
// every destination not set already (a fetch into an offload's memory),
// charging the target tier (*extra bytes); all or nothing.
ikv_status tier_moves_prepare_locked(ikv_pool *pool, std::vector<TierMove> &moves, bool to_host, uint64_t *extra,
                                     const char *fn);
// Under state_mu: what tier_moves_prepare_locked did, undone (the
// destinations it allocated back, the charge); fetches' preset ones stay.
void tier_moves_unprepare_locked(ikv_pool *pool, const std::vector<TierMove> &moves, size_t n_preset, bool to_host,
                                 uint64_t extra);
// A tier step's offloads and fetches, prepared, enqueued together
// (PageStore::exchange_pages: the first n_paired fetches land in the first
// n_paired offloads' device memory); then, under state_mu, every record
// takes its new bytes and tier. On failure both lists' preparation is
// undone and nothing moved.
ikv_status tier_exchange_finish(ikv_pool *pool, const std::vector<TierMove> &offloads, uint64_t offload_bytes,
                                const std::vector<TierMove> &fetches, uint64_t fetch_bytes, size_t n_paired,
                                void *stream);
// Without the lock: enqueue the copies on stream, then (under state_mu) the
// records take their new bytes and tier; on failure the prepared
// destinations and charge go back and nothing moved.
ikv_status tier_moves_finish(ikv_pool *pool, const std::vector<TierMove> &moves, bool to_host, uint64_t extra,
                             void *stream);

// Floats in one staging buffer (K and V of a tail page of one layer).
inline uint64_t stage_floats(const PageShape &s) { return 2ull * s.n_kv_heads * s.page_size * s.head_dim; }
inline uint64_t stage_bytes(const PageShape &s) { return stage_floats(s) * sizeof(float); }

// Tokens of `layer` inside page p.
inline uint32_t tokens_in_page(const Seq &seq, const PageShape &s, uint32_t layer, uint32_t p) {
    const uint64_t start = uint64_t(p) * s.page_size, len = seq.layers[layer].length;
    if (len <= start) return 0;
    return uint32_t(len - start < s.page_size ? len - start : s.page_size);
}

// Refill layer's staging from the stored (dequantized) rows of page rec.
inline ikv_status restage_from_page(ikv_pool *pool, Seq &seq, uint32_t layer, const PageRec &rec, uint32_t n_valid) {
    return pool->store->stage_from_page(rec.format, rec.bytes, layer, n_valid, seq.layers[layer].stage);
}

// Give every staging buffer of seq back to the store; returns how many there were.
inline uint32_t free_stages(ikv_pool *pool, Seq &seq) {
    uint32_t n = 0;
    for (LayerState &ls : seq.layers)
        if (ls.stage != nullptr) {
            pool->store->stage_free(ls.stage);
            ls.stage = nullptr;
            ++n;
        }
    return n;
}

// A staging-sized scratch buffer of the store for one call (format changes).
class TempStage {
public:
    explicit TempStage(PageStore *store) : store_(store) {}
    ~TempStage() {
        if (buf_ != nullptr) store_->stage_free(buf_);
    }
    ikv_status alloc() { return store_->stage_alloc(&buf_); }
    float *get() const { return buf_; }
    TempStage(const TempStage &) = delete;
    TempStage &operator=(const TempStage &) = delete;

private:
    PageStore *store_;
    float *buf_ = nullptr;
};

// The format of the pool's new pages when no plan says otherwise.
inline ikv_format default_page_format(const ikv_pool *pool) {
    return pool->config.default_format == IKV_FMT_AUTO ? IKV_FMT_F16 : pool->config.default_format;
}

}  // namespace ikv
