// The read-side view of a pool that decode (CPU and CUDA) and query-aware
// selection need. Implemented by the pool (src/pool/); consumed by
// src/decode/, src/cpu/ and src/cuda/. This is the only way those folders
// reach into a pool.
#pragma once

#include <cstdint>
#include <vector>

#include "common/page_format.hpp"
#include "intentkv.h"

namespace ikv {

// One logical page of a sequence as decode sees it: the page base address (in
// host memory for CPU pools, device memory for CUDA pools; the sub-page of
// (layer, head) is at base + subpage_offset(...)) and its storage format.
// base == nullptr means the page was evicted (block-table sentinel).
struct PageRef {
    const uint8_t *base;
    ikv_format format;
    bool on_host;  // CUDA pools: in the host tier (read over the bus)
};

// A consistent copy of one sequence's block table for one layer.
// pages[i] covers tokens [i*P, (i+1)*P); tokens at or beyond `length` do not
// exist yet. `length` is the number of tokens stored in this layer.
// A sequence with room reserved on a CUDA pool (ikv_pool_reserve) has its
// true length on the device: `length` is then the end of the room (pages
// exist up to it), `room` the device record (kernels/ikv_kernels.h
// RoomRecord, of generation room_generation) whose per-layer lengths the
// decode reads when its kernels run, and host_length the fewest tokens any
// layer holds as the host knows it (no layer's device length is below it).
struct SeqSnapshot {
    uint32_t length = 0;
    uint32_t host_length = 0;
    void *room = nullptr;
    uint32_t room_generation = 0;
    std::vector<PageRef> pages;
};

// What decides a sequence's page lists at one layer besides the plan: the
// layer's stored length and the generation of the block table (a value that
// changes, never to one used before, whenever the table or a page's storage
// changes; appends that stay inside allocated pages keep it).
struct SeqState {
    uint32_t length = 0;  // as SeqSnapshot::length
    uint64_t table_gen = 0;
};

const PageShape &pool_shape(const ikv_pool *pool);
ikv_backend pool_backend(const ikv_pool *pool);
int pool_device(const ikv_pool *pool);

// Count n host-tier pages a decode call listed (ikv_pool_stats.host_page_reads).
void pool_count_host_reads(const ikv_pool *pool, uint64_t n);
// Order what the caller enqueues next on stream after the copies that put
// pages on the host tier (a decode whose lists hold host-tier pages).
ikv_status pool_order_after_moves(const ikv_pool *pool, void *stream, const char *fn);

// Snapshot seq's block table for `layer`, taken under the pool's lock so it is
// safe while other sequences change. Valid while the caller orders mutation of
// seq after the use (the header's thread-safety contract).
// Errors: IKV_E_NOT_FOUND (seq), IKV_E_RANGE (layer); message set via fail(),
// naming seq as ikv_decode's args->seqs[index].
ikv_status pool_snapshot(const ikv_pool *pool, ikv_seq_id seq, uint32_t index, uint32_t layer, SeqSnapshot *out);

// seq's state at `layer`, without copying its block table. Same errors as
// pool_snapshot (and the same sentences).
ikv_status pool_seq_state(const ikv_pool *pool, ikv_seq_id seq, uint32_t index, uint32_t layer, SeqState *out);

}  // namespace ikv
