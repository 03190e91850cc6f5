// Quantize-on-write: one layer of a page from fp32 rows in device memory
// (one launch per page layer; one launch per round of an append's page
// writes, each block first staging its input rows (stage_rows.cuh); or one
// for the empty layers of an append's fresh pages).
// One block per kv-head (sub-page). Every byte equals what the host's
// write_subpage() (common/quant.hpp) writes for the same input: the same
// scalar functions, the same per-group reductions (max/min are exact in any
// order), true IEEE division, and each packed INT4 byte written by one thread.
// Then the key summaries are recomputed from the stored keys exactly as the
// host store does (float min/max, double sum in token order, no FMA).
#include <cuda_runtime.h>
#include <math.h>

#include "append_f16_rows.cuh"
#include "common/quant.hpp"
#include "ikv_kernels.h"
#include "launch_pdl.cuh"
#include "room_lists.cuh"
#include "stage_rows.cuh"

namespace ikv {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kMaxRowsPerPage = 128;  // the pool's largest page_size

// Block-wide max of non-negative values (0 if none).
__device__ float block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float m = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, red[w]);
    return m;
}

// store(i, load(i)) for i = first, first + stride, ... < n, with kBatch loads
// issued before their stores. Why: the page bytes are written through byte
// pointers, which may alias the fp32 staging as far as the compiler knows, so
// a plain loop waited one load round trip per element (ncu, 2048-token F16
// append: the quantize kernel at 16% of DRAM bandwidth, 177 us a launch).
template <class Load, class Store>
__device__ __forceinline__ void batched(uint32_t first, uint32_t n, uint32_t stride, Load load, Store store) {
    constexpr uint32_t kBatch = 8;
    for (uint32_t i0 = first; i0 < n; i0 += kBatch * stride) {
        float x[kBatch];
#pragma unroll
        for (uint32_t b = 0; b < kBatch; ++b) x[b] = i0 + b * stride < n ? load(i0 + b * stride) : 0.0f;
#pragma unroll
        for (uint32_t b = 0; b < kBatch; ++b)
            if (i0 + b * stride < n) store(i0 + b * stride, x[b]);
    }
}

// Dequantized key (t, d) as read_subpage_row computes it, without FMA contraction.
__device__ __forceinline__ float stored_key(ikv_format f, const SubpageLayout &L, uint32_t D, const uint8_t *sub,
                                            uint32_t t, uint32_t d) {
    const uint8_t *data = sub + L.k + t * row_bytes(f, D);
    const float *sc = reinterpret_cast<const float *>(sub + L.k_scale);
    switch (f) {
        case IKV_FMT_F16: return f16_to_f32(reinterpret_cast<const uint16_t *>(data)[d]);
        case IKV_FMT_BF16: return bf16_to_f32(reinterpret_cast<const uint16_t *>(data)[d]);
        case IKV_FMT_FP8_E4M3: return __fmul_rn(e4m3_to_f32(data[d]), sc[0]);
        case IKV_FMT_INT8: return __fmul_rn(float(int8_t(data[d])), sc[d]);
        case IKV_FMT_INT4: {
            const uint32_t q = d & 1 ? data[d / 2] >> 4 : data[d / 2] & 0xFu;
            const uint16_t *sch = reinterpret_cast<const uint16_t *>(sub + L.k_scale);
            const uint16_t *mnh = reinterpret_cast<const uint16_t *>(sub + L.k_min);
            return __fadd_rn(__fmul_rn(float(q), f16_to_f32(sch[d])), f16_to_f32(mnh[d]));
        }
        default: return 0.0f;
    }
}

// Sub-page h of one layer of a page (one block of kThreads threads).
// kFmt >= 0: compiled for that format alone (f_any is ignored), so the other
// formats' code is not in the kernel: a short launch that starts cold spends
// half its stalls fetching instructions (bench/RESULTS.md 1j).
// fold: the staging buffer whose StageFold this write refreshes (k is its
// start), or nullptr when k is not a staging buffer.
template <int kFmt = -1>
__device__ void quantize_subpage(const PageShape &shape, ikv_format f_any, uint8_t *page, uint32_t layer, uint32_t h,
                                 const float *k, const float *v, uint32_t n_valid, float *fold_stage = nullptr) {
    const ikv_format f = kFmt >= 0 ? ikv_format(kFmt) : f_any;
    __shared__ float red[kThreads / 32];
    const uint32_t P = shape.page_size, D = shape.head_dim;
    const SubpageLayout L = subpage_layout(f, P, D);
    uint8_t *sub = page + subpage_offset(shape, f, layer, h);
    const uint32_t tid = threadIdx.x;

    // Sub-pages and their sections start on 16-byte boundaries (page_format.hpp).
    for (uint64_t o = tid; o < L.bytes / 16; o += kThreads) reinterpret_cast<uint4 *>(sub)[o] = make_uint4(0, 0, 0, 0);
    for (uint64_t o = L.bytes / 16 * 16 + tid; o < L.bytes; o += kThreads) sub[o] = 0;
    __syncthreads();

    for (int which = 0; which < 2; ++which) {
        const float *src = n_valid ? (which == 0 ? k : v) + uint64_t(h) * P * D : nullptr;  // no rows: no staging
        uint8_t *data = sub + (which == 0 ? L.k : L.v);
        const uint64_t rb = row_bytes(f, D);
        auto in = [src](uint32_t e) { return src[e]; };
        if (f == IKV_FMT_F16 || f == IKV_FMT_BF16) {
            uint16_t *out = reinterpret_cast<uint16_t *>(data);
            batched(tid, n_valid * D, kThreads, in,
                    [&](uint32_t e, float x) { out[e] = narrow16(x, f == IKV_FMT_F16); });
        } else if (f == IKV_FMT_FP8_E4M3) {
            float amax = 0.0f;
            for (uint32_t e = tid; e < n_valid * D; e += kThreads) amax = fmaxf(amax, fabsf(src[e]));
            const float s = fp8_scale(block_max(amax, red));
            if (tid == 0) *reinterpret_cast<float *>(sub + (which == 0 ? L.k_scale : L.v_scale)) = s;
            batched(tid, n_valid * D, kThreads, in, [&](uint32_t e, float x) { data[e] = f32_to_e4m3(x / s); });
        } else if (f == IKV_FMT_INT8) {
            float *scales = reinterpret_cast<float *>(sub + (which == 0 ? L.k_scale : L.v_scale));
            if (which == 0) {
                for (uint32_t d = tid; d < D; d += kThreads) {
                    float amax = 0.0f;
                    for (uint32_t t = 0; t < n_valid; ++t) amax = fmaxf(amax, fabsf(src[t * D + d]));
                    const float s = int8_scale(amax);
                    scales[d] = s;
                    batched(0, n_valid, 1, [&](uint32_t t) { return src[t * D + d]; },
                            [&](uint32_t t, float x) { data[t * rb + d] = uint8_t(quant_int8(x, s)); });
                }
            } else {  // V: one warp per token, its lanes across the channels (max is exact in any order)
                const uint32_t lane = tid % 32;
                for (uint32_t t = tid / 32; t < n_valid; t += kThreads / 32) {
                    float amax = 0.0f;
                    for (uint32_t d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(src[t * D + d]));
                    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
                    const float s = int8_scale(amax);
                    if (lane == 0) scales[t] = s;
                    batched(lane, D, 32, [&](uint32_t d) { return src[t * D + d]; },
                            [&](uint32_t d, float x) { data[t * rb + d] = uint8_t(quant_int8(x, s)); });
                }
            }
        } else if (f == IKV_FMT_INT4) {
            uint16_t *scales = reinterpret_cast<uint16_t *>(sub + (which == 0 ? L.k_scale : L.v_scale));
            uint16_t *mins = reinterpret_cast<uint16_t *>(sub + (which == 0 ? L.k_min : L.v_min));
            if (which == 0) {  // one thread per channel pair: it owns the packed bytes
                for (uint32_t j = tid; j < D / 2; j += kThreads) {
                    uint8_t packed[kMaxRowsPerPage];
                    for (uint32_t t = 0; t < n_valid; ++t) packed[t] = 0;
                    for (uint32_t d = 2 * j; d < 2 * j + 2; ++d) {
                        float lo = INFINITY, hi = -INFINITY;
                        for (uint32_t t = 0; t < n_valid; ++t) {
                            lo = fminf(lo, src[t * D + d]);
                            hi = fmaxf(hi, src[t * D + d]);
                        }
                        if (n_valid == 0) lo = hi = 0.0f;
                        const Int4Params g = int4_params(lo, hi);
                        scales[d] = g.scale_h;
                        mins[d] = g.min_h;
                        for (uint32_t t = 0; t < n_valid; ++t) {
                            const uint8_t q = quant_int4(src[t * D + d], g.min, g.scale);
                            packed[t] |= uint8_t(d & 1 ? q << 4 : q);
                        }
                    }
                    for (uint32_t t = 0; t < n_valid; ++t) data[t * rb + j] = packed[t];
                }
            } else {  // one warp per (token, group of 32 channels): lane = channel of the group
                static_assert(kInt4VGroup == 32, "a warp per V group");
                const uint32_t G = int4_v_groups(D), lane = tid % 32;
                for (uint32_t e = tid / 32; e < n_valid * G; e += kThreads / 32) {
                    const uint32_t t = e / G, g = e % G;
                    const uint32_t d0 = g * kInt4VGroup, d1 = d0 + kInt4VGroup < D ? d0 + kInt4VGroup : D;
                    const uint32_t d = d0 + lane;
                    const float x = d < d1 ? src[t * D + d] : 0.0f;
                    float lo = d < d1 ? x : INFINITY, hi = d < d1 ? x : -INFINITY;  // min/max: exact in any order
                    for (int o = 16; o > 0; o >>= 1) {
                        lo = fminf(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, o));
                        hi = fmaxf(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, o));
                    }
                    const Int4Params ip = int4_params(lo, hi);
                    if (lane == 0) scales[t * G + g] = ip.scale_h, mins[t * G + g] = ip.min_h;
                    const uint32_t q = d < d1 ? quant_int4(x, ip.min, ip.scale) : 0u;
                    const uint32_t q_odd = __shfl_down_sync(0xFFFFFFFFu, q, 1);  // channel d + 1 (groups are even-sized)
                    if (d < d1 && (lane & 1) == 0) data[t * rb + d / 2] = uint8_t(q | q_odd << 4);
                }
            }
        }
        __syncthreads();
    }

    // Key summaries of the stored keys: each channel's keys are loaded kBatch
    // at a time (independent loads in flight), then folded in token order.
    constexpr uint32_t kBatch = 16;
    uint16_t *rec = reinterpret_cast<uint16_t *>(page + summary_offset(shape, f, layer, h));
    for (uint32_t d = tid; d < D; d += kThreads) {
        float mn = INFINITY, mx = -INFINITY;
        double sum = 0.0;
        for (uint32_t t0 = 0; t0 < n_valid; t0 += kBatch) {
            float x[kBatch];
#pragma unroll
            for (uint32_t i = 0; i < kBatch; ++i) x[i] = t0 + i < n_valid ? stored_key(f, L, D, sub, t0 + i, d) : 0.0f;
#pragma unroll
            for (uint32_t i = 0; i < kBatch; ++i) {
                if (t0 + i >= n_valid) break;
                mn = fminf(mn, x[i]);
                mx = fmaxf(mx, x[i]);
                sum += double(x[i]);
            }
        }
        if (n_valid == 0) mn = mx = 0.0f;
        encode_summary(rec, D, d, mn, mx, n_valid == 0 ? 0.0 : sum / double(n_valid));
        if (fold_stage != nullptr && n_valid > 0) {  // keep the staging's folds for the next append
            const StageFold fold = stage_fold(shape, fold_stage);
            fold.mn[h * D + d] = mn, fold.mx[h * D + d] = mx, fold.sum[h * D + d] = sum;
        }
    }
    if (fold_stage != nullptr && n_valid > 0 && tid == 0) stage_fold(shape, fold_stage).rows[h] = n_valid;
}

__global__ void quantize_layer_kernel(PageShape shape, ikv_format f, uint8_t *page, uint32_t layer, const float *k,
                                      const float *v, uint32_t n_valid, float *fold_stage) {
    quantize_subpage(shape, f, page, layer, blockIdx.x, k, v, n_valid, fold_stage);
}

// Grids of (item, kv-head) pairs are flat in x (block = item * H + head):
// n_layers and n_kv_heads may each exceed grid y's 65535 limit.
bool flat_grid_ok(uint64_t items, uint32_t H) { return items * H <= 0x7FFFFFFFull; }

// A launch's jobs (JobsIn): read from device memory, or from the launch's
// parameters (__grid_constant__: indexed in place, never copied per thread).
struct DeviceJobs {
    const AppendJob *p;
    __device__ AppendJob at(uint32_t i) const { return p[i]; }
    __device__ void done(uint32_t) const {}  // nothing when a block is done (RoomJobs::done)
};
struct InlineJobs {
    AppendJob job[kInlineJobs];
    __device__ AppendJob at(uint32_t i) const { return job[i]; }
    __device__ void done(uint32_t) const {}
};

// The jobs of an append to sequences with room (RoomAppend), made on the
// device: job i is (sequence i / n_layers, layer l0 + i % n_layers), written
// at the length the device holds for it. Phase 0 writes the tokens that fit
// in the length's page, phase 1 those that spill into the next page. A job
// with nothing to write (no spill; past the room) has page == nullptr.
template <uint32_t N>
struct RoomJobs {
    uint32_t n_layers, l0, n_tokens, phase, P, H;
    RoomRecord *rec[N];
    uint32_t gen[N];
    __device__ AppendJob at(uint32_t i) const {
        const uint32_t s = i / n_layers, layer = l0 + i % n_layers;
        const RoomRecord &r = *rec[s];
        AppendJob j{nullptr, nullptr, layer, s * n_tokens, 0, 0, 0, r.seq};
        if (r.generation != gen[s]) return j;  // a graph of an earlier room: done() reports it
        const uint32_t pos = r.lengths[layer];
        j.stage = r.stages[layer];
        if (uint64_t(pos) + n_tokens > r.end) return j;  // past the room: done() reports it
        const uint32_t page = pos / P, off = pos % P, fit = min(P - off, n_tokens);
        const uint32_t k = page + phase - r.page_first;
        if (phase == 1 && fit == n_tokens) return j;
        j.page = r.pages[k];
        j.format = r.formats[k];
        j.row0 = phase == 0 ? off : 0;
        j.rows = phase == 0 ? fit : n_tokens - fit;
        j.token0 += phase == 0 ? 0 : fit;
        return j;
    }
    // Called by one thread of each of job i's H blocks once every thread of
    // its block has read the job (the length): in the last phase, the last
    // block to arrive advances the length (no block of this grid reads it
    // again), or records that the append would have passed the room. One
    // launch fewer than an advance kernel, which cost a kernel boundary of
    // every layer of a captured step.
    __device__ void done(uint32_t i) const {
        if (phase != (n_tokens > 1 ? 1u : 0u)) return;
        const uint32_t s = i / n_layers, layer = l0 + i % n_layers;
        RoomRecord &r = *rec[s];
        if (r.generation != gen[s]) {  // nothing was written: report the stale graph
            r.stale_read = 1;
            return;
        }
        __threadfence();  // this block's reads of the length come first
        if (atomicAdd(&r.tickets[layer], 1u) != H - 1) return;
        r.tickets[layer] = 0;
        advance_room_length(r, layer, *static_cast<volatile uint32_t *>(&r.lengths[layer]), n_tokens);
    }
};


// Fresh pages (item = job without staging): each page layer written empty.
// (Bounds: 3 blocks per SM = 80 registers, no spills; it used 96, 2 blocks.)
template <class Jobs>
__global__ void __launch_bounds__(kThreads, 3) quantize_jobs_kernel(PageShape shape, const __grid_constant__ Jobs jobs) {
    const uint32_t H = shape.n_kv_heads;
    const AppendJob j = jobs.at(blockIdx.x / H);
    const uint64_t half = uint64_t(H) * shape.page_size * shape.head_dim;
    quantize_subpage(shape, ikv_format(j.format), j.page, j.layer, blockIdx.x % H, j.stage,
                     j.stage ? j.stage + half : nullptr, j.row0 + j.rows);
}

// The page writes of an append (item = job): the block stages its head's
// input rows of K and V, then quantizes the sub-page from the staging. One
// launch where there were two (a staging kernel over (job, head, K|V) blocks,
// then this quantizer) plus their dependency: at B = 1 an asynchronous
// one-token append cost 15-27 us of a layer (bench/RESULTS.md 1j).
template <int kVec, class Jobs, int kFmt>
__global__ void __launch_bounds__(kThreads, 3)
    append_jobs_kernel(PageShape shape, AppendRows in, const __grid_constant__ Jobs jobs, AppendError *error) {
    const uint32_t H = shape.n_kv_heads, h = blockIdx.x % H;
    pdl_wait();  // the jobs, the input and the pages come from earlier work (kernels/launch_pdl.cuh)
    pdl_launch_dependents();
    const AppendJob j = jobs.at(blockIdx.x / H);
    if (j.page == nullptr) {  // a room job with nothing to write (RoomJobs)
        __syncthreads();
        if (threadIdx.x == 0) jobs.done(blockIdx.x / H);
        return;
    }
    // F16/BF16 pages continue the staging's folds where they cover the rows before this write.
    constexpr bool kMay16 = kFmt < 0 || kFmt == IKV_FMT_F16 || kFmt == IKV_FMT_BF16;
    const StageFold fold = stage_fold(shape, j.stage);
    const bool fast = kMay16 && (j.format == IKV_FMT_F16 || j.format == IKV_FMT_BF16) &&
                      (j.row0 == 0 || fold.rows[h] == j.row0);
    stage_head<kVec>(shape, in, j, h, 0, error);
    stage_head<kVec>(shape, in, j, h, 1, error);
    __syncthreads();  // staged rows visible to the block; every thread has read the job and the folds' rows
    if (threadIdx.x == 0) jobs.done(blockIdx.x / H);
    if constexpr (kMay16) {
        if (fast) {
            append_rows_f16<kFmt>(shape, j, h, fold);
            return;
        }
    }
    const uint64_t half = uint64_t(H) * shape.page_size * shape.head_dim;
    quantize_subpage<kFmt>(shape, ikv_format(j.format), j.page, j.layer, h, j.stage, j.stage + half, j.row0 + j.rows,
                           j.stage);  // a job's stage is a staging buffer (or a scratch stage of its size)
}

// One append launch: 4 channels per thread when the rows allow (vector_aligned).
template <int kFmt, class Jobs>
cudaError_t launch_append(const PageShape &shape, const AppendRows &in, const Jobs &jobs, uint32_t n_jobs,
                          AppendError *error, cudaStream_t stream) {
    const dim3 grid(n_jobs * shape.n_kv_heads), block(kThreads);
    return vector_aligned(shape, in)
               ? launch_pdl(append_jobs_kernel<4, Jobs, kFmt>, grid, block, 0, stream, shape, in, jobs, error)
               : launch_pdl(append_jobs_kernel<1, Jobs, kFmt>, grid, block, 0, stream, shape, in, jobs, error);
}

// The kernel for the jobs' one format where they share one, else the
// kernel for all formats.
template <class Jobs>
cudaError_t launch_append_for(int only_format, const PageShape &shape, const AppendRows &in, const Jobs &jobs,
                              uint32_t n_jobs, AppendError *error, cudaStream_t stream) {
    switch (only_format) {
        case IKV_FMT_F16: return launch_append<IKV_FMT_F16>(shape, in, jobs, n_jobs, error, stream);
        case IKV_FMT_BF16: return launch_append<IKV_FMT_BF16>(shape, in, jobs, n_jobs, error, stream);
        case IKV_FMT_FP8_E4M3: return launch_append<IKV_FMT_FP8_E4M3>(shape, in, jobs, n_jobs, error, stream);
        case IKV_FMT_INT8: return launch_append<IKV_FMT_INT8>(shape, in, jobs, n_jobs, error, stream);
        case IKV_FMT_INT4: return launch_append<IKV_FMT_INT4>(shape, in, jobs, n_jobs, error, stream);
        default: return launch_append<-1>(shape, in, jobs, n_jobs, error, stream);
    }
}

// Jobs of a launch as the kernels take them.
DeviceJobs device_jobs(const AppendJob *jobs) { return DeviceJobs{jobs}; }
InlineJobs inline_jobs(const AppendJob *jobs, uint32_t n) {
    InlineJobs out{};
    for (uint32_t i = 0; i < n; ++i) out.job[i] = jobs[i];
    return out;
}

bool shape_ok(const PageShape &shape) { return shape.page_size <= kMaxRowsPerPage && shape.head_dim % 16 == 0; }

}  // namespace

cudaError_t launch_quantize_jobs(const PageShape &shape, const AppendJob *jobs, JobsIn where, uint32_t n_jobs,
                                 cudaStream_t stream) {
    if (!shape_ok(shape) || !flat_grid_ok(n_jobs, shape.n_kv_heads)) return cudaErrorInvalidValue;
    if (n_jobs == 0) return cudaSuccess;
    const dim3 grid(n_jobs * shape.n_kv_heads);
    if (where == JobsIn::kDevice)
        return launch(quantize_jobs_kernel<DeviceJobs>, grid, dim3(kThreads), 0, stream, shape, device_jobs(jobs));
    if (n_jobs > kInlineJobs) return cudaErrorInvalidValue;
    return launch(quantize_jobs_kernel<InlineJobs>, grid, dim3(kThreads), 0, stream, shape, inline_jobs(jobs, n_jobs));
}

cudaError_t launch_append_jobs(const PageShape &shape, const AppendRows &in, const AppendJob *jobs, JobsIn where,
                               uint32_t n_jobs, int only_format, AppendError *error, cudaStream_t stream) {
    if (!shape_ok(shape) || !flat_grid_ok(n_jobs, shape.n_kv_heads)) return cudaErrorInvalidValue;
    if (n_jobs == 0) return cudaSuccess;
    if (where == JobsIn::kDevice)
        return launch_append_for(only_format, shape, in, device_jobs(jobs), n_jobs, error, stream);
    if (n_jobs > kInlineJobs) return cudaErrorInvalidValue;
    return launch_append_for(only_format, shape, in, inline_jobs(jobs, n_jobs), n_jobs, error, stream);
}

namespace {

// Both phases (the second only when tokens can spill into a next page; its
// blocks advance the lengths, RoomJobs::done).
template <uint32_t N>
cudaError_t launch_room(const PageShape &shape, const AppendRows &in, const RoomAppend &a, int only_format,
                        AppendError *error, cudaStream_t stream) {
    RoomJobs<N> jobs{};
    jobs.n_layers = a.n_layers;
    jobs.l0 = a.l0;
    jobs.n_tokens = a.n_tokens;
    jobs.P = shape.page_size;
    jobs.H = shape.n_kv_heads;
    for (uint32_t i = 0; i < a.n_seqs; ++i) jobs.rec[i] = a.records[i], jobs.gen[i] = a.generations[i];
    const uint32_t n_jobs = a.n_seqs * a.n_layers;
    cudaError_t err = cudaSuccess;
    for (uint32_t phase = 0; phase < (a.n_tokens > 1 ? 2u : 1u) && err == cudaSuccess; ++phase) {
        jobs.phase = phase;
        err = launch_append_for(only_format, shape, in, jobs, n_jobs, error, stream);
    }
    return err;
}

}  // namespace

cudaError_t launch_room_append(const PageShape &shape, const AppendRows &in, const RoomAppend &a, int only_format,
                               AppendError *error, cudaStream_t stream) {
    const uint64_t n_jobs = uint64_t(a.n_seqs) * a.n_layers;
    if (!shape_ok(shape) || !flat_grid_ok(n_jobs, shape.n_kv_heads) || a.n_seqs == 0 || a.n_seqs > kMaxRoomSeqs ||
        a.n_tokens == 0 || a.n_tokens > shape.page_size)
        return cudaErrorInvalidValue;
    // Small batches take a small parameter block (launch cost grows with it).
    return a.n_seqs <= 32 ? launch_room<32>(shape, in, a, only_format, error, stream)
                          : launch_room<kMaxRoomSeqs>(shape, in, a, only_format, error, stream);
}

cudaError_t launch_quantize_layer(const PageShape &shape, ikv_format f, uint8_t *page, uint32_t layer,
                                  const float *k, const float *v, uint32_t n_valid, float *fold_stage,
                                  cudaStream_t stream) {
    if (!shape_ok(shape) || n_valid > shape.page_size) return cudaErrorInvalidValue;
    return launch(quantize_layer_kernel, dim3(shape.n_kv_heads), dim3(kThreads), 0, stream, shape, f, page, layer, k,
                  v, n_valid, fold_stage);
}

}  // namespace cuda
}  // namespace ikv
