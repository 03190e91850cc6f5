// The KV page pool's core: sequences, block tables, reference counts, fp32
// staging of partial tail pages and capacity accounting. Page bytes live
// behind a PageStore (host or device), so nothing here depends on where.
//
// Locking (see the thread-safety note in intentkv.h):
//   table_mu  (shared_mutex) guards the sequence table. Lookups take it shared
//             and copy out a shared_ptr, so a destroy of another sequence
//             cannot free a Seq in use. Create/fork/destroy take it exclusive.
//   state_mu  guards page records' refcounts, the PageStore's allocator and
//             all accounting. Taken after table_mu, never before.
// A Seq's own fields (block table, lengths, staging) are changed only by
// calls on that sequence, which the caller orders; quantization runs outside
// both locks. A page shared by several sequences is never written in place:
// writers copy it first (copy-on-write, decided under state_mu).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "common/page_format.hpp"
#include "common/unique_id.hpp"
#include "intentkv.h"
#include "pool/page_store.hpp"
#include "pool/room_append.hpp"

namespace ikv {

struct PageRec {
    uint8_t *bytes = nullptr;
    ikv_format format = IKV_FMT_F16;
    uint32_t refs = 1;     // sequences whose block table holds this page (under state_mu)
    bool on_host = false;  // CUDA pools with a host tier: bytes are pinned host memory (pool_tier.cpp)
    uint64_t last_used = 0;  // the tier policy's step that last named this page (tier_policy.cpp)
    uint32_t call_copies = 0;  // scratch of keep_last_shared_copy_locked (pool_internal.hpp): 0 between calls
};

// The automatic tier policy (ikv_pool_set_tier_policy), defaults filled in.
struct TierPolicy {
    bool on = false;
    uint32_t idle_steps = 8;
    double device_high = 0.9, device_low = 0.75;
    bool prefetch = true;
};

struct LayerState {
    uint32_t length = 0;  // tokens stored in this layer
    // fp32 copy of the tail page's tokens while it is partial: K [H][P][D]
    // followed by V [H][P][D], a buffer of the pool's PageStore (host or
    // device memory: PageStore::stage_alloc); null when length is a multiple
    // of P. Freed by whoever clears it (stage_free).
    float *stage = nullptr;
};

struct Seq {
    std::vector<PageRec *> pages;  // block table: page i covers tokens [i*P, (i+1)*P); nullptr = evicted
    std::vector<LayerState> layers;
    uint32_t length = 0;  // min over layers
    // Room reserved ahead (ikv_pool_reserve): pages exist for positions
    // [0, reserved_end) of every layer; 0 = none. On a store with device
    // lengths (CUDA) `reservation` is the store's record of the room, whose
    // per-layer lengths the device advances: the host's `layers[l].length`
    // then counts only eager appends until ikv_pool_sync / ikv_pool_reserve
    // take the device's lengths.
    uint32_t reserved_end = 0;
    void *reservation = nullptr;
    // Changes (to a value never used before) whenever `pages` or the storage
    // of a page in it (bytes, format) changes: decoders reuse the page lists
    // of an earlier call while it and the layer's length are unchanged.
    uint64_t table_gen = next_unique_id();
};

// What the device found while appending to or decoding sequences with room
// (ikv_pool_reserve), reported by ikv_pool_sync.
struct RoomIncident {
    bool found = false;
    bool stale_read = false;  // a decode met more tokens than its lists covered; else an append overran
    ikv_seq_id seq = 0;
    uint32_t layer = 0;
};

// Every change to a sequence's block table or its pages' storage calls this.
inline void table_changed(Seq &seq) { seq.table_gen = next_unique_id(); }

}  // namespace ikv

struct ikv_pool {
    ikv_pool_config config{};
    ikv::PageShape shape{};
    uint64_t page_bytes[IKV_FMT_COUNT] = {};
    std::unique_ptr<ikv::PageStore> store;

    mutable std::shared_mutex table_mu;
    std::unordered_map<ikv_seq_id, std::shared_ptr<ikv::Seq>> seqs;
    ikv_seq_id next_id = 1;

    mutable std::mutex state_mu;
    uint64_t used_bytes = 0;
    uint64_t pages_used = 0;
    uint64_t pages_by_format[IKV_FMT_COUNT] = {};
    uint64_t bytes_by_format[IKV_FMT_COUNT] = {};
    uint64_t staging_bytes = 0;
    uint64_t tokens_total = 0;
    // The host tier (CUDA pools): bytes and pages there, bytes moved each way.
    uint64_t host_used_bytes = 0;
    uint64_t host_pages = 0;
    uint64_t bytes_offloaded = 0;
    uint64_t bytes_fetched = 0;
    // The tier policy and its step count (new pages start as used now).
    ikv::TierPolicy tier_policy;
    uint64_t tier_clock = 0;
    // Host-tier pages decode calls listed (ikv_pool_stats.host_page_reads);
    // decoders add to it without the pool's locks.
    mutable std::atomic<uint64_t> host_page_reads{0};
    // The first incident of sequences with room (ikv_pool_reserve) that
    // ikv_pool_sync has not reported yet.
    ikv::RoomIncident room_report;
};

namespace ikv {

// Core operations. Arguments that do not depend on pool state were checked
// by src/api/api_pool.cpp; these check the rest and report through fail().
ikv_status pool_create(const ikv_pool_config &config, ikv_pool **out);
void pool_destroy(ikv_pool *pool);
void pool_stats(const ikv_pool *pool, ikv_pool_stats *out);
// ikv_pool_sync: wait for asynchronous appends and report their first non-finite input.
ikv_status pool_sync(ikv_pool *pool);

ikv_status seq_create(ikv_pool *pool, ikv_seq_id *id_out);
ikv_status seq_destroy(ikv_pool *pool, ikv_seq_id seq);
ikv_status seq_length(const ikv_pool *pool, ikv_seq_id seq, uint32_t *length_out);
ikv_status seq_layer_length(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t *length_out);
// Append to n distinct sequences (ikv_pool_append_batch; n = 1 for
// ikv_pool_append), atomically over all of them; fn names the entry point.
// With defer (a decode that appends), an append to sequences with room is
// only prepared into *defer (room_append_prepare); any other runs as usual.
ikv_status seqs_append(ikv_pool *pool, const ikv_seq_id *ids, uint32_t n, const ikv_append &args, const char *fn,
                       RoomAppendReady *defer = nullptr);
ikv_status seq_fork(ikv_pool *pool, ikv_seq_id parent, ikv_seq_id *child_out);
// ikv_pool_reserve (pool_reserve.cpp), over n distinct sequences.
ikv_status seqs_reserve(ikv_pool *pool, const ikv_seq_id *ids, uint32_t n, uint32_t n_tokens);
// A sequence with room on the device: its host lengths take the device's;
// an incident found is kept for ikv_pool_sync (unless one is pending) and,
// with taken, handed to the caller too.
ikv_status take_room_lengths(ikv_pool *pool, Seq &seq, ikv_seq_id id, PageStore::RoomReport *taken = nullptr);
// Every sequence's take_room_lengths; with report, the pool's first incident
// as ikv_pool_sync reports it; found incidents are cleared either way.
ikv_status take_room_reports(ikv_pool *pool, bool report);
// An append to sequences of which at least one has room on the device
// (seqs_append hands it over after checking the arguments it checks for
// every append); src is the append's source as seqs_append built it.
ikv_status room_append(ikv_pool *pool, const std::shared_ptr<Seq> *seqs, const ikv_seq_id *ids, uint32_t n_seqs,
                       const AppendSource &src, uint32_t l0, uint32_t l1);
// IKV_E_STATE naming fn when seq has room on the device (fork, truncate, format changes).
ikv_status refuse_with_room(const Seq &seq, ikv_seq_id id, const char *fn);
ikv_status seq_truncate(ikv_pool *pool, ikv_seq_id seq, uint32_t n_tokens);
ikv_status seq_evict(ikv_pool *pool, ikv_seq_id seq, uint32_t begin, uint32_t end);
ikv_status seq_is_evicted(const ikv_pool *pool, ikv_seq_id seq, uint32_t token, int *evicted_out);
ikv_status seq_page_format(const ikv_pool *pool, ikv_seq_id seq, uint32_t page, ikv_format *out);
ikv_status seq_set_page_format(ikv_pool *pool, ikv_seq_id seq, uint32_t page, ikv_format format);
ikv_status seq_apply_plan_formats(ikv_pool *pool, ikv_seq_id seq, const ikv_plan *plan);
// ikv_seq_offload (to_host) / ikv_seq_fetch; fn names the entry point.
ikv_status seq_move_tier(ikv_pool *pool, ikv_seq_id seq, uint32_t begin, uint32_t end, bool to_host, void *stream,
                         uint32_t *moved_out, const char *fn);
ikv_status seq_page_tier(const ikv_pool *pool, ikv_seq_id seq, uint32_t page, int *on_host_out);
// ikv_pool_set_tier_policy (policy checked and defaults filled) / ikv_pool_tier_step.
ikv_status pool_set_tier_policy(ikv_pool *pool, const TierPolicy &policy);
ikv_status pool_tier_step(ikv_pool *pool, const ikv_seq_id *seqs, const ikv_plan *const *plans, uint32_t n_seqs,
                          void *stream, ikv_tier_step_report *report);
ikv_status seq_read(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t begin, uint32_t end, float *k_out,
                    float *v_out);
ikv_status seq_page_summary(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t kv_head, uint32_t page,
                            float *k_min, float *k_max, float *k_mean, uint32_t *n_tokens_out);

}  // namespace ikv
