// The decoder handle: a worker pool, reusable scratch, the CUDA state and the
// bytes the last step read. One caller thread at a time (header contract).
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/attn_kernel.hpp"
#include "cuda/cuda_backend.hpp"
#include "decode/selection.hpp"
#include "decode/step_lists.hpp"
#include "decode/thread_pool.hpp"
#include "intentkv.h"
#include "pool/pool_view.hpp"

namespace ikv {

// Per-call working memory, kept between calls so a steady decode loop does
// not allocate.
struct DecodeScratch {
    dvec<float> q;          // [B*H][R][D] scaled fp32 queries, grouped by kv-head
    dvec<uint8_t> q_bad;    // [B*H][R]: the row's query holds a NaN or inf (its outputs are NaN)
    dvec<Entry> entries, picked;  // entries: every sequence's, at entry_lo[b]
    dvec<uint32_t> entry_lo;      // [B + 1]
    dvec<float> bounds;           // top-k: [H][entries] Quest bounds (or hybrid scores)
    dvec<float> rows;             // per-row top-k: [H][entries][rows] sums before combine_rows
    dvec<float> row_offset;       // per-row top-k: [B*H][rows] (query memory rows: log(decay) or -inf)
    dvec<float> worker_rows;      // per-row top-k: per worker, kScoreBatch+1 entries' rows of scratch
    dvec<float> qsigns;           // top-k: [B*H][2 or 3][rows][D] q+, q- (hybrid: halved, then q/2) of query token 0
                                  //        (rows: the group's heads, then any query-memory rows)
    dvec<uint32_t> order;         // top-k: select_topk scratch
    dvec<uint8_t> keep;
    struct BoundTask {
        uint32_t b, h, e0, e1;  // entries [e0, e1) of sequence b, kv-head h
    };
    dvec<BoundTask> bound_tasks;
    // IKV_TOPK_SCORE_KEYS: per worker, the two passes' scratch; per (b, h),
    // the selection and the bytes of the candidates' keys it read.
    struct KeysWorker {
        dvec<uint32_t> order;
        dvec<uint8_t> keep;
        dvec<Entry> candidates;
        dvec<float> q, scores, scratch;
    };
    dvec<KeysWorker> keys_worker;
    dvec<dvec<Entry>> keys_picked;
    dvec<uint64_t> keys_bytes;
    dvec<SpanRef> spans;    // all spans, grouped by (b, h)
    dvec<uint64_t> span_lo; // [B*H + 1] offsets into spans
    struct Item {
        uint32_t bh;
        uint32_t span_begin, span_end;
    };
    dvec<Item> items;
    dvec<uint32_t> item_lo;  // [B*H + 1] offsets into items
    struct Unit {            // the kv-heads of sequence b's chunk `chunk`, run together (attend_chunks)
        uint32_t b, chunk;
    };
    dvec<Unit> units;
    dvec<float> partial;     // [items][R*(D+2)]: m, l, acc
    dvec<dvec<float>> worker;  // per worker: logits, kspan, vspan, qfold
    // attention feedback: row LSEs [B*H][R], each span's share, one (b, h)'s pages and shares
    dvec<float> row_lse, span_share, fb_share;
    // attention feedback, per worker: for one (b, h)'s spans and rows, each max logit and sum of exp(logit - max),
    // then each row's own lse ([2 * spans + 1][R] doubles)
    dvec<dvec<double>> fb_worker;
    dvec<uint32_t> fb_pages;
};

// Run one step on a CPU pool. args were validated by src/api/api_decode.cpp.
// With lists.reuse, scratch.entries and *lists.snaps are the last call's and
// still exact; otherwise this call takes the snapshots and collects entries.
ikv_status cpu_decode(ThreadPool &threads, DecodeScratch &scratch, const ikv_pool *pool,
                      const ikv_decode_args &args, StepLists &lists, uint64_t *bytes_read);

// The token runs the last cpu_decode read for list bh = b * n_kv_heads + h
// (its spans, still in scratch): ikv_decoder_last_selection.
void cpu_last_selection(const DecodeScratch &scratch, uint32_t bh, std::vector<ikv_token_range> &runs);

}  // namespace ikv

struct ikv_decoder {
    explicit ikv_decoder(unsigned n_threads) : threads(n_threads) {}
    ~ikv_decoder() { ikv::cuda_decoder_state_destroy(cuda); }
    ikv::ThreadPool threads;
    ikv::DecodeScratch scratch;
    // The page lists' key, the block-table snapshots they came from (kept so
    // that steady-state steps reuse them or their capacity) and the counters.
    ikv::ListMemory lists;
    ikv::CudaDecoderState *cuda = nullptr;
    uint64_t last_bytes = 0;
    uint64_t appends_fused = 0;  // ikv_decoder_stats
    // The last successful call, for ikv_decoder_last_selection: its shape,
    // backend, and whether it was captured (its selection exists at replay only).
    struct LastCall {
        bool valid = false, cuda = false, captured = false;
        uint32_t n_seqs = 0, n_kv_heads = 0;
    } last;
};
