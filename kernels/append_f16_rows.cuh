// An append's new rows of an F16/BF16 sub-page, by one block of any size:
// shared by the append kernel (quantize_pages.cu) and the decode that appends
// its step's token first (decode_attention.cu, FusedAppend: where the
// staging's folds do not cover the page's earlier rows).
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/quant.hpp"
#include "ikv_kernels.h"
#include "stage_rows.cuh"

namespace ikv {
namespace cuda {

// Channel d of kv-head h's key summary from its folded stored keys (rows of
// them so far): the folds kept in staging for the next append, the record
// encoded (quant.hpp encode_summary).
__device__ __forceinline__ void store_fold(const StageFold &fold, uint16_t *rec, uint32_t D, uint32_t h, uint32_t d,
                                           float mn, float mx, double sum, uint32_t rows) {
    const uint32_t fi = h * D + d;
    fold.mn[fi] = mn, fold.mx[fi] = mx, fold.sum[fi] = sum;
    encode_summary(rec, D, d, mn, mx, sum / double(rows));
}

// Rows [row0, row0 + rows) of job j's F16/BF16 sub-page h, from its staging.
// When the staging's folds (StageFold) cover rows [0, row0), or row0 is 0,
// the new rows are encoded and the key summaries' folds continued in token
// order, which is the full rewrite's arithmetic step for step, so the bytes
// equal quantize_subpage's (the rows past the valid ones are zero already:
// every write leaves them so). A one-token append then touches one row
// instead of re-encoding the page and re-reading its keys. from_start: the
// folds do not cover [0, row0): rows [0, row0) are encoded and folded again
// from the staging, which is quantize_subpage's F16/BF16 rewrite (the
// decode that appends cannot hand that to another launch).
template <int kFmt>
__device__ void append_rows_f16(const PageShape &shape, const AppendJob &j, uint32_t h, const StageFold &fold,
                                bool from_start = false) {
    const ikv_format f = kFmt >= 0 ? ikv_format(kFmt) : ikv_format(j.format);
    const bool f16 = f == IKV_FMT_F16;
    const uint32_t P = shape.page_size, D = shape.head_dim, H = shape.n_kv_heads;
    const SubpageLayout L = subpage_layout(f, P, D);
    uint8_t *sub = j.page + subpage_offset(shape, f, j.layer, h);
    uint16_t *rec = reinterpret_cast<uint16_t *>(j.page + summary_offset(shape, f, j.layer, h));
    const uint64_t half = uint64_t(H) * P * D;
    const uint32_t t0 = from_start ? 0u : j.row0;
    for (uint32_t e = threadIdx.x; e < 2 * D; e += blockDim.x) {
        const uint32_t which = e / D, d = e % D;
        const float *src = j.stage + which * half + uint64_t(h) * P * D;
        uint16_t *out = reinterpret_cast<uint16_t *>(sub + (which == 0 ? L.k : L.v));
        const uint32_t fi = h * D + d;
        float mn = INFINITY, mx = -INFINITY;
        double sum = 0.0;
        if (which == 0 && t0 > 0) mn = fold.mn[fi], mx = fold.mx[fi], sum = fold.sum[fi];
        for (uint32_t t = t0; t < j.row0 + j.rows; ++t) {
            const uint16_t b = narrow16(src[t * D + d], f16);
            out[t * D + d] = b;
            if (which == 0) {
                const float x = widen16(b, f16);
                mn = fminf(mn, x);
                mx = fmaxf(mx, x);
                sum += double(x);
            }
        }
        if (which == 0) store_fold(fold, rec, D, h, d, mn, mx, sum, j.row0 + j.rows);
    }
    if (threadIdx.x == 0) fold.rows[h] = j.row0 + j.rows;
}

}  // namespace cuda
}  // namespace ikv
