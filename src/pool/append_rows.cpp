// Host readers of engine rows for appends (append_rows.hpp).
#include "pool/append_rows.hpp"

#include <cmath>
#include <cstring>

#include "common/quant.hpp"
#include "common/target_clones.hpp"
#include "cpu/dispatch.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define IKV_X86_F16C 1
#endif
#include "pool/host_codec.hpp"

namespace ikv {
namespace {

#if IKV_X86_F16C
// F16 to fp32 by the F16C instruction, exact for every half (head_dim is a
// multiple of 16), so equal to f16_to_f32; DAZ does not apply to it.
__attribute__((target("avx,f16c"))) void f16_row_f16c(const uint16_t *h, uint32_t D, float *out) {
    for (uint32_t d = 0; d < D; d += 8)
        _mm256_storeu_ps(out + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + d))));
}
bool f16c_present() {  // F16C's YMM form also needs the OS to keep AVX state ("avx" checks both)
    static const bool yes = has_f16c() && __builtin_cpu_supports("avx");
    return yes;
}
#endif

// Read D elements of an engine array in dtype dt starting at element index off.
void load_row(const void *base, ikv_dtype dt, int64_t off, uint32_t D, float *out) {
    if (dt == IKV_DTYPE_F32) {
        std::memcpy(out, static_cast<const float *>(base) + off, D * sizeof(float));
    } else if (dt == IKV_DTYPE_F16) {
#if IKV_X86_F16C
        if (f16c_present()) return f16_row_f16c(static_cast<const uint16_t *>(base) + off, D, out);
#endif
        decode_row_f16(static_cast<const uint16_t *>(base) + off, D, out);
    } else {
        const uint16_t *p = static_cast<const uint16_t *>(base) + off;
        for (uint32_t d = 0; d < D; ++d) out[d] = bf16_to_f32(p[d]);
    }
}

}  // namespace

IKV_AVX2_CLONES void find_nonfinite_host(const AppendSource &s, const PageShape &shape, uint32_t l0, uint32_t l1, NonFinite *out) {
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
                    out->negative = row[d] < 0.0f;
                    out->which = which;
                    out->layer = l;
                    out->token = t;
                    out->head = h;
                    out->channel = d;
                    return;
                }
    }
}

IKV_AVX2_CLONES void stage_rows_host(const AppendSource &s, const PageShape &shape, const AppendWrite &w) {
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
