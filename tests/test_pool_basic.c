/* KV page pool: creation and config validation, sequences, append in every
 * input dtype and stride layout, read-back, partial pages, summaries. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static ikv_pool_config small_config(void) {
    return ikvt_pool_config(
        (ikvt_pool_spec){.n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .page_size = 8, .capacity_bytes = 64u << 20});
}

static ikv_pool *make_pool(ikv_pool_config c) {
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create(&c, &pool));
    assert_non_null(pool);
    return pool;
}

static void test_default_config(void **state) {
    (void)state;
    ikv_pool_config c = ikv_pool_default_config();
    assert_int_equal(c.struct_size, sizeof c);
    assert_int_equal(c.backend, IKV_BACKEND_CPU);
    assert_int_equal(c.page_size, 16);
    assert_int_equal(c.head_dim, 128);
    assert_true(c.capacity_bytes == (1ull << 30));
    assert_int_equal(c.default_format, IKV_FMT_F16);
    assert_int_equal(c.kv_dtype, IKV_DTYPE_F16);
    ikv_pool *pool = make_pool(small_config());
    ikv_pool_config got;
    memset(&got, 0, sizeof got);
    IKVT_EXPECT_STATUS(ikv_pool_get_config(pool, &got), IKV_E_INVALID, "struct_size");
    assert_int_equal(got.n_layers, 0); /* unchanged */
    got.struct_size = sizeof got;
    IKVT_OK(ikv_pool_get_config(pool, &got));
    assert_int_equal(got.n_layers, 2);
    assert_int_equal(got.page_size, 8);
    IKVT_EXPECT_STATUS(ikv_pool_get_config(NULL, &got), IKV_E_NULL, "ikv_pool_get_config");
    IKVT_EXPECT_STATUS(ikv_pool_get_config(pool, NULL), IKV_E_NULL, "out");
    ikv_pool_destroy(pool);
    ikv_pool_destroy(NULL);
}

typedef struct bad_case {
    const char *field;
    ikv_status status;
} bad_case;

static void test_create_rejects_bad_config(void **state) {
    (void)state;
    ikv_pool *pool = (ikv_pool *)0x1;
    IKVT_EXPECT_STATUS(ikv_pool_create(NULL, &pool), IKV_E_NULL, "config");
    ikv_pool_config c = small_config();
    IKVT_EXPECT_STATUS(ikv_pool_create(&c, NULL), IKV_E_NULL, "out");
    for (int i = 0; i < 14; ++i) {
        c = small_config();
        const char *needle = NULL;
        switch (i) {
            case 0: c.head_dim = 48; needle = "head_dim"; break;
            case 1: c.head_dim = 0; needle = "head_dim"; break;
            case 2: c.head_dim = 129; needle = "head_dim"; break;
            case 3: c.page_size = 4; needle = "page_size"; break;
            case 4: c.page_size = 256; needle = "page_size"; break;
            case 5: c.page_size = 24; needle = "page_size"; break;
            case 6: c.n_layers = 0; needle = "n_layers"; break;
            case 7: c.n_kv_heads = 0; needle = "n_kv_heads"; break;
            case 8: c.capacity_bytes = 0; needle = "capacity_bytes"; break;
            case 9: c.default_format = (ikv_format)7; needle = "default_format"; break;
            case 10: c.kv_dtype = (ikv_dtype)3; needle = "kv_dtype"; break;
            case 11: c.backend = (ikv_backend)5; needle = "backend"; break;
            case 12: c.struct_size = 4; needle = "struct_size"; break;
            case 13: c.default_format = (ikv_format)-1; needle = "default_format"; break;
        }
        pool = (ikv_pool *)0x1;
        IKVT_EXPECT_STATUS(ikv_pool_create(&c, &pool), i == 12 ? IKV_E_INVALID : IKV_E_INVALID, needle);
        assert_ptr_equal(pool, (ikv_pool *)0x1); /* untouched */
    }
    /* Every supported head_dim and page size is accepted. */
    const uint32_t dims[] = {32, 64, 80, 96, 128, 256};
    for (int i = 0; i < 6; ++i)
        for (uint32_t p = 8; p <= 128; p *= 2) {
            c = small_config();
            c.head_dim = dims[i];
            c.page_size = p;
            pool = make_pool(c);
            assert_true(ikv_pool_page_bytes(pool, IKV_FMT_INT4) < ikv_pool_page_bytes(pool, IKV_FMT_F16));
            ikv_pool_destroy(pool);
        }
    /* AUTO default format is accepted (new pages without a plan are F16). */
    c = small_config();
    c.default_format = IKV_FMT_AUTO;
    pool = make_pool(c);
    ikv_pool_destroy(pool);
}

static void test_cuda_backend(void **state) {
    (void)state;
    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    IKVT_OK(ikv_runtime_info_get(&info));
    ikv_pool_config c = small_config();
    c.backend = IKV_BACKEND_CUDA;
    ikv_pool *pool = NULL;
    ikv_status st = ikv_pool_create(&c, &pool);
    if (!info.cuda_built || info.cuda_device_count == 0) {
        IKVT_EXPECT_STATUS(st, IKV_E_NO_DEVICE, "CUDA");
        assert_null(pool);
    } else {
        assert_int_equal(st, IKV_OK);
        ikv_pool_destroy(pool);
    }
}

static void test_page_bytes(void **state) {
    (void)state;
    ikv_pool_config c = small_config();
    c.head_dim = 128;
    c.page_size = 16;
    ikv_pool *pool = make_pool(c);
    const uint64_t LH = 4, D = 128, P = 16, summary = 3 * 2 * D; /* bf16 k_min, k_max, k_mean */
    /* F16: K and V rows of 2 bytes per channel. */
    assert_true(ikv_pool_page_bytes(pool, IKV_FMT_F16) == LH * (2 * P * D * 2 + summary));
    assert_true(ikv_pool_page_bytes(pool, IKV_FMT_BF16) == LH * (2 * P * D * 2 + summary));
    assert_true(ikv_pool_page_bytes(pool, IKV_FMT_FP8_E4M3) == LH * (2 * P * D + 16 + summary));
    assert_true(ikv_pool_page_bytes(pool, IKV_FMT_INT8) == LH * (2 * P * D + 4 * D + 4 * P + summary));
    assert_true(ikv_pool_page_bytes(pool, IKV_FMT_INT4) ==
                LH * (2 * P * D / 2 + 4 * D + 2 * 2 * P * 4 + summary)); /* half scales and minimums */
    assert_true(ikv_pool_page_bytes(pool, (ikv_format)9) == 0);
    assert_true(ikv_pool_page_bytes(pool, IKV_FMT_AUTO) == 0);
    assert_true(ikv_pool_page_bytes(NULL, IKV_FMT_F16) == 0);
    ikv_pool_destroy(pool);
}

static void test_sequences(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(small_config());
    ikv_seq_id a = 0, b = 0;
    IKVT_OK(ikv_seq_create(pool, &a));
    IKVT_OK(ikv_seq_create(pool, &b));
    assert_int_not_equal(a, b);
    uint32_t len = 99;
    IKVT_OK(ikv_seq_length(pool, a, &len));
    assert_int_equal(len, 0);
    ikv_pool_stats s = ikvt_pool_stats(pool);
    assert_int_equal(s.n_sequences, 2);
    assert_true(s.used_bytes == 0 && s.pages_used == 0 && s.tokens_total == 0);
    IKVT_EXPECT_STATUS(ikv_seq_create(NULL, &a), IKV_E_NULL, "pool");
    IKVT_EXPECT_STATUS(ikv_seq_create(pool, NULL), IKV_E_NULL, "id_out");
    IKVT_EXPECT_STATUS(ikv_seq_length(pool, 12345, &len), IKV_E_NOT_FOUND, "12345");
    IKVT_EXPECT_STATUS(ikv_seq_length(pool, a, NULL), IKV_E_NULL, "length_out");
    IKVT_OK(ikv_seq_layer_length(pool, a, 1, &len));
    assert_int_equal(len, 0);
    IKVT_EXPECT_STATUS(ikv_seq_layer_length(pool, 12345, 0, &len), IKV_E_NOT_FOUND, "12345");
    IKVT_EXPECT_STATUS(ikv_seq_layer_length(pool, a, 2, &len), IKV_E_RANGE, "layer 2");
    IKVT_EXPECT_STATUS(ikv_seq_layer_length(pool, a, 0, NULL), IKV_E_NULL, "length_out");
    IKVT_EXPECT_STATUS(ikv_seq_layer_length(NULL, a, 0, &len), IKV_E_NULL, "pool");
    IKVT_OK(ikv_seq_destroy(pool, a));
    IKVT_EXPECT_STATUS(ikv_seq_destroy(pool, a), IKV_E_NOT_FOUND, "ikv_seq_destroy");
    IKVT_EXPECT_STATUS(ikv_seq_destroy(NULL, b), IKV_E_NULL, "pool");
    assert_int_equal(ikvt_pool_stats(pool).n_sequences, 1);
    ikv_pool_stats bad;
    memset(&bad, 0, sizeof bad);
    bad.struct_size = 8;
    IKVT_EXPECT_STATUS(ikv_pool_get_stats(pool, &bad), IKV_E_INVALID, "struct_size");
    assert_true(bad.used_bytes == 0 && bad.n_sequences == 0);
    IKVT_EXPECT_STATUS(ikv_pool_get_stats(NULL, &bad), IKV_E_NULL, "pool");
    ikv_pool_destroy(pool); /* frees b too */
}

/* Append n tokens of random data to every layer (F32 input, default strides). */
static void fill(ikvt_rng *r, float *x, size_t n) { ikvt_fill_normal(r, x, n, 1.0f); }

static void test_append_read_f16_exact(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(small_config());
    const uint32_t L = 2, H = 2, D = 64, n = 21; /* 2 full pages + a partial one */
    const size_t per_layer = (size_t)n * H * D;
    float *k = malloc(L * per_layer * sizeof(float)), *v = malloc(L * per_layer * sizeof(float));
    float *rk = malloc(per_layer * sizeof(float)), *rv = malloc(per_layer * sizeof(float));
    uint16_t *h = malloc(L * per_layer * sizeof(uint16_t));
    ikvt_rng r = {7};
    fill(&r, k, L * per_layer);
    fill(&r, v, L * per_layer);
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    ikv_append a = ikv_append_default(pool, n);
    a.layer = IKV_ALL_LAYERS;
    a.k = k;
    a.v = v;
    IKVT_OK(ikv_pool_append(pool, s, &a));
    uint32_t len;
    IKVT_OK(ikv_seq_length(pool, s, &len));
    assert_int_equal(len, n);
    for (uint32_t l = 0; l < L; ++l) {
        IKVT_OK(ikv_seq_read(pool, s, l, 0, n, rk, rv));
        ikvt_to_f16(k + l * per_layer, h, per_layer);
        for (size_t i = 0; i < per_layer; ++i) assert_true(rk[i] == ikvt_f16_to_f32(h[i]));
        ikvt_to_f16(v + l * per_layer, h, per_layer);
        for (size_t i = 0; i < per_layer; ++i) assert_true(rv[i] == ikvt_f16_to_f32(h[i]));
    }
    ikv_pool_stats st = ikvt_pool_stats(pool);
    assert_int_equal(st.pages_used, 3);
    assert_true(st.pages_by_format[IKV_FMT_F16] == 3);
    assert_true(st.used_bytes == 3 * ikv_pool_page_bytes(pool, IKV_FMT_F16));
    assert_true(st.bytes_by_format[IKV_FMT_F16] == st.used_bytes);
    assert_true(st.reserved_bytes >= st.used_bytes);
    assert_true(st.tokens_total == n);
    assert_true(st.staging_bytes == L * 2ull * H * 8 * D * sizeof(float)); /* tail page of 5 tokens, per layer */
    /* A sub-range straddling pages. */
    IKVT_OK(ikv_seq_read(pool, s, 1, 6, 17, rk, rv));
    ikvt_to_f16(k + per_layer + 6 * H * D, h, 11 * H * D);
    for (size_t i = 0; i < 11 * H * D; ++i) assert_true(rk[i] == ikvt_f16_to_f32(h[i]));
    IKVT_OK(ikv_seq_read(pool, s, 1, 4, 4, rk, rv)); /* empty range */
    IKVT_OK(ikv_seq_destroy(pool, s));
    st = ikvt_pool_stats(pool);
    assert_true(st.pages_used == 0 && st.used_bytes == 0 && st.staging_bytes == 0 && st.tokens_total == 0);
    free(k);
    free(v);
    free(rk);
    free(rv);
    free(h);
    ikv_pool_destroy(pool);
}

/* Token-by-token appends store exactly what one bulk append stores. */
static void test_token_by_token_equals_bulk(void **state) {
    (void)state;
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        ikv_pool_config c = small_config();
        c.default_format = (ikv_format)f;
        ikv_pool *pool = make_pool(c);
        const uint32_t H = 2, D = 64, n = 19;
        const size_t row = (size_t)H * D;
        float *k = malloc(n * row * sizeof(float)), *v = malloc(n * row * sizeof(float));
        float *k1 = malloc(n * row * sizeof(float)), *v1 = malloc(n * row * sizeof(float));
        float *k2 = malloc(n * row * sizeof(float)), *v2 = malloc(n * row * sizeof(float));
        ikvt_rng r = {100 + f};
        fill(&r, k, n * row);
        fill(&r, v, n * row);
        k[3 * row + 5] = 40.0f; /* an outlier late in the page widens its scales */
        ikv_seq_id bulk, step;
        IKVT_OK(ikv_seq_create(pool, &bulk));
        IKVT_OK(ikv_seq_create(pool, &step));
        for (uint32_t l = 0; l < 2; ++l) {
            ikv_append a = ikv_append_default(pool, n);
            a.layer = l;
            a.k = k;
            a.v = v;
            IKVT_OK(ikv_pool_append(pool, bulk, &a));
            /* per-layer lengths: layer 0 has the tokens before layer 1 does; the sequence's length follows the last */
            uint32_t l0 = 0, l1 = 0, len = 0;
            IKVT_OK(ikv_seq_layer_length(pool, bulk, 0, &l0));
            IKVT_OK(ikv_seq_layer_length(pool, bulk, 1, &l1));
            IKVT_OK(ikv_seq_length(pool, bulk, &len));
            assert_int_equal(l0, n);
            assert_int_equal(l1, l == 1 ? n : 0);
            assert_int_equal(len, l == 1 ? n : 0);
            for (uint32_t t = 0; t < n; ++t) {
                ikv_append b = ikv_append_default(pool, 1);
                b.layer = l;
                b.k = k + t * row;
                b.v = v + t * row;
                IKVT_OK(ikv_pool_append(pool, step, &b));
            }
        }
        for (uint32_t l = 0; l < 2; ++l) {
            IKVT_OK(ikv_seq_read(pool, bulk, l, 0, n, k1, v1));
            IKVT_OK(ikv_seq_read(pool, step, l, 0, n, k2, v2));
            assert_memory_equal(k1, k2, n * row * sizeof(float));
            assert_memory_equal(v1, v2, n * row * sizeof(float));
            for (uint32_t p = 0; p < 3; ++p) {
                float a1[64], a2[64], b1[64], b2[64], m1[64], m2[64];
                uint32_t n1, n2;
                IKVT_OK(ikv_seq_page_summary(pool, bulk, l, 1, p, a1, b1, m1, &n1));
                IKVT_OK(ikv_seq_page_summary(pool, step, l, 1, p, a2, b2, m2, &n2));
                assert_int_equal(n1, n2);
                assert_int_equal(n1, p < 2 ? 8 : 3);
                assert_memory_equal(a1, a2, sizeof a1);
                assert_memory_equal(b1, b2, sizeof b1);
                assert_memory_equal(m1, m2, sizeof m1);
            }
        }
        free(k);
        free(v);
        free(k1);
        free(v1);
        free(k2);
        free(v2);
        ikv_pool_destroy(pool);
    }
}

/* F16 and BF16 input, and a head-major [layer][head][token][d] layout via strides. */
static void test_dtypes_and_strides(void **state) {
    (void)state;
    const ikv_dtype dts[] = {IKV_DTYPE_F32, IKV_DTYPE_F16, IKV_DTYPE_BF16};
    for (int di = 0; di < 3; ++di) {
        ikv_pool_config c = small_config();
        c.kv_dtype = dts[di];
        c.default_format = IKV_FMT_BF16; /* lossless for every input dtype except F32 */
        ikv_pool *pool = make_pool(c);
        const uint32_t L = 2, H = 2, D = 64, n = 11;
        const size_t total = (size_t)L * H * n * D;
        float *x = malloc(total * sizeof(float));
        float *want = malloc(total * sizeof(float));
        uint16_t *h16 = malloc(total * sizeof(uint16_t));
        ikvt_rng r = {55 + di};
        fill(&r, x, total);
        /* what each source element is as fp32 after the engine's own dtype */
        if (dts[di] == IKV_DTYPE_F16) {
            ikvt_to_f16(x, h16, total);
            for (size_t i = 0; i < total; ++i) want[i] = ikvt_f16_to_f32(h16[i]);
        } else if (dts[di] == IKV_DTYPE_BF16) {
            ikvt_to_bf16(x, h16, total);
            for (size_t i = 0; i < total; ++i) want[i] = ikvt_bf16_to_f32(h16[i]);
        } else {
            memcpy(want, x, total * sizeof(float));
        }
        const void *src = dts[di] == IKV_DTYPE_F32 ? (const void *)x : (const void *)h16;
        ikv_seq_id s;
        IKVT_OK(ikv_seq_create(pool, &s));
        ikv_append a = ikv_append_default(pool, n);
        a.layer = IKV_ALL_LAYERS;
        a.k = src;
        a.v = src;
        a.head_stride = (int64_t)n * D;
        a.token_stride = D;
        a.layer_stride = (int64_t)H * n * D;
        IKVT_OK(ikv_pool_append(pool, s, &a));
        float *rk = malloc((size_t)n * H * D * sizeof(float)), *rv = malloc((size_t)n * H * D * sizeof(float));
        uint16_t bf;
        for (uint32_t l = 0; l < L; ++l) {
            IKVT_OK(ikv_seq_read(pool, s, l, 0, n, rk, rv));
            for (uint32_t t = 0; t < n; ++t)
                for (uint32_t hh = 0; hh < H; ++hh)
                    for (uint32_t d = 0; d < D; ++d) {
                        const float w = want[((size_t)(l * H + hh) * n + t) * D + d];
                        ikvt_to_bf16(&w, &bf, 1);
                        const size_t o = ((size_t)t * H + hh) * D + d;
                        assert_true(rk[o] == ikvt_bf16_to_f32(bf));
                        assert_true(rv[o] == rk[o]);
                    }
        }
        free(rk);
        free(rv);
        free(x);
        free(want);
        free(h16);
        ikv_pool_destroy(pool);
    }
}

/* New pages take the plan's format; pages beyond the plan take default_format. */
static void test_append_with_plan(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(small_config());
    const uint32_t n = 48, row = 2 * 64;
    float *k = calloc((size_t)n * row, sizeof(float)), *v = calloc((size_t)n * row, sizeof(float));
    ikvt_rng r = {3};
    fill(&r, k, (size_t)n * row);
    fill(&r, v, (size_t)n * row);
    ikv_token_range range = {0, 40};
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_plan_from_ranges(&range, 1, 40, 8, IKV_FMT_INT8, &plan));
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(pool, &s));
    for (uint32_t l = 0; l < 2; ++l) {
        ikv_append a = ikv_append_default(pool, n);
        a.layer = l;
        a.k = k;
        a.v = v;
        a.formats = plan;
        IKVT_OK(ikv_pool_append(pool, s, &a));
    }
    for (uint32_t p = 0; p < 6; ++p) {
        ikv_format f;
        IKVT_OK(ikv_seq_page_format(pool, s, p, &f));
        assert_int_equal(f, p < 5 ? IKV_FMT_INT8 : IKV_FMT_F16);
    }
    ikv_pool_stats st = ikvt_pool_stats(pool);
    assert_true(st.pages_by_format[IKV_FMT_INT8] == 5 && st.pages_by_format[IKV_FMT_F16] == 1);
    assert_true(st.used_bytes == 5 * ikv_pool_page_bytes(pool, IKV_FMT_INT8) + ikv_pool_page_bytes(pool, IKV_FMT_F16));
    /* apply_plan_formats re-stores full pages in the plan's format */
    ikv_plan *plan4 = NULL;
    IKVT_OK(ikv_plan_from_ranges(&range, 1, 40, 8, IKV_FMT_INT4, &plan4));
    IKVT_OK(ikv_seq_apply_plan_formats(pool, s, plan4));
    st = ikvt_pool_stats(pool);
    assert_true(st.pages_by_format[IKV_FMT_INT4] == 5 && st.pages_by_format[IKV_FMT_F16] == 1);
    ikv_plan_destroy(plan);
    ikv_plan_destroy(plan4);
    free(k);
    free(v);
    ikv_pool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_config),      cmocka_unit_test(test_create_rejects_bad_config),
        cmocka_unit_test(test_cuda_backend),        cmocka_unit_test(test_page_bytes),
        cmocka_unit_test(test_sequences),           cmocka_unit_test(test_append_read_f16_exact),
        cmocka_unit_test(test_token_by_token_equals_bulk), cmocka_unit_test(test_dtypes_and_strides),
        cmocka_unit_test(test_append_with_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
