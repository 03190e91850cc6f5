/* Fork and copy-on-write, truncate (roll back) and eviction, checked value by
 * value. F16 pages with F32 input: every stored value is exactly the F16
 * rounding of its input, so expectations are exact. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

enum { L = 2, H = 2, D = 64, P = 8, ROW = H * D, MAXT = 64 };

static ikv_pool *make_pool(void) {
    return ikvt_make_pool(
        (ikvt_pool_spec){.n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P, .capacity_bytes = 8u << 20});
}

/* What a sequence should hold: per layer, token rows of K and V as F16-rounded floats. */
typedef struct shadow {
    uint32_t len;
    float k[L][MAXT * ROW], v[L][MAXT * ROW];
} shadow;

static float f16r(float x) {
    uint16_t h;
    ikvt_to_f16(&x, &h, 1);
    return ikvt_f16_to_f32(h);
}

/* Append n random tokens to one layer of s, or every layer (IKV_ALL_LAYERS);
 * the inputs are left in k, v. */
static void append_layer(ikv_pool *pool, ikv_seq_id s, uint32_t layer, uint32_t n, uint64_t seed, float *k, float *v) {
    ikvt_rng r = {seed};
    const uint32_t layers = layer == IKV_ALL_LAYERS ? L : 1;
    ikvt_fill_normal(&r, k, (size_t)layers * n * ROW, 1.0f);
    ikvt_fill_normal(&r, v, (size_t)layers * n * ROW, 1.0f);
    ikv_append a = ikv_append_default(pool, n);
    a.layer = layer;
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append(pool, s, &a));
}

/* Append n random tokens to every layer of s and to its shadow. */
static void append(ikv_pool *pool, ikv_seq_id s, shadow *sh, uint32_t n, uint64_t seed) {
    static float k[L * MAXT * ROW], v[L * MAXT * ROW];
    append_layer(pool, s, IKV_ALL_LAYERS, n, seed, k, v);
    for (uint32_t l = 0; l < L; ++l)
        for (size_t i = 0; i < (size_t)n * ROW; ++i) {
            sh->k[l][sh->len * ROW + i] = f16r(k[(size_t)l * n * ROW + i]);
            sh->v[l][sh->len * ROW + i] = f16r(v[(size_t)l * n * ROW + i]);
        }
    sh->len += n;
}

static void check(const ikv_pool *pool, ikv_seq_id s, const shadow *sh) {
    static float k[MAXT * ROW], v[MAXT * ROW];
    uint32_t len;
    IKVT_OK(ikv_seq_length(pool, s, &len));
    assert_int_equal(len, sh->len);
    for (uint32_t l = 0; l < L; ++l)
        for (uint32_t p = 0; p * P < len; ++p) {
            int ev;
            IKVT_OK(ikv_seq_is_evicted(pool, s, p * P, &ev));
            if (ev) continue;
            const uint32_t t1 = (p + 1) * P < len ? (p + 1) * P : len;
            IKVT_OK(ikv_seq_read(pool, s, l, p * P, t1, k, v));
            assert_memory_equal(k, sh->k[l] + (size_t)p * P * ROW, (size_t)(t1 - p * P) * ROW * sizeof(float));
            assert_memory_equal(v, sh->v[l] + (size_t)p * P * ROW, (size_t)(t1 - p * P) * ROW * sizeof(float));
        }
}

static shadow g_a, g_b, g_c;

static void test_fork_cow(void **state) {
    (void)state;
    ikv_pool *pool = make_pool();
    const uint64_t pb = ikv_pool_page_bytes(pool, IKV_FMT_F16);
    ikv_seq_id a, b;
    memset(&g_a, 0, sizeof g_a);
    IKVT_OK(ikv_seq_create(pool, &a));
    append(pool, a, &g_a, 2 * P + 4, 1);
    IKVT_OK(ikv_seq_fork(pool, a, &b));
    g_b = g_a;
    ikv_pool_stats st = ikvt_pool_stats(pool);
    assert_true(st.pages_used == 3 && st.used_bytes == 3 * pb); /* nothing copied */
    assert_true(st.n_sequences == 2 && st.tokens_total == 2 * (2 * P + 4));
    check(pool, a, &g_a);
    check(pool, b, &g_b);
    /* Parent writes into the shared partial page: it gets its own copy. */
    append(pool, a, &g_a, 2, 2);
    assert_true(ikvt_pool_stats(pool).pages_used == 4);
    check(pool, b, &g_b); /* the child still sees the old tail */
    check(pool, a, &g_a);
    /* The child is now the only user of the old tail page: no copy. */
    append(pool, b, &g_b, 3, 3);
    assert_true(ikvt_pool_stats(pool).pages_used == 4);
    check(pool, a, &g_a);
    check(pool, b, &g_b);
    /* Crossing into new pages: each gets its own. */
    append(pool, b, &g_b, P, 4);
    assert_true(ikvt_pool_stats(pool).pages_used == 5);
    check(pool, a, &g_a);
    check(pool, b, &g_b);
    /* Full pages stay shared: format changes are refused, eviction only drops a reference. */
    IKVT_EXPECT_STATUS(ikv_seq_set_page_format(pool, b, 0, IKV_FMT_INT8), IKV_E_SHARED, "shared");
    IKVT_OK(ikv_seq_evict(pool, b, 0, P));
    assert_true(ikvt_pool_stats(pool).pages_used == 5);
    int ev;
    IKVT_OK(ikv_seq_is_evicted(pool, b, 3, &ev));
    assert_int_equal(ev, 1);
    IKVT_OK(ikv_seq_is_evicted(pool, a, 3, &ev));
    assert_int_equal(ev, 0);
    check(pool, a, &g_a);
    check(pool, b, &g_b);
    IKVT_OK(ikv_seq_evict(pool, a, 0, P)); /* last user: freed */
    assert_true(ikvt_pool_stats(pool).pages_used == 4);
    /* Fork of a fork, then destroy the middle one. */
    ikv_seq_id c;
    IKVT_OK(ikv_seq_fork(pool, b, &c));
    g_c = g_b;
    IKVT_OK(ikv_seq_destroy(pool, b));
    assert_true(ikvt_pool_stats(pool).pages_used == 4);
    check(pool, c, &g_c);
    /* Page 1 is shared by a and c until a goes. */
    IKVT_EXPECT_STATUS(ikv_seq_set_page_format(pool, c, 1, IKV_FMT_INT8), IKV_E_SHARED, "shared");
    IKVT_OK(ikv_seq_destroy(pool, a));
    IKVT_OK(ikv_seq_set_page_format(pool, c, 1, IKV_FMT_INT8));
    IKVT_OK(ikv_seq_destroy(pool, c));
    st = ikvt_pool_stats(pool);
    assert_true(st.pages_used == 0 && st.used_bytes == 0 && st.staging_bytes == 0 && st.tokens_total == 0);
    ikv_pool_destroy(pool);
}

static void test_truncate(void **state) {
    (void)state;
    ikv_pool *pool = make_pool();
    ikv_seq_id a, b;
    memset(&g_a, 0, sizeof g_a);
    IKVT_OK(ikv_seq_create(pool, &a));
    append(pool, a, &g_a, 3 * P + 2, 10);
    /* Roll back across a page boundary: the emptied page is released. */
    IKVT_OK(ikv_seq_truncate(pool, a, 5));
    g_a.len -= 5;
    assert_true(ikvt_pool_stats(pool).pages_used == 3);
    check(pool, a, &g_a);
    append(pool, a, &g_a, 7, 11); /* re-fills the re-staged tail */
    check(pool, a, &g_a);
    /* Roll back to a page boundary: no partial tail, no staging. */
    IKVT_OK(ikv_seq_truncate(pool, a, g_a.len - 2 * P));
    g_a.len = 2 * P;
    ikv_pool_stats st = ikvt_pool_stats(pool);
    assert_true(st.pages_used == 2 && st.staging_bytes == 0 && st.tokens_total == 2 * P);
    check(pool, a, &g_a);
    /* Truncating a shared partial tail copies it; the other sequence keeps its tokens. */
    append(pool, a, &g_a, 5, 12);
    IKVT_OK(ikv_seq_fork(pool, a, &b));
    g_b = g_a;
    IKVT_OK(ikv_seq_truncate(pool, b, 2));
    g_b.len -= 2;
    assert_true(ikvt_pool_stats(pool).pages_used == 4);
    check(pool, a, &g_a);
    check(pool, b, &g_b);
    append(pool, b, &g_b, 4, 13);
    append(pool, a, &g_a, 1, 14);
    check(pool, a, &g_a);
    check(pool, b, &g_b);
    /* Truncate everything. */
    IKVT_OK(ikv_seq_truncate(pool, b, g_b.len));
    g_b.len = 0;
    check(pool, b, &g_b);
    append(pool, b, &g_b, 3, 15);
    check(pool, b, &g_b);
    check(pool, a, &g_a);
    IKVT_OK(ikv_seq_destroy(pool, a));
    IKVT_OK(ikv_seq_destroy(pool, b));
    st = ikvt_pool_stats(pool);
    assert_true(st.pages_used == 0 && st.used_bytes == 0 && st.staging_bytes == 0 && st.tokens_total == 0);
    ikv_pool_destroy(pool);
}

/* Evicted tokens keep their positions; survivors and later appends are unaffected. */
/* A speculative rollback of a fork near capacity: the new tail page is shared
 * (so it is copied) while the rollback releases two pages of its own; with
 * capacity for 5.5 pages and 5 in use it must succeed (it ends with 4). */
static void test_truncate_fork_near_capacity(void **state) {
    (void)state;
    ikv_pool *probe = make_pool();
    const uint64_t pb = ikv_pool_page_bytes(probe, IKV_FMT_F16);
    ikv_pool_destroy(probe);
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P,
                                                     .capacity_bytes = pb * 11 / 2});
    static shadow parent, child, other;
    memset(&parent, 0, sizeof parent);
    memset(&other, 0, sizeof other);
    ikv_seq_id sp, sc, so;
    IKVT_OK(ikv_seq_create(pool, &sp));
    append(pool, sp, &parent, 2 * P, 31); /* 2 full pages */
    IKVT_OK(ikv_seq_fork(pool, sp, &sc));
    child = parent;
    append(pool, sc, &child, P + 6, 32); /* 2 pages of its own */
    IKVT_OK(ikv_seq_create(pool, &so));
    append(pool, so, &other, P, 33);
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 5);
    IKVT_OK(ikv_seq_truncate(pool, sc, child.len - 4)); /* keep 4 tokens of the shared page 0 */
    child.len = 4;
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 4);
    check(pool, sc, &child);
    check(pool, sp, &parent);
    check(pool, so, &other);
    ikv_pool_destroy(pool);
}

/* Layers of different lengths in a fork: an all-layers append copies only the
 * shared pages some layer writes (layer 0 at 20 tokens writes page 2, layer
 * 1 at 4 writes page 0; page 1 stays shared), and both sequences keep their
 * values. */
static void test_fork_uneven_layers(void **state) {
    (void)state;
    ikv_pool *pool = make_pool();
    static float k[L * MAXT * ROW], v[L * MAXT * ROW];
    static float pk[L][MAXT * ROW], pv[L][MAXT * ROW], ck[MAXT * ROW], cv[MAXT * ROW];
    const uint32_t len[L] = {20, 4};
    ikv_seq_id sp, sc;
    IKVT_OK(ikv_seq_create(pool, &sp));
    append_layer(pool, sp, 0, len[0], 41, k, v);
    append_layer(pool, sp, 1, len[1], 42, k, v);
    for (uint32_t l = 0; l < L; ++l) IKVT_OK(ikv_seq_read(pool, sp, l, 0, len[l], pk[l], pv[l]));
    IKVT_OK(ikv_seq_fork(pool, sp, &sc));
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 3);
    append_layer(pool, sc, IKV_ALL_LAYERS, 1, 43, k, v);
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 5); /* pages 0 and 2 copied, page 1 still shared */
    for (uint32_t l = 0; l < L; ++l) {
        IKVT_OK(ikv_seq_read(pool, sp, l, 0, len[l], ck, cv)); /* the parent is unchanged */
        assert_memory_equal(ck, pk[l], (size_t)len[l] * ROW * sizeof(float));
        assert_memory_equal(cv, pv[l], (size_t)len[l] * ROW * sizeof(float));
        IKVT_OK(ikv_seq_read(pool, sc, l, 0, len[l] + 1, ck, cv));
        assert_memory_equal(ck, pk[l], (size_t)len[l] * ROW * sizeof(float));
        assert_memory_equal(cv, pv[l], (size_t)len[l] * ROW * sizeof(float));
        for (uint32_t i = 0; i < ROW; ++i) {
            assert_true(ck[(size_t)len[l] * ROW + i] == f16r(k[(size_t)l * ROW + i]));
            assert_true(cv[(size_t)len[l] * ROW + i] == f16r(v[(size_t)l * ROW + i]));
        }
    }
    ikv_pool_destroy(pool);
}

static void test_evict(void **state) {
    (void)state;
    ikv_pool *pool = make_pool();
    ikv_seq_id a;
    memset(&g_a, 0, sizeof g_a);
    IKVT_OK(ikv_seq_create(pool, &a));
    append(pool, a, &g_a, 5 * P + 1, 20);
    IKVT_OK(ikv_seq_evict(pool, a, P, 3 * P));
    assert_true(ikvt_pool_stats(pool).pages_used == 4);
    check(pool, a, &g_a);
    for (uint32_t t = 0; t < g_a.len; ++t) {
        int ev;
        IKVT_OK(ikv_seq_is_evicted(pool, a, t, &ev));
        assert_int_equal(ev, t >= P && t < 3 * P);
    }
    append(pool, a, &g_a, 2 * P, 21);
    check(pool, a, &g_a);
    uint32_t len;
    IKVT_OK(ikv_seq_length(pool, a, &len));
    assert_int_equal(len, 7 * P + 1);
    /* Truncating back over a whole evicted page is fine, cutting inside one is not. */
    IKVT_OK(ikv_seq_truncate(pool, a, 4 * P + 1)); /* length 3P: pages 1 and 2 still evicted */
    g_a.len = 3 * P;
    check(pool, a, &g_a);
    IKVT_EXPECT_STATUS(ikv_seq_truncate(pool, a, 1), IKV_E_EVICTED, "evicted");
    IKVT_OK(ikv_seq_truncate(pool, a, P));
    g_a.len = 2 * P;
    check(pool, a, &g_a);
    IKVT_OK(ikv_seq_destroy(pool, a));
    ikv_pool_stats st = ikvt_pool_stats(pool);
    assert_true(st.pages_used == 0 && st.used_bytes == 0);
    ikv_pool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_cow),
        cmocka_unit_test(test_truncate),
        cmocka_unit_test(test_truncate_fork_near_capacity),
        cmocka_unit_test(test_evict),
        cmocka_unit_test(test_fork_uneven_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
