/* Version, status names, error sentence, log callback, runtime info. */
#define _DEFAULT_SOURCE /* alarm */
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "support.h"

/* A program built against the first header: its ikv_decode_args ends at
 * `stream`, and ikv_decode_args_default was a function returning that struct.
 * The library still exports that symbol for it. */
typedef struct first_decode_args {
    uint32_t struct_size, layer, n_seqs;
    const ikv_seq_id *seqs;
    const ikv_plan *const *plans;
    uint32_t n_query_tokens, n_q_heads;
    const void *q;
    ikv_dtype q_dtype;
    void *out;
    ikv_dtype out_dtype;
    float *lse;
    float scale, softcap;
    uint32_t topk_token_budget;
    void *stream;
} first_decode_args;
#undef ikv_decode_args_default
first_decode_args ikv_decode_args_default(void);

/* The second header's ikv_decode_args (before `append`) and its default. */
typedef struct second_decode_args {
    unsigned char bytes[offsetof(ikv_decode_args, append)];
} second_decode_args;
second_decode_args ikv_decode_args_default_v2(void);

/* The first header's ikv_pool_config (through kv_dtype) and its unversioned default. */
typedef struct first_pool_config {
    uint32_t struct_size;
    ikv_backend backend;
    int device;
    uint32_t n_layers, n_kv_heads, head_dim, page_size;
    uint64_t capacity_bytes;
    ikv_format default_format;
    ikv_dtype kv_dtype;
} first_pool_config;
#undef ikv_pool_default_config
first_pool_config ikv_pool_default_config(void);

/* The first header's ikv_query_memory_config (through decay) and its unversioned default. */
typedef struct first_query_memory_config {
    uint32_t struct_size;
    uint32_t n_q_heads;
    float decay;
} first_query_memory_config;
#undef ikv_query_memory_default_config
first_query_memory_config ikv_query_memory_default_config(void);

/* The first header's ikv_append (through `formats`) and its unversioned default. */
typedef struct first_append {
    uint32_t struct_size, layer, n_tokens;
    const void *k, *v;
    int64_t token_stride, head_stride, layer_stride;
    int src_on_device;
    void *stream;
    const ikv_plan *formats;
} first_append;
#undef ikv_append_default
first_append ikv_append_default(const ikv_pool *pool, uint32_t n_tokens);

static void test_version(void **state) {
    (void)state;
    assert_int_equal(ikv_version(), IKV_VERSION_NUMBER);
    assert_string_equal(ikv_version_string(), "0.1.0");
}

static void test_status_names(void **state) {
    (void)state;
    assert_string_equal(ikv_status_name(IKV_OK), "IKV_OK");
    assert_string_equal(ikv_status_name(IKV_E_RANGE), "IKV_E_RANGE");
    assert_string_equal(ikv_status_name(IKV_E_INTERNAL), "IKV_E_INTERNAL");
    assert_string_equal(ikv_status_name((ikv_status)-99), "IKV_UNKNOWN_STATUS");
    assert_string_equal(ikv_status_name((ikv_status)5), "IKV_UNKNOWN_STATUS");
    assert_string_equal(ikv_status_name((ikv_status)INT_MIN), "IKV_UNKNOWN_STATUS"); /* UBSan: no overflow */
    assert_string_equal(ikv_format_name(IKV_FMT_INT4), "int4");
    assert_string_equal(ikv_format_name(IKV_FMT_AUTO), "auto");
    assert_string_equal(ikv_format_name((ikv_format)17), "?");
    assert_string_equal(ikv_policy_name(IKV_POLICY_RECENT), "RECENT");
    assert_string_equal(ikv_block_kind_name(IKV_KIND_TOOL_OUTPUT), "tool_output");
    assert_string_equal(ikv_reason_name(IKV_REASON_BUDGET_EXHAUSTED), "budget_exhausted");
    assert_string_equal(ikv_reason_name((ikv_reason)IKV_REASON_COUNT), "?");
}

typedef struct captured {
    int calls;
    ikv_log_level level;
    char text[512];
} captured;

static void capture(ikv_log_level level, const char *msg, void *user) {
    captured *c = (captured *)user;
    c->calls++;
    c->level = level;
    strncpy(c->text, msg, sizeof c->text - 1);
}

static void test_errors_and_log(void **state) {
    (void)state;
    captured c;
    memset(&c, 0, sizeof c);
    ikv_set_log_callback(capture, &c, IKV_LOG_DEBUG);
    IKVT_EXPECT_STATUS(ikv_runtime_info_get(NULL), IKV_E_NULL, "ikv_runtime_info_get");
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.level, IKV_LOG_ERROR);
    assert_string_equal(c.text, ikv_last_error());
    ikv_set_log_callback(NULL, NULL, IKV_LOG_DEBUG);
    IKVT_EXPECT_STATUS(ikv_runtime_info_get(NULL), IKV_E_NULL, NULL);
    assert_int_equal(c.calls, 1); /* removed sink is not called */

    ikv_runtime_info small;
    memset(&small, 0, sizeof small);
    small.struct_size = 4;
    IKVT_EXPECT_STATUS(ikv_runtime_info_get(&small), IKV_E_INVALID, "struct_size");
    assert_int_equal(small.version, 0); /* unchanged */
}

/* A failing call sends exactly one sentence to the sink, the one
 * ikv_last_error() then holds: also where the error is found below the API
 * (a decode of a sequence the pool does not hold, with and without an
 * append; it once sent the pool's own sentence first). */
static void test_one_sentence_per_failure(void **state) {
    (void)state;
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.backend = IKV_BACKEND_CPU, .n_layers = 1, .n_kv_heads = 1,
                                                     .head_dim = 32, .page_size = 16, .default_format = IKV_FMT_F16,
                                                     .kv_dtype = IKV_DTYPE_F32});
    ikv_seq_id s = 0;
    IKVT_OK(ikv_seq_create(pool, &s));
    float kv[32] = {0}, q[32] = {0}, out[32];
    ikv_append ap = ikv_append_default_v2(pool, 1);
    ap.k = kv;
    ap.v = kv;
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    const ikv_seq_id missing = s + 999;
    ikv_decode_args d = ikv_decode_args_default_v3();
    d.n_seqs = 1;
    d.seqs = &missing;
    d.n_q_heads = 1;
    d.q = q;
    d.out = out;
    for (int with_append = 0; with_append < 2; ++with_append) {
        d.append = with_append ? &ap : NULL;
        captured c;
        memset(&c, 0, sizeof c);
        ikv_set_log_callback(capture, &c, IKV_LOG_DEBUG);
        const ikv_status st = ikv_decode(dec, pool, &d);
        ikv_set_log_callback(NULL, NULL, IKV_LOG_DEBUG);
        assert_int_equal(st, IKV_E_NOT_FOUND);
        assert_int_equal(c.calls, 1);
        assert_int_equal(c.level, IKV_LOG_ERROR);
        assert_string_equal(c.text, ikv_last_error());
        assert_non_null(strstr(c.text, "args->seqs[0]"));
    }
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(pool);
}

/* A sink may call ikv_set_log_callback and ikv_last_error (the header's
 * exceptions): no deadlock (alarm: a deadlock fails the test instead of
 * hanging it), the sentence is both the message and ikv_last_error() inside
 * the sink, and the caller reads its own call's sentence after. */
static int g_sink_calls, g_sink_checks; /* checked after the call: no assert may jump out of a sink */
static void reentrant_sink(ikv_log_level level, const char *msg, void *user) {
    (void)level, (void)user;
    ++g_sink_calls;
    g_sink_checks += strstr(msg, "ikv_runtime_info_get") != NULL && strcmp(msg, ikv_last_error()) == 0;
    ikv_set_log_callback(reentrant_sink, NULL, IKV_LOG_DEBUG);
}
static void test_log_sink_calls_the_library(void **state) {
    (void)state;
    alarm(20);
    g_sink_calls = g_sink_checks = 0;
    ikv_set_log_callback(reentrant_sink, NULL, IKV_LOG_DEBUG);
    const ikv_status first = ikv_runtime_info_get(NULL);
    const int first_named = strstr(ikv_last_error(), "ikv_runtime_info_get") != NULL;
    const ikv_status second = ikv_runtime_info_get(NULL);
    ikv_set_log_callback(NULL, NULL, IKV_LOG_DEBUG);
    alarm(0);
    assert_int_equal(first, IKV_E_NULL);
    assert_true(first_named);
    assert_int_equal(second, IKV_E_NULL);
    assert_int_equal(g_sink_calls, 2); /* still installed after the first (it re-installed itself) */
    assert_int_equal(g_sink_checks, 2);
}

/* An out-of-range score is named with the digits that tell it from the bound. */
static void test_error_sentence_digits(void **state) {
    (void)state;
    ikv_layout *l = NULL;
    IKVT_OK(ikv_layout_create(&l));
    ikv_block_desc d = ikv_block_desc_default();
    d.name = "doc";
    d.start = 0;
    d.end = 8;
    d.score = 1.0000001f;
    IKVT_EXPECT_STATUS(ikv_layout_add(l, &d, NULL), IKV_E_INVALID, "1.00000012");
    ikv_layout_destroy(l);
}

/* Every failed ikv_decode forgets the last selection, the earliest refusals
 * too (a NULL pool or args, a struct_size too small). */
static void test_last_selection_after_refusals(void **state) {
    (void)state;
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.backend = IKV_BACKEND_CPU, .n_layers = 1, .n_kv_heads = 1,
                                                     .head_dim = 32, .page_size = 16, .default_format = IKV_FMT_F16,
                                                     .kv_dtype = IKV_DTYPE_F16});
    ikv_seq_id s = 0;
    IKVT_OK(ikv_seq_create(pool, &s));
    uint16_t kv[20 * 32] = {0};
    ikv_append a = ikv_append_default_v2(pool, 20); /* the macro is #undef-ed above */
    a.k = kv;
    a.v = kv;
    IKVT_OK(ikv_pool_append(pool, s, &a));
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    float q[32] = {0}, out[32];
    ikv_decode_args d = ikv_decode_args_default_v3();
    d.n_seqs = 1;
    d.seqs = &s;
    d.n_q_heads = 1;
    d.q = q;
    d.out = out;
    ikv_token_range r[4];
    size_t n = 0;
    for (int refusal = 0; refusal < 3; ++refusal) {
        IKVT_OK(ikv_decode(dec, pool, &d));
        IKVT_OK(ikv_decoder_last_selection(dec, 0, 0, r, 4, &n));
        assert_int_equal(n, 1);
        ikv_decode_args small = d;
        small.struct_size = 4;
        const ikv_status st = refusal == 0   ? ikv_decode(dec, NULL, &d)
                              : refusal == 1 ? ikv_decode(dec, pool, NULL)
                                             : ikv_decode(dec, pool, &small);
        assert_int_equal(st, refusal == 2 ? IKV_E_INVALID : IKV_E_NULL);
        IKVT_EXPECT_STATUS(ikv_decoder_last_selection(dec, 0, 0, r, 4, &n), IKV_E_STATE, "failed call");
    }
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(pool);
}

/* The first header's default writes exactly its struct (under ASan an extra
 * byte would be a stack-buffer-overflow) and a decode with it reads only those
 * fields, every later one at its default. */
static void test_first_header_decode_args(void **state) {
    (void)state;
    first_decode_args a = ikv_decode_args_default();
    assert_int_equal(a.struct_size, sizeof(first_decode_args));
    assert_int_equal(a.n_seqs, 1);
    assert_int_equal(a.n_query_tokens, 1);
    assert_int_equal(a.topk_token_budget, 0);
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = 1, .n_kv_heads = 1, .head_dim = 64, .page_size = 16,
                                                     .capacity_bytes = 4u << 20});
    ikv_seq_id seq;
    IKVT_OK(ikv_seq_create(pool, &seq));
    float kv[40 * 64], q[2 * 64], out[2 * 64];
    ikvt_rng rng = {77};
    ikvt_fill_normal(&rng, kv, 40 * 64, 1.0f);
    ikvt_fill_normal(&rng, q, 2 * 64, 1.0f);
    ikv_append ap = ikv_append_default_v2(pool, 40);
    ap.k = kv;
    ap.v = kv;
    IKVT_OK(ikv_pool_append(pool, seq, &ap));
    ikv_decoder *dec = NULL;
    ikv_decoder_config dc = ikv_decoder_default_config();
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    a.seqs = &seq;
    a.n_q_heads = 2;
    a.q = q;
    a.out = out;
    a.topk_token_budget = 16;
    IKVT_OK(ikv_decode(dec, pool, (const ikv_decode_args *)(const void *)&a));
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(pool);
}

/* The first header's ikv_append default writes exactly its struct (80 bytes
 * on 64-bit; today's is 96: a larger write overran old callers' stacks) with
 * today's defaults, and an append with it reads only those fields (seq_stride
 * and flags at their defaults) and stores what today's struct stores. */
static void test_first_header_append(void **state) {
    (void)state;
    ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){.n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .page_size = 16,
                                                     .capacity_bytes = 4u << 20});
    union {
        first_append a;
        unsigned char bytes[sizeof(ikv_append) + 16];
    } slot;
    memset(slot.bytes, 0xA5, sizeof slot.bytes);
#if defined(__x86_64__) && !defined(_WIN32)
    /* The System V ABI returns a struct this size through a hidden first
     * argument: call the symbol that way so the callee writes straight into
     * the canary-filled slot (a plain call may return into a temporary). */
    {
        extern void first_append_raw(void *ret, const ikv_pool *pool, uint32_t n) __asm__("ikv_append_default");
        first_append_raw(slot.bytes, pool, 5);
        for (size_t i = sizeof(first_append); i < sizeof slot.bytes; ++i) assert_int_equal(slot.bytes[i], 0xA5);
    }
#endif
    slot.a = ikv_append_default(pool, 5);
    const ikv_append now = ikv_append_default_v2(pool, 5);
    assert_int_equal(slot.a.struct_size, sizeof(first_append));
    assert_int_equal(now.struct_size, sizeof(ikv_append));
    assert_int_equal(slot.a.layer, now.layer);
    assert_int_equal(slot.a.n_tokens, now.n_tokens);
    assert_ptr_equal(slot.a.k, now.k);
    assert_ptr_equal(slot.a.v, now.v);
    assert_true(slot.a.token_stride == now.token_stride && slot.a.head_stride == now.head_stride &&
                slot.a.layer_stride == now.layer_stride);
    assert_int_equal(slot.a.src_on_device, now.src_on_device);
    assert_ptr_equal(slot.a.stream, now.stream);
    assert_ptr_equal(slot.a.formats, now.formats);
    float kv[2 * 5 * 2 * 32], out_old[5 * 2 * 32], out_new[5 * 2 * 32], v[5 * 2 * 32];
    ikvt_rng rng = {99};
    ikvt_fill_normal(&rng, kv, 2 * 5 * 2 * 32, 1.0f);
    ikv_seq_id s_old, s_new;
    IKVT_OK(ikv_seq_create(pool, &s_old));
    IKVT_OK(ikv_seq_create(pool, &s_new));
    first_append a = slot.a;
    a.layer = 1;
    a.k = a.v = kv;
    IKVT_OK(ikv_pool_append(pool, s_old, (const ikv_append *)(const void *)&a));
    ikv_append b = now;
    b.layer = 1;
    b.k = b.v = kv;
    IKVT_OK(ikv_pool_append(pool, s_new, &b));
    IKVT_OK(ikv_seq_read(pool, s_old, 1, 0, 5, out_old, v));
    IKVT_OK(ikv_seq_read(pool, s_new, 1, 0, 5, out_new, v));
    assert_memory_equal(out_old, out_new, sizeof out_old);
    ikv_pool_destroy(pool);
}

/* The second header's default writes its struct's bytes: today's defaults up
 * to `append`, with that version's struct_size (a decode reads `append` as NULL). */
static void test_second_header_decode_args(void **state) {
    (void)state;
    second_decode_args old = ikv_decode_args_default_v2();
    ikv_decode_args now = ikv_decode_args_default_v3();
    uint32_t size = 0;
    memcpy(&size, old.bytes, sizeof size);
    assert_int_equal(size, offsetof(ikv_decode_args, append));
    assert_memory_equal(old.bytes + 4, (const unsigned char *)&now + 4, sizeof old.bytes - 4);
}

/* The same for ikv_query_memory_config: the old default writes exactly its
 * struct, and a memory created from it takes the first version's form (no
 * turns kept apart: `turns` 0). The new default keeps 4. */
static void test_first_header_query_memory_config(void **state) {
    (void)state;
    first_query_memory_config c = ikv_query_memory_default_config();
    assert_int_equal(c.struct_size, sizeof(first_query_memory_config));
    assert_true(c.decay == 0.5f && c.n_q_heads == 0);
    c.n_q_heads = 8;
    ikv_pool_config pc = ikv_pool_default_config_v2();
    pc.n_layers = 1;
    pc.n_kv_heads = 2;
    pc.capacity_bytes = 1u << 20;
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create(&pc, &pool));
    ikv_query_memory *m = NULL;
    IKVT_OK(ikv_query_memory_create(pool, (const ikv_query_memory_config *)(const void *)&c, &m));
    ikv_query_memory_destroy(m);
    ikv_query_memory_config now = ikv_query_memory_default_config_v2();
    assert_true(now.struct_size == sizeof now && now.turns == 4);
    ikv_pool_destroy(pool);
}

/* The same for ikv_pool_config: the old default writes exactly its struct,
 * a pool created from it has no host tier and reads it back. */
static void test_first_header_pool_config(void **state) {
    (void)state;
    first_pool_config c = ikv_pool_default_config();
    assert_int_equal(c.struct_size, sizeof(first_pool_config));
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.kv_dtype, IKV_DTYPE_F16);
    c.n_layers = 2;
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create((const ikv_pool_config *)(const void *)&c, &pool));
    first_pool_config back;
    memset(&back, 0, sizeof back);
    back.struct_size = sizeof back;
    IKVT_OK(ikv_pool_get_config(pool, (ikv_pool_config *)(void *)&back));
    assert_int_equal(back.n_layers, 2);
    assert_int_equal(back.struct_size, sizeof back);
    ikv_pool_config now = ikv_pool_default_config_v2();
    assert_int_equal(now.struct_size, sizeof now);
    assert_true(now.host_capacity_bytes == 0);
    ikv_pool_destroy(pool);
}

static void test_runtime_info(void **state) {
    (void)state;
    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    IKVT_OK(ikv_runtime_info_get(&info));
    assert_int_equal(info.version, IKV_VERSION_NUMBER);
    assert_true(strlen(info.cpu_isa) > 0);
    assert_non_null(strstr(info.cpu_isa_available, info.cpu_isa));
    assert_non_null(strstr(info.cpu_isa_available, "scalar"));
    if (!info.cuda_built) assert_int_equal(info.cuda_device_count, 0);
    /* A caller built against a newer header (a larger struct): the library's
     * size is written, nothing past it, and struct_size says how much. */
    struct {
        ikv_runtime_info info;
        unsigned char later[16];
    } newer;
    memset(&newer, 0xAB, sizeof newer);
    newer.info.struct_size = sizeof newer;
    IKVT_OK(ikv_runtime_info_get(&newer.info));
    assert_int_equal(newer.info.struct_size, sizeof(ikv_runtime_info));
    assert_int_equal(newer.info.version, IKV_VERSION_NUMBER);
    for (size_t i = 0; i < sizeof newer.later; ++i) assert_int_equal(newer.later[i], 0xAB);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_errors_and_log),
        cmocka_unit_test(test_log_sink_calls_the_library),
        cmocka_unit_test(test_error_sentence_digits),
        cmocka_unit_test(test_last_selection_after_refusals),
        cmocka_unit_test(test_runtime_info),
        cmocka_unit_test(test_first_header_pool_config),
        cmocka_unit_test(test_first_header_query_memory_config),
        cmocka_unit_test(test_first_header_decode_args),
        cmocka_unit_test(test_first_header_append),
        cmocka_unit_test(test_one_sentence_per_failure),
        cmocka_unit_test(test_second_header_decode_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
