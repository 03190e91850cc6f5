/* Page formats against a float64 reference: every element's reconstruction
 * error stays within the bound docs/FORMATS.md gives, on random normal data
 * and on adversarial data; F16/BF16 are exactly round-to-nearest-even;
 * promotion after demotion; key summaries equal plain recomputation. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

enum { H = 2, D = 80, P = 16, N = 2 * P + 5 }; /* D = 80: the last INT4 V group is 16 channels */

static ikv_pool *make_pool(ikv_format f) {
    return ikvt_make_pool((ikvt_pool_spec){.n_layers = 1, .n_kv_heads = H, .head_dim = D, .page_size = P,
                                           .capacity_bytes = 16u << 20, .default_format = f});
}

/* x[t][h][d] */
#define AT(x, t, h, d) (x)[((size_t)(t) * H + (h)) * D + (d)]

typedef enum data_kind { NORMAL, OUTLIERS, CONSTANT, ZEROS, LARGE, HUGE, KIND_COUNT } data_kind;
static const char *const kKindNames[] = {"normal", "outliers", "constant", "zeros", "large(1e4)", "huge(1e30)"};

static void make_data(data_kind kind, uint64_t seed, float *x) {
    ikvt_rng r = {seed};
    ikvt_fill_normal(&r, x, (size_t)N * H * D, 1.0f);
    for (uint32_t t = 0; t < N; ++t)
        for (uint32_t h = 0; h < H; ++h)
            for (uint32_t d = 0; d < D; ++d) {
                float *e = &AT(x, t, h, d);
                switch (kind) {
                    case OUTLIERS:
                        if ((t * 7 + d * 13) % 97 == 0) *e *= 300.0f; /* a few channels/tokens 300x larger */
                        break;
                    case CONSTANT:
                        if (d % 3 == 0) *e = 2.5f;      /* constant channels */
                        if (t % 5 == 0) *e = -1.25f;    /* constant tokens */
                        break;
                    case ZEROS: *e = (d % 2 == 0 || t % 4 == 0) ? 0.0f : *e; break;
                    case LARGE: *e *= 1e4f / 4.0f; break;
                    case HUGE: *e *= 1e30f / 4.0f; break;
                    default: break;
                }
            }
    if (kind == ZEROS) memset(&AT(x, 0, 0, 0), 0, sizeof(float) * H * D * 3); /* all-zero tokens */
}

/* Half step of the group's scale in float64 from the page's input: the
 * bound of docs/FORMATS.md. page_lo/hi: tokens of the element's page. */
static double bound(ikv_format f, const float *x, int which, uint32_t t, uint32_t h, uint32_t d) {
    const uint32_t p0 = t / P * P, p1 = p0 + P < N ? p0 + P : N;
    const double xv = fabs((double)AT(x, t, h, d));
    switch (f) {
        case IKV_FMT_F16: return xv * ldexp(1.0, -11) + ldexp(1.0, -25);
        case IKV_FMT_BF16: return xv * ldexp(1.0, -8) + 1e-45;
        case IKV_FMT_FP8_E4M3: {
            double amax = 0;
            for (uint32_t tt = p0; tt < p1; ++tt)
                for (uint32_t dd = 0; dd < D; ++dd) amax = fmax(amax, fabs((double)AT(x, tt, h, dd)));
            const double s = amax > 0 ? amax / 448.0 : 1.0;
            return xv * ldexp(1.0, -4) + s * ldexp(1.0, -10) + xv * 1e-6;
        }
        case IKV_FMT_INT8: {
            double amax = 0;
            if (which == 0)
                for (uint32_t tt = p0; tt < p1; ++tt) amax = fmax(amax, fabs((double)AT(x, tt, h, d)));
            else
                for (uint32_t dd = 0; dd < D; ++dd) amax = fmax(amax, fabs((double)AT(x, t, h, dd)));
            return 0.5 * (amax / 127.0) * (1 + 1e-5) + amax * 1e-6;
        }
        case IKV_FMT_INT4: {
            double lo = INFINITY, hi = -INFINITY;
            if (which == 0) {
                for (uint32_t tt = p0; tt < p1; ++tt) {
                    lo = fmin(lo, AT(x, tt, h, d));
                    hi = fmax(hi, AT(x, tt, h, d));
                }
            } else {
                const uint32_t d0 = d / 32 * 32, d1 = d0 + 32 < D ? d0 + 32 : D;
                for (uint32_t dd = d0; dd < d1; ++dd) {
                    lo = fmin(lo, AT(x, t, h, dd));
                    hi = fmax(hi, AT(x, t, h, dd));
                }
            }
            float m, s; /* the stored (half) minimum and scale: lo rounded down, (hi - m)/15 up */
            ikvt_int4_params((float)lo, (float)hi, &m, &s);
            return 0.5 * s * (1 + 1e-5) + fmax(fabs(lo), fabs(hi)) * 1e-6;
        }
        default: return 0;
    }
}

static void check_against_reference(ikv_format f, data_kind kind, int token_by_token) {
    ikv_pool *pool = make_pool(f);
    const size_t n = (size_t)N * H * D;
    float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    float *rk = malloc(n * sizeof(float)), *rv = malloc(n * sizeof(float));
    make_data(kind, 1000 + kind * 10 + f, k);
    make_data(kind, 2000 + kind * 10 + f, v);
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
    double worst = 0;
    for (int which = 0; which < 2; ++which) {
        const float *x = which == 0 ? k : v, *y = which == 0 ? rk : rv;
        for (uint32_t t = 0; t < N; ++t)
            for (uint32_t h = 0; h < H; ++h)
                for (uint32_t d = 0; d < D; ++d) {
                    const double err = fabs((double)AT(y, t, h, d) - (double)AT(x, t, h, d));
                    const double b = bound(f, x, which, t, h, d);
                    if (!(err <= b)) {
                        print_error("%s on %s data: %s[t=%u,h=%u,d=%u] = %.9g, input %.9g, error %.3g > bound %.3g\n",
                                    ikv_format_name(f), kKindNames[kind], which ? "v" : "k", t, h, d,
                                    (double)AT(y, t, h, d), (double)AT(x, t, h, d), err, b);
                        fail();
                    }
                    if (b > 0) worst = fmax(worst, err / b);
                }
    }
    /* zero stays exactly zero in the symmetric formats (INT4 is asymmetric: zero is
     * exact only where the group's minimum is 0) */
    if (kind == ZEROS && f != IKV_FMT_INT4)
        for (size_t i = 0; i < (size_t)3 * H * D; ++i) assert_true(rk[i] == 0.0f && rv[i] == 0.0f);
    if (f == IKV_FMT_F16 || f == IKV_FMT_BF16) { /* exactly the RNE conversion */
        uint16_t *c = malloc(n * sizeof(uint16_t));
        for (int which = 0; which < 2; ++which) {
            const float *x = which == 0 ? k : v, *y = which == 0 ? rk : rv;
            if (f == IKV_FMT_F16) {
                ikvt_to_f16(x, c, n);
                for (size_t i = 0; i < n; ++i) assert_true(y[i] == ikvt_f16_to_f32(c[i]));
            } else {
                ikvt_to_bf16(x, c, n);
                for (size_t i = 0; i < n; ++i) assert_true(y[i] == ikvt_bf16_to_f32(c[i]));
            }
        }
        free(c);
    }
    (void)worst;
    free(k);
    free(v);
    free(rk);
    free(rv);
    ikv_pool_destroy(pool);
}

static void test_error_bounds(void **state) {
    (void)state;
    for (int f = 0; f < IKV_FMT_COUNT; ++f)
        for (int kind = 0; kind < KIND_COUNT; ++kind) {
            /* beyond F16's range F16 and INT4 (half group parameters) saturate (tested below) */
            if ((f == IKV_FMT_F16 || f == IKV_FMT_INT4) && kind == HUGE) continue;
            check_against_reference((ikv_format)f, (data_kind)kind, 0);
            check_against_reference((ikv_format)f, (data_kind)kind, 1);
        }
}

/* A new sequence holding the n tokens k, v ([t][h][d]). */
static ikv_seq_id new_seq_of(ikv_pool *pool, const float *k, const float *v, uint32_t n) {
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    ikv_append a = ikv_append_default(pool, n);
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append(pool, s, &a));
    return s;
}

/* One token (H kv-heads of D channels) appended to a new sequence, read back. */
static void append_one_and_read(ikv_pool *pool, const float *k, const float *v, float *rk, float *rv) {
    IKVT_OK(ikv_seq_read(pool, new_seq_of(pool, k, v, 1), 0, 0, 1, rk, rv));
}

static void test_f16_saturates(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_FMT_F16);
    float k[H * D], v[H * D], rk[H * D], rv[H * D];
    for (int i = 0; i < H * D; ++i) {
        k[i] = (i % 2 ? -1.0f : 1.0f) * (60000.0f + 100.0f * (float)i);
        v[i] = (i % 2 ? -1e-9f : 1e-9f) * (float)i; /* subnormal halves of both signs, +0 */
    }
    v[1] = -0.0f;
    append_one_and_read(pool, k, v, rk, rv);
    uint16_t c[H * D];
    ikvt_to_f16(k, c, H * D);
    for (int i = 0; i < H * D; ++i) {
        assert_true(rk[i] == ikvt_f16_to_f32(c[i]));
        assert_true(fabsf(rk[i]) <= 65504.0f);
    }
    ikvt_to_f16(v, c, H * D);
    for (int i = 0; i < H * D; ++i) {
        assert_true(rv[i] == ikvt_f16_to_f32(c[i]));
        assert_int_equal(signbit(rv[i]) != 0, signbit(ikvt_f16_to_f32(c[i])) != 0); /* -0 stays -0 */
    }
    ikv_pool_destroy(pool);
}

/* INT4 keeps its group minimum and scale as halves, so it saturates like F16:
 * values beyond +-65504 are stored as if they were +-65504 (a group then
 * spans at most [-65504, 65504 + s]), and every other value of their group
 * keeps the s/2 bound of the clamped range. */
static void test_int4_saturates(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_FMT_INT4);
    float k[H * D], v[H * D], rk[H * D], rv[H * D];
    for (int i = 0; i < H * D; ++i) {
        k[i] = (i % 7 == 0 ? 1e30f : i % 7 == 1 ? -7e4f : 0.01f * (float)(i % 5)) * (i % 2 ? 1.0f : -1.0f);
        v[i] = i % 32 == 3 ? 3e38f : i % 32 == 4 ? -65504.0f : 1e-3f * (float)i;
    }
    append_one_and_read(pool, k, v, rk, rv);
    for (int which = 0; which < 2; ++which) {
        const float *x = which ? v : k, *y = which ? rv : rk;
        for (int i = 0; i < H * D; ++i) {
            /* the group: K one channel (one token here), V 32 channels of the token within its head */
            const int head0 = i / D * D, head1 = head0 + D;
            const int g0 = which ? head0 + (i - head0) / 32 * 32 : i;
            const int g1 = which ? (g0 + 32 < head1 ? g0 + 32 : head1) : i + 1;
            float lo = INFINITY, hi = -INFINITY, m, sc;
            for (int j = g0; j < g1; ++j) lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
            ikvt_int4_params(lo, hi, &m, &sc);
            const double xc = fmin(fmax((double)x[i], -65504.0), 65504.0);
            const double clo = fmax((double)lo, -65504.0), chi = fmin((double)hi, 65504.0);
            const double slack = fmax(fabs(clo), fabs(chi)) * 1e-6; /* fp32 rounding of the clamped range */
            if (!(isfinite(y[i]) && fabs((double)y[i] - xc) <= 0.5 * sc * (1 + 1e-5) + slack)) {
                print_error("int4 saturation: %s[%d] = %.9g, input %.9g (clamped %.9g), scale %.9g\n", which ? "v" : "k",
                            i, (double)y[i], (double)x[i], xc, (double)sc);
                fail();
            }
        }
    }
    ikv_pool_destroy(pool);
}

/* Finite inputs up to +-FLT_MAX are stored finite in every format and their
 * key summaries stay finite bounds of the stored keys: BF16 rounds them to
 * its largest finite value (0x1.fep127) instead of infinity, and INT8/FP8 take
 * a group's largest magnitude at most 0x1.fcp127, so their largest code times
 * the scale stays finite (docs/FORMATS.md). A page of two tokens: token 0
 * huge, token 1 ordinary, appended one token at a time and then rewritten by a
 * format change (both encoders). */
static void test_huge_finite_values_stay_finite(void **state) {
    (void)state;
    const float huge[4] = {FLT_MAX, -FLT_MAX, 3.4e38f, -3.39e38f};
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        ikv_pool *pool = make_pool((ikv_format)f);
        ikv_seq_id s;
        IKVT_OK(ikv_seq_create(pool, &s));
        float k[2][H * D], v[2][H * D];
        for (int i = 0; i < H * D; ++i) {
            k[0][i] = v[0][i] = huge[i % 4];
            k[1][i] = v[1][i] = 0.5f + 0.01f * (float)(i % 7);
        }
        for (int t = 0; t < 2; ++t) { /* f odd: the ordinary token first, so the huge one widens the scales */
            const int src = f % 2 ? 1 - t : t;
            ikv_append a = ikv_append_default(pool, 1);
            a.k = k[src];
            a.v = v[src];
            IKVT_OK(ikv_pool_append(pool, s, &a));
        }
        for (int pass = 0; pass < 2; ++pass) {
            if (pass == 1) IKVT_OK(ikv_seq_set_page_format(pool, s, 0, (ikv_format)((f + 1) % IKV_FMT_COUNT)));
            float rk[2 * H * D], rv[2 * H * D], mn[D], mx[D], mean[D];
            IKVT_OK(ikv_seq_read(pool, s, 0, 0, 2, rk, rv));
            for (int i = 0; i < 2 * H * D; ++i)
                if (!isfinite(rk[i]) || !isfinite(rv[i])) {
                    print_error("%s (pass %d): element %d stored as k %g, v %g from finite input\n",
                                ikv_format_name((ikv_format)f), pass, i, (double)rk[i], (double)rv[i]);
                    fail();
                }
            const ikv_format now = pass == 0 ? (ikv_format)f : (ikv_format)((f + 1) % IKV_FMT_COUNT);
            const float *hk = rk + (f % 2 ? H * D : 0); /* the huge token's row */
            if (pass == 0 && now == IKV_FMT_BF16) assert_true(hk[0] == 0x1.fep127f && hk[1] == -0x1.fep127f);
            for (uint32_t h = 0; h < H; ++h) {
                IKVT_OK(ikv_seq_page_summary(pool, s, 0, h, 0, mn, mx, mean, NULL));
                for (uint32_t d = 0; d < D; ++d) {
                    const float a = rk[h * D + d], b = rk[H * D + h * D + d];
                    const float lo = a < b ? a : b, hi = a < b ? b : a;
                    if (!(isfinite(mn[d]) && isfinite(mx[d]) && isfinite(mean[d]) && mn[d] <= lo && hi <= mx[d])) {
                        print_error("%s (pass %d): head %u channel %u summary [%g, %g] mean %g, stored %g, %g\n",
                                    ikv_format_name(now), pass, h, d, (double)mn[d], (double)mx[d], (double)mean[d],
                                    (double)a, (double)b);
                        fail();
                    }
                }
            }
        }
        ikv_pool_destroy(pool);
    }
}

/* A group whose largest magnitude is a tiny subnormal (absmax / 448 and
 * absmax / 127 underflow to 0) is stored with s = 1: every value reads back
 * finite and within the bound (here 0), never 0 / 0 = NaN. */
static void test_tiny_groups_stay_finite(void **state) {
    (void)state;
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        ikv_pool *pool = make_pool((ikv_format)f);
        float k[H * D], v[H * D], rk[H * D], rv[H * D];
        for (int i = 0; i < H * D; ++i) k[i] = v[i] = i % 9 == 4 ? 1e-44f : 0.0f;
        append_one_and_read(pool, k, v, rk, rv);
        for (int i = 0; i < H * D; ++i)
            if (!(isfinite(rk[i]) && isfinite(rv[i]) && fabsf(rk[i]) <= 1e-44f && fabsf(rv[i]) <= 1e-44f)) {
                print_error("%s: element %d read back as k %g, v %g (input %g)\n", ikv_format_name((ikv_format)f), i,
                            (double)rk[i], (double)rv[i], (double)k[i]);
                fail();
            }
        ikv_pool_destroy(pool);
    }
}

/* Demote F16 -> INT4, promote back: storage precision returns (the page is
 * F16 again, exactly the F16 rounding of the INT4 values), the lost bits do not. */

static void test_promote_after_demote(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_FMT_F16);
    const size_t n = (size_t)N * H * D;
    float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    float *dk = malloc(n * sizeof(float)), *dv = malloc(n * sizeof(float));
    float *pk = malloc(n * sizeof(float)), *pv = malloc(n * sizeof(float));
    make_data(NORMAL, 77, k);
    make_data(NORMAL, 78, v);
    const ikv_seq_id s = new_seq_of(pool, k, v, N);
    for (uint32_t p = 0; p < 3; ++p) IKVT_OK(ikv_seq_set_page_format(pool, s, p, IKV_FMT_INT4));
    ikv_format f;
    IKVT_OK(ikv_seq_page_format(pool, s, 2, &f));
    assert_int_equal(f, IKV_FMT_INT4);
    ikv_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    IKVT_OK(ikv_pool_get_stats(pool, &st));
    assert_true(st.pages_by_format[IKV_FMT_INT4] == 3 && st.pages_by_format[IKV_FMT_F16] == 0);
    assert_true(st.used_bytes == 3 * ikv_pool_page_bytes(pool, IKV_FMT_INT4));
    IKVT_OK(ikv_seq_read(pool, s, 0, 0, N, dk, dv));
    double err_demoted = 0, err_promoted = 0;
    for (size_t i = 0; i < n; ++i) err_demoted = fmax(err_demoted, fabs((double)dk[i] - k[i]));
    for (uint32_t p = 0; p < 3; ++p) IKVT_OK(ikv_seq_set_page_format(pool, s, p, IKV_FMT_F16));
    IKVT_OK(ikv_pool_get_stats(pool, &st));
    assert_true(st.pages_by_format[IKV_FMT_F16] == 3 && st.used_bytes == 3 * ikv_pool_page_bytes(pool, IKV_FMT_F16));
    IKVT_OK(ikv_seq_read(pool, s, 0, 0, N, pk, pv));
    uint16_t *c = malloc(n * sizeof(uint16_t));
    ikvt_to_f16(dk, c, n);
    for (size_t i = 0; i < n; ++i) assert_true(pk[i] == ikvt_f16_to_f32(c[i]));
    ikvt_to_f16(dv, c, n);
    for (size_t i = 0; i < n; ++i) assert_true(pv[i] == ikvt_f16_to_f32(c[i]));
    for (size_t i = 0; i < n; ++i) err_promoted = fmax(err_promoted, fabs((double)pk[i] - k[i]));
    assert_true(err_demoted > 1e-2);                    /* INT4 lost bits ... */
    assert_true(err_promoted > 0.5 * err_demoted);      /* ... and promotion does not bring them back */
    /* An append into the (promoted) partial tail keeps the demoted values of its old tokens. */
    float one_k[H * D], one_v[H * D];
    memcpy(one_k, k, sizeof one_k);
    memcpy(one_v, v, sizeof one_v);
    ikv_append b = ikv_append_default(pool, 1);
    b.k = one_k;
    b.v = one_v;
    IKVT_OK(ikv_pool_append(pool, s, &b));
    IKVT_OK(ikv_seq_read(pool, s, 0, 2 * P, N, pk, pv));
    ikvt_to_f16(dk + (size_t)2 * P * H * D, c, (size_t)(N - 2 * P) * H * D);
    for (size_t i = 0; i < (size_t)(N - 2 * P) * H * D; ++i) assert_true(pk[i] == ikvt_f16_to_f32(c[i]));
    free(c);
    free(k);
    free(v);
    free(dk);
    free(dv);
    free(pk);
    free(pv);
    ikv_pool_destroy(pool);
}

/* "Page storage comes from ... slabs as pages are needed, up to
 * capacity_bytes": a small pool whose pages change through every format keeps
 * its slab memory (reserved_bytes) within the capacity; it used to keep an
 * empty slab per format, each up to the capacity (5x the capacity here). */
static void test_slabs_within_capacity(void **state) {
    (void)state;
    ikv_pool *probe = make_pool(IKV_FMT_F16);
    const uint64_t cap = 8 * ikv_pool_page_bytes(probe, IKV_FMT_F16);
    ikv_pool_destroy(probe);
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = 1, .n_kv_heads = H, .head_dim = D, .page_size = P,
                                                     .capacity_bytes = cap});
    float *k = malloc((size_t)N * H * D * sizeof(float)), *v = malloc((size_t)N * H * D * sizeof(float));
    make_data(NORMAL, 91, k);
    make_data(NORMAL, 92, v);
    const ikv_seq_id s = new_seq_of(pool, k, v, N);
    static const ikv_format order[] = {IKV_FMT_INT4, IKV_FMT_INT8, IKV_FMT_FP8_E4M3, IKV_FMT_BF16, IKV_FMT_F16,
                                       IKV_FMT_INT8, IKV_FMT_INT4};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; ++i) {
        IKVT_OK(ikv_seq_set_page_format(pool, s, (uint32_t)(i % 2), order[i]));
        const ikv_pool_stats st = ikvt_pool_stats(pool);
        assert_true(st.reserved_bytes >= st.used_bytes);
        assert_true(st.reserved_bytes <= cap);
    }
    /* A second sequence fills the capacity in F16: every page still fits. */
    ikv_seq_id s2;
    IKVT_OK(ikv_seq_create(pool, &s2));
    const ikv_pool_stats before = ikvt_pool_stats(pool);
    const uint32_t pages = (uint32_t)((cap - before.used_bytes) / ikv_pool_page_bytes(pool, IKV_FMT_F16));
    for (uint32_t p = 0; p < pages; ++p) {
        ikv_append b = ikv_append_default(pool, P);
        b.k = k;
        b.v = v;
        IKVT_OK(ikv_pool_append(pool, s2, &b));
    }
    assert_true(ikvt_pool_stats(pool).used_bytes <= cap);
    free(k);
    free(v);
    ikv_pool_destroy(pool);
}

/* bfloat16 helpers for the summary checks, written from the definition (an
 * fp32 value with 16 zero low bits; neighbours one step of the top 16 bits
 * apart), independently of the library's rounding code. */
static int is_bf16(float x) { return (ikvt_f32_bits(x) & 0xFFFFu) == 0; }
/* The bf16 value next above (up = 1) or below (up = 0) the bf16 value x. */
static float bf16_next(float x, int up) {
    if (x == 0.0f) return ikvt_bits_f32(up ? 0x00010000u : 0x80010000u);
    const uint32_t u = ikvt_f32_bits(x);
    const int away = (x > 0) == (up != 0); /* moving away from zero grows the magnitude bits */
    return ikvt_bits_f32(away ? u + 0x10000u : u - 0x10000u);
}

/* The bfloat16 nearest m (ties to the even significand), from the definition:
 * 8 significant bits, steps of 2^(e-8) for m in [2^(e-1), 2^e), 2^-133 below
 * 2^-126 (subnormal). */
static double bf16_nearest(double m) {
    const double a = fabs(m);
    if (a == 0) return m;
    int e;
    frexp(a, &e);
    const double step = e - 8 < -133 ? 0x1p-133 : ldexp(1.0, e - 8);
    const double lo = floor(a / step) * step, hi = lo + step;
    const double r = a - lo < hi - a ? lo : a - lo > hi - a ? hi : fmod(lo / step, 2.0) == 0 ? lo : hi;
    return m < 0 ? -r : r;
}

/* Each page's key summary against a plain recomputation from the values read
 * back: k_min is the largest bf16 <= the minimum, k_max the smallest bf16 >=
 * the maximum (so they bound every stored key), k_mean the bf16 nearest the
 * mean (summed in double in token order, as the header's one rounding says). */
static void check_summaries(ikv_pool *pool, ikv_seq_id s) {
    uint32_t len;
    IKVT_OK(ikv_seq_length(pool, s, &len));
    float *rk = malloc((size_t)len * H * D * sizeof(float) + 4), *rv = malloc((size_t)len * H * D * sizeof(float) + 4);
    IKVT_OK(ikv_seq_read(pool, s, 0, 0, len, rk, rv));
    for (uint32_t p = 0; p * P < len; ++p)
        for (uint32_t h = 0; h < H; ++h) {
            float mn[D], mx[D], mean[D];
            uint32_t nt;
            IKVT_OK(ikv_seq_page_summary(pool, s, 0, h, p, mn, mx, mean, &nt));
            const uint32_t t0 = p * P, t1 = t0 + P < len ? t0 + P : len;
            assert_int_equal(nt, t1 - t0);
            for (uint32_t d = 0; d < D; ++d) {
                double lo = INFINITY, hi = -INFINITY, sum = 0;
                for (uint32_t t = t0; t < t1; ++t) {
                    lo = fmin(lo, AT(rk, t, h, d));
                    hi = fmax(hi, AT(rk, t, h, d));
                    sum += AT(rk, t, h, d);
                }
                assert_true(is_bf16(mn[d]) && is_bf16(mx[d]) && is_bf16(mean[d]));
                assert_true(mn[d] <= lo && bf16_next(mn[d], 1) > lo);
                assert_true(mx[d] >= hi && bf16_next(mx[d], 0) < hi);
                if (mean[d] != bf16_nearest(sum / nt))
                    fail_msg("page %u head %u channel %u: k_mean %.9g, the nearest bf16 to the mean %.17g is %.9g", p, h,
                             d, (double)mean[d], sum / nt, bf16_nearest(sum / nt));
            }
        }
    free(rk);
    free(rv);
}

static void test_summaries(void **state) {
    (void)state;
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        ikv_pool *pool = make_pool((ikv_format)f);
        const size_t n = (size_t)N * H * D;
        float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
        make_data(OUTLIERS, 300 + f, k);
        make_data(NORMAL, 400 + f, v);
        const ikv_seq_id s = new_seq_of(pool, k, v, N);
        check_summaries(pool, s);
        IKVT_OK(ikv_seq_truncate(pool, s, 9)); /* tail page 1 keeps 12 tokens */
        check_summaries(pool, s);
        IKVT_OK(ikv_seq_set_page_format(pool, s, 0, (ikv_format)((f + 2) % IKV_FMT_COUNT)));
        IKVT_OK(ikv_seq_set_page_format(pool, s, 1, (ikv_format)((f + 3) % IKV_FMT_COUNT)));
        check_summaries(pool, s);
        ikv_append a = ikv_append_default(pool, 3);
        a.k = k;
        a.v = v;
        IKVT_OK(ikv_pool_append(pool, s, &a));
        check_summaries(pool, s);
        free(k);
        free(v);
        ikv_pool_destroy(pool);
    }
}

/* k_mean is the bf16 nearest the mean in one rounding: channel 0 of an F16
 * page holds 2 + 2^-7 and 2^-24 (both exact in F16), whose mean 1 + 2^-8 +
 * 2^-25 lies just above the midpoint of the bf16 values 1 and 1 + 2^-7. Its
 * nearest fp32 is that midpoint, which ties-to-even would have taken to 1. */
static void test_summary_mean_one_rounding(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_FMT_F16);
    float k[2 * H * D], v[2 * H * D];
    memset(k, 0, sizeof k);
    memset(v, 0, sizeof v);
    k[0] = 2.0f + 0x1p-7f;
    k[H * D] = 0x1p-24f;
    const ikv_seq_id s = new_seq_of(pool, k, v, 2);
    float mn[D], mx[D], mean[D];
    IKVT_OK(ikv_seq_page_summary(pool, s, 0, 0, 0, mn, mx, mean, NULL));
    assert_true(mean[0] == 1.0f + 0x1p-7f);
    assert_true(mn[0] == 0x1p-24f && mx[0] == 2.0f + 0x1p-6f); /* 2 + 2^-7 is not a bf16: k_max rounds up */
    ikv_pool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_bounds),
        cmocka_unit_test(test_int4_saturates),
        cmocka_unit_test(test_f16_saturates),
        cmocka_unit_test(test_huge_finite_values_stay_finite),
        cmocka_unit_test(test_tiny_groups_stay_finite),
        cmocka_unit_test(test_promote_after_demote),
        cmocka_unit_test(test_summaries),
        cmocka_unit_test(test_summary_mean_one_rounding),
        cmocka_unit_test(test_slabs_within_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
