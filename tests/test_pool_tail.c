/* Appends into a partial tail page. A CPU pool keeps running statistics of
 * the tail page so a one-token append encodes and folds in only the new row
 * (re-quantizing old rows only where a scale widened). Whatever the path,
 * the page must hold exactly what one write of all its rows from the same
 * fp32 values holds: every value read back and every key summary equal bit
 * for bit, for every format, on data that widens scales on every token,
 * never widens them, ties and signed zeros; and after each operation that
 * rewrites the tail page's staging: truncate, fork, a format change. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

enum { L = 2, H = 2, D = 64, P = 8, ROW = H * D };

/* Token t's K or V row of data kind `kind` (H*D floats). */
static void make_row(int kind, uint32_t t, ikvt_rng *r, float *out) {
    for (uint32_t i = 0; i < ROW; ++i) {
        const float g = (float)ikvt_normal(r);
        switch (kind) {
            case 0: out[i] = g; break;                                  /* plain normal */
            case 1: out[i] = g * (float)(1u << (t % 12)); break;        /* ranges widen token after token */
            case 2: out[i] = t == 0 ? 50.0f * g : 0.01f * g; break;     /* first row sets every scale */
            case 3: {                                                   /* ties and signed zeros */
                static const float vals[] = {-2.0f, -1.0f, -0.0f, 0.0f, 1.0f, 2.0f};
                out[i] = vals[ikvt_next(r) % 6];
                break;
            }
            default: out[i] = t < 3 ? ((i & 1) ? -0.0f : 0.0f) : g;   /* zero rows first */
        }
    }
}

static ikv_pool *make_pool(ikv_format f) {
    return ikvt_make_pool((ikvt_pool_spec){.n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P,
                                           .capacity_bytes = 32u << 20, .default_format = f});
}

/* Append n tokens (rows of ROW floats) to one layer, one call. */
static void append(ikv_pool *pool, ikv_seq_id s, uint32_t layer, const float *k, const float *v, uint32_t n) {
    ikv_append a = ikv_append_default(pool, n);
    a.layer = layer;
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append(pool, s, &a));
}
/* The same tokens to every layer, one token per call (the incremental path). */
static void append_each(ikv_pool *pool, ikv_seq_id s, const float *k, const float *v, uint32_t n) {
    for (uint32_t t = 0; t < n; ++t)
        for (uint32_t l = 0; l < L; ++l) append(pool, s, l, k + (size_t)t * ROW, v + (size_t)t * ROW, 1);
}
/* The same tokens to every layer in one call per layer. */
static void append_bulk(ikv_pool *pool, ikv_seq_id s, const float *k, const float *v, uint32_t n) {
    for (uint32_t l = 0; l < L; ++l) append(pool, s, l, k, v, n);
}

/* FNV-1a over every value and summary the tests read back: with
 * IKVT_PRINT_DIGEST set, main prints it, and scripts/check_baseline_x86.sh
 * compares the native run (the append path's AVX2 copy) with one on an
 * emulated CPU without AVX (its baseline copy): the same bytes stored. */
static uint64_t g_digest = 1469598103934665603ull;
static void digest(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; ++i) g_digest = (g_digest ^ b[i]) * 1099511628211ull;
}

/* Rows [a0, a0+n) of sequence a equal rows [b0, b0+n) of b, and so do the
 * summaries of the pages they fill (a0, b0 page-aligned), bit for bit. */
static void expect_same_rows(const ikv_pool *pa, ikv_seq_id a, uint32_t a0, const ikv_pool *pb, ikv_seq_id b,
                             uint32_t b0, uint32_t n) {
    float *ka = malloc((size_t)n * ROW * sizeof(float)), *va = malloc((size_t)n * ROW * sizeof(float));
    float *kb = malloc((size_t)n * ROW * sizeof(float)), *vb = malloc((size_t)n * ROW * sizeof(float));
    for (uint32_t l = 0; l < L; ++l) {
        IKVT_OK(ikv_seq_read(pa, a, l, a0, a0 + n, ka, va));
        IKVT_OK(ikv_seq_read(pb, b, l, b0, b0 + n, kb, vb));
        assert_memory_equal(ka, kb, (size_t)n * ROW * sizeof(float));
        assert_memory_equal(va, vb, (size_t)n * ROW * sizeof(float));
        digest(ka, (size_t)n * ROW * sizeof(float));
        digest(va, (size_t)n * ROW * sizeof(float));
        for (uint32_t p = 0; p < (n + P - 1) / P; ++p)
            for (uint32_t h = 0; h < H; ++h) {
                float mn1[D], mx1[D], me1[D], mn2[D], mx2[D], me2[D];
                uint32_t n1 = 0, n2 = 0;
                IKVT_OK(ikv_seq_page_summary(pa, a, l, h, a0 / P + p, mn1, mx1, me1, &n1));
                IKVT_OK(ikv_seq_page_summary(pb, b, l, h, b0 / P + p, mn2, mx2, me2, &n2));
                assert_int_equal(n1, n2);
                assert_memory_equal(mn1, mn2, sizeof mn1);
                assert_memory_equal(mx1, mx2, sizeof mx1);
                assert_memory_equal(me1, me2, sizeof me1);
                digest(mn1, sizeof mn1);
                digest(mx1, sizeof mx1);
                digest(me1, sizeof me1);
            }
    }
    free(ka);
    free(va);
    free(kb);
    free(vb);
}

typedef struct tokens {
    float *k, *v;
} tokens;

static tokens make_tokens(int kind, uint32_t n, uint64_t seed) {
    tokens t = {malloc((size_t)n * ROW * sizeof(float)), malloc((size_t)n * ROW * sizeof(float))};
    ikvt_rng r = {seed};
    for (uint32_t i = 0; i < n; ++i) {
        make_row(kind, i, &r, t.k + (size_t)i * ROW);
        make_row(kind, i, &r, t.v + (size_t)i * ROW);
    }
    return t;
}
static void free_tokens(tokens t) {
    free(t.k);
    free(t.v);
}
/* rows [0, n0) of a then [0, n1) of b, as one array */
static tokens concat(const float *ak, const float *av, uint32_t n0, const float *bk, const float *bv, uint32_t n1) {
    tokens t = {malloc((size_t)(n0 + n1) * ROW * sizeof(float)), malloc((size_t)(n0 + n1) * ROW * sizeof(float))};
    memcpy(t.k, ak, (size_t)n0 * ROW * sizeof(float));
    memcpy(t.v, av, (size_t)n0 * ROW * sizeof(float));
    memcpy(t.k + (size_t)n0 * ROW, bk, (size_t)n1 * ROW * sizeof(float));
    memcpy(t.v + (size_t)n0 * ROW, bv, (size_t)n1 * ROW * sizeof(float));
    return t;
}

/* Token by token equals one bulk append, over 2.5 pages. */
static void test_token_by_token(void **state) {
    (void)state;
    const uint32_t n = 2 * P + P / 2;
    for (int f = 0; f < IKV_FMT_COUNT; ++f)
        for (int kind = 0; kind < 5; ++kind) {
            ikv_pool *pool = make_pool((ikv_format)f);
            tokens x = make_tokens(kind, n, 1000 + 10 * f + kind);
            ikv_seq_id bulk, step;
            IKVT_OK(ikv_seq_create(pool, &bulk));
            IKVT_OK(ikv_seq_create(pool, &step));
            append_bulk(pool, bulk, x.k, x.v, n);
            append_each(pool, step, x.k, x.v, n);
            expect_same_rows(pool, step, 0, pool, bulk, 0, n);
            /* two tokens per call land on the same path */
            ikv_seq_id pairs;
            IKVT_OK(ikv_seq_create(pool, &pairs));
            for (uint32_t t = 0; t < n; t += 2)
                for (uint32_t l = 0; l < L; ++l)
                    append(pool, pairs, l, x.k + (size_t)t * ROW, x.v + (size_t)t * ROW, t + 2 <= n ? 2 : 1);
            expect_same_rows(pool, pairs, 0, pool, bulk, 0, n);
            free_tokens(x);
            ikv_pool_destroy(pool);
        }
}

/* After a truncate inside a page, the kept rows are re-staged from their
 * stored values; appending on equals one write of [those values, new rows]. */
static void test_after_truncate(void **state) {
    (void)state;
    const uint32_t n = P + 6, keep = P + 3, more = 4;
    for (int f = 0; f < IKV_FMT_COUNT; ++f)
        for (int kind = 0; kind < 5; ++kind) {
            ikv_pool *pool = make_pool((ikv_format)f);
            tokens x = make_tokens(kind, n, 2000 + 10 * f + kind), y = make_tokens((kind + 1) % 5, more, 2500 + f);
            ikv_seq_id a, ref;
            IKVT_OK(ikv_seq_create(pool, &a));
            append_each(pool, a, x.k, x.v, n);
            tokens kept = make_tokens(0, keep - P, 0); /* the tail page's kept rows, as stored (per layer: equal) */
            float *k1 = malloc((size_t)(keep - P) * ROW * sizeof(float)), *v1 = malloc((size_t)(keep - P) * ROW * sizeof(float));
            IKVT_OK(ikv_seq_read(pool, a, 0, P, keep, kept.k, kept.v));
            IKVT_OK(ikv_seq_read(pool, a, 1, P, keep, k1, v1));
            assert_memory_equal(kept.k, k1, (size_t)(keep - P) * ROW * sizeof(float));
            IKVT_OK(ikv_seq_truncate(pool, a, n - keep));
            append_each(pool, a, y.k, y.v, more);
            tokens tail = concat(kept.k, kept.v, keep - P, y.k, y.v, more);
            IKVT_OK(ikv_seq_create(pool, &ref));
            append_bulk(pool, ref, tail.k, tail.v, keep - P + more);
            expect_same_rows(pool, a, P, pool, ref, 0, keep - P + more);
            free(k1);
            free(v1);
            free_tokens(kept);
            free_tokens(tail);
            free_tokens(x);
            free_tokens(y);
            ikv_pool_destroy(pool);
        }
}

/* A fork shares the partial tail page; parent and child then append their
 * own tokens, each equal to one write of its whole history. */
static void test_after_fork(void **state) {
    (void)state;
    const uint32_t n = P + 5, more = 5;
    for (int f = 0; f < IKV_FMT_COUNT; ++f)
        for (int kind = 0; kind < 5; ++kind) {
            ikv_pool *pool = make_pool((ikv_format)f);
            tokens x = make_tokens(kind, n, 3000 + 10 * f + kind);
            tokens yp = make_tokens(1, more, 3500 + f), yc = make_tokens(3, more, 3600 + f);
            ikv_seq_id parent, child, ref_p, ref_c;
            IKVT_OK(ikv_seq_create(pool, &parent));
            append_each(pool, parent, x.k, x.v, n);
            IKVT_OK(ikv_seq_fork(pool, parent, &child));
            append_each(pool, child, yc.k, yc.v, more);
            append_each(pool, parent, yp.k, yp.v, more);
            tokens hp = concat(x.k, x.v, n, yp.k, yp.v, more), hc = concat(x.k, x.v, n, yc.k, yc.v, more);
            IKVT_OK(ikv_seq_create(pool, &ref_p));
            IKVT_OK(ikv_seq_create(pool, &ref_c));
            append_bulk(pool, ref_p, hp.k, hp.v, n + more);
            append_bulk(pool, ref_c, hc.k, hc.v, n + more);
            expect_same_rows(pool, parent, 0, pool, ref_p, 0, n + more);
            expect_same_rows(pool, child, 0, pool, ref_c, 0, n + more);
            free_tokens(hp);
            free_tokens(hc);
            free_tokens(x);
            free_tokens(yp);
            free_tokens(yc);
            ikv_pool_destroy(pool);
        }
}

/* A format change of the partial tail page re-stages it from the values the
 * new format stores; appending on equals one write, in that format, of
 * [those values, new rows]. */
static void test_after_format_change(void **state) {
    (void)state;
    const uint32_t n = P + 4, more = 3;
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        const ikv_format f2 = (ikv_format)((f + 2) % IKV_FMT_COUNT);
        ikv_pool *pool = make_pool((ikv_format)f), *pool2 = make_pool(f2);
        tokens x = make_tokens(1, n, 4000 + f), y = make_tokens(0, more, 4500 + f);
        ikv_seq_id a, ref;
        IKVT_OK(ikv_seq_create(pool, &a));
        append_each(pool, a, x.k, x.v, n);
        IKVT_OK(ikv_seq_set_page_format(pool, a, 1, f2));
        tokens kept = make_tokens(0, n - P, 0);
        IKVT_OK(ikv_seq_read(pool, a, 0, P, n, kept.k, kept.v));
        append_each(pool, a, y.k, y.v, more);
        tokens tail = concat(kept.k, kept.v, n - P, y.k, y.v, more);
        IKVT_OK(ikv_seq_create(pool2, &ref));
        append_bulk(pool2, ref, tail.k, tail.v, n - P + more);
        expect_same_rows(pool, a, P, pool2, ref, 0, n - P + more);
        free_tokens(kept);
        free_tokens(tail);
        free_tokens(x);
        free_tokens(y);
        ikv_pool_destroy(pool);
        ikv_pool_destroy(pool2);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_by_token),
        cmocka_unit_test(test_after_truncate),
        cmocka_unit_test(test_after_fork),
        cmocka_unit_test(test_after_format_change),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (getenv("IKVT_PRINT_DIGEST")) printf("stored-bytes digest %016llx\n", (unsigned long long)g_digest);
    return rc;
}
