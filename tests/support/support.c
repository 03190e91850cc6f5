#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t ikvt_next(ikvt_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double ikvt_uniform(ikvt_rng *r) { return (double)(ikvt_next(r) >> 11) * (1.0 / 9007199254740992.0); }

double ikvt_normal(ikvt_rng *r) {
    double u1 = ikvt_uniform(r), u2 = ikvt_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void ikvt_fill_normal(ikvt_rng *r, float *x, size_t n, float sigma) {
    for (size_t i = 0; i < n; ++i) x[i] = (float)(ikvt_normal(r) * sigma);
}

void ikvt_expect_status_impl(ikv_status got, ikv_status expected, const char *needle, const char *expr,
                             const char *file, int line) {
    if (got != expected) {
        print_error("%s:%d: %s returned %s, expected %s (last error: %s)\n", file, line, expr,
                    ikv_status_name(got), ikv_status_name(expected), ikv_last_error());
        _fail(file, line);
    }
    if (expected != IKV_OK) {
        const char *msg = ikv_last_error();
        if (msg == NULL || msg[0] == '\0') {
            print_error("%s:%d: %s failed with an empty ikv_last_error()\n", file, line, expr);
            _fail(file, line);
        }
        if (needle != NULL && strstr(msg, needle) == NULL) {
            print_error("%s:%d: %s: message \"%s\" does not mention \"%s\"\n", file, line, expr, msg, needle);
            _fail(file, line);
        }
    }
}

uint32_t ikvt_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
float ikvt_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Plain (slow, obviously correct) conversions, independent of the library's. */
void ikvt_to_f16(const float *in, uint16_t *out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        float x = in[i];
        uint16_t sign = (uint16_t)(x < 0 || (x == 0 && signbit(x)) ? 0x8000u : 0u);
        double a = fabs((double)x);
        uint16_t h;
        if (isnan(x)) {
            h = 0x7E00u;
        } else if (a >= 65520.0) {
            h = 0x7BFFu; /* the library saturates */
        } else if (a < ldexp(1.0, -14)) {
            h = (uint16_t)nearbyint(a * ldexp(1.0, 24));
        } else {
            int e;
            double m = frexp(a, &e); /* a = m 2^e, m in [0.5,1) */
            double mant = nearbyint((m * 2.0 - 1.0) * 1024.0);
            int E = e - 1;
            if (mant >= 1024.0) {
                mant = 0;
                ++E;
            }
            h = (uint16_t)(((E + 15) << 10) | (int)mant);
        }
        out[i] = (uint16_t)(sign | h);
    }
}

/* Round to nearest even; a finite value that would round to +-inf saturates
 * to the largest bf16 (0x7F7F), as the library stores it (docs/FORMATS.md). */
void ikvt_to_bf16(const float *in, uint16_t *out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        uint32_t x = ikvt_f32_bits(in[i]);
        const int finite = (x & 0x7F800000u) != 0x7F800000u;
        x += 0x7FFFu + ((x >> 16) & 1u);
        out[i] = finite && (x & 0x7F800000u) == 0x7F800000u ? (uint16_t)(((x >> 16) & 0x8000u) | 0x7F7Fu)
                                                            : (uint16_t)(x >> 16);
    }
}

float ikvt_f16_to_f32(uint16_t h) {
    int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1.0 + m / 1024.0, e - 15);
    return (float)((h & 0x8000u) ? -v : v);
}

float ikvt_bf16_to_f32(uint16_t b) { return ikvt_bits_f32((uint32_t)b << 16); }

/* The spacing of IEEE halves at magnitude a (subnormals: 2^-24). */
static double f16_ulp(double a) {
    if (a < ldexp(1.0, -14)) return ldexp(1.0, -24);
    int e;
    (void)frexp(a, &e); /* a in [2^(e-1), 2^e) */
    return ldexp(1.0, e - 11);
}

float ikvt_f16_down(float x) {
    const double a = fabs((double)x);
    const double u = f16_ulp(a);
    return (float)(x >= 0 ? floor(a / u) * u : -ceil(a / u) * u);
}

float ikvt_f16_up(float x) { return -ikvt_f16_down(-x); }

void ikvt_int4_params(float lo, float hi, float *min, float *scale) {
    const float lim = 65504.0f;
    lo = lo < -lim ? -lim : lo > lim ? lim : lo;
    hi = hi < -lim ? -lim : hi > lim ? lim : hi;
    *min = ikvt_f16_down(lo);
    const float range = hi - *min; /* fp32, as documented */
    *scale = range > 0 ? ikvt_f16_up(range / 15.0f) : 1.0f;
}

double ikvt_rel_l2(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (isnan(num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

ikv_pool_stats ikvt_pool_stats(const ikv_pool *pool) {
    ikv_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    IKVT_OK(ikv_pool_get_stats(pool, &st));
    return st;
}

ikv_model_shape ikvt_model_shape(uint32_t n_layers, uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim) {
    ikv_model_shape sh = ikv_model_shape_default();
    sh.n_layers = n_layers;
    sh.n_q_heads = n_q_heads;
    sh.n_kv_heads = n_kv_heads;
    sh.head_dim = head_dim;
    return sh;
}

ikv_pool_config ikvt_pool_config(ikvt_pool_spec s) {
    ikv_pool_config c = ikv_pool_default_config();
    c.backend = s.backend;
    if (s.n_layers) c.n_layers = s.n_layers;
    if (s.n_kv_heads) c.n_kv_heads = s.n_kv_heads;
    if (s.head_dim) c.head_dim = s.head_dim;
    if (s.page_size) c.page_size = s.page_size;
    if (s.capacity_bytes) c.capacity_bytes = s.capacity_bytes;
    c.default_format = s.default_format;
    c.kv_dtype = s.kv_dtype;
    return c;
}

ikv_pool *ikvt_make_pool(ikvt_pool_spec s) {
    const ikv_pool_config c = ikvt_pool_config(s);
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create(&c, &pool));
    return pool;
}

void ikvt_skip_program(const char *why) {
    printf("SKIPPED: %s\n", why);
    fflush(stdout);
    exit(77);
}

double ikvt_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

int ikvt_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
