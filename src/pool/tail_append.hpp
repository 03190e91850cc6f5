// Appends into a partial tail page without redoing the rows it already holds.
//
// A CPU pool re-stores a partial page from its fp32 staging on every append
// so that scales cover the page's true range (one quantization's error).
// Done naively that is O(rows in the page) per appended token: every row is
// re-quantized, dequantized again and folded into the key summary (the
// summary describes the keys as stored). Here the store keeps, beside the
// staging of each (sequence, layer), the running state of those folds per
// kv-head (TailStats): the key summary's per-channel min, max and double sum,
// and the quantizers' running maxima. An append then
//   - folds only the new rows into that state, in token order, which gives
//     exactly the fold over all rows a full rewrite computes (same operands,
//     same order), so the bytes are the full rewrite's, bit for bit;
//   - re-quantizes old rows only where a scale changed: FP8's page scale, or
//     the INT8/INT4 key channels whose range the new rows widened (a
//     channel's codes depend on its own scale only), and recomputes those
//     channels' summary entries from the rows as now stored.
// The state is valid for exactly `rows` rows of one format; anything else
// that rewrites the staging (re-staging after truncate or a format change)
// invalidates it, and the next write rebuilds it with a full rewrite.
#pragma once

#include <cstdint>

#include "intentkv.h"

namespace ikv {

// The running state of one (layer, kv-head) of a partial tail page, in raw
// memory the store allocates after the staging floats: a 16-byte header, then
// double sum[D], float mn[D], mx[D], ka[D], kb[D], km[D], ks[D] (8-byte
// aligned when the base is).
class TailStats {
public:
    static constexpr uint32_t kInvalid = 0xFFFFFFFFu;
    static constexpr uint64_t bytes(uint32_t D) { return 16 + 32ull * D; }

    TailStats(uint8_t *base, uint32_t D) : p_(base), D_(D) {}
    uint32_t &rows() const { return *reinterpret_cast<uint32_t *>(p_); }    // rows described, or kInvalid
    uint32_t &format() const { return *reinterpret_cast<uint32_t *>(p_ + 4); }
    float &k_amax() const { return *reinterpret_cast<float *>(p_ + 8); }    // FP8 K's max |x|
    float &v_amax() const { return *reinterpret_cast<float *>(p_ + 12); }   // FP8 V's max |x|
    double *sum() const { return reinterpret_cast<double *>(p_ + 16); }     // summary: per-channel sums
    float *mn() const { return reinterpret_cast<float *>(p_ + 16 + 8ull * D_); }
    float *mx() const { return mn() + D_; }
    float *ka() const { return mn() + 2ull * D_; }  // INT8 K: max |x|; INT4 K: min
    float *kb() const { return mn() + 3ull * D_; }  // INT4 K: max
    // INT4 K: each channel's stored minimum and scale as floats (int4_params of
    // ka, kb), so an append derives them only where the range changed.
    float *km() const { return mn() + 4ull * D_; }
    float *ks() const { return mn() + 5ull * D_; }
    bool describes(ikv_format f, uint32_t n) const { return rows() == n && format() == uint32_t(f); }

private:
    uint8_t *p_;
    uint32_t D_;
};

// Full rewrite of one (layer, kv-head) sub-page from fp32 rows [0, n_valid)
// (k, v with row stride D) and its summary record; the running state is
// rebuilt to describe it (stats may be null: nothing kept).
void tail_write_full(ikv_format f, uint32_t P, uint32_t D, const float *k, const float *v, uint32_t n_valid,
                     uint8_t *sub, uint16_t *rec, const TailStats *stats);

// Rows [first, n_valid) appended to a sub-page whose rows [0, first) were
// written from k, v rows [0, first) and which `stats` describes (first >= 1).
// Stores exactly what tail_write_full(n_valid) would, and advances stats.
void tail_write_append(ikv_format f, uint32_t P, uint32_t D, const float *k, const float *v, uint32_t first,
                       uint32_t n_valid, uint8_t *sub, uint16_t *rec, const TailStats &stats);

}  // namespace ikv
