// The tail page's incremental writes (see tail_append.hpp). The two entry
// points get an AVX2 copy (common/target_clones.hpp).
#include "pool/tail_append.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/target_clones.hpp"
#include "pool/host_codec.hpp"


namespace ikv {
namespace {

// The key summary's folds from scratch over stored rows [0, n), n >= 1
// (rows outer so channels vectorize; per channel the order is by token).
void summary_folds(const float *rows, uint32_t n, uint32_t D, float *mn, float *mx, double *sum) {
    for (uint32_t d = 0; d < D; ++d) {
        mn[d] = rows[d];
        mx[d] = rows[d];
        sum[d] = rows[d];
    }
    for (uint32_t t = 1; t < n; ++t) {
        const float *r = rows + uint64_t(t) * D;
        for (uint32_t d = 0; d < D; ++d) {
            mn[d] = std::min(mn[d], r[d]);
            mx[d] = std::max(mx[d], r[d]);
            sum[d] += r[d];
        }
    }
}
// The same fold for channel d alone.
void summary_channel_folds(const float *rows, uint32_t n, uint32_t D, uint32_t d, float *mn, float *mx,
                                  double *sum) {
    mn[d] = rows[d];
    mx[d] = rows[d];
    sum[d] = rows[d];
    for (uint32_t t = 1; t < n; ++t) {
        const float x = rows[uint64_t(t) * D + d];
        mn[d] = std::min(mn[d], x);
        mx[d] = std::max(mx[d], x);
        sum[d] += x;
    }
}
// The summary record (quant.hpp encode_summary) of n rows from the folds:
// min, max and mean per channel; all zero for n == 0.
void summary_encode(uint16_t *rec, uint32_t D, uint32_t n, const float *mn, const float *mx,
                           const double *sum) {
    if (n == 0) {
        std::memset(rec, 0, 3ull * D * sizeof(uint16_t));
        return;
    }
    // encode_summary per channel, written without branches so the loops
    // vectorize: bf16_down / bf16_up move one ulp away from zero when low
    // bits are cut and the direction is outward; the mean rounds to nearest
    // even in one rounding (mean_to_bf16).
    uint16_t *lo = rec, *hi = rec + D, *mean = rec + 2 * D;
    for (uint32_t d = 0; d < D; ++d) {
        const uint32_t x = f32_bits(mn[d]);
        lo[d] = uint16_t((x >> 16) + uint32_t((x & 0xFFFFu) != 0 && (x >> 31) != 0));
    }
    for (uint32_t d = 0; d < D; ++d) {
        const uint32_t x = f32_bits(mx[d]);
        hi[d] = uint16_t((x >> 16) + uint32_t((x & 0xFFFFu) != 0 && (x >> 31) == 0));
    }
    for (uint32_t d = 0; d < D; ++d) mean[d] = mean_to_bf16(sum[d] / n);
}

// Scratch rows for the dequantized keys, per thread (a store may be written
// by several threads, each for its own sequences).
float *tail_scratch(uint64_t floats) {
    thread_local std::vector<float> buf;
    if (buf.size() < floats) buf.resize(floats);
    return buf.data();
}

}  // namespace

IKV_AVX2_CLONES void tail_write_full(ikv_format f, uint32_t P, uint32_t D, const float *k, const float *v, uint32_t n_valid,
                            uint8_t *sub, uint16_t *rec, const TailStats *stats) {
    QuantFolds folds;
    float ka[256], kb[256];
    folds.ka = stats ? stats->ka() : ka;
    folds.kb = stats ? stats->kb() : kb;
    folds.km = stats ? stats->km() : nullptr;
    folds.ks = stats ? stats->ks() : nullptr;
    if (f == IKV_FMT_F16 || f == IKV_FMT_BF16)
        encode_rows_16(f, P, D, k, v, D, 0, n_valid, sub);
    else
        write_subpage_quant(f, P, D, k, v, D, n_valid, sub, &folds);
    float mn[256], mx[256];
    double sum[256];
    float *smn = stats ? stats->mn() : mn, *smx = stats ? stats->mx() : mx;
    double *ssum = stats ? stats->sum() : sum;
    if (n_valid > 0) {
        float *rows = tail_scratch(uint64_t(n_valid) * D);
        dequant_rows(f, P, D, sub, 0, 0, n_valid, rows, D);
        summary_folds(rows, n_valid, D, smn, smx, ssum);
    }
    summary_encode(rec, D, n_valid, smn, smx, ssum);
    if (stats) {
        stats->k_amax() = folds.k_amax;
        stats->v_amax() = folds.v_amax;
        stats->format() = uint32_t(f);
        stats->rows() = n_valid;
    }
}

IKV_AVX2_CLONES void tail_write_append(ikv_format f, uint32_t P, uint32_t D, const float *k, const float *v, uint32_t first,
                              uint32_t n_valid, uint8_t *sub, uint16_t *rec, const TailStats &stats) {
    const SubpageLayout L = subpage_layout(f, P, D);
    const uint64_t rb = row_bytes(f, D);
    uint8_t *kd = sub + L.k, *vd = sub + L.v;
    float *k_scales = reinterpret_cast<float *>(sub + L.k_scale), *v_scales = reinterpret_cast<float *>(sub + L.v_scale);
    uint16_t *k_scales_h = reinterpret_cast<uint16_t *>(sub + L.k_scale),
             *v_scales_h = reinterpret_cast<uint16_t *>(sub + L.v_scale);
    uint16_t *k_mins_h = reinterpret_cast<uint16_t *>(sub + L.k_min), *v_mins_h = reinterpret_cast<uint16_t *>(sub + L.v_min);
    // Key channels whose stored rows [0, first) changed (re-quantized).
    uint8_t changed[256] = {};
    bool any_changed = false;
    if (f == IKV_FMT_F16 || f == IKV_FMT_BF16) {
        encode_rows_16(f, P, D, k, v, D, first, n_valid, sub, false);  // rows past n_valid are zero already
    } else if (f == IKV_FMT_FP8_E4M3) {
        const float ka = fold_absmax(k, D, D, first, n_valid, stats.k_amax());
        const float va = fold_absmax(v, D, D, first, n_valid, stats.v_amax());
        const uint32_t k_from = ka == stats.k_amax() ? first : 0, v_from = va == stats.v_amax() ? first : 0;
        k_scales[0] = fp8_scale(ka);
        v_scales[0] = fp8_scale(va);
        fp8_rows(k, D, D, k_from, n_valid, k_scales[0], kd, rb);
        fp8_rows(v, D, D, v_from, n_valid, v_scales[0], vd, rb);
        stats.k_amax() = ka;
        stats.v_amax() = va;
        if (k_from == 0) {
            std::memset(changed, 1, D);
            any_changed = true;
        }
    } else if (f == IKV_FMT_INT8) {
        float *amax = stats.ka();
        float old[256];
        std::memcpy(old, amax, 4ull * D);
        fold_absmax_channels(k, D, D, first, n_valid, amax);
        for (uint32_t d = 0; d < D; ++d) {
            if (amax[d] == old[d]) continue;  // maxima are |x| >= 0: no signed zeros to tell apart
            changed[d] = 1;
            any_changed = true;
            k_scales[d] = int8_scale(amax[d]);
            for (uint32_t t = 0; t < first; ++t) kd[t * rb + d] = uint8_t(quant_int8(k[t * D + d], k_scales[d]));
        }
        int8_k_rows(k, D, D, first, n_valid, k_scales, kd, rb);
        int8_v_rows(v, D, D, first, n_valid, v_scales, vd, rb);
    } else if (f == IKV_FMT_INT4) {
        float *lo = stats.ka(), *hi = stats.kb();
        float old_lo[256], old_hi[256];
        std::memcpy(old_lo, lo, 4ull * D);
        std::memcpy(old_hi, hi, 4ull * D);
        fold_range_channels(k, D, D, first, n_valid, lo, hi);
        float *mins = stats.km(), *scales = stats.ks();  // as stored; recomputed where the range changed
        for (uint32_t d = 0; d < D; ++d) {
            // Compared as bits: a minimum that went from +0 to -0 is a new minimum.
            if (f32_bits(lo[d]) == f32_bits(old_lo[d]) && f32_bits(hi[d]) == f32_bits(old_hi[d])) continue;
            changed[d] = 1;
            any_changed = true;
            const Int4Params g = int4_params(lo[d], hi[d]);
            mins[d] = g.min, scales[d] = g.scale, k_mins_h[d] = g.min_h, k_scales_h[d] = g.scale_h;
            const unsigned shift = d & 1 ? 4 : 0;
            for (uint32_t t = 0; t < first; ++t) {
                uint8_t &byte = kd[t * rb + d / 2];
                const uint8_t q = quant_int4(k[t * D + d], mins[d], scales[d]);
                byte = uint8_t((byte & ~(0xFu << shift)) | (q << shift));
            }
        }
        int4_k_rows(k, D, D, first, n_valid, mins, scales, kd, rb);
        int4_v_rows(v, D, D, first, n_valid, v_scales_h, v_mins_h, vd, rb);
    }

    // The key summary: new rows folded into every channel (vectorizes), then
    // the changed channels refolded from all rows as now stored.
    float *mn = stats.mn(), *mx = stats.mx();
    double *sum = stats.sum();
    const uint32_t from = any_changed ? 0 : first;
    float *rows = tail_scratch(uint64_t(n_valid - from) * D);
    dequant_rows(f, P, D, sub, 0, from, n_valid - from, rows, D);
    const float *fresh = rows + uint64_t(first - from) * D;
    for (uint32_t t = 0; t < n_valid - first; ++t) {
        const float *r = fresh + uint64_t(t) * D;
        for (uint32_t d = 0; d < D; ++d) {
            mn[d] = std::min(mn[d], r[d]);
            mx[d] = std::max(mx[d], r[d]);
            sum[d] += r[d];
        }
    }
    if (any_changed)
        for (uint32_t d = 0; d < D; ++d)
            if (changed[d]) summary_channel_folds(rows, n_valid, D, d, mn, mx, sum);
    summary_encode(rec, D, n_valid, mn, mx, sum);
    stats.rows() = n_valid;
}


}  // namespace ikv
