// Fused selected-page mixed-precision decode (flash-decoding with split-K).
//
// Grid: x = split (a contiguous slice of the work list), y = kv-head x row
// chunk, z = sequence. 128 threads. A CTA streams its pages through a
// kStages-deep cp.async pipeline. A stage holds kStageTokens = 4096/D token
// rows (so ~16 KB of F16 K+V whatever D is) as kSlots slots of 16 rows; a
// slot is 16 rows of one page (pages of 8 fill half a slot, pages of 64/128
// several slots), copied raw with 16-byte cp.async (only the rows inside the
// page's bounds) together with the scales its format needs.
//
// Per stage:
//   scores   each token row is read from shared memory by 128/kStageTokens
//            threads, dequantized in registers (format per slot, switched at
//            run time: a list mixes formats; warp-uniform) and dotted with all
//            R query rows of the GQA group at once (each K byte read once);
//            causal + bounds masking by position;
//   softmax  one warp per query row: block max, rescale factor, exp;
//   P.V      thread (8-channel chunk, token group) dequantizes its V pieces
//            in registers and accumulates R x 8 fp32 outputs.
// The token groups' accumulators are reduced once at the end; each CTA writes
// (m, l, acc) for its split and the merge kernel does the exact log-sum-exp
// merge, writing out (F32/F16/BF16) and lse.
//
// Templated on head_dim and the row-chunk size R (query rows = tokens x group
// heads per CTA); one dispatch table.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>

#include <algorithm>
#include <atomic>

#include "common/quant.hpp"
#include "ikv_kernels.h"

namespace ikv {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kSlotRows = 16;
constexpr int kStages = 3;

template <int D>
struct Cfg {
    static constexpr int kStageTokens = 4096 / D;            // 64, 32, 16
    static constexpr int kSlots = kStageTokens / kSlotRows;  // 4, 2, 1
    static constexpr int kTpt = kThreads / kStageTokens;     // threads per token in the score phase: 2, 4, 8
    static constexpr int kPieces = D / 8 / kTpt;             // 8-channel pieces per thread and token: 4
    static constexpr int kChunks = D / 8;                    // 8-channel chunks of a row (P.V phase)
    static constexpr int kGroups = kThreads / kChunks;       // token groups in the P.V phase: 16, 8, 4
    static constexpr int kTpg = kStageTokens / kGroups;      // tokens per group and stage: 4
    // One slot: K rows, V rows (widest format), scales.
    static constexpr int kG = D / 32;  // INT4 V groups
    static constexpr int kSlotK = 0;
    static constexpr int kSlotV = kSlotRows * 2 * D;
    static constexpr int kSlotS = 2 * kSlotRows * 2 * D;
    static constexpr int kSlotBytes = kSlotS + 8 * D + 2 * kSlotRows * kG * 4;
    static constexpr int kStageBytes = kSlots * kSlotBytes;
    static_assert(kSlotBytes % 16 == 0, "slots keep 16-byte alignment");
    static_assert(kPieces * kTpt * 8 == D, "score mapping covers the row");
    static_assert(kTpg * kGroups == kStageTokens, "P.V mapping covers the stage");
};

struct SlotInfo {
    int r0, r1;        // rows [r0, r1) of the slot are read
    int format;
    uint32_t pos;      // position of slot row 0
};

template <int D, int R>
struct Smem {
    using C = Cfg<D>;
    static constexpr int kQOff = kStages * C::kStageBytes;
    static constexpr int kSOff = kQOff + R * D * 4;
    static constexpr int kPOff = kSOff + R * C::kStageTokens * 4;
    static constexpr int kInfoOff = kPOff + R * C::kStageTokens * 4;
    static constexpr int kStatOff = kInfoOff + kStages * C::kSlots * int(sizeof(SlotInfo));
    static constexpr int kBytes = kStatOff + 4 * R * 4;
    static_assert(C::kGroups * R * D * 4 <= kQOff, "the final reduction reuses the stage buffers");
};

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#else
    *reinterpret_cast<uint4 *>(smem) = *reinterpret_cast<const uint4 *>(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ void copy16(uint8_t *dst, const uint8_t *src, int bytes, int tid) {
    for (int o = tid * 16; o < bytes; o += kThreads * 16) cp_async16(dst + o, src + o);
}

// Chunk i of the CTA's slice: 16 rows (fewer for 8-row pages) of one page.
struct ChunkInfo {
    const uint8_t *sub;
    uint32_t pos0;
    int c0, lo, hi, format;
};

__device__ __forceinline__ ChunkInfo chunk_info(const DecodeParams &p, const DevPage *list, uint32_t first, int cpp,
                                                int i, uint32_t head, uint32_t max_pos) {
    ChunkInfo c;
    const DevPage pg = list[first + i / cpp];
    const int P = int(p.shape.page_size);
    c.c0 = (i % cpp) * kSlotRows;
    c.lo = max(int(pg.begin), c.c0);
    c.hi = min(int(pg.end), min(c.c0 + kSlotRows, P));
    const int64_t lim = int64_t(max_pos) + 1 - int64_t(pg.pos0);  // rows after the last query are never read
    if (lim < c.hi) c.hi = int(lim < 0 ? 0 : lim);
    c.format = pg.format;
    c.pos0 = pg.pos0;
    c.sub = pg.base + subpage_offset(p.shape, ikv_format(pg.format), p.layer, head);
    return c;
}

template <int D>
__device__ __forceinline__ void copy_chunk(const ChunkInfo &c, uint32_t P, uint8_t *slot, int tid) {
    using C = Cfg<D>;
    if (c.hi <= c.lo) return;
    const ikv_format f = ikv_format(c.format);
    const SubpageLayout L = subpage_layout(f, P, D);
    const int rb = int(row_bytes(f, D));
    const int r0 = c.lo - c.c0, n = c.hi - c.lo;
    copy16(slot + C::kSlotK + r0 * rb, c.sub + L.k + c.lo * rb, n * rb, tid);
    copy16(slot + C::kSlotV + r0 * rb, c.sub + L.v + c.lo * rb, n * rb, tid);
    uint8_t *s = slot + C::kSlotS;
    const int rows = min(kSlotRows, int(P));
    if (f == IKV_FMT_FP8_E4M3) {
        copy16(s, c.sub + L.k_scale, 16, tid);
    } else if (f == IKV_FMT_INT8) {
        copy16(s, c.sub + L.k_scale, 4 * D, tid);
        copy16(s + 4 * D, c.sub + L.v_scale + 4 * c.c0, ((4 * rows + 15) / 16) * 16, tid);
    } else if (f == IKV_FMT_INT4) {
        constexpr int G = C::kG;
        copy16(s, c.sub + L.k_scale, 4 * D, tid);
        copy16(s + 4 * D, c.sub + L.k_min, 4 * D, tid);
        copy16(s + 8 * D, c.sub + L.v_scale + 4 * G * c.c0, 4 * G * rows, tid);
        copy16(s + 8 * D + 4 * G * kSlotRows, c.sub + L.v_min + 4 * G * c.c0, 4 * G * rows, tid);
    }
}

// Eight consecutive channels [d0, d0+8) of row r of K (which = 0) or V (1) of a slot, dequantized.
template <int D>
__device__ __forceinline__ void load8(ikv_format f, const uint8_t *slot, int which, int r, int d0, float x[8]) {
    using C = Cfg<D>;
    const uint8_t *data = slot + (which == 0 ? C::kSlotK : C::kSlotV);
    const float *fs = reinterpret_cast<const float *>(slot + C::kSlotS);
    if (f == IKV_FMT_F16) {
        const uint4 w = *reinterpret_cast<const uint4 *>(data + r * 2 * D + 2 * d0);
        const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            __half2_raw h;
            h.x = uint16_t(u[j] & 0xFFFFu);
            h.y = uint16_t(u[j] >> 16);
            const float2 v = __half22float2(__half2(h));
            x[2 * j] = v.x;
            x[2 * j + 1] = v.y;
        }
    } else if (f == IKV_FMT_BF16) {
        const uint4 w = *reinterpret_cast<const uint4 *>(data + r * 2 * D + 2 * d0);
        const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            x[2 * j] = __uint_as_float(u[j] << 16);
            x[2 * j + 1] = __uint_as_float(u[j] & 0xFFFF0000u);
        }
    } else if (f == IKV_FMT_FP8_E4M3) {
        const uint2 w = *reinterpret_cast<const uint2 *>(data + r * D + d0);
        const uint32_t u[2] = {w.x, w.y};
        const float s = fs[which];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const __nv_fp8x2_storage_t pair = __nv_fp8x2_storage_t((u[j / 2] >> (16 * (j % 2))) & 0xFFFFu);
            const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
            x[2 * j] = v.x * s;
            x[2 * j + 1] = v.y * s;
        }
    } else if (f == IKV_FMT_INT8) {
        const uint2 w = *reinterpret_cast<const uint2 *>(data + r * D + d0);
        const uint32_t u[2] = {w.x, w.y};
        if (which == 0) {
            const float4 s0 = *reinterpret_cast<const float4 *>(fs + d0);
            const float4 s1 = *reinterpret_cast<const float4 *>(fs + d0 + 4);
            const float sc[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = float(int8_t(u[j / 4] >> (8 * (j % 4)))) * sc[j];
        } else {
            const float s = fs[D + r];
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = float(int8_t(u[j / 4] >> (8 * (j % 4)))) * s;
        }
    } else {  // INT4
        constexpr int G = Cfg<D>::kG;
        const uint32_t u = *reinterpret_cast<const uint32_t *>(data + r * (D / 2) + d0 / 2);
        if (which == 0) {
            const float4 s0 = *reinterpret_cast<const float4 *>(fs + d0);
            const float4 s1 = *reinterpret_cast<const float4 *>(fs + d0 + 4);
            const float4 m0 = *reinterpret_cast<const float4 *>(fs + D + d0);
            const float4 m1 = *reinterpret_cast<const float4 *>(fs + D + d0 + 4);
            const float sc[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
            const float mn[8] = {m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = float((u >> (4 * j)) & 0xFu) * sc[j] + mn[j];
        } else {
            const int i = r * G + d0 / 32;
            const float s = fs[2 * D + i], mn = fs[2 * D + G * kSlotRows + i];
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = float((u >> (4 * j)) & 0xFu) * s + mn;
        }
    }
}

__device__ __forceinline__ float load_elem(const void *p, ikv_dtype dt, uint64_t i) {
    if (dt == IKV_DTYPE_F32) return static_cast<const float *>(p)[i];
    const uint16_t b = static_cast<const uint16_t *>(p)[i];
    return dt == IKV_DTYPE_F16 ? __half2float(__ushort_as_half(b)) : bf16_to_f32(b);
}

template <int D, int R>
__global__ void __launch_bounds__(kThreads) decode_kernel(const DecodeParams p, uint32_t pages_per_split,
                                                          uint32_t rows_total, float *part_acc, float *part_ml) {
    using C = Cfg<D>;
    using SM = Smem<D, R>;
    extern __shared__ __align__(16) uint8_t smem[];
    float *Qs = reinterpret_cast<float *>(smem + SM::kQOff);
    float *S = reinterpret_cast<float *>(smem + SM::kSOff);   // [R][kStageTokens] logits
    float *Pt = reinterpret_cast<float *>(smem + SM::kPOff);  // [kStageTokens][R] probabilities
    SlotInfo *info = reinterpret_cast<SlotInfo *>(smem + SM::kInfoOff);
    float *Mrow = reinterpret_cast<float *>(smem + SM::kStatOff);
    float *Lrow = Mrow + R;
    float *Arow = Lrow + R;
    int *Qpos = reinterpret_cast<int *>(Arow + R);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t split = blockIdx.x, seq = blockIdx.z;
    const uint32_t Hkv = p.shape.n_kv_heads;
    const uint32_t head = blockIdx.y % Hkv, row_chunk = blockIdx.y / Hkv;
    const uint32_t G = p.n_q_heads / Hkv, T = p.n_query_tokens;
    const uint32_t row0 = row_chunk * R;
    const int nrows = int(min(uint32_t(R), rows_total - row0));
    const uint32_t len = p.seq_len[seq];

    // Query rows of this CTA (row r = t*G + g), pre-scaled; padding rows are zero and fully masked.
    for (int e = tid; e < R * D; e += kThreads) {
        const int r = e / D, d = e % D;
        float v = 0.0f;
        if (r < nrows) {
            const uint32_t rr = row0 + r, t = rr / G, g = rr % G;
            v = load_elem(p.q, p.q_dtype, ((uint64_t(seq) * T + t) * p.n_q_heads + head * G + g) * D + d) * p.scale;
        }
        Qs[e] = v;
    }
    if (tid < R) {
        Mrow[tid] = -INFINITY;
        Lrow[tid] = 0.0f;
        Qpos[tid] = tid < nrows ? int(len - T + (row0 + tid) / G) : -1;
    }
    const uint32_t max_pos = len - T + (row0 + uint32_t(nrows) - 1) / G;

    const uint32_t li = p.lists.list_heads > 1 ? seq * p.lists.list_heads + head : seq;
    const DevPage *list = p.lists.pages + uint64_t(li) * p.lists.stride;
    const uint32_t count = p.lists.counts[li];
    const uint32_t first = split * pages_per_split;
    const uint32_t npages = first < count ? min(pages_per_split, count - first) : 0u;
    const int P = int(p.shape.page_size);
    const int cpp = P > kSlotRows ? P / kSlotRows : 1;
    const int nchunks = int(npages) * cpp;
    const int nstages = (nchunks + C::kSlots - 1) / C::kSlots;

    auto issue = [&](int s) {
        uint8_t *buf = smem + (s % kStages) * C::kStageBytes;
#pragma unroll
        for (int k = 0; k < C::kSlots; ++k) {
            const int i = s * C::kSlots + k;
            SlotInfo si{0, 0, 0, 0};
            if (i < nchunks) {
                const ChunkInfo c = chunk_info(p, list, first, cpp, i, head, max_pos);
                copy_chunk<D>(c, uint32_t(P), buf + k * C::kSlotBytes, tid);
                si = SlotInfo{c.lo - c.c0, c.hi - c.c0, c.format, c.pos0 + uint32_t(c.c0)};
            }
            if (tid == 0) info[(s % kStages) * C::kSlots + k] = si;
        }
    };

    // P.V mapping: channel chunk and token group.
    const int pv_chunk = tid % C::kChunks, pv_group = tid / C::kChunks;
    float acc[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][j] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < nstages) issue(s);
        cp_async_commit();
    }

    for (int it = 0; it < nstages; ++it) {
        cp_async_wait<kStages - 2>();
        __syncthreads();  // stage `it` landed for every thread; the buffer of it-1 is free
        if (it + kStages - 1 < nstages) issue(it + kStages - 1);
        cp_async_commit();
        const uint8_t *buf = smem + (it % kStages) * C::kStageBytes;
        const SlotInfo *si = info + (it % kStages) * C::kSlots;

        // Scores: token tok, channel pieces j, j+kTpt, ...
        {
            const int tok = tid / C::kTpt, j = tid % C::kTpt;
            const int slot = tok / kSlotRows, row = tok % kSlotRows;
            const SlotInfo in = si[slot];
            const bool valid = row >= in.r0 && row < in.r1;
            float dot[R];
#pragma unroll
            for (int r = 0; r < R; ++r) dot[r] = 0.0f;
            if (valid) {
                const uint8_t *sl = buf + slot * C::kSlotBytes;
#pragma unroll
                for (int k = 0; k < C::kPieces; ++k) {
                    const int d0 = (j + k * C::kTpt) * 8;
                    float x[8];
                    load8<D>(ikv_format(in.format), sl, 0, row, d0, x);
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const float4 q0 = *reinterpret_cast<const float4 *>(Qs + r * D + d0);
                        const float4 q1 = *reinterpret_cast<const float4 *>(Qs + r * D + d0 + 4);
                        dot[r] += q0.x * x[0] + q0.y * x[1] + q0.z * x[2] + q0.w * x[3] + q1.x * x[4] + q1.y * x[5] +
                                  q1.z * x[6] + q1.w * x[7];
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int o = C::kTpt / 2; o > 0; o >>= 1) dot[r] += __shfl_xor_sync(0xFFFFFFFFu, dot[r], o);
            if (j == 0) {
                const int pos = int(in.pos) + row;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float sc = -INFINITY;
                    if (valid && pos <= Qpos[r]) sc = p.softcap > 0.0f ? p.softcap * tanhf(dot[r] / p.softcap) : dot[r];
                    S[r * C::kStageTokens + tok] = sc;
                }
            }
        }
        __syncthreads();
        // Online softmax: one warp per row.
        for (int r = warp; r < R; r += kThreads / 32) {
            float mx = -INFINITY;
            for (int t = lane; t < C::kStageTokens; t += 32) mx = fmaxf(mx, S[r * C::kStageTokens + t]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
            const float m_old = Mrow[r], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int t = lane; t < C::kStageTokens; t += 32) {
                const float sc = S[r * C::kStageTokens + t];
                const float e = sc == -INFINITY ? 0.0f : __expf(sc - m_new);
                Pt[t * R + r] = e;
                sum += e;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
            __syncwarp();
            if (lane == 0) {
                const float alpha = m_old == -INFINITY ? (m_new == -INFINITY ? 1.0f : 0.0f) : __expf(m_old - m_new);
                Arow[r] = alpha;
                Mrow[r] = m_new;
                Lrow[r] = Lrow[r] * alpha + sum;
            }
        }
        __syncthreads();
        // P.V: tokens pv_group*kTpg .. +kTpg, channels pv_chunk*8 .. +8.
        {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float a = Arow[r];
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[r][j] *= a;
            }
            const int d0 = pv_chunk * 8;
#pragma unroll
            for (int k = 0; k < C::kTpg; ++k) {
                const int tok = pv_group * C::kTpg + k;
                const int slot = tok / kSlotRows, row = tok % kSlotRows;
                const SlotInfo in = si[slot];
                if (row < in.r0 || row >= in.r1) continue;
                float x[8];
                load8<D>(ikv_format(in.format), buf + slot * C::kSlotBytes, 1, row, d0, x);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float w = Pt[tok * R + r];
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[r][j] += w * x[j];
                }
            }
        }
        // The next iteration's first barrier orders these reads before S/Pt/stage reuse.
    }
    cp_async_wait<0>();
    __syncthreads();

    // Reduce the token groups through the (now idle) stage buffers.
    float *red = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float4 *o = reinterpret_cast<float4 *>(red + (pv_group * R + r) * D + pv_chunk * 8);
        o[0] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        o[1] = make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]);
    }
    __syncthreads();
    const uint64_t base = ((uint64_t(seq) * Hkv + head) * gridDim.x + split) * rows_total + row0;
    for (int e = tid; e < nrows * D; e += kThreads) {
        const int r = e / D, d = e % D;
        float a = 0.0f;
#pragma unroll
        for (int g = 0; g < C::kGroups; ++g) a += red[(g * R + r) * D + d];
        part_acc[(base + r) * D + d] = a;
    }
    if (tid < nrows) {
        part_ml[2 * (base + tid)] = Mrow[tid];
        part_ml[2 * (base + tid) + 1] = Lrow[tid];
    }
}

// One block per (seq, head, row); one thread per channel.
__global__ void merge_kernel(const DecodeParams p, uint32_t n_splits, uint32_t rows_total, const float *part_acc,
                             const float *part_ml) {
    const uint32_t D = p.shape.head_dim, Hkv = p.shape.n_kv_heads;
    const uint32_t row = blockIdx.x % rows_total, head = (blockIdx.x / rows_total) % Hkv;
    const uint32_t seq = blockIdx.x / (rows_total * Hkv);
    const uint32_t G = p.n_q_heads / Hkv, t = row / G, g = row % G;
    const uint64_t stride = rows_total;
    const uint64_t b0 = (uint64_t(seq) * Hkv + head) * n_splits * stride + row;
    float m = -INFINITY;
    for (uint32_t s = 0; s < n_splits; ++s) m = fmaxf(m, part_ml[2 * (b0 + s * stride)]);
    float l = 0.0f;
    for (uint32_t s = 0; s < n_splits; ++s) {
        const float ms = part_ml[2 * (b0 + s * stride)];
        if (ms != -INFINITY) l += part_ml[2 * (b0 + s * stride) + 1] * __expf(ms - m);
    }
    const uint64_t oi = (uint64_t(seq) * p.n_query_tokens + t) * p.n_q_heads + head * G + g;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        float a = 0.0f;
        if (l > 0.0f) {
            for (uint32_t s = 0; s < n_splits; ++s) {
                const float ms = part_ml[2 * (b0 + s * stride)];
                if (ms != -INFINITY) a += part_acc[(b0 + s * stride) * D + d] * __expf(ms - m);
            }
            a /= l;
        }
        if (p.out_dtype == IKV_DTYPE_F32)
            static_cast<float *>(p.out)[oi * D + d] = a;
        else if (p.out_dtype == IKV_DTYPE_F16)
            static_cast<uint16_t *>(p.out)[oi * D + d] = f32_to_f16(a);
        else
            static_cast<uint16_t *>(p.out)[oi * D + d] = f32_to_bf16(a);
    }
    if (p.lse && threadIdx.x == 0) p.lse[oi] = l > 0.0f ? m + logf(l) : -INFINITY;
}

uint32_t rows_per_cta(uint32_t rows_total) { return rows_total <= 1 ? 1 : rows_total <= 4 ? 4 : 8; }

using DecodeFn = void (*)(const DecodeParams, uint32_t, uint32_t, float *, float *);

struct KernelEntry {
    uint32_t D, R;
    DecodeFn fn;
    int smem;
};

// The dispatch table: head_dim x row-chunk size.
#define IKV_DECODE_ENTRY(D, R) {D, R, decode_kernel<D, R>, Smem<D, R>::kBytes}
const KernelEntry kTable[] = {
    IKV_DECODE_ENTRY(64, 1),  IKV_DECODE_ENTRY(64, 4),  IKV_DECODE_ENTRY(64, 8),
    IKV_DECODE_ENTRY(128, 1), IKV_DECODE_ENTRY(128, 4), IKV_DECODE_ENTRY(128, 8),
    IKV_DECODE_ENTRY(256, 1), IKV_DECODE_ENTRY(256, 4), IKV_DECODE_ENTRY(256, 8),
};
#undef IKV_DECODE_ENTRY

const KernelEntry *find_kernel(uint32_t D, uint32_t R) {
    for (const KernelEntry &e : kTable)
        if (e.D == D && e.R == R) return &e;
    return nullptr;
}

// Opt in to the kernel's dynamic shared memory once per device (the setting
// is per device; repeating it would cost host time on every step).
cudaError_t allow_smem(const KernelEntry *k) {
    static std::atomic<uint64_t> done[sizeof(kTable) / sizeof(kTable[0])];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const uint64_t bit = 1ull << (dev & 63);
    std::atomic<uint64_t> &d = done[k - kTable];
    if (d.load(std::memory_order_acquire) & bit) return cudaSuccess;
    err = cudaFuncSetAttribute(reinterpret_cast<const void *>(k->fn), cudaFuncAttributeMaxDynamicSharedMemorySize,
                               k->smem);
    if (err == cudaSuccess) d.fetch_or(bit, std::memory_order_acq_rel);
    return err;
}

uint32_t query_rows(const DecodeParams &p) { return p.n_query_tokens * (p.n_q_heads / p.shape.n_kv_heads); }

uint32_t row_chunks(const DecodeParams &p) {
    const uint32_t rows = query_rows(p), R = rows_per_cta(rows);
    return (rows + R - 1) / R;
}

}  // namespace

uint32_t decode_choose_splits(const DecodeParams &p, int n_sms) {
    const uint64_t base = uint64_t(p.n_seqs) * p.shape.n_kv_heads * row_chunks(p);
    const uint64_t resident = uint64_t(n_sms > 0 ? n_sms : 132) * 3;  // 3 CTAs of ~70 KB shared memory per SM
    // Work units: stages of 16-row slots; keep at least 3 stages per split so the pipeline fills.
    const uint64_t P = p.shape.page_size, D = p.shape.head_dim ? p.shape.head_dim : 128;
    const uint64_t chunks = uint64_t(p.max_pages) * (P > 16 ? P / 16 : 1);
    const uint64_t slots = 256 / D > 0 ? 256 / D : 1;
    const uint64_t max_useful = std::max<uint64_t>(1, chunks / (3 * slots));
    // Fewest splits giving >= 2 waves, then the count in [s, 3s] whose last wave is fullest.
    uint64_t s0 = (2 * resident + base - 1) / base;
    if (s0 > max_useful) s0 = max_useful;
    if (s0 < 1) s0 = 1;
    uint64_t best = s0;
    double best_eff = 0.0;
    for (uint64_t s = s0; s <= std::min<uint64_t>(3 * s0, max_useful); ++s) {
        const uint64_t ctas = base * s, waves = (ctas + resident - 1) / resident;
        const double eff = double(ctas) / double(waves * resident);
        if (eff > best_eff + 0.02) best_eff = eff, best = s;
    }
    if (best > 1024) best = 1024;
    return uint32_t(best);
}

uint64_t decode_workspace_bytes(const DecodeParams &p, uint32_t n_splits) {
    const uint64_t n = uint64_t(p.n_seqs) * p.shape.n_kv_heads * n_splits * query_rows(p);
    return align_up(n * p.shape.head_dim * 4, 256) + n * 8;
}

cudaError_t launch_decode(const DecodeParams &p, cudaStream_t stream) {
    const uint32_t rows = query_rows(p);
    const KernelEntry *k = find_kernel(p.shape.head_dim, rows_per_cta(rows));
    if (!k || p.n_splits == 0 || p.shape.page_size > 128) return cudaErrorInvalidValue;
    const uint32_t splits = p.n_splits;
    const uint32_t pages_per_split = std::max<uint32_t>(1, (p.max_pages + splits - 1) / splits);
    const uint64_t n = uint64_t(p.n_seqs) * p.shape.n_kv_heads * splits * rows;
    float *part_acc = static_cast<float *>(p.workspace);
    float *part_ml = reinterpret_cast<float *>(static_cast<uint8_t *>(p.workspace) +
                                               align_up(n * p.shape.head_dim * 4, 256));
    cudaError_t err = allow_smem(k);
    if (err != cudaSuccess) return err;
    const dim3 grid(splits, p.shape.n_kv_heads * row_chunks(p), p.n_seqs);
    k->fn<<<grid, kThreads, k->smem, stream>>>(p, pages_per_split, rows, part_acc, part_ml);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const uint32_t mthreads = p.shape.head_dim < 128 ? p.shape.head_dim : 128;
    merge_kernel<<<p.n_seqs * p.shape.n_kv_heads * rows, mthreads, 0, stream>>>(p, splits, rows, part_acc, part_ml);
    return cudaGetLastError();
}

}  // namespace cuda
}  // namespace ikv
