/* The stored values are exactly the documented numerics (docs/FORMATS.md,
 * src/common/page_format.hpp): every value read back must equal, bit for
 * bit, a plain re-implementation here of each format's quantize-dequantize
 * with the page's groups (partial pages: only the filled tokens). This pins
 * the pool's fast paths to the one definition the GPU kernels also follow. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

enum { H = 2, P = 16, N = 3 * P + 7 };

/* ---- a plain E4M3 (OCP "fn") table: the nearest code, ties to the even code ---- */
static float g_e4m3[127]; /* values of codes 0x00..0x7E, non-negative */

static void init_e4m3(void) {
    for (int c = 0; c < 127; ++c) {
        const int e = c >> 3, m = c & 7;
        g_e4m3[c] = e == 0 ? (float)ldexp(m, -9) : (float)ldexp(1.0 + m / 8.0, e - 7);
    }
}

static float e4m3_round(float y) { /* decode(encode(y)) */
    const double a = fabs((double)y);
    int best = 0;
    for (int c = 1; c < 127; ++c) {
        const double dc = fabs(g_e4m3[c] - a), db = fabs(g_e4m3[best] - a);
        if (dc < db || (dc == db && (c & 1) == 0)) best = c;
    }
    if (a >= 448.0) best = 126;
    return y < 0 ? -g_e4m3[best] : g_e4m3[best];
}

/* x[t][d] of one (layer, head): rows of the page, n valid. out: expected read-back. */
static void expect_fp8(const float *x, int n, int D, float *out) {
    float amax = 0;
    for (int i = 0; i < n * D; ++i) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float s = amax > 0 ? amax / 448.0f : 1.0f;
    for (int i = 0; i < n * D; ++i) {
        const float y = x[i] / s;
        out[i] = e4m3_round(y) * s;
    }
}

static float q8(float x, float s) {
    float q = rintf(x / s);
    q = q > 127 ? 127 : (q < -127 ? -127 : q);
    return q * s;
}

static float q4(float x, float lo, float s) {
    x = x < -65504.0f ? -65504.0f : x > 65504.0f ? 65504.0f : x; /* INT4 saturates like F16 */
    float q = rintf((x - lo) / s);
    q = q > 15 ? 15 : (q < 0 ? 0 : q);
    volatile float p = q * s; /* no fused multiply-add: the library rounds the product first */
    return p + lo;
}

static void expect_int8(const float *x, int n, int D, int is_v, float *out) {
    if (!is_v) {
        for (int d = 0; d < D; ++d) {
            float amax = 0;
            for (int t = 0; t < n; ++t) amax = fabsf(x[t * D + d]) > amax ? fabsf(x[t * D + d]) : amax;
            const float s = amax > 0 ? amax / 127.0f : 1.0f;
            for (int t = 0; t < n; ++t) out[t * D + d] = q8(x[t * D + d], s);
        }
    } else {
        for (int t = 0; t < n; ++t) {
            float amax = 0;
            for (int d = 0; d < D; ++d) amax = fabsf(x[t * D + d]) > amax ? fabsf(x[t * D + d]) : amax;
            const float s = amax > 0 ? amax / 127.0f : 1.0f;
            for (int d = 0; d < D; ++d) out[t * D + d] = q8(x[t * D + d], s);
        }
    }
}

static void expect_int4(const float *x, int n, int D, int is_v, float *out) {
    if (!is_v) {
        for (int d = 0; d < D; ++d) {
            float lo = INFINITY, hi = -INFINITY;
            for (int t = 0; t < n; ++t) {
                lo = x[t * D + d] < lo ? x[t * D + d] : lo;
                hi = x[t * D + d] > hi ? x[t * D + d] : hi;
            }
            float m, s;
            ikvt_int4_params(lo, hi, &m, &s);
            for (int t = 0; t < n; ++t) out[t * D + d] = q4(x[t * D + d], m, s);
        }
    } else {
        for (int t = 0; t < n; ++t)
            for (int d0 = 0; d0 < D; d0 += 32) {
                const int d1 = d0 + 32 < D ? d0 + 32 : D;
                float lo = INFINITY, hi = -INFINITY;
                for (int d = d0; d < d1; ++d) {
                    lo = x[t * D + d] < lo ? x[t * D + d] : lo;
                    hi = x[t * D + d] > hi ? x[t * D + d] : hi;
                }
                float m, s;
                ikvt_int4_params(lo, hi, &m, &s);
                for (int d = d0; d < d1; ++d) out[t * D + d] = q4(x[t * D + d], m, s);
            }
    }
}

static void expect(ikv_format f, const float *x, int n, int D, int is_v, float *out) {
    uint16_t h;
    switch (f) {
        case IKV_FMT_F16:
            for (int i = 0; i < n * D; ++i) {
                ikvt_to_f16(&x[i], &h, 1);
                out[i] = ikvt_f16_to_f32(h);
            }
            break;
        case IKV_FMT_BF16:
            for (int i = 0; i < n * D; ++i) {
                ikvt_to_bf16(&x[i], &h, 1);
                out[i] = ikvt_bf16_to_f32(h);
            }
            break;
        case IKV_FMT_FP8_E4M3: expect_fp8(x, n, D, out); break;
        case IKV_FMT_INT8: expect_int8(x, n, D, is_v, out); break;
        case IKV_FMT_INT4: expect_int4(x, n, D, is_v, out); break;
        default: break;
    }
}

static void check_format(ikv_format f, uint32_t D, int kind, int token_by_token) {
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = 1, .n_kv_heads = H, .head_dim = D, .page_size = P,
                                                     .capacity_bytes = 16u << 20, .default_format = f});
    const size_t n = (size_t)N * H * D;
    float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    float *rk = malloc(n * sizeof(float)), *rv = malloc(n * sizeof(float));
    float *rows = malloc((size_t)P * D * sizeof(float)), *want = malloc((size_t)P * D * sizeof(float));
    ikvt_rng r = {(uint64_t)(f * 1000 + D * 10 + kind)};
    ikvt_fill_normal(&r, k, n, 1.0f);
    ikvt_fill_normal(&r, v, n, 1.0f);
    for (size_t i = 0; i < n; ++i) {
        if (kind == 1 && i % 61 == 0) k[i] *= 250.0f, v[i] *= -250.0f; /* outliers */
        if (kind == 2 && i % 3 == 0) k[i] = 0.0f, v[i] = 1.5f;         /* zeros, constants */
        if (kind == 3) k[i] *= 3e3f, v[i] *= 1e-3f;                     /* large and small */
    }
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    const uint32_t step = token_by_token ? 1 : N;
    for (uint32_t t = 0; t < N; t += step) {
        ikv_append a = ikv_append_default(pool, step);
        a.k = k + (size_t)t * H * D;
        a.v = v + (size_t)t * H * D;
        IKVT_OK(ikv_pool_append(pool, s, &a));
    }
    IKVT_OK(ikv_seq_read(pool, s, 0, 0, N, rk, rv));
    for (int which = 0; which < 2; ++which) {
        const float *x = which ? v : k, *y = which ? rv : rk;
        for (uint32_t p = 0; p * P < N; ++p)
            for (uint32_t h = 0; h < H; ++h) {
                const uint32_t t0 = p * P, cnt = t0 + P < N ? P : N - t0;
                for (uint32_t t = 0; t < cnt; ++t) memcpy(rows + t * D, x + ((size_t)(t0 + t) * H + h) * D, D * sizeof(float));
                expect(f, rows, (int)cnt, (int)D, which, want);
                for (uint32_t t = 0; t < cnt; ++t)
                    for (uint32_t d = 0; d < D; ++d) {
                        const float got = y[((size_t)(t0 + t) * H + h) * D + d], w = want[t * D + d];
                        if (!(got == w)) {
                            print_error("%s D=%u kind %d %s: %s[t=%u,h=%u,d=%u] = %.9g, expected %.9g (input %.9g)\n",
                                        ikv_format_name(f), D, kind, token_by_token ? "token by token" : "bulk",
                                        which ? "v" : "k", t0 + t, h, d, (double)got, (double)w,
                                        (double)rows[t * D + d]);
                            fail();
                        }
                    }
            }
    }
    free(k);
    free(v);
    free(rk);
    free(rv);
    free(rows);
    free(want);
    ikv_pool_destroy(pool);
}

static void test_exact_numerics(void **state) {
    (void)state;
    init_e4m3();
    const uint32_t dims[] = {32, 64, 80, 96, 128, 256};
    for (int f = 0; f < IKV_FMT_COUNT; ++f)
        for (int di = 0; di < 6; ++di)
            for (int kind = 0; kind < 4; ++kind) check_format((ikv_format)f, dims[di], kind, (kind + di) % 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_numerics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
