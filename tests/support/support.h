/* Shared helpers for the CMocka tests: deterministic random data, status
 * assertions that also check the error sentence, and the float64 reference. */
#ifndef IKV_TEST_SUPPORT_H
#define IKV_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "intentkv.h"

/* splitmix64: a seeded, portable generator so failures reproduce. */
typedef struct ikvt_rng {
    uint64_t state;
} ikvt_rng;

uint64_t ikvt_next(ikvt_rng *r);
double ikvt_uniform(ikvt_rng *r);              /* [0, 1) */
double ikvt_normal(ikvt_rng *r);               /* N(0, 1) */
void ikvt_fill_normal(ikvt_rng *r, float *x, size_t n, float sigma);

/* Assert that `call` returned `expected` and, for an error, that
 * ikv_last_error() is a non-empty sentence containing `needle` (NULL: any). */
#define IKVT_EXPECT_STATUS(call, expected, needle) \
    ikvt_expect_status_impl((call), (expected), (needle), #call, __FILE__, __LINE__)
void ikvt_expect_status_impl(ikv_status got, ikv_status expected, const char *needle, const char *expr,
                             const char *file, int line);
#define IKVT_OK(call) IKVT_EXPECT_STATUS(call, IKV_OK, NULL)

/* What the tests vary in a pool's config; the rest is ikv_pool_default_config()'s.
 * Shape fields and capacity_bytes: 0 keeps the default. backend,
 * default_format and kv_dtype are taken as given (zero: CPU, F16, F32). */
typedef struct ikvt_pool_spec {
    ikv_backend backend;
    uint32_t n_layers, n_kv_heads, head_dim, page_size;
    uint64_t capacity_bytes;
    ikv_format default_format;
    ikv_dtype kv_dtype;
} ikvt_pool_spec;
ikv_pool_config ikvt_pool_config(ikvt_pool_spec s);
/* The pool's statistics (asserting success). */
ikv_pool_stats ikvt_pool_stats(const ikv_pool *pool);
/* ikv_model_shape_default() with these fields. */
ikv_model_shape ikvt_model_shape(uint32_t n_layers, uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim);
ikv_pool *ikvt_make_pool(ikvt_pool_spec s); /* ikv_pool_create; the test fails unless it succeeds */

/* Convert fp32 arrays to the engine dtypes the pool accepts. */
void ikvt_to_f16(const float *in, uint16_t *out, size_t n);
void ikvt_to_bf16(const float *in, uint16_t *out, size_t n);
float ikvt_f16_to_f32(uint16_t h);
float ikvt_bf16_to_f32(uint16_t b);
/* Directed rounding to IEEE halves, by float64 arithmetic: the largest half
 * <= x and the smallest >= x (|x| <= 65504). */
float ikvt_f16_down(float x);
float ikvt_f16_up(float x);
/* INT4 group parameters as docs/FORMATS.md defines them: the minimum
 * rounded down to a half and (max - min')/15 (fp32) rounded up to one, after
 * clamping to +-65504; scale 1 where max == min'. */
void ikvt_int4_params(float lo, float hi, float *min, float *scale);
/* The bits of an fp32 value and back (memcpy, no aliasing). */
uint32_t ikvt_f32_bits(float f);
float ikvt_bits_f32(uint32_t u);

/* Relative L2 error ||a - b|| / ||b|| in float64 (b is the reference). */
double ikvt_rel_l2(const float *a, const double *b, size_t n);

/*
 * Plain float64 attention for one query head over n keys:
 *   logits_i = scale * q . k_i, optionally softcap * tanh(logit / softcap)
 *   out = sum_i softmax(logits)_i v_i, lse = log sum_i exp(logits_i)
 * k and v are row-major [n][d]. n == 0 gives out = 0, lse = -inf.
 */
void ikvt_ref_attention(const double *q, const double *k, const double *v, size_t n, size_t d, double scale,
                        double softcap, double *out, double *lse);

/* Timing for the benchmark modes of the GPU tests (reported, never asserted):
 * a monotonic clock in microseconds, and a qsort comparator for medians. */
double ikvt_now_us(void);
int ikvt_cmp_double(const void *a, const void *b);

/* Skip the whole test program (CTest SKIP_RETURN_CODE 77) with a visible reason. */
void ikvt_skip_program(const char *why);

#endif
