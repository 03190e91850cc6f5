// The interface between the decoder (src/decode/) and the SIMD attention
// kernels (src/cpu/attn_*.cpp). Plain structs only: the ISA files include
// this and nothing with inline functions shared with other files, so no
// function compiled with AVX flags can be picked by the linker for a caller
// on another path (one-definition-rule hazard of per-file ISA flags).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/page_format.hpp"  // SubpageLayout (a plain struct) and ikv_format

namespace ikv {

// A run of consecutive tokens of one sub-page (one page, layer, kv-head).
struct SpanRef {
    const uint8_t *sub;  // sub-page base
    uint32_t fmt;        // ikv_format of the page
    uint32_t begin;      // first token, local to the page (0..P-1)
    uint32_t end;        // one past the last, local (begin < end <= P)
    uint32_t pos0;       // absolute position of the page's local token 0
};

// One work item: the query rows of one kv-head group over a chunk of spans.
// Rows are r = t * group + g (query token t, query head g of the group).
struct ChunkTask {
    const SpanRef *spans;
    uint32_t n_spans;
    const float *q;        // [R][D] fp32, already multiplied by the scale
    uint32_t R;            // n_qt * group
    uint32_t group;        // query heads per kv-head
    uint32_t D;            // head_dim (a multiple of 16)
    uint32_t P;            // page_size
    uint32_t q_pos0;       // position of query token 0; token t sits at q_pos0 + t
    float softcap;         // 0 = off
    const SubpageLayout *layouts;  // [IKV_FMT_COUNT] for (P, D)
    // Scratch (per worker): logits [R][logit_stride(P)], qfold [R][D], and one sub-page's
    // dequantized K and V rows, kspan [P][D] and vspan [P][D] (at most
    // 128 x 256 floats each: a page, never the context).
    float *logits;
    float *kspan;
    float *vspan;
    float *qfold;  // [R][D]: the query with a page's K scales folded in (INT8, FP8)
    // Output: partial online-softmax state of the chunk (max, denominator, and
    // unnormalized accumulator) so chunks merge exactly by log-sum-exp.
    float *m;    // [R]
    float *l;    // [R]
    float *acc;  // [R][D]
};

// Row stride of ChunkTask::logits: P rounded up to a whole number of the
// widest vector (16 lanes), so exp runs on full vectors.
constexpr uint32_t logit_stride(uint32_t P) { return (P + 15u) / 16u * 16u; }

using AttendChunkFn = void (*)(const ChunkTask &task);
// n tasks with the same number of spans over the same pages (the kv-heads of
// one sequence), interleaved span by span; each task's result is the one
// AttendChunkFn computes.
using AttendChunksFn = void (*)(const ChunkTask *tasks, uint32_t n);

// Quest bounds of n candidate pages for one kv-head (src/decode/selection.hpp):
// bounds[i] = max over the group's query heads g of
//   sum_d qpos[g][d] * kmax_i[d] + qneg[g][d] * kmin_i[d],
// with qpos = max(q, 0) and qneg = min(q, 0), which is
// sum_d max(q_d * kmin_d, q_d * kmax_d) since kmin <= kmax (two FMAs, no
// per-channel select). records[i] is page i's key-summary record (bf16
// k_min[D], k_max[D], k_mean[D], page_format.hpp).
// With qmid set (IKV_TOPK_SCORE_HYBRID) each sum also has the mean key's
// term qmid[g][d] * kmean_i[d] (the caller passes halved queries, so this is
// the hybrid's s_ig); with rows set the kernel writes every row's sum,
// rows[i * group + g], instead of their max.
struct QuestTask {
    const uint8_t *const *records;
    uint32_t n;
    const float *qpos;  // [group][D]
    const float *qneg;  // [group][D]
    uint32_t group;
    uint32_t D;         // a multiple of 16
    float *bounds;      // [n] (Quest)
    const float *qmid = nullptr;  // [group][D]: hybrid
    float *rows = nullptr;        // [n][group]: per-row sums
};

using QuestBoundsFn = void (*)(const QuestTask &task);

// The kernels of one ISA path.
struct CpuKernels {
    const char *isa;
    AttendChunkFn attend_chunk;
    QuestBoundsFn quest_bounds;
    AttendChunksFn attend_chunks;
};

// Defined by the ISA files; only those this architecture compiles exist.
const CpuKernels &cpu_kernels_scalar();
const CpuKernels &cpu_kernels_avx2();
const CpuKernels &cpu_kernels_avx512();
const CpuKernels &cpu_kernels_avx512_vnni();  // the AVX-512 path with integer INT8 values
const CpuKernels &cpu_kernels_neon();

}  // namespace ikv
