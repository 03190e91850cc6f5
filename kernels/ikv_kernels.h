// Host-facing interface of the CUDA kernels (kernels/*.cu). Plain structs and
// launch functions, includable from host C++ (src/cuda/*.cpp, compiled by the
// host compiler) and from CUDA sources. Every launch function only enqueues on
// the given stream: no allocation, no synchronization, so a sequence of them
// can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/page_format.hpp"
#include "intentkv.h"

namespace ikv {
namespace cuda {

// One entry of a device work list: a page a decode reads. 16 bytes so a CTA
// reads it with one vector load.
struct DevPage {
    const uint8_t *base;  // page base in device memory (never null in a list)
    uint32_t pos0;        // absolute token position of row 0 of the page (= page * P)
    uint8_t begin;        // first row read, in [0, P)
    uint8_t end;          // one past the last row read, in (begin, P]   (P <= 128)
    uint8_t format;       // ikv_format
    uint8_t flags;        // IKV_PAGE_MANDATORY | IKV_PAGE_PARTIAL
};
static_assert(sizeof(DevPage) == 16, "DevPage must be 16 bytes");

// A set of work lists in device memory: list i (i = seq * list_heads + head
// when list_heads > 1, else i = seq) holds counts[i] entries at
// pages + i * stride.
struct DevLists {
    const DevPage *pages;
    const uint32_t *counts;
    uint32_t stride;      // capacity of one list (entries)
    uint32_t list_heads;  // 1: one list per sequence shared by all kv-heads; n_kv_heads: one per (seq, head)
};

// Head dims the CUDA kernels are built for (a dispatch table, not copies):
// 32, 64, 128, 256. (80 and 96 are not multiples of 32, which the decode's
// lane mappings, the tensor-core k-step pairs and the score kernel's 32-channel
// lanes need; the CPU backend serves them.)
inline bool head_dim_supported(uint32_t D) { return D == 32 || D == 64 || D == 128 || D == 256; }

// ---------------------------------------------------------------- decode --
// An append's engine rows (ikv_append addressing, strides in elements):
// element (t, h, d) of layer l at k[(all_layers ? l*layer_stride : 0) +
// t*token_stride + h*head_stride + d], dtype F32/F16/BF16.
struct AppendRows {
    const void *k;
    const void *v;
    ikv_dtype dtype;
    uint32_t all_layers;
    uint32_t seq_tokens;  // tokens per sequence of a batch (token t is token t % seq_tokens of sequence t / seq_tokens)
    int64_t token_stride, head_stride, layer_stride, seq_stride;
};

// A decode's lists for sequences with room: the host listed each room to its
// end; before a decode that does not append (eager or captured) the entries
// from `first` on are rewritten from their full copies, clipped to the
// layer's device length, and the sequence's count and length set
// (room_clip.cu); a decode that appends reads them whole (FusedAppend). One
// per sequence with room.
struct RoomRecord;
struct RoomTail {
    RoomRecord *record;
    uint32_t seq;         // index of the sequence in the call
    uint32_t first;       // list index of the first entry that may be clipped
    uint32_t n;           // full entries from `first` (at full + offset)
    uint32_t offset;
    uint32_t list_end;    // positions the full list covers (a longer device length: stale_read)
    uint32_t generation;  // the record's when the lists were built (another: nothing is read, stale_read)
    uint32_t page0;       // page of entry `first`; the room lists one entry per page from there (fused decodes)
};
struct AppendError;
constexpr uint32_t kInlineRoomTails = 8;
// A decode that appends one token per sequence first (ikv_decode_args.append;
// cuda_decode.cpp decides when it applies: every sequence has room, F16/BF16
// pages, no top-k, one row chunk per kv-head). The decode kernel reads each
// sequence's device length itself from the room record and reads the list
// as the host made it, to the room's end (rows at and past the length are
// never read; cuda_decode.cpp restores the room's entries with
// launch_room_clip(restore) where a clip may have cut them); the CTA whose
// slice holds the page the token lands in (the room lists one entry per
// page, so that entry's index follows from the length) writes the token's
// rows first (as the room append kernel's block of that kv-head: staging,
// page row, key summary), then reads that page as usual; the merge kernel,
// which runs after every decode CTA read the length, advances it. So a step
// of the engine's layer loop is the decode's two launches instead of four
// (append, clip, decode, merge).
// Query rows per kv-head a decode that appends takes (its kernels are built
// for one row chunk of at most 8 rows in every compute mode).
constexpr uint32_t kFusedAppendMaxRows = 8;
struct FusedAppend {
    AppendRows in;       // the engine's rows, batch numbering: token b is sequence b's
    AppendError *error;  // the pool's record of a non-finite input (stored as 0)
};

struct DecodeParams {
    PageShape shape;
    uint32_t layer;
    uint32_t n_seqs;
    uint32_t n_query_tokens;  // T, 1..IKV_MAX_QUERY_TOKENS
    uint32_t n_q_heads;       // Hq
    DevLists lists;
    const uint32_t *seq_len;  // device [n_seqs]: tokens stored in the layer (query t sits at len - T + t)
    const void *q;            // device, ((b*T + t)*Hq + h)*D + d
    ikv_dtype q_dtype;
    void *out;                // device, same index as q
    ikv_dtype out_dtype;
    float *lse;               // device, optional, ((b*T + t)*Hq + h)
    float scale;              // already resolved (no 0 here)
    float softcap;            // 0 = off
    uint32_t max_pages;       // pages of the longest list expected (sizes the split-K grid only: kernels read counts[])
    uint32_t n_splits;        // 0 = choose (see decode_choose_splits)
    void *workspace;          // device scratch of decode_workspace_bytes() bytes
    uint32_t compute;         // DecodeCompute
    uint32_t formats;         // bit (1u << ikv_format) per page format the lists hold (decode_resolve_compute reads it)
};

// What a decode that appends (FusedAppend) takes besides DecodeParams: a
// kernel argument of the fused variants alone, so that the plain decode's
// launches carry none of it (in DecodeParams its 344 bytes made every eager
// B = 1 decode 1.3% slower, bench/RESULTS.md 7c).
struct RoomArgs {
    const RoomTail *tails;  // device [n_seqs]: sequence b's tail is tails[b]
    FusedAppend fused;      // the append's input
    // The first kInlineRoomTails tails again, in the parameters: a decode
    // CTA then reads its sequence's length in its first round trip.
    RoomTail inline_tails[kInlineRoomTails];
};

// How the fused decode computes. F32 queries always use fp32 FMAs; F16/BF16
// queries use fp32 FMAs (SIMT) or tensor cores (mma.sync with operands in the
// query's type, fp32 accumulation; kernels/decode_mma.cuh). kComputeDefault is
// settled by decode_resolve_compute (below); a launch given it unresolved runs SIMT.
enum DecodeCompute : uint32_t { kComputeDefault = 0, kComputeSimt = 1, kComputeTensorCores = 2 };
// Page formats that decode faster on tensor cores (the bits of DecodeParams::formats).
constexpr uint32_t kTensorCoreFormats =
    (1u << IKV_FMT_INT8) | (1u << IKV_FMT_FP8_E4M3) | (1u << IKV_FMT_INT4);

// Fewest 16-row chunks per CTA for which kComputeDefault takes tensor cores.
// Measured on the H100 (bench/RESULTS.md section 1, both paths side by side,
// 2026-11-23): with INT8/FP8/INT4 pages tensor cores make the step
// bandwidth-bound (dense INT8 B = 32, 32K: 1.32 -> 0.90 ms) once each CTA has
// ~40 chunks; at ~21 they tie and at ~10 (B = 1, 8K; a 25% selection of 32K)
// SIMT is 8-20% faster, since a CTA with 8 padded mma rows has a longer
// critical path per chunk. F16/BF16 pages are bandwidth-bound on SIMT already
// (95-100% of copy bandwidth at B >= 8) and lose 1-12% on tensor cores.
constexpr uint64_t kTcMinChunksPerCta = 24;
// On a device whose memory feeds each SM this fast or faster, F16/BF16 pages
// too decode faster on tensor cores: SIMT's fp32 FMAs per SM stop keeping up
// with the bytes. Measured (bench/RESULTS.md section 0): H200 (4.8 TB/s, 132
// SMs: ~36 GB/s per SM) dense F16 1.04-1.33x faster on tensor cores, a 25%
// plan 1.05-1.27x where a CTA has >= kTcMinChunksPerCta chunks; H100 SXM
// (3.35 TB/s: ~25 GB/s per SM) 1-12% slower.
constexpr double kTc16BitMinGBpsPerSm = 30.0;
// Query rows per kv-head (n_query_tokens x group) up to which SIMT is
// considered: past them (a multi-token step such as a speculative draft, or
// one token of a group above 4, e.g. G = 8) SIMT would run CTAs of 8 rows at
// one CTA per SM, re-reading the pages for every 8 rows, where tensor cores
// take 8 or 16 rows at 3 or 2 CTAs per SM. Measured on the H100
// (bench/RESULTS.md section 5b, 2026-11-27; G = 4, F16 pages): 2 to 16 query
// tokens (8 to 64 rows) 2.2-7.0x faster on tensor cores; 4 rows (one token)
// stay on SIMT, 1.01-1.07x faster there. G = 8 at one token is the 8-row
// case measured as T = 2 at G = 4. Tensor cores take 16-bit operands: with
// F16 queries, page values past f16's range (BF16 pages, large scales) do
// not survive (docs/CUDA.md).
constexpr uint32_t kSimtMaxQueryRows = 4;
// Peak memory bandwidth of a device per SM, GB/s, from its memory clock and
// bus width (0 when the device does not say).
double device_memory_gbps_per_sm(int device);
// The compute p runs on: p.compute unless kComputeDefault; then tensor cores
// for F16/BF16 queries with more than kSimtMaxQueryRows query rows per
// kv-head, or when p.formats has a kTensorCoreFormats bit (or, with
// mem_gbps_per_sm >= kTc16BitMinGBpsPerSm, any bit) and the longest list
// (max_rows rows) gives every CTA at least kTcMinChunksPerCta chunks at the
// split count SIMT would use on n_sms SMs; SIMT otherwise.
uint32_t decode_resolve_compute(const DecodeParams &p, uint32_t max_rows, int n_sms, double mem_gbps_per_sm);
// Whether the fused decode can launch p: its grid's y (kv-heads x row chunks
// of the compute p.compute settles to) and z (sequences) within CUDA's 65535.
bool decode_grid_fits(const DecodeParams &p);
// Splits the launcher picks for a shape on a device with n_sms SMs.
uint32_t decode_choose_splits(const DecodeParams &p, int n_sms);
// Scratch bytes decode needs for p with n_splits splits (partials of the split-K merge).
uint64_t decode_workspace_bytes(const DecodeParams &p, uint32_t n_splits);
// Enqueue the fused decode (+ merge). p.n_splits must be set (>= 1).
// Returns cudaErrorInvalidValue for an unsupported head_dim.
// room: a decode that appends (its fused variants; cuda_decode.cpp decides), else nullptr.
// sums: a decode with attention feedback (ChunkSums below; not with room), else nullptr.
struct ChunkSums;
cudaError_t launch_decode(const DecodeParams &p, cudaStream_t stream, const RoomArgs *room = nullptr,
                          const ChunkSums *sums = nullptr);

// ------------------------------------------- multi-token path (cuBLASLt) --
// Device pieces around the cuBLASLt GEMMs of the multi-token path
// (kernels/multi_token_attention.cu; orchestration in src/cuda/cuda_multi_token.cpp).
// They read a DecodeParams (shape, layer, lists, seq_len, q, out, lse, softcap).
// Operands are 16-bit: f16, or bf16 (bf16 = true) when q is bf16. A (seq,
// kv-head) pair is bh = seq * n_kv_heads + head; M = T * G query rows per bh.

// qs[bh][M][D] = q in operand precision (row r = t*G + g); O = 0, m = -inf, l = 0.
cudaError_t launch_mt_stage(const DecodeParams &p, bool bf16, uint16_t *qs, float *O, float *m, float *l,
                            cudaStream_t stream);
// offsets[list][i] (stride lists.stride + 1) = rows of the list's entries before i, i <= count.
cudaError_t launch_mt_offsets(const DecodeParams &p, uint32_t n_lists, uint32_t *offsets, cudaStream_t stream);
// Key tile: tokens [tok0, tok0 + nk) of the lists of bh0 .. bh0+nbh-1, dequantized
// into K, V [nbh][nk][D] with positions pos [nbh][nk] (0xFFFFFFFF past a list's end).
cudaError_t launch_mt_gather(const DecodeParams &p, bool bf16, const uint32_t *offsets, uint32_t bh0, uint32_t nbh,
                             uint32_t tok0, uint32_t nk, uint16_t *K, uint16_t *V, uint32_t *pos,
                             cudaStream_t stream);
// S [nbh][M][nk] (fp32 scaled logits) -> softcap, causal mask, online softmax
// state m, l [bh][M]; P written in place (row i's 16-bit values at
// (uint16_t *)(S + i*nk)); O [bh][M][D] rescaled for O += P V. nk % 128 == 0.
cudaError_t launch_mt_softmax(const DecodeParams &p, bool bf16, uint32_t bh0, uint32_t nbh, uint32_t nk,
                              const uint32_t *pos, float *S, float *O, float *m, float *l, cudaStream_t stream);
// out = O / l in out_dtype, lse = m + log(l); out 0 and lse -inf where l == 0.
cudaError_t launch_mt_finalize(const DecodeParams &p, const float *O, const float *m, const float *l,
                               cudaStream_t stream);

// ------------------------------------------------------ attention feedback --
// After a decode of p (p.lse set: the rows' log-sum-exp it wrote), the
// softmax share each entry of p.lists received (kernels/attention_feedback.cu),
// per (sequence, kv-head) bh = b * n_kv_heads + h: counts[bh] entries, entry i's
// share at shares[bh * stride + i] and its page (pos0 / page_size) at
// pages[bh * stride + i], in list order. stride >= p.lists.stride. n_sms:
// the device's SMs (sizes the grid; 0: assume 132).
struct FeedbackOut {
    float *shares;
    uint32_t *pages;
    uint32_t *counts;
    uint32_t stride;
};
cudaError_t launch_attention_feedback(const DecodeParams &p, const FeedbackOut &o, int n_sms, cudaStream_t stream);

// The same shares without reading the keys again: the fused decode's feedback
// variants (launch_decode with sums) write, per (sequence, kv-head) bh, chunk
// of its list (entry e's chunks e * cpp .. e * cpp + cpp - 1, cpp = page_size
// / 16 or 1) and query row r, the row's running max m after the chunk (base-2
// scaled logits; -inf while nothing was read) and the sum l of
// exp2(logit - m) over the chunk's keys at
// sums[((bh * chunks_per_list + chunk) * rows + r) * 2 + {0, 1}], rows =
// T * G; launch_feedback_from_chunks turns them into o with p.lse:
// share = sum over chunks and rows of l * exp2(m - lse * log2 e) / rows.
// bytes: 8 * n_seqs * n_kv_heads * chunks_per_list * rows.
struct ChunkSums {
    float *sums;
    uint32_t chunks_per_list;  // >= lists.stride * cpp
};
uint64_t chunk_sums_bytes(const DecodeParams &p, uint32_t list_stride);  // lists of list_stride entries
uint32_t chunks_per_entry(const DecodeParams &p);  // cpp
cudaError_t launch_feedback_from_chunks(const DecodeParams &p, const ChunkSums &c, const FeedbackOut &o,
                                        cudaStream_t stream);

// --------------------------------------------------------- score + top-k --
constexpr uint32_t kMaxTopkCandidates = 8192;

struct TopkParams {
    PageShape shape;
    uint32_t layer;
    uint32_t n_seqs;
    uint32_t n_q_heads;
    uint32_t n_query_tokens;
    const void *q;            // device, as DecodeParams::q; query token 0 of each sequence is scored
    ikv_dtype q_dtype;
    DevLists candidates;      // list_heads must be 1: candidates per sequence (flags: MANDATORY kept)
    uint32_t max_candidates;  // upper bound of candidates.counts[i], <= kMaxTopkCandidates
    uint32_t token_budget;
    float *scores;            // device scratch [n_seqs * n_kv_heads * max_candidates]
    // IKV_TOPK_SCORE_HYBRID: rows is device scratch [n_seqs * n_kv_heads * group * max_candidates]
    // for the per-head sums before their shift (nullptr: Quest bounds).
    bool hybrid;
    float *rows;
    // IKV_TOPK_MASS: budgets is device scratch [n_seqs * n_kv_heads] that
    // mass_budget_kernel fills and the select kernel reads instead of
    // token_budget (then the cap, 0 = none); nullptr: the fixed budget.
    uint32_t *budgets;
    double *weights;       // device scratch [n_seqs * n_kv_heads * max_candidates]: each candidate's weight
    float mass_share;      // estimated share of the bounds' weight to cover, (0, 1]
    uint32_t min_tokens;   // the budget's floor
    float scale;           // the logit scale (scores are of the unscaled query)
    DevPage *out_pages;       // device [n_seqs * n_kv_heads * max_candidates]
    uint32_t *out_counts;     // device [n_seqs * n_kv_heads]
    // A query memory (ikv_query_memory): mem_rows [n_seqs][n_kv_heads][group][D]
    // holds each head's recalled query (unscaled) and mem_ok [n_seqs * n_kv_heads]
    // whether there is one; both written by the recall kernel that
    // launch_score_topk runs first when given a MemoryRecall. The group's
    // scores are then taken over 2 * group rows, the recalled ones
    // mem_offset (= log(decay) / scale) lower; without a memory (or where
    // mem_ok is 0) they are the current queries' alone.
    float *mem_rows;
    uint32_t *mem_ok;
    float mem_offset;
    // The attention-feedback prior (ikv_decode_args.topk_feedback_weight):
    // prior [n_seqs * n_kv_heads * max_candidates] holds log(weight * ema) / scale
    // of each candidate's page, -inf where it has none; prior_on
    // [n_seqs * n_kv_heads] whether anything was fed back there (else its
    // scores stay as they are). nullptr: no prior. Applied after the scores
    // (and the hybrid shift), before the mass budget and the selection, as
    // decode/selection.cpp's apply_feedback_prior does on the CPU.
    const float *prior;
    const uint32_t *prior_on;
    // IKV_TOPK_SCORE_KEYS' first pass: > 1 makes the select kernel take
    // candidates for M + candidate_factor * (budget - M) tokens (M: the
    // mandatory tokens; budget > M), as decode/selection.hpp's
    // keys_candidate_budget does; 0 or 1: the budget itself.
    uint32_t candidate_factor;
};

// The device copies of a query memory for the sequences of one call
// (src/cuda/cuda_query_memory.cpp writes them). A sequence's block holds
// uint32 {filled, next} per layer (padded to 16 bytes: mem_block_header_bytes),
// then fp32 m[layer][slot][n_q_heads][head_dim], as the host memory keeps
// them: slot (next + slots - 1 - age) % slots holds the turn ended `age`
// turns before the last. Null block: nothing remembered.
constexpr uint32_t kMaxMemorySeqs = 256;  // sequences per call with a query memory (kernel argument space)
struct MemoryRecall {
    uint32_t n_layers;
    uint32_t slots;  // max(turns, 1)
    const uint8_t *blocks[kMaxMemorySeqs];
};
constexpr uint64_t mem_block_header_bytes(uint32_t n_layers) { return (uint64_t(n_layers) * 8 + 15) / 16 * 16; }

// Quest upper bound per candidate page and kv-head (max over the group's
// query heads of sum_d max(q_d*kmin_d, q_d*kmax_d); with p.hybrid the
// header's IKV_TOPK_SCORE_HYBRID score: each head's sums shifted by its best
// over the non-mandatory candidates, in the select or mass kernel or a kernel
// of its own), then per (seq, kv-head)
// the mandatory pages plus the best others in descending bound order (ties:
// lower list index first) while the running token count (mandatory first)
// stays within token_budget; the first page that does not fit ends the
// selection. Output lists keep candidate order. Writes out_pages/out_counts
// as a DevLists with stride max_candidates and list_heads n_kv_heads. With
// budgets set (IKV_TOPK_MASS) a kernel between score and select sizes each
// (seq, kv-head)'s budget from its scores (the header's rule, ties taken in
// candidate order as on the CPU).
// With mem (a query memory), a recall kernel first writes p.mem_rows and
// p.mem_ok: for each query head the remembered turn whose mean is the most
// similar (cosine, double) to its query token 0, the newest on equal
// cosines, as ikv_query_memory::recall does on the host.
cudaError_t launch_score_topk(const TopkParams &p, const MemoryRecall *mem, cudaStream_t stream);
constexpr uint32_t kMaxHybridGroup = 256;  // score rows per kv-head (query heads, with a memory twice) the hybrid shift handles

// The select kernel of launch_score_topk alone, on p.scores as they are: for
// candidates listed per (seq, kv-head) (p.candidates.list_heads n_kv_heads,
// stride p.max_candidates), as IKV_TOPK_SCORE_KEYS' second pass selects. No
// hybrid combine, no prior; p.budgets (when set) read as they are.
cudaError_t launch_topk_select(const TopkParams &p, cudaStream_t stream);

// IKV_TOPK_SCORE_KEYS' second pass (kernels/keys_rerank.cu): each
// non-mandatory entry of the first pass's lists (candidates, list_heads
// n_kv_heads) scored from its keys: scores[bh * candidates.stride + i] =
// log sum_r w_r exp(lse_r(i) - Z_r) over the scored rows r (the group's
// query heads at query token 0, scaled by scale, logits softcapped; then,
// where mem_ok[bh], the memory's recalled rows mem_rows (unscaled, as
// TopkParams::mem_rows) with log w_r = mem_log_weight, else w_r = 1),
// lse_r(i) the log-sum-exp of the entry's logits, Z_r that over the
// non-mandatory candidates; mandatory entries -inf. lse: device scratch
// [n_seqs * n_kv_heads][candidates.stride][lse_rows], lse_rows >= the
// scored rows (<= kMaxKeysRows).
constexpr uint32_t kMaxKeysRows = 16;
struct KeysRerankParams {
    PageShape shape;
    uint32_t layer;
    uint32_t n_seqs;
    uint32_t n_q_heads;
    uint32_t n_query_tokens;
    const void *q;
    ikv_dtype q_dtype;
    float scale;
    float softcap;
    DevLists candidates;
    const float *mem_rows;   // nullptr: no memory
    const uint32_t *mem_ok;
    float mem_log_weight;    // log(decay)
    float *lse;
    uint32_t lse_rows;
    float *scores;
    int n_sms;               // the device's SMs (sizes the lse kernel's grid); 0: assume 132
};
cudaError_t launch_keys_rerank(const KeysRerankParams &p, cudaStream_t stream);

// ------------------------------------------------------ quantize-on-write --
// Quantize one layer of a page from fp32 rows in device memory: k, v are
// [H][P][D] (row r of head h at k + (h*P + r)*D); rows n_valid..P-1 are
// written as zeros. Bytes equal write_subpage()'s; then the layer's key
// summaries (k_min, k_max, k_mean of the stored keys, as the host store
// computes them) are written. fold_stage: a staging buffer (StageFold, below)
// whose folds this write refreshes, or nullptr.
cudaError_t launch_quantize_layer(const PageShape &shape, ikv_format f, uint8_t *page, uint32_t layer,
                                  const float *k, const float *v, uint32_t n_valid, float *fold_stage,
                                  cudaStream_t stream);

// ------------------------------------------------ appends from the device --

// A CUDA store's staging buffer (one per sequence and layer with a partial
// tail page): K [H][P][D] then V [H][P][D] fp32 rows, then the running folds
// of the tail page's key summaries, as quantize-on-write computes them
// (quantize_pages.cu): min [H][D] f32, max [H][D] f32, sum [H][D] f64, and
// per head the rows they cover [H] u32. An append of F16/BF16 rows continues
// the folds instead of re-reading every stored key.
struct StageFold {
    float *mn, *mx;
    double *sum;
    uint32_t *rows;
};
IKV_HD uint64_t stage_rows_floats(const PageShape &s) { return 2ull * s.n_kv_heads * s.page_size * s.head_dim; }
IKV_HD uint64_t stage_buffer_bytes(const PageShape &s) {
    return stage_rows_floats(s) * 4 + uint64_t(s.n_kv_heads) * s.head_dim * 16 + 4ull * s.n_kv_heads;
}
IKV_HD StageFold stage_fold(const PageShape &s, float *stage) {
    const uint64_t HD = uint64_t(s.n_kv_heads) * s.head_dim;
    float *base = stage + stage_rows_floats(s);  // 8-byte aligned: head_dim is even
    double *sum = reinterpret_cast<double *>(base + 2 * HD);
    return StageFold{base, base + HD, sum, reinterpret_cast<uint32_t *>(sum + HD)};
}

// One page write of an append: input tokens [token0, token0+rows) of `layer`
// go to rows [row0, row0+rows) of every head of `stage` (K [H][P][D] then V),
// then the layer of `page` is quantized from stage rows [0, row0+rows).
// A job with stage == nullptr and row0 = rows = 0 writes the layer empty (as
// launch_quantize_layer with n_valid = 0: fresh pages).
struct AppendJob {
    uint8_t *page;
    float *stage;
    uint32_t layer, token0, row0, rows;
    uint32_t format;  // ikv_format
    uint32_t seq;     // the sequence (ikv_seq_id), for AppendError
};

// Where the staging kernel found a non-finite input element (asynchronous
// appends skip the host's check). `claimed` goes 0 -> 1 once; the thread
// that claims it writes the rest. The token is the sequence's own (not the
// batch numbering). Zero-initialized by its owner.
struct AppendError {
    uint32_t claimed;
    uint32_t seq, layer, token, head, channel, which, is_nan;
};

// First non-finite element of layers [l0, l0+n_layers) x n_tokens x heads x
// head_dim of K, then V, in that order: *first (device) is lowered by
// atomicMin to ((((which*n_layers + l-l0)*n_tokens + t)*H + h)*D + d)*2 + (inf ? 1 : 0);
// the caller sets it to ~0 first.
cudaError_t launch_find_nonfinite(const PageShape &shape, const AppendRows &in, uint32_t l0, uint32_t n_layers,
                                  uint32_t n_tokens, unsigned long long *first, cudaStream_t stream);
// Where a launch's jobs are: a device array, or host memory copied into the
// launch's parameters (at most kInlineJobs jobs: no upload and no buffer to
// keep alive, which is what a one-token append of a small batch needs).
enum class JobsIn { kDevice, kHost };
constexpr uint32_t kInlineJobs = 64;

// n_jobs page writes of an append (their stages must be distinct), one block
// per (job, kv-head): the job's input rows of that head converted to fp32
// into its stage (a non-finite element is staged as 0 and, if *error is
// unclaimed, recorded there; checked appends never have one), then the page
// layer's sub-page quantized from stage rows [0, row0 + rows). only_format:
// the format every job has (a kernel compiled for that format alone runs),
// or -1 (the kernel for all formats).
cudaError_t launch_append_jobs(const PageShape &shape, const AppendRows &in, const AppendJob *jobs, JobsIn where,
                               uint32_t n_jobs, int only_format, AppendError *error, cudaStream_t stream);
// Jobs without input: each page layer written empty (fresh pages; stage null).
cudaError_t launch_quantize_jobs(const PageShape &shape, const AppendJob *jobs, JobsIn where, uint32_t n_jobs,
                                 cudaStream_t stream);

// ---------------------------------------------- room reserved ahead ------
// A sequence's room (ikv_pool_reserve) in device memory, written by the host
// (src/cuda/cuda_page_store.cpp) while the device is idle and at a fixed
// address for the room's life, so a graph captured once keeps reading it.
// Appends (launch_room_append) write at lengths[layer] and advance it;
// decodes read it (launch_room_clip).
struct RoomRecord {
    uint32_t page_first;  // page index of pages[0]
    uint32_t n_pages;     // pages [page_first, page_first + n_pages) hold positions up to end
    uint32_t end;         // positions < end have a page
    uint32_t overrun;     // 0, or 1 + the first layer an append would have passed end at
    uint32_t stale_read;  // 1: a decode or append of a graph captured against an earlier room ran
    uint32_t seq;         // the sequence (ikv_seq_id), for AppendError
    uint32_t generation;  // changes with every room the record holds (and when it retires)
    uint32_t *lengths;        // [n_layers] tokens stored per layer
    uint8_t *const *pages;    // [n_pages]
    const uint32_t *formats;  // [n_pages] ikv_format
    float *const *stages;     // [n_layers] fp32 staging of the layer's tail page
    uint32_t *tickets;        // [n_layers] zero between appends: an append's blocks count in (quantize_pages.cu)
};

// A record is one allocation (src/cuda/device_rooms.hpp): the header, then
// lengths [n_layers], tickets [n_layers] and stages [n_layers] (8-aligned) at
// these offsets, so a kernel that knows the record's address reaches a
// layer's length or staging pointer in one load instead of two.
IKV_HD uint64_t room_lengths_offset() { return sizeof(RoomRecord); }
IKV_HD uint64_t room_tickets_offset(uint32_t n_layers) { return room_lengths_offset() + 4ull * n_layers; }
IKV_HD uint64_t room_stages_offset(uint32_t n_layers) { return (room_tickets_offset(n_layers) + 4ull * n_layers + 7) / 8 * 8; }
IKV_HD uint64_t room_record_bytes(uint32_t n_layers) { return room_stages_offset(n_layers) + 8ull * n_layers; }

// One append to sequences with room: n_tokens (<= page_size) tokens per
// sequence to layers [l0, l0 + n_layers), sequence i's rows numbered from
// i * n_tokens in `in` (batch numbering). n_seqs <= kMaxRoomSeqs.
constexpr uint32_t kMaxRoomSeqs = 1024;
struct RoomAppend {
    uint32_t n_seqs, l0, n_layers, n_tokens;
    RoomRecord *const *records;    // host array [n_seqs]: copied into the launches' parameters
    const uint32_t *generations;   // host array [n_seqs]: each record's generation now (a replay
                                   // of another generation appends nothing and sets stale_read)
};
// Stage + quantize at each (sequence, layer)'s device length (the tokens that
// fit in its page, then, in a second launch when n_tokens > 1, those that
// spill into the next page); the last launch's blocks advance the lengths. An
// append that would pass a room's end writes nothing there and sets its overrun.
cudaError_t launch_room_append(const PageShape &shape, const AppendRows &in, const RoomAppend &a, int only_format,
                               AppendError *error, cudaStream_t stream);

// restore: the room's entries written back in full and the counts to the
// room's end, lengths untouched (what a decode that appends reads; see FusedAppend).
cudaError_t launch_room_clip(const RoomTail *tails, uint32_t n_tails, const DevPage *full, DevPage *pages,
                             uint32_t stride, uint32_t *counts, uint32_t *seq_len, uint32_t layer, bool restore,
                             cudaStream_t stream);


}  // namespace cuda
}  // namespace ikv
