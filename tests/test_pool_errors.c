/* Every bad input of the pool calls: the status, a sentence naming the
 * problem, and nothing changed (stats, lengths, evicted flags, formats and
 * every stored value compared before and after). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

enum { L = 2, H = 2, D = 64, P = 8, MAXT = 64 };

static ikv_pool *make_pool(uint64_t capacity) {
    return ikvt_make_pool(
        (ikvt_pool_spec){.n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P, .capacity_bytes = capacity});
}

/* Everything observable about one sequence and the pool. */
typedef struct observed {
    ikv_pool_stats stats;
    uint32_t length;
    int evicted[MAXT];
    int format[MAXT / P];
    float k[L][MAXT * H * D], v[L][MAXT * H * D];
} observed;

static void observe(const ikv_pool *pool, ikv_seq_id s, observed *o) {
    memset(o, 0, sizeof *o);
    o->stats.struct_size = sizeof o->stats;
    IKVT_OK(ikv_pool_get_stats(pool, &o->stats));
    IKVT_OK(ikv_seq_length(pool, s, &o->length));
    for (uint32_t t = 0; t < o->length; ++t) IKVT_OK(ikv_seq_is_evicted(pool, s, t, &o->evicted[t]));
    for (uint32_t p = 0; p * P < o->length; ++p) {
        if (o->evicted[p * P]) continue;
        ikv_format f;
        IKVT_OK(ikv_seq_page_format(pool, s, p, &f));
        o->format[p] = f;
        const uint32_t t1 = (p + 1) * P < o->length ? (p + 1) * P : o->length;
        for (uint32_t l = 0; l < L; ++l)
            IKVT_OK(ikv_seq_read(pool, s, l, p * P, t1, o->k[l] + (size_t)p * P * H * D,
                                 o->v[l] + (size_t)p * P * H * D));
    }
}

static observed g_before, g_after;

#define EXPECT_UNCHANGED(pool, s, call, status, needle)                \
    do {                                                               \
        observe(pool, s, &g_before);                                   \
        IKVT_EXPECT_STATUS(call, status, needle);                      \
        observe(pool, s, &g_after);                                    \
        assert_memory_equal(&g_before, &g_after, sizeof g_before);     \
    } while (0)

static float g_k[L * MAXT * H * D], g_v[L * MAXT * H * D];

static void append_all(ikv_pool *pool, ikv_seq_id s, uint32_t n, uint64_t seed) {
    ikvt_rng r = {seed};
    ikvt_fill_normal(&r, g_k, (size_t)L * n * H * D, 1.0f);
    ikvt_fill_normal(&r, g_v, (size_t)L * n * H * D, 1.0f);
    ikv_append a = ikv_append_default(pool, n);
    a.layer = IKV_ALL_LAYERS;
    a.k = g_k;
    a.v = g_v;
    IKVT_OK(ikv_pool_append(pool, s, &a));
}

static void test_append_errors(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(1u << 20);
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    append_all(pool, s, 13, 1);
    static float k[L * 4 * H * D], v[L * 4 * H * D];
    ikvt_rng r = {9};
    ikvt_fill_normal(&r, k, sizeof k / sizeof *k, 1.0f);
    ikvt_fill_normal(&r, v, sizeof v / sizeof *v, 1.0f);
    ikv_append good = ikv_append_default(pool, 4);
    good.layer = IKV_ALL_LAYERS;
    good.k = k;
    good.v = v;
    ikv_append a;

    EXPECT_UNCHANGED(pool, s, ikv_pool_append(NULL, s, &good), IKV_E_NULL, "pool");
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, NULL), IKV_E_NULL, "args");
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s + 100, &good), IKV_E_NOT_FOUND, "sequence");
    a = good; a.struct_size = 4;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_INVALID, "struct_size");
    a = good; a.layer = L;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_RANGE, "layer");
    a = good; a.n_tokens = 0;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_INVALID, "n_tokens");
    a = good; a.k = NULL;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_NULL, "k");
    a = good; a.v = NULL;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_NULL, "v");
    a = good; a.token_stride = D - 1;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_INVALID, "token_stride");
    a = good; a.head_stride = -D;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_INVALID, "head_stride");
    a = good; a.layer_stride = 0;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_INVALID, "layer_stride");
    a = good; a.token_stride = INT64_MAX / 2;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_INVALID, "strides");
    a = good; a.src_on_device = 1;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_INVALID, "src_on_device");
    /* A non-finite value in the very last element: nothing of the append lands. */
    k[L * 4 * H * D - 1] = NAN;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &good), IKV_E_INVALID, "NaN");
    k[L * 4 * H * D - 1] = 0.5f;
    v[L * 4 * H * D - 7] = -INFINITY;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &good), IKV_E_INVALID, "is -inf");
    v[L * 4 * H * D - 7] = INFINITY;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &good), IKV_E_INVALID, "is inf");
    v[L * 4 * H * D - 7] = 0.5f;
    /* layer_stride is ignored for a one-layer append */
    a = good; a.layer = 1; a.layer_stride = 0;
    IKVT_OK(ikv_pool_append(pool, s, &a));
    ikv_pool_destroy(pool);
}

static uint64_t page_bytes_of(ikv_format f) {
    ikv_pool *probe = make_pool(1u << 20);
    const uint64_t pb = ikv_pool_page_bytes(probe, f);
    ikv_pool_destroy(probe);
    return pb;
}

static void test_capacity(void **state) {
    (void)state;
    const uint64_t pb = page_bytes_of(IKV_FMT_F16), p4 = page_bytes_of(IKV_FMT_INT4);
    ikv_pool *pool = make_pool(3 * pb); /* exactly 3 F16 pages */
    ikv_seq_id s, c;
    IKVT_OK(ikv_seq_create(pool, &s));
    append_all(pool, s, 2 * P + 3, 2); /* 3 pages, the last partial */
    static float k[L * 8 * H * D], v[L * 8 * H * D];
    ikv_append a = ikv_append_default(pool, 8);
    a.layer = IKV_ALL_LAYERS;
    a.k = k;
    a.v = v;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_NOMEM, "capacity");
    a.n_tokens = P - 3; /* filling the partial page needs no new page */
    a.layer_stride = (int64_t)a.n_tokens * H * D;
    IKVT_OK(ikv_pool_append(pool, s, &a));
    a.n_tokens = 1;
    a.layer_stride = H * D;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_NOMEM, "capacity");
    IKVT_OK(ikv_seq_set_page_format(pool, s, 0, IKV_FMT_INT4));
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_NOMEM, "capacity");
    IKVT_OK(ikv_seq_truncate(pool, s, 3)); /* tail page 2 partial again */
    /* The fork shares every page; its first write to the shared tail needs a copy. */
    IKVT_OK(ikv_seq_fork(pool, s, &c));
    EXPECT_UNCHANGED(pool, c, ikv_pool_append(pool, c, &a), IKV_E_NOMEM, "capacity");
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_NOMEM, "capacity");
    EXPECT_UNCHANGED(pool, c, ikv_seq_truncate(pool, c, 1), IKV_E_NOMEM, "capacity");
    EXPECT_UNCHANGED(pool, s, ikv_seq_set_page_format(pool, s, 0, IKV_FMT_F16), IKV_E_SHARED, "shared");
    EXPECT_UNCHANGED(pool, c, ikv_seq_set_page_format(pool, c, 1, IKV_FMT_INT8), IKV_E_SHARED, "shared");
    IKVT_OK(ikv_seq_destroy(pool, c));
    /* Promotion back needs pb - p4 more: fits exactly. */
    IKVT_OK(ikv_seq_set_page_format(pool, s, 0, IKV_FMT_F16));
    EXPECT_UNCHANGED(pool, s, ikv_seq_set_page_format(pool, s, 0, IKV_FMT_F16), IKV_OK, NULL); /* same format */
    IKVT_OK(ikv_seq_set_page_format(pool, s, 1, IKV_FMT_INT4));
    IKVT_OK(ikv_seq_set_page_format(pool, s, 2, IKV_FMT_INT4));
    ikv_pool_destroy(pool);

    /* apply_plan_formats is atomic: promoting both full pages exceeds capacity by one byte. */
    pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P,
                                           .capacity_bytes = 2 * pb + p4 - 1, .default_format = IKV_FMT_INT4});
    IKVT_OK(ikv_seq_create(pool, &s));
    append_all(pool, s, 2 * P + 1, 3);
    ikv_token_range all = {0, 2 * P + 1};
    ikv_plan *plan = NULL, *plan16 = NULL;
    IKVT_OK(ikv_plan_from_ranges(&all, 1, 2 * P + 1, P, IKV_FMT_F16, &plan));
    IKVT_OK(ikv_plan_from_ranges(&all, 1, 2 * P + 1, 16, IKV_FMT_F16, &plan16));
    EXPECT_UNCHANGED(pool, s, ikv_seq_apply_plan_formats(pool, s, plan), IKV_E_NOMEM, "capacity");
    EXPECT_UNCHANGED(pool, s, ikv_seq_apply_plan_formats(pool, s, plan16), IKV_E_INVALID, "page_size");
    EXPECT_UNCHANGED(pool, s, ikv_seq_apply_plan_formats(pool, s, NULL), IKV_E_NULL, "plan");
    EXPECT_UNCHANGED(pool, s, ikv_seq_apply_plan_formats(pool, s + 9, plan), IKV_E_NOT_FOUND, "sequence");
    ikv_append b = ikv_append_default(pool, 1);
    b.k = g_k;
    b.v = g_v;
    b.formats = plan16;
    EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &b), IKV_E_INVALID, "page_size");
    IKVT_OK(ikv_seq_set_page_format(pool, s, 0, IKV_FMT_F16)); /* one page alone fits */
    ikv_format f;
    IKVT_OK(ikv_seq_page_format(pool, s, 1, &f));
    assert_int_equal(f, IKV_FMT_INT4);
    IKVT_OK(ikv_seq_set_page_format(pool, s, 0, IKV_FMT_INT4));
    ikv_plan_destroy(plan);
    ikv_plan_destroy(plan16);
    ikv_pool_destroy(pool);
}

static void test_edit_errors(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(1u << 20);
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    append_all(pool, s, 4 * P + 3, 4); /* pages 0..3 full, page 4 partial */
    IKVT_OK(ikv_seq_evict(pool, s, P, 2 * P));
    const ikv_seq_id bad = s + 77;
    /* truncate */
    EXPECT_UNCHANGED(pool, s, ikv_seq_truncate(NULL, s, 1), IKV_E_NULL, "pool");
    EXPECT_UNCHANGED(pool, s, ikv_seq_truncate(pool, bad, 1), IKV_E_NOT_FOUND, "sequence");
    EXPECT_UNCHANGED(pool, s, ikv_seq_truncate(pool, s, 4 * P + 4), IKV_E_RANGE, "n_tokens");
    EXPECT_UNCHANGED(pool, s, ikv_seq_truncate(pool, s, 3 * P + 3 - 2), IKV_E_EVICTED, "evicted");
    EXPECT_UNCHANGED(pool, s, ikv_seq_truncate(pool, s, 0), IKV_OK, NULL);
    /* evict */
    EXPECT_UNCHANGED(pool, s, ikv_seq_evict(NULL, s, 0, P), IKV_E_NULL, "pool");
    EXPECT_UNCHANGED(pool, s, ikv_seq_evict(pool, bad, 0, P), IKV_E_NOT_FOUND, "sequence");
    EXPECT_UNCHANGED(pool, s, ikv_seq_evict(pool, s, 1, P), IKV_E_INVALID, "aligned");
    EXPECT_UNCHANGED(pool, s, ikv_seq_evict(pool, s, 0, P + 1), IKV_E_INVALID, "aligned");
    EXPECT_UNCHANGED(pool, s, ikv_seq_evict(pool, s, 2 * P, P), IKV_E_RANGE, "begin");
    EXPECT_UNCHANGED(pool, s, ikv_seq_evict(pool, s, 3 * P, 5 * P), IKV_E_RANGE, "tail");
    EXPECT_UNCHANGED(pool, s, ikv_seq_evict(pool, s, P, 2 * P), IKV_OK, NULL); /* already evicted: no-op */
    EXPECT_UNCHANGED(pool, s, ikv_seq_evict(pool, s, 2 * P, 2 * P), IKV_OK, NULL); /* empty */
    /* formats */
    EXPECT_UNCHANGED(pool, s, ikv_seq_set_page_format(pool, s, 0, (ikv_format)5), IKV_E_INVALID, "format");
    EXPECT_UNCHANGED(pool, s, ikv_seq_set_page_format(pool, s, 0, IKV_FMT_AUTO), IKV_E_INVALID, "format");
    EXPECT_UNCHANGED(pool, s, ikv_seq_set_page_format(pool, s, 5, IKV_FMT_INT8), IKV_E_RANGE, "page");
    EXPECT_UNCHANGED(pool, s, ikv_seq_set_page_format(pool, s, 1, IKV_FMT_INT8), IKV_E_EVICTED, "evicted");
    EXPECT_UNCHANGED(pool, s, ikv_seq_set_page_format(pool, bad, 0, IKV_FMT_INT8), IKV_E_NOT_FOUND, "sequence");
    EXPECT_UNCHANGED(pool, s, ikv_seq_set_page_format(NULL, s, 0, IKV_FMT_INT8), IKV_E_NULL, "pool");
    ikv_format f;
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_format(pool, s, 5, &f), IKV_E_RANGE, "page");
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_format(pool, s, 1, &f), IKV_E_EVICTED, "evicted");
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_format(pool, s, 0, NULL), IKV_E_NULL, "out");
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_format(pool, bad, 0, &f), IKV_E_NOT_FOUND, "sequence");
    /* is_evicted */
    int ev = 7;
    EXPECT_UNCHANGED(pool, s, ikv_seq_is_evicted(pool, s, 4 * P + 3, &ev), IKV_E_RANGE, "token");
    EXPECT_UNCHANGED(pool, s, ikv_seq_is_evicted(pool, s, 0, NULL), IKV_E_NULL, "evicted_out");
    EXPECT_UNCHANGED(pool, s, ikv_seq_is_evicted(pool, bad, 0, &ev), IKV_E_NOT_FOUND, "sequence");
    assert_int_equal(ev, 7);
    /* read */
    static float rk[MAXT * H * D], rv[MAXT * H * D];
    EXPECT_UNCHANGED(pool, s, ikv_seq_read(pool, s, 0, 0, 4, NULL, rv), IKV_E_NULL, "k_out");
    EXPECT_UNCHANGED(pool, s, ikv_seq_read(pool, s, 0, 0, 4, rk, NULL), IKV_E_NULL, "v_out");
    EXPECT_UNCHANGED(pool, s, ikv_seq_read(pool, s, L, 0, 4, rk, rv), IKV_E_RANGE, "layer");
    EXPECT_UNCHANGED(pool, s, ikv_seq_read(pool, s, 0, 0, 4 * P + 4, rk, rv), IKV_E_RANGE, "[0, 36)");
    EXPECT_UNCHANGED(pool, s, ikv_seq_read(pool, s, 0, 5, 4, rk, rv), IKV_E_RANGE, "[5, 4)");
    EXPECT_UNCHANGED(pool, s, ikv_seq_read(pool, s, 0, 0, 3 * P, rk, rv), IKV_E_EVICTED, "evicted");
    IKVT_OK(ikv_seq_read(pool, s, 0, P + 3, P + 3, rk, rv)); /* an empty range in the evicted page reads nothing */
    EXPECT_UNCHANGED(pool, s, ikv_seq_read(pool, bad, 0, 0, 4, rk, rv), IKV_E_NOT_FOUND, "sequence");
    /* summaries */
    float mn[D];
    uint32_t nt;
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_summary(pool, s, L, 0, 0, mn, NULL, NULL, &nt), IKV_E_RANGE, "layer");
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_summary(pool, s, 0, H, 0, mn, NULL, NULL, &nt), IKV_E_RANGE, "kv_head");
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_summary(pool, s, 0, 0, 5, mn, NULL, NULL, &nt), IKV_E_RANGE, "page");
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_summary(pool, s, 0, 0, 1, mn, NULL, NULL, &nt), IKV_E_EVICTED, "evicted");
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_summary(pool, bad, 0, 0, 0, mn, NULL, NULL, &nt), IKV_E_NOT_FOUND, "sequence");
    EXPECT_UNCHANGED(pool, s, ikv_seq_page_summary(NULL, s, 0, 0, 0, mn, NULL, NULL, &nt), IKV_E_NULL, "pool");
    IKVT_OK(ikv_seq_page_summary(pool, s, 0, 0, 4, NULL, NULL, NULL, NULL)); /* any pointer may be NULL */
    /* fork */
    ikv_seq_id c = 0;
    EXPECT_UNCHANGED(pool, s, ikv_seq_fork(pool, bad, &c), IKV_E_NOT_FOUND, "sequence");
    EXPECT_UNCHANGED(pool, s, ikv_seq_fork(pool, s, NULL), IKV_E_NULL, "child_out");
    EXPECT_UNCHANGED(pool, s, ikv_seq_fork(NULL, s, &c), IKV_E_NULL, "pool");
    assert_int_equal(c, 0);
    ikv_pool_destroy(pool);
}

/* Layers of unequal length: the sequence length counts only tokens every layer has. */
static void test_unequal_layers(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(1u << 20);
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    ikv_append a = ikv_append_default(pool, 2 * P + 1);
    a.layer = 0;
    a.k = g_k;
    a.v = g_v;
    IKVT_OK(ikv_pool_append(pool, s, &a));
    uint32_t len;
    IKVT_OK(ikv_seq_length(pool, s, &len));
    assert_int_equal(len, 0);
    EXPECT_UNCHANGED(pool, s, ikv_seq_truncate(pool, s, 0), IKV_E_STATE, "layers");
    EXPECT_UNCHANGED(pool, s, ikv_seq_evict(pool, s, 0, P), IKV_E_RANGE, "tail");
    static float rk[MAXT * H * D], rv[MAXT * H * D];
    IKVT_OK(ikv_seq_read(pool, s, 0, 0, 2 * P + 1, rk, rv));
    IKVT_EXPECT_STATUS(ikv_seq_read(pool, s, 1, 0, 1, rk, rv), IKV_E_RANGE, "layer 1");
    IKVT_EXPECT_STATUS(ikv_seq_page_summary(pool, s, 1, 0, 0, NULL, NULL, NULL, NULL), IKV_E_RANGE, "no tokens");
    a.layer = 1;
    a.n_tokens = P + 3;
    IKVT_OK(ikv_pool_append(pool, s, &a));
    IKVT_OK(ikv_seq_length(pool, s, &len));
    assert_int_equal(len, P + 3);
    ikv_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    IKVT_OK(ikv_pool_get_stats(pool, &st));
    assert_true(st.pages_used == 3 && st.tokens_total == P + 3);
    a.n_tokens = P - 2;
    IKVT_OK(ikv_pool_append(pool, s, &a));
    IKVT_OK(ikv_seq_length(pool, s, &len));
    assert_int_equal(len, 2 * P + 1);
    IKVT_OK(ikv_seq_truncate(pool, s, 2));
    ikv_pool_destroy(pool);
}

/* Non-finite values in F16 and BF16 engine input are found without converting. */
static void test_nonfinite_half_input(void **state) {
    (void)state;
    const ikv_dtype dts[2] = {IKV_DTYPE_F16, IKV_DTYPE_BF16};
    const uint16_t bad[2][2] = {{0x7C00u, 0xFE00u}, {0xFF80u, 0x7FC1u}}; /* f16 inf, NaN; bf16 -inf, NaN */
    for (int i = 0; i < 2; ++i) {
        ikv_pool *pool =
            ikvt_make_pool((ikvt_pool_spec){.n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P, .kv_dtype = dts[i]});
        ikv_seq_id s;
        IKVT_OK(ikv_seq_create(pool, &s));
        static uint16_t k[3 * H * D], v[3 * H * D];
        for (int j = 0; j < 3 * H * D; ++j) k[j] = v[j] = dts[i] == IKV_DTYPE_F16 ? 0x3C00u : 0x3F80u; /* 1.0 */
        ikv_append a = ikv_append_default(pool, 3);
        a.k = k;
        a.v = v;
        IKVT_OK(ikv_pool_append(pool, s, &a));
        for (int j = 0; j < 2; ++j) {
            k[2 * H * D + D + 17] = bad[i][j];
            EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_INVALID,
                             j == 1 ? "NaN"
                             : i == 0 ? "k[layer 0, token 2, head 1, channel 17] is inf"
                                      : "k[layer 0, token 2, head 1, channel 17] is -inf");
            k[2 * H * D + D + 17] = 0;
            v[5] = bad[i][j];
            EXPECT_UNCHANGED(pool, s, ikv_pool_append(pool, s, &a), IKV_E_INVALID, "v[layer 0, token 0, head 0, channel 5]");
            v[5] = 0;
        }
        ikv_pool_destroy(pool);
    }
}

/* The host tier is a CUDA pool's: a CPU pool refuses it at creation and
 * refuses moves; callers built with the first header's ikv_pool_config and
 * ikv_pool_stats (before host_capacity_bytes / host_used_bytes) still work
 * and nothing is written past their structs. */
static void test_host_tier_on_cpu_pools(void **state) {
    (void)state;
    ikv_pool_config c = ikv_pool_default_config();
    c.n_layers = L;
    c.n_kv_heads = H;
    c.head_dim = D;
    c.page_size = P;
    c.kv_dtype = IKV_DTYPE_F32;
    c.host_capacity_bytes = 1u << 20;
    ikv_pool *bad = NULL;
    IKVT_EXPECT_STATUS(ikv_pool_create(&c, &bad), IKV_E_INVALID, "host_capacity_bytes");
    assert_null(bad);

    /* the first header's config ends where host_capacity_bytes begins; the bytes after it are not read */
    unsigned char cbuf[sizeof(ikv_pool_config) + 8];
    memset(cbuf, 0xFF, sizeof cbuf);
    c.struct_size = (uint32_t)offsetof(ikv_pool_config, host_capacity_bytes);
    memcpy(cbuf, &c, c.struct_size);
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create((const ikv_pool_config *)(const void *)cbuf, &pool));
    ikv_pool_config got;
    memset(&got, 0, sizeof got);
    got.struct_size = sizeof got;
    IKVT_OK(ikv_pool_get_config(pool, &got));
    assert_true(got.host_capacity_bytes == 0);

    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    static float kv[2 * P * L * H * D];
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; ++i) kv[i] = (float)(i % 7) - 3.0f;
    ikv_append a = ikv_append_default(pool, 2 * P);
    a.layer = IKV_ALL_LAYERS;
    a.k = kv;
    a.v = kv;
    IKVT_OK(ikv_pool_append(pool, s, &a));
    observed before, after;
    observe(pool, s, &before);
    uint32_t moved = 5;
    IKVT_EXPECT_STATUS(ikv_seq_offload(pool, s, 0, 2 * P, NULL, &moved), IKV_E_UNSUPPORTED, "host tier");
    assert_int_equal(moved, 5); /* an error leaves it as it was */
    IKVT_EXPECT_STATUS(ikv_seq_fetch(pool, s, 0, 2 * P, NULL, NULL), IKV_E_UNSUPPORTED, "host tier");
    IKVT_EXPECT_STATUS(ikv_seq_offload(NULL, s, 0, 1, NULL, NULL), IKV_E_NULL, "ikv_seq_offload");
    int on_host = 7;
    IKVT_OK(ikv_seq_page_tier(pool, s, 1, &on_host));
    assert_int_equal(on_host, 0);
    IKVT_EXPECT_STATUS(ikv_seq_page_tier(pool, s, 2, &on_host), IKV_E_RANGE, "page 2");
    IKVT_EXPECT_STATUS(ikv_seq_page_tier(pool, s, 0, NULL), IKV_E_NULL, "ikv_seq_page_tier");
    /* the automatic tier policy: CUDA pools with a host tier only */
    ikv_tier_policy policy;
    memset(&policy, 0, sizeof policy);
    policy.struct_size = sizeof policy;
    IKVT_EXPECT_STATUS(ikv_pool_set_tier_policy(pool, &policy), IKV_E_UNSUPPORTED, "host tier");
    IKVT_EXPECT_STATUS(ikv_pool_set_tier_policy(NULL, &policy), IKV_E_NULL, "ikv_pool_set_tier_policy");
    policy.device_high = 1.5f;
    IKVT_EXPECT_STATUS(ikv_pool_set_tier_policy(pool, &policy), IKV_E_INVALID, "device_high");
    policy.device_high = 0.5f;
    policy.device_low = 0.6f;
    IKVT_EXPECT_STATUS(ikv_pool_set_tier_policy(pool, &policy), IKV_E_INVALID, "device_low");
    policy.device_low = 0.0f;
    policy.flags = 0x80;
    IKVT_EXPECT_STATUS(ikv_pool_set_tier_policy(pool, &policy), IKV_E_INVALID, "flags");
    policy.flags = 0;
    policy.struct_size = 4;
    IKVT_EXPECT_STATUS(ikv_pool_set_tier_policy(pool, &policy), IKV_E_INVALID, "struct_size");
    ikv_tier_step_report rep;
    memset(&rep, 0x5A, sizeof rep);
    rep.struct_size = sizeof rep;
    IKVT_EXPECT_STATUS(ikv_pool_tier_step(pool, &s, NULL, 1, NULL, &rep), IKV_E_UNSUPPORTED, "host tier");
    IKVT_EXPECT_STATUS(ikv_pool_tier_step(pool, NULL, NULL, 1, NULL, NULL), IKV_E_NULL, "seqs");
    rep.struct_size = 8;
    IKVT_EXPECT_STATUS(ikv_pool_tier_step(pool, &s, NULL, 1, NULL, &rep), IKV_E_INVALID, "struct_size");
    observe(pool, s, &after);
    assert_memory_equal(&before, &after, sizeof before);

    /* the first header's stats: filled up to its size, nothing past it */
    const size_t first = offsetof(ikv_pool_stats, host_used_bytes);
    unsigned char sbuf[sizeof(ikv_pool_stats) + 8];
    memset(sbuf, 0xA5, sizeof sbuf);
    ikv_pool_stats *old = (ikv_pool_stats *)(void *)sbuf;
    old->struct_size = (uint32_t)first;
    IKVT_OK(ikv_pool_get_stats(pool, old));
    assert_true(old->pages_used == 2 && old->tokens_total == 2 * P);
    for (size_t i = first; i < sizeof sbuf; ++i) assert_int_equal(sbuf[i], 0xA5);
    ikv_pool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_errors),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_edit_errors),
        cmocka_unit_test(test_unequal_layers),
        cmocka_unit_test(test_nonfinite_half_input),
        cmocka_unit_test(test_host_tier_on_cpu_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
