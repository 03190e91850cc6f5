// Host readers of engine rows for appends (append_rows.hpp).
#include "pool/append_rows.hpp"

#include <cmath>
#include <cstring>

#include "common/quant.hpp"
#include "pool/host_codec.hpp"

namespace ikv {
namespace {

// Read D elements of an engine array in dtype dt starting at element index off.
void load_row(const void *base, ikv_dtype dt, int64_t off, uint32_t D, float *out) {
    if (dt == IKV_DTYPE_F32) {
        std::memcpy(out, static_cast<const float *>(base) + off, D * sizeof(float));
    } else if (dt == IKV_DTYPE_F16) {
        decode_row_f16(static_cast<const uint16_t *>(base) + off, D, out);
    } else {
        const uint16_t *p = static_cast<const uint16_t *>(base) + off;
        for (uint32_t d = 0; d < D; ++d) out[d] = bf16_to_f32(p[d]);
    }
}

// True if any of D elements at src+off is NaN or inf, testing exponent bits
// only (all ones) so no conversion is needed.
bool row_has_nonfinite(const void *src, ikv_dtype dt, int64_t off, uint32_t D) {
    uint32_t bad = 0;
    if (dt == IKV_DTYPE_F32) {
        const uint32_t *p = static_cast<const uint32_t *>(src) + off;
        for (uint32_t d = 0; d < D; ++d) bad |= uint32_t((p[d] & 0x7F800000u) == 0x7F800000u);
    } else {
        const uint16_t mask = dt == IKV_DTYPE_F16 ? 0x7C00u : 0x7F80u;
        const uint16_t *p = static_cast<const uint16_t *>(src) + off;
        for (uint32_t d = 0; d < D; ++d) bad |= uint32_t((p[d] & mask) == mask);
    }
    return bad != 0;
}

}  // namespace

void find_nonfinite_host(const AppendSource &s, const PageShape &shape, uint32_t l0, uint32_t l1, NonFinite *out) {
    *out = NonFinite{};
    for (int which = 0; which < 2; ++which) {
        const void *src = which == 0 ? s.k : s.v;
        for (uint32_t l = l0; l < l1; ++l)
            for (uint32_t t = 0; t < s.n_tokens; ++t)
                for (uint32_t h = 0; h < shape.n_kv_heads; ++h) {
                    const int64_t off = source_offset(s, l, t, h);
                    if (!row_has_nonfinite(src, s.dtype, off, shape.head_dim)) continue;
                    float row[256];  // slow path: name the element (head_dim <= 256)
                    load_row(src, s.dtype, off, shape.head_dim, row);
                    uint32_t d = 0;
                    while (d + 1 < shape.head_dim && std::isfinite(row[d])) ++d;
                    out->found = true;
                    out->is_nan = std::isnan(row[d]);
                    out->which = which;
                    out->layer = l;
                    out->token = t;
                    out->head = h;
                    out->channel = d;
                    return;
                }
    }
}

void stage_rows_host(const AppendSource &s, const PageShape &shape, const AppendWrite &w) {
    const uint64_t head_floats = uint64_t(shape.page_size) * shape.head_dim;
    float *k = w.stage, *v = w.stage + head_floats * shape.n_kv_heads;
    for (uint32_t i = 0; i < w.rows; ++i)
        for (uint32_t h = 0; h < shape.n_kv_heads; ++h) {
            const int64_t src = source_offset(s, w.layer, w.token0 + i, h);
            const uint64_t dst = h * head_floats + uint64_t(w.row0 + i) * shape.head_dim;
            load_row(s.k, s.dtype, src, shape.head_dim, k + dst);
            load_row(s.v, s.dtype, src, shape.head_dim, v + dst);
        }
}

}  // namespace ikv
