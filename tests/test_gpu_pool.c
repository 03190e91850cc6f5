/* Appends to a CUDA pool from device pointers, through the public API.
 *
 * Everywhere (CI without a GPU included): an append with src_on_device to a
 * CPU pool is refused with IKV_E_INVALID, and a CUDA pool is refused with
 * IKV_E_NO_DEVICE where no GPU is usable; then, without a GPU, the program
 * prints "SKIPPED: no CUDA device" and exits 77 (CTest: skipped).
 *
 * With a GPU, for every page format x kv dtype (F32, F16, BF16): a CUDA pool
 * fed device pointers (and, for some appends, host pointers) and a CPU pool
 * fed the same host data go through the same history -- token-by-token and
 * bulk IKV_ALL_LAYERS appends with custom layer/token/head strides (the
 * padding the strides skip holds NaN, so a stride bug is caught), single-layer
 * appends, set_page_format on a full and on the partial tail page, fork +
 * appends to the shared tail, truncate + append -- and must store exactly the
 * same values and key summaries (ikv_seq_read, ikv_seq_page_summary) with the
 * same accounting (ikv_pool_get_stats, slab sizes aside). A NaN or inf in
 * device input is rejected with IKV_E_INVALID naming its position, and the
 * pool is unchanged (length, stats, stored values). Batch appends
 * (ikv_pool_append_batch) store what one append per sequence stores, and a
 * rejected batch changes nothing (support/batch_append.c, also run on a CPU
 * pool by test_pool_batch). The pools have head_dim 64; the *_head_dim_32
 * tests repeat the appends, the unaligned (one-element) staging and the
 * NaN/inf refusals at head_dim 32, the smallest CUDA pools take (16-byte INT4
 * rows, one INT4 V group per token, rows of 4 staging vectors).
 *
 * IKV_GPU_POOL_BENCH=1 adds a timing run (no assertion on times; =bulk runs
 * only its bulk appends, skipping the tests, for a profiler): one-token
 * IKV_ALL_LAYERS append latency (32 layers, 8 kv-heads, head_dim 128, page 16,
 * F16 input, F16 and INT8 pages) from device and from host pointers, and bulk
 * append throughput (GB/s of K+V input). Lines start with "BENCH".
 * Device memory comes from the CUDA runtime loaded with dlopen, so the test
 * needs nothing beyond the public header.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_append.h"
#include "cuda_rt.h"
#include "support.h"

/* ---- runs everywhere ---- */

static void test_refusals_everywhere(void **state) {
    (void)state;
    ikv_pool_config c = ikvt_pool_config((ikvt_pool_spec){
        .n_layers = 1, .n_kv_heads = 1, .head_dim = 64, .capacity_bytes = 1 << 20, .kv_dtype = IKV_DTYPE_F16});
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create(&c, &pool));
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    uint16_t k[64] = {0}, v[64] = {0};
    ikv_append a = ikv_append_default(pool, 1);
    a.k = k;
    a.v = v;
    a.src_on_device = 1;
    IKVT_EXPECT_STATUS(ikv_pool_append(pool, s, &a), IKV_E_INVALID, "CPU pool");
    uint32_t len = 99;
    IKVT_OK(ikv_seq_length(pool, s, &len));
    assert_int_equal(len, 0);
    ikv_pool_destroy(pool);

    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    IKVT_OK(ikv_runtime_info_get(&info));
    if (!info.cuda_built || info.cuda_device_count == 0) {
        c.backend = IKV_BACKEND_CUDA;
        pool = NULL;
        IKVT_EXPECT_STATUS(ikv_pool_create(&c, &pool), IKV_E_NO_DEVICE, "CUDA");
        assert_null(pool);
    }
}

/* ---- GPU: CUDA pool from device pointers == CPU pool from host pointers ---- */

enum { L = 3, H = 2, P = 16, MAX_PAGES = 16, D_MAX = 64 };
/* head_dim of the pools: 64, or 32 between the head_dim_32 setup and teardown (at most D_MAX). */
static uint32_t D = 64;

static int use_head_dim_32(void **state) {
    (void)state;
    D = 32;
    return 0;
}
static int use_head_dim_64(void **state) {
    (void)state;
    D = 64;
    return 0;
}

/* Engine input of n tokens in dtype dt, addressed by the given strides
 * (elements). Every element the strides address is a random finite value;
 * every other element of the extent is NaN, so reading outside the addressed
 * rows would be caught by the finiteness check or the comparison. */
typedef struct {
    void *host, *k_dev, *v_dev;
    uint8_t *k, *v; /* host copies */
    size_t bytes;
    ikv_append a; /* strides, n_tokens, layer; k/v set by the caller */
} input_t;

static size_t dtype_size(ikv_dtype dt) { return dt == IKV_DTYPE_F32 ? 4 : 2; }

static void put(uint8_t *base, ikv_dtype dt, size_t i, float x) {
    if (dt == IKV_DTYPE_F32) {
        memcpy(base + 4 * i, &x, 4);
    } else {
        uint16_t h;
        if (dt == IKV_DTYPE_F16 && isinf(x))
            h = x > 0 ? 0x7C00u : 0xFC00u; /* ikvt_to_f16 saturates, as the library does */
        else if (dt == IKV_DTYPE_F16)
            ikvt_to_f16(&x, &h, 1);
        else
            ikvt_to_bf16(&x, &h, 1);
        memcpy(base + 2 * i, &h, 2);
    }
}

static int64_t elem_index(const ikv_append *a, uint32_t l, uint32_t t, uint32_t h) {
    return (a->layer == IKV_ALL_LAYERS ? (int64_t)l * a->layer_stride : 0) + (int64_t)t * a->token_stride +
           (int64_t)h * a->head_stride;
}

static input_t make_input(ikv_pool *pool, ikv_dtype dt, uint32_t layer, uint32_t n, int64_t ts, int64_t hs,
                          int64_t ls, ikvt_rng *rng) {
    input_t in;
    memset(&in, 0, sizeof in);
    in.a = ikv_append_default(pool, n);
    in.a.layer = layer;
    if (ts) in.a.token_stride = ts;
    if (hs) in.a.head_stride = hs;
    if (ls) in.a.layer_stride = ls;
    const uint32_t nl = layer == IKV_ALL_LAYERS ? L : 1;
    const size_t elems = (size_t)elem_index(&in.a, nl - 1, n - 1, H - 1) + D;
    const size_t es = dtype_size(dt);
    in.bytes = elems * es;
    in.k = malloc(in.bytes);
    in.v = malloc(in.bytes);
    for (int w = 0; w < 2; ++w) {
        uint8_t *b = w ? in.v : in.k;
        for (size_t i = 0; i < elems; ++i) put(b, dt, i, NAN);
        for (uint32_t l = 0; l < nl; ++l)
            for (uint32_t t = 0; t < n; ++t)
                for (uint32_t h = 0; h < H; ++h)
                    for (uint32_t d = 0; d < D; ++d) {
                        float x = (float)ikvt_normal(rng) * (1.0f + 0.5f * (float)(d % 5));
                        if (d % 7 == 3) x += 2.5f; /* uneven channels */
                        put(b, dt, (size_t)elem_index(&in.a, l, t, h) + d, x);
                    }
    }
    in.k_dev = ikvt_dev_upload(in.k, in.bytes);
    in.v_dev = ikvt_dev_upload(in.v, in.bytes);
    return in;
}

static void upload_again(input_t *in) {
    assert_int_equal(ikvt_rt.memcpy_(in->k_dev, in->k, in->bytes, IKVT_H2D), 0);
    assert_int_equal(ikvt_rt.memcpy_(in->v_dev, in->v, in->bytes, IKVT_H2D), 0);
}

static void free_input(input_t *in) {
    ikvt_rt.free_(in->k_dev);
    ikvt_rt.free_(in->v_dev);
    free(in->k);
    free(in->v);
}

typedef struct {
    ikv_pool *cpu, *gpu;
    ikv_dtype dt;
    ikvt_rng rng;
} pools_t;

typedef struct {
    ikv_seq_id c, g;
    uint32_t len[L]; /* tokens per layer (the test keeps track) */
} seq_t;

static pools_t make_pools(ikv_format fmt, ikv_dtype dt, uint64_t seed) {
    pools_t p;
    p.dt = dt;
    p.rng.state = seed;
    for (int b = 0; b < 2; ++b) {
        ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.backend = b ? IKV_BACKEND_CUDA : IKV_BACKEND_CPU,
                                                         .n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P,
                                                         .capacity_bytes = 16u << 20, .default_format = fmt,
                                                         .kv_dtype = dt});
        if (b)
            p.gpu = pool;
        else
            p.cpu = pool;
    }
    return p;
}

static seq_t new_seq(pools_t *p) {
    seq_t s;
    memset(&s, 0, sizeof s);
    IKVT_OK(ikv_seq_create(p->cpu, &s.c));
    IKVT_OK(ikv_seq_create(p->gpu, &s.g));
    return s;
}

/* The same tokens into both pools: the CPU pool from host memory, the CUDA
 * pool from device memory (or from host memory when gpu_from_host). */
static void append_both(pools_t *p, seq_t *s, uint32_t layer, uint32_t n, int64_t ts, int64_t hs, int64_t ls,
                        int gpu_from_host) {
    input_t in = make_input(p->cpu, p->dt, layer, n, ts, hs, ls, &p->rng);
    ikv_append a = in.a;
    a.k = in.k;
    a.v = in.v;
    IKVT_OK(ikv_pool_append(p->cpu, s->c, &a));
    if (!gpu_from_host) {
        a.k = in.k_dev;
        a.v = in.v_dev;
        a.src_on_device = 1;
    }
    IKVT_OK(ikv_pool_append(p->gpu, s->g, &a));
    for (uint32_t l = 0; l < L; ++l)
        if (layer == IKV_ALL_LAYERS || layer == l) s->len[l] += n;
    free_input(&in);
}

static void expect_same_stats(ikv_pool *cpu, ikv_pool *gpu) {
    ikv_pool_stats a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.struct_size = b.struct_size = sizeof a;
    IKVT_OK(ikv_pool_get_stats(cpu, &a));
    IKVT_OK(ikv_pool_get_stats(gpu, &b));
    assert_int_equal(a.used_bytes, b.used_bytes);
    assert_int_equal(a.pages_used, b.pages_used);
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        assert_int_equal(a.pages_by_format[f], b.pages_by_format[f]);
        assert_int_equal(a.bytes_by_format[f], b.bytes_by_format[f]);
    }
    assert_int_equal(a.staging_bytes, b.staging_bytes);
    assert_int_equal(a.n_sequences, b.n_sequences);
    assert_int_equal(a.tokens_total, b.tokens_total);
}

/* Stored values and key summaries of every layer, page and head, byte for byte. */
static void expect_same_seq(pools_t *p, const seq_t *s) {
    uint32_t lc = 0, lg = 0;
    IKVT_OK(ikv_seq_length(p->cpu, s->c, &lc));
    IKVT_OK(ikv_seq_length(p->gpu, s->g, &lg));
    assert_int_equal(lc, lg);
    for (uint32_t l = 0; l < L; ++l) {
        const uint32_t n = s->len[l];
        const size_t floats = (size_t)n * H * D + 1;
        float *k1 = malloc(4 * floats), *v1 = malloc(4 * floats), *k2 = malloc(4 * floats), *v2 = malloc(4 * floats);
        IKVT_OK(ikv_seq_read(p->cpu, s->c, l, 0, n, k1, v1));
        IKVT_OK(ikv_seq_read(p->gpu, s->g, l, 0, n, k2, v2));
        assert_memory_equal(k1, k2, 4 * (floats - 1));
        assert_memory_equal(v1, v2, 4 * (floats - 1));
        free(k1), free(v1), free(k2), free(v2);
        for (uint32_t pg = 0; pg * P < n; ++pg)
            for (uint32_t h = 0; h < H; ++h) {
                float a[3 * D_MAX], b[3 * D_MAX];
                uint32_t na = 0, nb = 0;
                IKVT_OK(ikv_seq_page_summary(p->cpu, s->c, l, h, pg, a, a + D, a + 2 * D, &na));
                IKVT_OK(ikv_seq_page_summary(p->gpu, s->g, l, h, pg, b, b + D, b + 2 * D, &nb));
                assert_int_equal(na, nb);
                assert_memory_equal(a, b, sizeof(float) * 3 * D);
            }
    }
    expect_same_stats(p->cpu, p->gpu);
}

static void set_format_both(pools_t *p, const seq_t *s, uint32_t page, ikv_format f) {
    IKVT_OK(ikv_seq_set_page_format(p->cpu, s->c, page, f));
    IKVT_OK(ikv_seq_set_page_format(p->gpu, s->g, page, f));
}

static void test_device_appends_match_cpu(void **state) {
    (void)state;
    static const ikv_dtype dts[] = {IKV_DTYPE_F32, IKV_DTYPE_F16, IKV_DTYPE_BF16};
    for (int f = 0; f < IKV_FMT_COUNT; ++f)
        for (int di = 0; di < 3; ++di) {
            const ikv_format fmt = (ikv_format)f;
            pools_t p = make_pools(fmt, dts[di], 0x5eed0000u + 16u * f + di);
            seq_t s = new_seq(&p);
            /* token by token, default strides (tail page re-quantized each time) */
            for (int i = 0; i < 5; ++i) append_both(&p, &s, IKV_ALL_LAYERS, 1, 0, 0, 0, 0);
            expect_same_seq(&p, &s);
            /* bulk over three pages, padded token/head/layer strides */
            append_both(&p, &s, IKV_ALL_LAYERS, 37, H * (D + 16) + 32, D + 16, 37 * (H * (D + 16) + 32) + 64, 0);
            /* head-major engine layout: heads outer, tokens inner */
            append_both(&p, &s, IKV_ALL_LAYERS, 6, D + 8, 6 * (D + 8), 6 * H * (D + 8) + 8, 0);
            expect_same_seq(&p, &s);
            /* one layer at a time, custom strides; the middle one from host pointers */
            for (uint32_t l = 0; l < L; ++l) append_both(&p, &s, l, 3, H * D + 8, D, 0, l == 1);
            expect_same_seq(&p, &s); /* 51 tokens: pages 0-2 full, page 3 holds 3 */
            /* format changes: a full page and the partial tail page, then more tokens */
            set_format_both(&p, &s, 0, (ikv_format)((f + 1) % IKV_FMT_COUNT));
            set_format_both(&p, &s, 3, (ikv_format)((f + 3) % IKV_FMT_COUNT));
            expect_same_seq(&p, &s);
            append_both(&p, &s, IKV_ALL_LAYERS, 20, 0, 0, 0, 0); /* 71 */
            append_both(&p, &s, IKV_ALL_LAYERS, 9, 0, 0, 0, 1);  /* 80: tail page ends full */
            append_both(&p, &s, IKV_ALL_LAYERS, 2, 0, 0, 0, 0);  /* 82 */
            expect_same_seq(&p, &s);

            /* fork at a partial tail, then both append to the shared tail page */
            seq_t c = s;
            IKVT_OK(ikv_seq_fork(p.cpu, s.c, &c.c));
            IKVT_OK(ikv_seq_fork(p.gpu, s.g, &c.g));
            expect_same_seq(&p, &c);
            append_both(&p, &c, IKV_ALL_LAYERS, 4, 0, 0, 0, 0);
            append_both(&p, &s, IKV_ALL_LAYERS, 1, 0, 0, 0, 0);
            expect_same_seq(&p, &s);
            expect_same_seq(&p, &c);
            /* truncate into a page shared with the parent, then append */
            IKVT_OK(ikv_seq_truncate(p.cpu, c.c, 7));
            IKVT_OK(ikv_seq_truncate(p.gpu, c.g, 7));
            for (uint32_t l = 0; l < L; ++l) c.len[l] -= 7; /* 79 */
            expect_same_seq(&p, &c);
            append_both(&p, &c, IKV_ALL_LAYERS, 9, 0, 0, 0, 0);
            append_both(&p, &c, IKV_ALL_LAYERS, 1, 0, 0, 0, 0);
            expect_same_seq(&p, &c);
            expect_same_seq(&p, &s);
            /* truncate to a page boundary (staging released), then append */
            IKVT_OK(ikv_seq_truncate(p.cpu, c.c, 9));
            IKVT_OK(ikv_seq_truncate(p.gpu, c.g, 9));
            for (uint32_t l = 0; l < L; ++l) c.len[l] -= 9; /* 80 */
            append_both(&p, &c, IKV_ALL_LAYERS, 3, 0, 0, 0, 0);
            expect_same_seq(&p, &c);
            IKVT_OK(ikv_seq_destroy(p.cpu, c.c));
            IKVT_OK(ikv_seq_destroy(p.gpu, c.g));
            expect_same_seq(&p, &s);
            IKVT_OK(ikv_seq_destroy(p.cpu, s.c));
            IKVT_OK(ikv_seq_destroy(p.gpu, s.g));
            expect_same_stats(p.cpu, p.gpu);
            ikv_pool_destroy(p.cpu);
            ikv_pool_destroy(p.gpu);
        }
}

/* Strides that are not multiples of 4 elements: the device staging takes its
 * one-element path instead of 4-channel vectors (kernels/append_rows.cu). */
static void test_unaligned_device_input_matches_cpu(void **state) {
    (void)state;
    static const ikv_dtype dts[] = {IKV_DTYPE_F32, IKV_DTYPE_F16, IKV_DTYPE_BF16};
    static const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8, IKV_FMT_INT4};
    for (int f = 0; f < 3; ++f)
        for (int di = 0; di < 3; ++di) {
            pools_t p = make_pools(fmts[f], dts[di], 0x0dd50000u + 16u * f + di);
            seq_t s = new_seq(&p);
            append_both(&p, &s, IKV_ALL_LAYERS, 19, H * (D + 1) + 3, D + 1, 19 * (H * (D + 1) + 3) + 5, 0);
            append_both(&p, &s, IKV_ALL_LAYERS, 2, 0, 0, 0, 0); /* aligned again: the vector path */
            expect_same_seq(&p, &s);
            IKVT_OK(ikv_seq_destroy(p.cpu, s.c));
            IKVT_OK(ikv_seq_destroy(p.gpu, s.g));
            ikv_pool_destroy(p.cpu);
            ikv_pool_destroy(p.gpu);
        }
}

/* Everything an append could change, to compare before and after a refused one. */
typedef struct {
    ikv_pool_stats stats;
    uint32_t length;
    float *k[L], *v[L];
} pool_image_t;

static pool_image_t take_image(ikv_pool *pool, const seq_t *s) {
    pool_image_t im;
    memset(&im, 0, sizeof im);
    im.stats.struct_size = sizeof im.stats;
    IKVT_OK(ikv_pool_get_stats(pool, &im.stats));
    IKVT_OK(ikv_seq_length(pool, s->g, &im.length));
    for (uint32_t l = 0; l < L; ++l) {
        const size_t n = (size_t)s->len[l] * H * D + 1;
        im.k[l] = malloc(4 * n);
        im.v[l] = malloc(4 * n);
        IKVT_OK(ikv_seq_read(pool, s->g, l, 0, s->len[l], im.k[l], im.v[l]));
    }
    return im;
}

static void expect_same_image(const pool_image_t *a, const pool_image_t *b, const seq_t *s) {
    assert_memory_equal(&a->stats, &b->stats, sizeof a->stats);
    assert_int_equal(a->length, b->length);
    for (uint32_t l = 0; l < L; ++l) {
        assert_memory_equal(a->k[l], b->k[l], 4 * (size_t)s->len[l] * H * D);
        assert_memory_equal(a->v[l], b->v[l], 4 * (size_t)s->len[l] * H * D);
    }
}

static void free_image(pool_image_t *im) {
    for (uint32_t l = 0; l < L; ++l) free(im->k[l]), free(im->v[l]);
}

/* Appending `in` to the CUDA pool (from device memory, or from host memory
 * when from_host) is refused with IKV_E_INVALID and `msg`, and the pool still
 * matches `before`. */
static void expect_refused(pools_t *p, const seq_t *s, const pool_image_t *before, input_t *in, int from_host,
                           const char *msg) {
    upload_again(in);
    ikv_append a = in->a;
    a.k = from_host ? in->k : in->k_dev;
    a.v = from_host ? in->v : in->v_dev;
    a.src_on_device = !from_host;
    IKVT_EXPECT_STATUS(ikv_pool_append(p->gpu, s->g, &a), IKV_E_INVALID, msg);
    pool_image_t after = take_image(p->gpu, s);
    expect_same_image(before, &after, s);
    free_image(&after);
}

static void test_nonfinite_device_input_rejected(void **state) {
    (void)state;
    static const ikv_dtype dts[] = {IKV_DTYPE_F32, IKV_DTYPE_F16, IKV_DTYPE_BF16};
    static const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8, IKV_FMT_INT4};
    for (int fi = 0; fi < 3; ++fi)
        for (int di = 0; di < 3; ++di) {
            pools_t p = make_pools(fmts[fi], dts[di], 0xbad0000u + 16u * fi + di);
            seq_t s = new_seq(&p);
            append_both(&p, &s, IKV_ALL_LAYERS, 21, 0, 0, 0, 0); /* a partial tail page with staging */
            pool_image_t before = take_image(p.gpu, &s);

            /* NaN in V at (layer 1, token 2, head 1, channel 5) of an all-layer append, padded strides */
            input_t in = make_input(p.cpu, p.dt, IKV_ALL_LAYERS, 4, H * D + 8, D, 4 * (H * D + 8) + 16, &p.rng);
            put(in.v, p.dt, (size_t)elem_index(&in.a, 1, 2, 1) + 5, NAN);
            put(in.v, p.dt, (size_t)elem_index(&in.a, 2, 0, 0) + 1, INFINITY); /* later in check order */
            expect_refused(&p, &s, &before, &in, 0, "v[layer 1, token 2, head 1, channel 5] is NaN");
            ikv_append a = in.a; /* the CPU pool names the same element */
            a.k = in.k;
            a.v = in.v;
            IKVT_EXPECT_STATUS(ikv_pool_append(p.cpu, s.c, &a), IKV_E_INVALID,
                               "v[layer 1, token 2, head 1, channel 5] is NaN");
            free_input(&in);

            /* The same with odd strides (the check's row kernel, not its 16-byte vectors):
             * inf in K at (layer 0, token 1, head 1, channel 2) before a NaN later in V */
            in = make_input(p.cpu, p.dt, IKV_ALL_LAYERS, 3, H * (D + 1) + 1, D + 1, 3 * (H * (D + 1) + 1) + 3, &p.rng);
            put(in.k, p.dt, (size_t)elem_index(&in.a, 0, 1, 1) + 2, INFINITY);
            put(in.v, p.dt, (size_t)elem_index(&in.a, 0, 0, 0), NAN);
            expect_refused(&p, &s, &before, &in, 0, "k[layer 0, token 1, head 1, channel 2] is inf");
            free_input(&in);

            /* +inf in K of a single-layer append (last channel), from device memory, then from host memory */
            in = make_input(p.cpu, p.dt, 2, 3, 0, 0, 0, &p.rng);
            put(in.k, p.dt, (size_t)elem_index(&in.a, 0, 1, 0) + D - 1, INFINITY);
            char last[64];
            snprintf(last, sizeof last, "k[layer 2, token 1, head 0, channel %u] is inf", D - 1);
            expect_refused(&p, &s, &before, &in, 0, last);
            expect_refused(&p, &s, &before, &in, 1, last);
            free_image(&before);
            free_input(&in);

            /* the staging survived: later appends still match the CPU pool */
            append_both(&p, &s, IKV_ALL_LAYERS, 5, 0, 0, 0, 0);
            expect_same_seq(&p, &s);
            ikv_pool_destroy(p.cpu);
            ikv_pool_destroy(p.gpu);
        }
}

/* The three tests above at head_dim 32 (D set by the use_head_dim_32 setup). */
static void test_device_appends_match_cpu_head_dim_32(void **state) {
    assert_int_equal(D, 32);
    test_device_appends_match_cpu(state);
}
static void test_unaligned_device_input_matches_cpu_head_dim_32(void **state) {
    assert_int_equal(D, 32);
    test_unaligned_device_input_matches_cpu(state);
}
static void test_nonfinite_device_input_rejected_head_dim_32(void **state) {
    assert_int_equal(D, 32);
    test_nonfinite_device_input_rejected(state);
}

/* ikv_pool_append_batch on CUDA pools, from device and host memory (support/batch_append.c). */
static void test_batch_appends_match_single_appends(void **state) {
    (void)state;
    ikvt_batch_append_scenario(IKV_BACKEND_CUDA, 0);
}

/* The same with IKV_APPEND_ASYNC: decodes on the append's stream, ikv_pool_sync. */
static void test_async_batch_appends(void **state) {
    (void)state;
    ikvt_batch_append_scenario(IKV_BACKEND_CUDA, 1);
}

/* Asynchronous batch appends from several threads at once, each thread on
 * its own stream with its own sequences (one token per step, the layers in
 * turn, past a page boundary), into one CUDA pool: after ikv_pool_sync the
 * pool holds what a CPU pool fed the same tokens synchronously holds. The
 * store's lock, its job list and the chain of asynchronous appends across
 * streams are what is shared. */
enum { TH = 4, TSEQ = 2, TSTEPS = 3 * 20 };
#define TROW ((size_t)H * D) /* floats of one token's row of every head */
typedef struct {
    ikv_pool *gpu;
    ikv_seq_id seqs[TSEQ];
    void *stream, *k_dev, *v_dev;
    ikv_status status; /* first failure (cmocka asserts only on the main thread) */
} async_thread_t;

static void *async_thread_main(void *arg) {
    async_thread_t *t = arg;
    t->status = IKV_OK;
    for (int s = 0; s < TSTEPS && t->status == IKV_OK; ++s) {
        ikv_append a = ikv_append_default(t->gpu, 1);
        a.layer = (uint32_t)(s % L);
        a.k = (const float *)t->k_dev + (size_t)s * TSEQ * TROW;
        a.v = (const float *)t->v_dev + (size_t)s * TSEQ * TROW;
        a.src_on_device = 1;
        a.stream = t->stream;
        a.flags = IKV_APPEND_ASYNC;
        t->status = ikv_pool_append_batch(t->gpu, t->seqs, TSEQ, &a);
    }
    return NULL;
}

static void test_async_appends_from_threads(void **state) {
    (void)state;
    pools_t p = make_pools(IKV_FMT_INT8, IKV_DTYPE_F32, 0x7e4d5u);
    const size_t floats = (size_t)TSTEPS * TSEQ * TROW;
    async_thread_t t[TH];
    ikv_seq_id cpu_seqs[TH][TSEQ];
    float *k[TH], *v[TH];
    for (int i = 0; i < TH; ++i) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].gpu = p.gpu;
        for (int j = 0; j < TSEQ; ++j) {
            IKVT_OK(ikv_seq_create(p.gpu, &t[i].seqs[j]));
            IKVT_OK(ikv_seq_create(p.cpu, &cpu_seqs[i][j]));
        }
        k[i] = malloc(floats * sizeof(float));
        v[i] = malloc(floats * sizeof(float));
        ikvt_fill_normal(&p.rng, k[i], floats, 1.0f);
        ikvt_fill_normal(&p.rng, v[i], floats, 1.0f);
        t[i].k_dev = ikvt_dev_upload(k[i], floats * sizeof(float));
        t[i].v_dev = ikvt_dev_upload(v[i], floats * sizeof(float));
        assert_int_equal(ikvt_rt.stream_create_(&t[i].stream), 0);
    }
    pthread_t th[TH];
    for (int i = 0; i < TH; ++i) assert_int_equal(pthread_create(&th[i], NULL, async_thread_main, &t[i]), 0);
    for (int i = 0; i < TH; ++i) pthread_join(th[i], NULL);
    for (int i = 0; i < TH; ++i) assert_int_equal(t[i].status, IKV_OK);
    IKVT_OK(ikv_pool_sync(p.gpu));

    for (int i = 0; i < TH; ++i)
        for (int s = 0; s < TSTEPS; ++s) {
            ikv_append a = ikv_append_default(p.cpu, 1);
            a.layer = (uint32_t)(s % L);
            a.k = k[i] + (size_t)s * TSEQ * TROW;
            a.v = v[i] + (size_t)s * TSEQ * TROW;
            IKVT_OK(ikv_pool_append_batch(p.cpu, cpu_seqs[i], TSEQ, &a));
        }
    for (int i = 0; i < TH; ++i)
        for (int j = 0; j < TSEQ; ++j) {
            seq_t sq;
            memset(&sq, 0, sizeof sq);
            sq.c = cpu_seqs[i][j];
            sq.g = t[i].seqs[j];
            for (uint32_t l = 0; l < L; ++l) sq.len[l] = TSTEPS / L;
            expect_same_seq(&p, &sq);
        }
    for (int i = 0; i < TH; ++i) {
        ikvt_rt.stream_destroy_(t[i].stream);
        ikvt_rt.free_(t[i].k_dev), ikvt_rt.free_(t[i].v_dev);
        free(k[i]), free(v[i]);
    }
    ikv_pool_destroy(p.cpu);
    ikv_pool_destroy(p.gpu);
}

/* ---- IKV_GPU_POOL_BENCH=1: append latency and throughput (reported, not asserted) ---- */

/* bulk_only: just the bulk appends (IKV_GPU_POOL_BENCH=bulk), so a profiler
 * sees their kernels first. */
static void run_bench(int bulk_only) {
    enum { BL = 32, BH = 8, BD = 128, BP = 16, STEPS = 512, WARM = 32, BULK = 2048, REPS = 5 };
    static const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8};
    const size_t tok_elems = (size_t)BL * BH * BD; /* one token of every layer */
    const size_t bulk_bytes = (size_t)BULK * tok_elems * 2;
    uint16_t *host = malloc(bulk_bytes);
    ikvt_rng rng = {42};
    for (size_t i = 0; i < bulk_bytes / 2; ++i) {
        const float x = (float)ikvt_normal(&rng);
        ikvt_to_f16(&x, &host[i], 1);
    }
    void *dk = ikvt_dev_upload(host, bulk_bytes), *dv = ikvt_dev_upload(host, bulk_bytes);
    printf("BENCH shape: %d layers, %d kv-heads, head_dim %d, page %d, F16 input, IKV_ALL_LAYERS\n", BL, BH, BD, BP);
    for (int fi = 0; fi < 2; ++fi) {
        ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.backend = IKV_BACKEND_CUDA, .n_layers = BL, .n_kv_heads = BH,
                                                         .head_dim = BD, .page_size = BP, .capacity_bytes = 3ull << 30,
                                                         .default_format = fmts[fi], .kv_dtype = IKV_DTYPE_F16});
        const char *fname = fmts[fi] == IKV_FMT_F16 ? "F16" : "INT8";
        for (int from_host = 0; from_host < 2 && !bulk_only; ++from_host) {
            ikv_seq_id s;
            IKVT_OK(ikv_seq_create(pool, &s));
            double t[STEPS];
            for (int i = 0; i < WARM + STEPS; ++i) {
                ikv_append a = ikv_append_default(pool, 1);
                a.layer = IKV_ALL_LAYERS;
                const size_t off = (size_t)(i % BULK) * tok_elems;
                a.k = from_host ? (const void *)(host + off) : (const void *)((uint16_t *)dk + off);
                a.v = from_host ? (const void *)(host + off) : (const void *)((uint16_t *)dv + off);
                a.layer_stride = BH * BD;
                a.token_stride = (int64_t)BL * BH * BD; /* unused for one token */
                a.src_on_device = !from_host;
                const double t0 = ikvt_now_us();
                IKVT_OK(ikv_pool_append(pool, s, &a));
                if (i >= WARM) t[i - WARM] = ikvt_now_us() - t0;
            }
            qsort(t, STEPS, sizeof t[0], ikvt_cmp_double);
            printf("BENCH one-token append, %-4s pages, from %s pointers: median %.1f us  p10 %.1f  p90 %.1f  "
                   "(%d appends)\n",
                   fname, from_host ? "host  " : "device", t[STEPS / 2], t[STEPS / 10], t[STEPS * 9 / 10], STEPS);
            IKVT_OK(ikv_seq_destroy(pool, s));
        }
        double tb[REPS];
        for (int r = 0; r < REPS; ++r) {
            ikv_seq_id s;
            IKVT_OK(ikv_seq_create(pool, &s));
            ikv_append a = ikv_append_default(pool, BULK);
            a.layer = IKV_ALL_LAYERS;
            a.k = dk;
            a.v = dv;
            a.token_stride = (int64_t)BH * BD;
            a.layer_stride = (int64_t)BULK * BH * BD;
            a.src_on_device = 1;
            const double t0 = ikvt_now_us();
            IKVT_OK(ikv_pool_append(pool, s, &a));
            tb[r] = ikvt_now_us() - t0;
            IKVT_OK(ikv_seq_destroy(pool, s));
        }
        qsort(tb, REPS, sizeof tb[0], ikvt_cmp_double);
        printf("BENCH bulk append of %d tokens, %-4s pages, from device pointers: median %.2f ms = %.2f GB/s of "
               "K+V input (%d runs)\n",
               BULK, fname, tb[REPS / 2] * 1e-3, 2.0 * bulk_bytes / (tb[REPS / 2] * 1e3), REPS);
        ikv_pool_destroy(pool);
    }
    ikvt_rt.free_(dk);
    ikvt_rt.free_(dv);
    free(host);
}

int main(void) {
    const struct CMUnitTest everywhere[] = {
        cmocka_unit_test(test_refusals_everywhere),
    };
    const int failed = cmocka_run_group_tests_name("gpu_pool_everywhere", everywhere, NULL, NULL);
    if (failed) return failed;
    ikvt_require_cuda_device();
    const char *bench = getenv("IKV_GPU_POOL_BENCH");
    if (bench && strcmp(bench, "bulk") == 0) {
        run_bench(1);
        return 0;
    }
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test(test_device_appends_match_cpu),
        cmocka_unit_test(test_unaligned_device_input_matches_cpu),
        cmocka_unit_test(test_nonfinite_device_input_rejected),
        cmocka_unit_test_setup_teardown(test_device_appends_match_cpu_head_dim_32, use_head_dim_32, use_head_dim_64),
        cmocka_unit_test_setup_teardown(test_unaligned_device_input_matches_cpu_head_dim_32, use_head_dim_32,
                                        use_head_dim_64),
        cmocka_unit_test_setup_teardown(test_nonfinite_device_input_rejected_head_dim_32, use_head_dim_32,
                                        use_head_dim_64),
        cmocka_unit_test(test_batch_appends_match_single_appends),
        cmocka_unit_test(test_async_batch_appends),
        cmocka_unit_test(test_async_appends_from_threads),
    };
    const int rc = cmocka_run_group_tests_name("gpu_pool", gpu, NULL, NULL);
    if (rc == 0 && bench && strcmp(bench, "1") == 0) run_bench(0);
    return rc;
}
