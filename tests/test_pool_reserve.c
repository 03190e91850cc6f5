/* ikv_pool_reserve on CPU pools (runs everywhere): room for the next tokens
 * is allocated ahead and charged at once; appends into it allocate nothing and
 * store exactly what appends to a pool without room store (values, summaries,
 * decode); a room that does not fit changes nothing; n_tokens = 0 gives the
 * unused pages back; a fork shares the tokens, not the parent's room; a shared
 * tail is copied when the room is reserved (once, where a fork and its parent
 * reserve in one call; on a CUDA pool too where there is a GPU); bad
 * arguments are refused with a sentence. The CUDA side (lengths on the device, captured steps) is
 * test_gpu_graph_step.c. */
#include <stdlib.h>
#include <string.h>

#include "support.h"

enum { L = 2, H = 2, D = 32, P = 16 };

static ikv_pool *make_pool(ikv_format f, uint64_t capacity) {
    return ikvt_make_pool((ikvt_pool_spec){.backend = IKV_BACKEND_CPU, .n_layers = L, .n_kv_heads = H, .head_dim = D,
                                           .page_size = P, .capacity_bytes = capacity, .default_format = f,
                                           .kv_dtype = IKV_DTYPE_F32});
}

/* n tokens of seeded K/V to every layer of seq. */
static void append_tokens(ikv_pool *pool, ikv_seq_id seq, uint32_t n, ikvt_rng *rng) {
    const size_t count = (size_t)L * n * H * D;
    float *k = malloc(4 * count), *v = malloc(4 * count);
    ikvt_fill_normal(rng, k, count, 1.0f);
    ikvt_fill_normal(rng, v, count, 1.0f);
    ikv_append a = ikv_append_default(pool, n);
    a.layer = IKV_ALL_LAYERS;
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append(pool, seq, &a));
    free(k), free(v);
}

/* Stored values of every layer and head of seq in a and b are equal. */
static void assert_same_tokens(ikv_pool *a, ikv_seq_id sa, ikv_pool *b, ikv_seq_id sb) {
    uint32_t la = 0, lb = 0;
    IKVT_OK(ikv_seq_length(a, sa, &la));
    IKVT_OK(ikv_seq_length(b, sb, &lb));
    assert_int_equal(la, lb);
    const size_t bytes = 4 * (size_t)la * H * D;
    float *ka = malloc(bytes), *kb = malloc(bytes), *va = malloc(bytes), *vb = malloc(bytes);
    for (uint32_t l = 0; l < L; ++l) {
        IKVT_OK(ikv_seq_read(a, sa, l, 0, la, ka, va));
        IKVT_OK(ikv_seq_read(b, sb, l, 0, la, kb, vb));
        assert_memory_equal(ka, kb, bytes);
        assert_memory_equal(va, vb, bytes);
    }
    free(ka), free(kb), free(va), free(vb);
}

/* A dense decode of seq at layer 1 gives the same bytes in a and b. */
static void assert_same_decode(ikv_pool *a, ikv_seq_id sa, ikv_pool *b, ikv_seq_id sb) {
    enum { HQ = 2 * H };
    ikvt_rng rng = {42};
    float q[HQ * D], out[2][HQ * D];
    ikvt_fill_normal(&rng, q, HQ * D, 1.0f);
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    for (int i = 0; i < 2; ++i) {
        ikv_decode_args args = ikv_decode_args_default();
        args.layer = 1;
        args.seqs = i == 0 ? &sa : &sb;
        args.n_q_heads = HQ;
        args.q = q;
        args.out = out[i];
        IKVT_OK(ikv_decode(dec, i == 0 ? a : b, &args));
    }
    assert_memory_equal(out[0], out[1], sizeof out[0]);
    ikv_decoder_destroy(dec);
}

static void test_room_is_allocated_ahead_and_stores_the_same(void **state) {
    (void)state;
    const ikv_format formats[] = {IKV_FMT_F16, IKV_FMT_INT8, IKV_FMT_INT4};
    for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; ++fi) {
        ikv_pool *roomy = make_pool(formats[fi], 0), *plain = make_pool(formats[fi], 0);
        ikv_seq_id sr, sp;
        IKVT_OK(ikv_seq_create(roomy, &sr));
        IKVT_OK(ikv_seq_create(plain, &sp));
        ikvt_rng r1 = {7 + fi}, r2 = {7 + fi};
        append_tokens(roomy, sr, 21, &r1);
        append_tokens(plain, sp, 21, &r2);
        const ikv_pool_stats before = ikvt_pool_stats(roomy);
        assert_int_equal(before.pages_used, 2); /* tokens 0..20 */
        IKVT_OK(ikv_pool_reserve(roomy, &sr, 1, 40)); /* up to 61: pages 0..3 */
        const ikv_pool_stats reserved = ikvt_pool_stats(roomy);
        assert_int_equal(reserved.pages_used, 4);
        assert_int_equal(reserved.used_bytes, before.used_bytes * 2);
        uint32_t len = 0;
        IKVT_OK(ikv_seq_length(roomy, sr, &len));
        assert_int_equal(len, 21); /* room is not length */
        assert_same_decode(roomy, sr, plain, sp); /* the room's empty pages are not read */
        for (int t = 0; t < 40; ++t) {
            append_tokens(roomy, sr, 1, &r1);
            append_tokens(plain, sp, 1, &r2);
            assert_int_equal(ikvt_pool_stats(roomy).pages_used, 4); /* nothing allocated inside the room */
        }
        assert_same_tokens(roomy, sr, plain, sp);
        assert_same_decode(roomy, sr, plain, sp);
        for (uint32_t page = 0; page < 4; ++page) { /* key summaries too */
            float mn[2][D], mx[2][D], me[2][D];
            uint32_t n[2];
            IKVT_OK(ikv_seq_page_summary(roomy, sr, 1, 1, page, mn[0], mx[0], me[0], &n[0]));
            IKVT_OK(ikv_seq_page_summary(plain, sp, 1, 1, page, mn[1], mx[1], me[1], &n[1]));
            assert_int_equal(n[0], n[1]);
            assert_memory_equal(mn[0], mn[1], sizeof mn[0]);
            assert_memory_equal(mx[0], mx[1], sizeof mx[0]);
            assert_memory_equal(me[0], me[1], sizeof me[0]);
        }
        /* Past the room, appends allocate as usual. */
        append_tokens(roomy, sr, 5, &r1);
        assert_int_equal(ikvt_pool_stats(roomy).pages_used, 5);
        ikv_pool_destroy(roomy);
        ikv_pool_destroy(plain);
    }
}

static void test_room_ends_and_shrinks(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_FMT_F16, 0);
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    ikvt_rng rng = {11};
    append_tokens(pool, s, 10, &rng);
    IKVT_OK(ikv_pool_reserve(pool, &s, 1, 100)); /* up to 110: 7 pages */
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 7);
    IKVT_OK(ikv_pool_reserve(pool, &s, 1, 20)); /* replaced: up to 30, 2 pages */
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 2);
    IKVT_OK(ikv_pool_reserve(pool, &s, 1, 0)); /* ended: the page that holds tokens stays */
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 1);
    uint32_t len = 0;
    IKVT_OK(ikv_seq_length(pool, s, &len));
    assert_int_equal(len, 10);
    /* An empty sequence's room. */
    ikv_seq_id e;
    IKVT_OK(ikv_seq_create(pool, &e));
    IKVT_OK(ikv_pool_reserve(pool, &e, 1, 1));
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 2);
    IKVT_OK(ikv_seq_destroy(pool, e)); /* its room goes with it */
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 1);
    ikv_pool_destroy(pool);
}

static void test_room_that_does_not_fit_changes_nothing(void **state) {
    (void)state;
    ikv_pool *probe = make_pool(IKV_FMT_F16, 0);
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(probe, &s));
    ikvt_rng rng = {3};
    append_tokens(probe, s, 1, &rng);
    const uint64_t page = ikvt_pool_stats(probe).used_bytes;
    ikv_pool_destroy(probe);

    ikv_pool *pool = make_pool(IKV_FMT_F16, 5 * page); /* room for 5 pages */
    ikv_seq_id a, b;
    IKVT_OK(ikv_seq_create(pool, &a));
    IKVT_OK(ikv_seq_create(pool, &b));
    append_tokens(pool, a, 20, &rng); /* 2 pages */
    append_tokens(pool, b, 3, &rng);  /* 1 page */
    const ikv_pool_stats before = ikvt_pool_stats(pool);
    const ikv_seq_id both[2] = {a, b};
    /* a needs 2 more pages (to 60), b 2 more (to 43): 7 > 5, neither gets any. */
    IKVT_EXPECT_STATUS(ikv_pool_reserve(pool, both, 2, 40), IKV_E_NOMEM, "capacity");
    const ikv_pool_stats after = ikvt_pool_stats(pool);
    assert_int_equal(after.pages_used, before.pages_used);
    assert_int_equal(after.used_bytes, before.used_bytes);
    assert_int_equal(after.staging_bytes, before.staging_bytes);
    IKVT_OK(ikv_pool_reserve(pool, both, 2, 12)); /* a to 32 (2 pages), b to 15 (1): fits */
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 3);
    ikv_pool_destroy(pool);
}

static void test_fork_and_shared_tail(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_FMT_INT8, 0);
    ikv_seq_id parent, child;
    IKVT_OK(ikv_seq_create(pool, &parent));
    ikvt_rng rng = {5};
    append_tokens(pool, parent, 20, &rng); /* pages 0 (full), 1 (partial) */
    IKVT_OK(ikv_seq_fork(pool, parent, &child));
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 2);
    /* The child's room: its shared partial tail is copied now, and one more page. */
    IKVT_OK(ikv_pool_reserve(pool, &child, 1, 20));
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 4);
    /* A fork of a sequence with room shares its tokens only. */
    ikv_seq_id grandchild;
    IKVT_OK(ikv_seq_fork(pool, child, &grandchild));
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 4);
    assert_same_tokens(pool, grandchild, pool, child);
    ikvt_rng r1 = {9}, r2 = {9};
    append_tokens(pool, child, 3, &r1); /* the tail it shares with grandchild is copied now */
    append_tokens(pool, grandchild, 3, &r2);
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 5);
    assert_same_tokens(pool, grandchild, pool, child);
    ikv_pool_destroy(pool);
}

/* A fork and its parent sharing a partial tail page, named together in one
 * ikv_pool_append_batch or one ikv_pool_reserve: the shared page is copied
 * once, not twice (the last of them keeps it, as two single calls would), so
 * at a capacity of exactly the pages two single calls end with, the one call
 * fits too; the batch stores what the two single appends store. */
static void fork_and_parent_in_one_call(ikv_backend backend, ikv_format fmt) {
    ikv_pool *probe = make_pool(fmt, 1u << 20);
    const uint64_t page = ikv_pool_page_bytes(probe, fmt);
    ikv_pool_destroy(probe);
    ikv_pool *pools[3];
    ikv_seq_id seqs[3][2];
    ikvt_rng rng = {91};
    const size_t count = (size_t)L * 2 * H * D; /* one token of every layer for each of two sequences */
    float *k = malloc(4 * count), *v = malloc(4 * count);
    ikvt_fill_normal(&rng, k, count, 1.0f);
    ikvt_fill_normal(&rng, v, count, 1.0f);
    for (int way = 0; way < 3; ++way) { /* two single appends, one batch append, one reserve then a batch */
        pools[way] = ikvt_make_pool((ikvt_pool_spec){.backend = backend, .n_layers = L, .n_kv_heads = H, .head_dim = D,
                                                     .page_size = P, .capacity_bytes = 2 * page,
                                                     .default_format = fmt, .kv_dtype = IKV_DTYPE_F32});
        ikvt_rng same = {5};
        IKVT_OK(ikv_seq_create(pools[way], &seqs[way][0]));
        append_tokens(pools[way], seqs[way][0], 3, &same);
        IKVT_OK(ikv_seq_fork(pools[way], seqs[way][0], &seqs[way][1]));
        ikv_append a = ikv_append_default(pools[way], 1);
        a.layer = IKV_ALL_LAYERS;
        a.layer_stride = (int64_t)2 * H * D; /* layer l of sequence i at l * 2HD + i * HD */
        a.seq_stride = (int64_t)H * D;
        a.k = k;
        a.v = v;
        if (way == 0) {
            for (int i = 0; i < 2; ++i) {
                a.k = k + (size_t)i * H * D;
                a.v = v + (size_t)i * H * D;
                IKVT_OK(ikv_pool_append(pools[way], seqs[way][i], &a));
            }
        } else {
            if (way == 2) IKVT_OK(ikv_pool_reserve(pools[way], seqs[way], 2, 1));
            /* a CUDA pool's room takes device input only: there the reserve alone is checked */
            if (way == 1 || backend == IKV_BACKEND_CPU) IKVT_OK(ikv_pool_append_batch(pools[way], seqs[way], 2, &a));
        }
        ikv_pool_stats st;
        st.struct_size = sizeof st;
        IKVT_OK(ikv_pool_get_stats(pools[way], &st));
        assert_int_equal(st.pages_used, 2);
    }
    for (int way = 1; way < (backend == IKV_BACKEND_CPU ? 3 : 2); ++way)
        for (int i = 0; i < 2; ++i) assert_same_tokens(pools[0], seqs[0][i], pools[way], seqs[way][i]);
    for (int way = 0; way < 3; ++way) ikv_pool_destroy(pools[way]);
    free(k), free(v);
}
static void test_fork_and_parent_in_one_call(void **state) {
    (void)state;
    ikv_runtime_info info;
    info.struct_size = sizeof info;
    IKVT_OK(ikv_runtime_info_get(&info));
    const int gpu = info.cuda_built && info.cuda_device_count > 0;
    for (int f = 0; f < 2; ++f) { /* INT8: the kept page's rows are re-encoded where a scale widens */
        const ikv_format fmt = f ? IKV_FMT_INT8 : IKV_FMT_F16;
        fork_and_parent_in_one_call(IKV_BACKEND_CPU, fmt);
        if (gpu) fork_and_parent_in_one_call(IKV_BACKEND_CUDA, fmt); /* host input */
    }
}

/* A page held by three sequences, two of them in one batch: both copy it
 * (the third still holds it), and the third's tokens are unchanged. */
static void test_shared_page_with_a_holder_outside_the_call(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_FMT_INT8, 1u << 20);
    ikvt_rng rng = {17};
    ikv_seq_id s[3];
    IKVT_OK(ikv_seq_create(pool, &s[0]));
    append_tokens(pool, s[0], 5, &rng);
    IKVT_OK(ikv_seq_fork(pool, s[0], &s[1]));
    IKVT_OK(ikv_seq_fork(pool, s[0], &s[2]));
    float before_k[(size_t)5 * H * D], before_v[(size_t)5 * H * D], k2[(size_t)5 * H * D], v2[(size_t)5 * H * D];
    IKVT_OK(ikv_seq_read(pool, s[2], 1, 0, 5, before_k, before_v));
    const size_t count = (size_t)L * 2 * H * D;
    float *k = malloc(4 * count), *v = malloc(4 * count);
    ikvt_fill_normal(&rng, k, count, 30.0f); /* larger than the stored rows: the scales widen */
    ikvt_fill_normal(&rng, v, count, 30.0f);
    ikv_append a = ikv_append_default(pool, 1);
    a.layer = IKV_ALL_LAYERS;
    a.layer_stride = (int64_t)2 * H * D;
    a.seq_stride = (int64_t)H * D;
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append_batch(pool, s, 2, &a));
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 3);
    IKVT_OK(ikv_seq_read(pool, s[2], 1, 0, 5, k2, v2));
    assert_memory_equal(before_k, k2, sizeof k2);
    assert_memory_equal(before_v, v2, sizeof v2);
    ikv_pool_destroy(pool);
    free(k), free(v);
}

/* A CPU pool keeps no record of a room beyond its pages: a truncate releases
 * the pages past the new length, the room's too, and appends after it
 * allocate again (the header's rule). */
static void test_truncate_releases_the_room(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_FMT_F16, 16u << 20);
    ikvt_rng rng = {77};
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    append_tokens(pool, s, 10, &rng);
    IKVT_OK(ikv_pool_reserve(pool, &s, 1, 40)); /* positions up to 50: pages 0-3 */
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 4);
    IKVT_OK(ikv_seq_truncate(pool, s, 5));
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 1);
    append_tokens(pool, s, 30, &rng); /* length 35: pages 0-2, allocated by the appends */
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 3);
    /* A rollback of nothing releases the room too (every page past the length) and changes no token. */
    IKVT_OK(ikv_pool_reserve(pool, &s, 1, 40)); /* positions up to 75: pages 0-4 */
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 5);
    float before[2 * 35 * H * D], after[2 * 35 * H * D];
    IKVT_OK(ikv_seq_read(pool, s, 0, 0, 35, before, before + 35 * H * D));
    IKVT_OK(ikv_seq_truncate(pool, s, 0));
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 3);
    uint32_t len = 0;
    IKVT_OK(ikv_seq_length(pool, s, &len));
    assert_int_equal(len, 35);
    IKVT_OK(ikv_seq_read(pool, s, 0, 0, 35, after, after + 35 * H * D));
    assert_memory_equal(before, after, sizeof before);
    ikv_pool_destroy(pool);
}

static void test_bad_arguments(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_FMT_F16, 0);
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    const ikv_seq_id twice[2] = {s, s}, missing = s + 100;
    IKVT_EXPECT_STATUS(ikv_pool_reserve(NULL, &s, 1, 4), IKV_E_NULL, "pool");
    IKVT_EXPECT_STATUS(ikv_pool_reserve(pool, NULL, 1, 4), IKV_E_NULL, "seqs");
    IKVT_EXPECT_STATUS(ikv_pool_reserve(pool, &s, 0, 4), IKV_E_INVALID, "n_seqs");
    IKVT_EXPECT_STATUS(ikv_pool_reserve(pool, twice, 2, 4), IKV_E_INVALID, "twice");
    IKVT_EXPECT_STATUS(ikv_pool_reserve(pool, &missing, 1, 4), IKV_E_NOT_FOUND, "does not exist");
    IKVT_EXPECT_STATUS(ikv_pool_reserve(pool, &s, 1, UINT32_MAX), IKV_E_NOMEM, NULL); /* far beyond capacity */
    assert_int_equal(ikvt_pool_stats(pool).pages_used, 0);
    ikvt_rng rng = {1};
    append_tokens(pool, s, 1, &rng);
    IKVT_EXPECT_STATUS(ikv_pool_reserve(pool, &s, 1, UINT32_MAX), IKV_E_RANGE, "2^32-1");
    ikv_pool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_room_is_allocated_ahead_and_stores_the_same),
        cmocka_unit_test(test_room_ends_and_shrinks),
        cmocka_unit_test(test_room_that_does_not_fit_changes_nothing),
        cmocka_unit_test(test_fork_and_shared_tail),
        cmocka_unit_test(test_fork_and_parent_in_one_call),
        cmocka_unit_test(test_shared_page_with_a_holder_outside_the_call),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_truncate_releases_the_room),
    };
    return cmocka_run_group_tests_name("pool_reserve", tests, NULL, NULL);
}
