/* An engine's whole decode step in one CUDA graph, through the public API
 * (ikv_pool_reserve). Skips (exit 77) without a CUDA device.
 *
 * For every page format and three selections (dense, a plan, hybrid top-k),
 * two sequences of two CUDA pools get the same prefill and room for 40 more
 * tokens. Pool A's step -- per layer one asynchronous batch append from
 * device memory and one ikv_decode -- is captured once (global capture mode,
 * torch.cuda.graph's) and replayed 40 times, crossing page boundaries, with
 * new K/V and queries written to the same device buffers before each replay;
 * pool B runs the same calls eagerly. Every step's output of the replay
 * equals the eager step's byte for byte; after ikv_pool_sync both pools
 * hold the same lengths, values and key summaries, equal to a CPU pool fed the
 * same tokens (whose dense and plan outputs agree with the CUDA ones to fp32
 * rounding). Then: a replay past the room writes nothing and ikv_pool_sync
 * reports IKV_E_RANGE; a graph replayed after its room was replaced or ended,
 * or its sequence destroyed, writes and reads nothing and is reported
 * (IKV_E_STATE); the calls a room forbids are refused with a sentence and
 * allowed again once the room ends. Decodes that append their token
 * (args->append) equal separate appends, eagerly and replayed, at other
 * shapes, and with the layers run in either order, a token apart and beside
 * top-k steps whose lists are clipped. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "support.h"

enum { L = 2, H = 2, D = 64, P = 16, HQ = 4, B = 2, ROOM = 40 };
enum { KV_STEP = L * B * H * D, Q_STEP = L * B * HQ * D }; /* elements of one step's input */
static const uint32_t kPrefill[B] = {37, 50};
enum kind { DENSE, PLAN, TOPK };

typedef struct bufs {
    void *dk, *dv, *dq, *dout; /* device: K, V [L][B][H][D] f16; q, out [L][B][HQ][D] f32 */
} bufs;

static ikv_pool *make_pool(ikv_backend backend, ikv_format f) {
    return ikvt_make_pool((ikvt_pool_spec){.backend = backend, .n_layers = L, .n_kv_heads = H, .head_dim = D,
                                           .page_size = P, .default_format = f, .kv_dtype = IKV_DTYPE_F16});
}

/* The prefill of sequence b (host input, every layer), the same in every pool. */
static void prefill(ikv_pool *pool, ikv_seq_id *seqs) {
    for (uint32_t b = 0; b < B; ++b) {
        IKVT_OK(ikv_seq_create(pool, &seqs[b]));
        const size_t n = (size_t)L * kPrefill[b] * H * D;
        float *x = malloc(4 * n);
        uint16_t *k = malloc(2 * n), *v = malloc(2 * n);
        ikvt_rng rng = {100 + b};
        ikvt_fill_normal(&rng, x, n, 1.0f);
        ikvt_to_f16(x, k, n);
        ikvt_fill_normal(&rng, x, n, 1.0f);
        ikvt_to_f16(x, v, n);
        ikv_append a = ikv_append_default(pool, kPrefill[b]);
        a.layer = IKV_ALL_LAYERS;
        a.k = k;
        a.v = v;
        IKVT_OK(ikv_pool_append(pool, seqs[b], &a));
        free(x), free(k), free(v);
    }
}

/* Step t's input, on the host: K, V (f16) and q (f32) of every layer and sequence. */
static void step_input(uint32_t t, uint16_t *k, uint16_t *v, float *q) {
    ikvt_rng rng = {0x5EED + t};
    float x[KV_STEP];
    ikvt_fill_normal(&rng, x, KV_STEP, 1.0f);
    ikvt_to_f16(x, k, KV_STEP);
    ikvt_fill_normal(&rng, x, KV_STEP, 1.0f);
    ikvt_to_f16(x, v, KV_STEP);
    ikvt_fill_normal(&rng, q, Q_STEP, 1.0f);
}

static ikv_decode_args decode_args(const ikv_seq_id *seqs, uint32_t l, const void *q, void *out, void *stream,
                                   const ikv_plan *const *plans, enum kind kind) {
    ikv_decode_args d = ikv_decode_args_default();
    d.layer = l;
    d.n_seqs = B;
    d.seqs = seqs;
    d.n_q_heads = HQ;
    d.q = q;
    d.out = out;
    d.stream = stream;
    d.plans = kind == PLAN ? plans : NULL;
    d.topk_token_budget = kind == TOPK ? 48 : 0;
    d.topk_score = IKV_TOPK_SCORE_HYBRID;
    return d;
}

/* Layer l's append of one token per sequence from device memory (layer l's
 * part of bf), asynchronous on stream. */
static ikv_append layer_append(ikv_pool *pool, const bufs *bf, void *stream, uint32_t l) {
    ikv_append a = ikv_append_default(pool, 1);
    a.layer = l;
    a.k = (const uint16_t *)bf->dk + (size_t)l * B * H * D;
    a.v = (const uint16_t *)bf->dv + (size_t)l * B * H * D;
    a.src_on_device = 1;
    a.stream = stream;
    a.flags = IKV_APPEND_ASYNC;
    return a;
}

/* Layer l of an engine step on a CUDA pool: the batch append of one token per
 * sequence, then the decode; with `fused`, the decode's args->append instead
 * of a separate append call. */
static ikv_status layer_step(ikv_pool *pool, ikv_decoder *dec, const ikv_seq_id *seqs, const bufs *bf, void *stream,
                             const ikv_plan *const *plans, enum kind kind, int fused, uint32_t l) {
    ikv_append a = layer_append(pool, bf, stream, l);
    ikv_status st = fused ? IKV_OK : ikv_pool_append_batch(pool, seqs, B, &a);
    if (st != IKV_OK) return st;
    ikv_decode_args d = decode_args(seqs, l, (const float *)bf->dq + (size_t)l * B * HQ * D,
                                    (float *)bf->dout + (size_t)l * B * HQ * D, stream, plans, kind);
    d.append = fused ? &a : NULL;
    return ikv_decode(dec, pool, &d);
}

/* One engine step: every layer's layer_step, in order. */
static ikv_status cuda_step(ikv_pool *pool, ikv_decoder *dec, const ikv_seq_id *seqs, const bufs *bf, void *stream,
                            const ikv_plan *const *plans, enum kind kind, int fused) {
    for (uint32_t l = 0; l < L; ++l) {
        const ikv_status st = layer_step(pool, dec, seqs, bf, stream, plans, kind, fused, l);
        if (st != IKV_OK) return st;
    }
    return IKV_OK;
}

/* Calls of dec whose args->append its kernels wrote (ikv_decoder_stats). */
static uint64_t appends_fused(const ikv_decoder *dec) {
    ikv_decoder_stats st;
    st.struct_size = sizeof st;
    IKVT_OK(ikv_decoder_get_stats(dec, &st));
    return st.appends_fused;
}

/* The same step on a CPU pool from host memory. */
static void cpu_step(ikv_pool *pool, ikv_decoder *dec, const ikv_seq_id *seqs, const uint16_t *k, const uint16_t *v,
                     const float *q, float *out, const ikv_plan *const *plans, enum kind kind) {
    for (uint32_t l = 0; l < L; ++l) {
        ikv_append a = ikv_append_default(pool, 1);
        a.layer = l;
        a.k = k + (size_t)l * B * H * D;
        a.v = v + (size_t)l * B * H * D;
        IKVT_OK(ikv_pool_append_batch(pool, seqs, B, &a));
        const ikv_decode_args d =
            decode_args(seqs, l, q + (size_t)l * B * HQ * D, out + (size_t)l * B * HQ * D, NULL, plans, kind);
        IKVT_OK(ikv_decode(dec, pool, &d));
    }
}

/* Lengths, stored values and key summaries of seqs equal in pools a and b. */
static void assert_same_pools(ikv_pool *a, const ikv_seq_id *sa, ikv_pool *b, const ikv_seq_id *sb) {
    for (uint32_t s = 0; s < B; ++s) {
        uint32_t la = 0, lb = 0;
        IKVT_OK(ikv_seq_length(a, sa[s], &la));
        IKVT_OK(ikv_seq_length(b, sb[s], &lb));
        assert_int_equal(la, lb);
        const size_t n = (size_t)la * H * D;
        float *x[4];
        for (int i = 0; i < 4; ++i) x[i] = malloc(4 * n);
        for (uint32_t l = 0; l < L; ++l) {
            IKVT_OK(ikv_seq_read(a, sa[s], l, 0, la, x[0], x[1]));
            IKVT_OK(ikv_seq_read(b, sb[s], l, 0, lb, x[2], x[3]));
            assert_memory_equal(x[0], x[2], 4 * n);
            assert_memory_equal(x[1], x[3], 4 * n);
            for (uint32_t page = 0; page * P < la; ++page)
                for (uint32_t h = 0; h < H; ++h) {
                    float sum[2][3][D];
                    uint32_t nt[2];
                    IKVT_OK(ikv_seq_page_summary(a, sa[s], l, h, page, sum[0][0], sum[0][1], sum[0][2], &nt[0]));
                    IKVT_OK(ikv_seq_page_summary(b, sb[s], l, h, page, sum[1][0], sum[1][1], sum[1][2], &nt[1]));
                    assert_int_equal(nt[0], nt[1]);
                    assert_memory_equal(sum[0], sum[1], sizeof sum[0]);
                }
        }
        for (int i = 0; i < 4; ++i) free(x[i]);
    }
}

static double rel_l2_f(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* fused: pool A's captured step appends through its decodes (ikv_decode_args.append);
 * pool B's eager step stays two calls a layer, so the replay equals them too. */
static void run_case(ikv_format f, enum kind kind, int fused) {
    ikv_pool *ga = make_pool(IKV_BACKEND_CUDA, f), *gb = make_pool(IKV_BACKEND_CUDA, f);
    ikv_pool *cpu = make_pool(IKV_BACKEND_CPU, f);
    ikv_seq_id sa[B], sb[B], sc[B];
    prefill(ga, sa);
    prefill(gb, sb);
    prefill(cpu, sc);
    IKVT_OK(ikv_pool_reserve(ga, sa, B, ROOM));
    IKVT_OK(ikv_pool_reserve(gb, sb, B, ROOM));
    static const ikv_token_range ranges[] = {{0, 16}, {33, 50 + ROOM}};
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_plan_from_ranges(ranges, 2, 50 + ROOM, P, f, &plan));
    const ikv_plan *plans[B] = {plan, plan};
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *da = NULL, *db = NULL, *dcpu = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &da));
    IKVT_OK(ikv_decoder_create(&dc, &db));
    IKVT_OK(ikv_decoder_create(&dc, &dcpu));
    void *stream_a = NULL, *stream_b = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&stream_a), 0);
    assert_int_equal(ikvt_rt.stream_create_(&stream_b), 0);
    bufs bf = {ikvt_dev_upload(NULL, 2 * KV_STEP), ikvt_dev_upload(NULL, 2 * KV_STEP), ikvt_dev_upload(NULL, 4 * Q_STEP),
               ikvt_dev_upload(NULL, 4 * Q_STEP)};
    uint16_t *k = malloc(2 * KV_STEP), *v = malloc(2 * KV_STEP);
    float *q = malloc(4 * Q_STEP), *out_a = malloc(4 * Q_STEP), *out_b = malloc(4 * Q_STEP), *out_c = malloc(4 * Q_STEP);

    /* One eager decode per layer sizes the decoder's buffers (a capture cannot
     * allocate); it appends nothing. Then the step is captured once. */
    step_input(999, k, v, q);
    assert_int_equal(ikvt_rt.memcpy_(bf.dq, q, 4 * Q_STEP, IKVT_H2D), 0);
    for (uint32_t l = 0; l < L; ++l) {
        const ikv_decode_args d = decode_args(sa, l, bf.dq, bf.dout, stream_a, plans, kind);
        IKVT_OK(ikv_decode(da, ga, &d));
    }
    assert_int_equal(ikvt_rt.stream_sync_(stream_a), 0);
    void *graph = NULL, *exec = NULL;
    assert_int_equal(ikvt_rt.begin_capture_(stream_a, IKVT_CAPTURE_GLOBAL), 0);
    const ikv_status captured = cuda_step(ga, da, sa, &bf, stream_a, plans, kind, fused);
    assert_int_equal(ikvt_rt.end_capture_(stream_a, &graph), 0);
    if (captured != IKV_OK) fail_msg("capture: %s: %s", ikv_status_name(captured), ikv_last_error());
    /* The decode's kernels write the token where ikv_decode_args.append says they do. */
    const int in_kernels = fused && (f == IKV_FMT_F16 || f == IKV_FMT_BF16) && kind != TOPK;
    assert_int_equal(appends_fused(da), in_kernels ? L : 0);
    assert_int_equal(ikvt_rt.graph_instantiate_(&exec, graph, 0), 0);
    uint32_t len = 0;
    IKVT_OK(ikv_seq_length(ga, sa[0], &len));
    assert_int_equal(len, kPrefill[0]); /* capturing appended nothing */

    double worst = 0;
    for (uint32_t t = 0; t < ROOM; ++t) {
        step_input(t, k, v, q);
        assert_int_equal(ikvt_rt.memcpy_(bf.dk, k, 2 * KV_STEP, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.memcpy_(bf.dv, v, 2 * KV_STEP, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.memcpy_(bf.dq, q, 4 * Q_STEP, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.sync_(), 0);
        assert_int_equal(ikvt_rt.graph_launch_(exec, stream_a), 0);
        assert_int_equal(ikvt_rt.stream_sync_(stream_a), 0);
        assert_int_equal(ikvt_rt.memcpy_(out_a, bf.dout, 4 * Q_STEP, IKVT_D2H), 0);
        IKVT_OK(cuda_step(gb, db, sb, &bf, stream_b, plans, kind, 0));
        assert_int_equal(ikvt_rt.stream_sync_(stream_b), 0);
        assert_int_equal(ikvt_rt.memcpy_(out_b, bf.dout, 4 * Q_STEP, IKVT_D2H), 0);
        if (memcmp(out_a, out_b, 4 * Q_STEP) != 0)
            fail_msg("format %d kind %d fused %d step %u: the replay's output differs from the eager step's", f, kind,
                     fused, t);
        cpu_step(cpu, dcpu, sc, k, v, q, out_c, plans, kind);
        if (kind != TOPK) { /* top-k may break near-ties of its bf16 scores differently on the CPU */
            const double e = rel_l2_f(out_b, out_c, Q_STEP);
            worst = e > worst ? e : worst;
        }
    }
    if (worst > 1e-5) fail_msg("format %d kind %d: CUDA vs CPU output rel. L2 %.3g", f, kind, worst);
    IKVT_OK(ikv_pool_sync(ga));
    IKVT_OK(ikv_pool_sync(gb));
    IKVT_OK(ikv_seq_length(ga, sa[1], &len));
    assert_int_equal(len, kPrefill[1] + ROOM);
    assert_same_pools(ga, sa, gb, sb);
    assert_same_pools(ga, sa, cpu, sc);

    /* A replay past the room: nothing written, reported once. */
    assert_int_equal(ikvt_rt.graph_launch_(exec, stream_a), 0);
    assert_int_equal(ikvt_rt.stream_sync_(stream_a), 0);
    IKVT_EXPECT_STATUS(ikv_pool_sync(ga), IKV_E_RANGE, "passed its reserved room");
    IKVT_OK(ikv_pool_sync(ga));
    assert_same_pools(ga, sa, gb, sb);

    /* What a room forbids, and a graph older than its room. */
    IKVT_EXPECT_STATUS(ikv_seq_truncate(ga, sa[0], 1), IKV_E_STATE, "ikv_pool_reserve");
    ikv_seq_id child;
    IKVT_EXPECT_STATUS(ikv_seq_fork(ga, sa[0], &child), IKV_E_STATE, "ikv_pool_reserve");
    IKVT_EXPECT_STATUS(ikv_seq_set_page_format(ga, sa[0], 0, IKV_FMT_INT8), IKV_E_STATE, "ikv_pool_reserve");
    ikv_append host = ikv_append_default(ga, 1);
    host.k = k;
    host.v = v;
    IKVT_EXPECT_STATUS(ikv_pool_append(ga, sa[0], &host), IKV_E_INVALID, "src_on_device");
    /* A new room is a new generation of the device record: the old graph appends and reads
     * nothing, and says so; the same after the room ends. The pages stay as they were. */
    IKVT_OK(ikv_pool_reserve(ga, sa, B, 8));
    assert_int_equal(ikvt_rt.graph_launch_(exec, stream_a), 0);
    assert_int_equal(ikvt_rt.stream_sync_(stream_a), 0);
    IKVT_EXPECT_STATUS(ikv_pool_sync(ga), IKV_E_STATE, "capture the step again");
    IKVT_OK(ikv_seq_length(ga, sa[0], &len));
    assert_int_equal(len, kPrefill[0] + ROOM);
    assert_same_pools(ga, sa, gb, sb);
    IKVT_OK(ikv_pool_reserve(ga, sa, B, 0));
    assert_int_equal(ikvt_rt.graph_launch_(exec, stream_a), 0);
    assert_int_equal(ikvt_rt.stream_sync_(stream_a), 0);
    IKVT_EXPECT_STATUS(ikv_pool_sync(ga), IKV_E_STATE, "capture the step again");
    assert_same_pools(ga, sa, gb, sb);
    IKVT_OK(ikv_seq_truncate(ga, sa[0], 1));
    IKVT_OK(ikv_seq_destroy(ga, sa[1])); /* its record retires: a replay touches nothing of it */
    assert_int_equal(ikvt_rt.graph_launch_(exec, stream_a), 0);
    assert_int_equal(ikvt_rt.stream_sync_(stream_a), 0);
    IKVT_EXPECT_STATUS(ikv_pool_sync(ga), IKV_E_STATE, NULL);

    ikvt_rt.graph_exec_destroy_(exec);
    ikvt_rt.graph_destroy_(graph);
    ikvt_rt.stream_destroy_(stream_a);
    ikvt_rt.stream_destroy_(stream_b);
    ikvt_rt.free_(bf.dk), ikvt_rt.free_(bf.dv), ikvt_rt.free_(bf.dq), ikvt_rt.free_(bf.dout);
    free(k), free(v), free(q), free(out_a), free(out_b), free(out_c);
    ikv_decoder_destroy(da), ikv_decoder_destroy(db), ikv_decoder_destroy(dcpu);
    ikv_plan_destroy(plan);
    ikv_pool_destroy(ga), ikv_pool_destroy(gb), ikv_pool_destroy(cpu);
}

static const ikv_format kFormats[] = {IKV_FMT_F16, IKV_FMT_BF16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};

static void run_formats(enum kind kind, int fused) {
    for (size_t i = 0; i < sizeof kFormats / sizeof kFormats[0]; ++i) run_case(kFormats[i], kind, fused);
}
static void test_dense_step_replayed(void **state) {
    (void)state;
    run_formats(DENSE, 0);
}
static void test_plan_step_replayed(void **state) {
    (void)state;
    run_formats(PLAN, 0);
}
static void test_topk_step_replayed(void **state) {
    (void)state;
    run_formats(TOPK, 0);
}
/* The same steps with the appends passed to the decodes (ikv_decode_args.append). */
static void test_dense_step_fused(void **state) {
    (void)state;
    run_formats(DENSE, 1);
}
static void test_plan_step_fused(void **state) {
    (void)state;
    run_formats(PLAN, 1);
}
static void test_topk_step_fused(void **state) {
    (void)state;
    run_formats(TOPK, 1);
}

/* Appends a room refuses, on a CUDA pool: more than a page of tokens, a batch
 * mixing sequences with and without room, a capture without room. */
static void test_room_append_refusals(void **state) {
    (void)state;
    ikv_pool *pool = make_pool(IKV_BACKEND_CUDA, IKV_FMT_F16);
    ikv_seq_id s[B];
    prefill(pool, s);
    IKVT_OK(ikv_pool_reserve(pool, &s[0], 1, 64));
    void *dk = ikvt_dev_upload(NULL, 2 * (size_t)B * (P + 1) * H * D), *dv = ikvt_dev_upload(NULL, 2 * (size_t)B * (P + 1) * H * D);
    assert_int_equal(ikvt_rt.memset_(dk, 0, 2 * (size_t)B * (P + 1) * H * D), 0);
    assert_int_equal(ikvt_rt.memset_(dv, 0, 2 * (size_t)B * (P + 1) * H * D), 0);
    ikv_append a = ikv_append_default(pool, P + 1);
    a.k = dk;
    a.v = dv;
    a.src_on_device = 1;
    a.flags = IKV_APPEND_ASYNC;
    IKVT_EXPECT_STATUS(ikv_pool_append(pool, s[0], &a), IKV_E_INVALID, "page_size");
    a = ikv_append_default(pool, 1);
    a.k = dk;
    a.v = dv;
    a.src_on_device = 1;
    a.flags = IKV_APPEND_ASYNC;
    IKVT_EXPECT_STATUS(ikv_pool_append_batch(pool, s, B, &a), IKV_E_INVALID, "no reserved room");
    void *stream = NULL, *graph = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
    a.stream = stream;
    assert_int_equal(ikvt_rt.begin_capture_(stream, IKVT_CAPTURE_GLOBAL), 0);
    const ikv_status without = ikv_pool_append(pool, s[1], &a);
    a.flags = 0;
    const ikv_status sync_in_capture = ikv_pool_append(pool, s[0], &a);
    assert_int_equal(ikvt_rt.end_capture_(stream, &graph), 0);
    IKVT_EXPECT_STATUS(without, IKV_E_INVALID, NULL);
    IKVT_EXPECT_STATUS(sync_in_capture, IKV_E_INVALID, NULL);
    if (graph) ikvt_rt.graph_destroy_(graph);
    uint32_t len = 0;
    IKVT_OK(ikv_seq_length(pool, s[0], &len));
    assert_int_equal(len, kPrefill[0]);
    /* Eager, synchronous: allowed, checked, and counted by the host at once (layer 0 only). */
    a.stream = NULL;
    IKVT_OK(ikv_pool_append(pool, s[0], &a));
    IKVT_OK(ikv_seq_layer_length(pool, s[0], 0, &len));
    assert_int_equal(len, kPrefill[0] + 1);
    IKVT_OK(ikv_seq_layer_length(pool, s[0], 1, &len));
    assert_int_equal(len, kPrefill[0]);
    IKVT_OK(ikv_pool_sync(pool));
    IKVT_OK(ikv_seq_layer_length(pool, s[0], 0, &len)); /* the device agrees */
    assert_int_equal(len, kPrefill[0] + 1);
    /* NaN input: refused by a synchronous append (nothing written), stored as 0
     * and reported by ikv_pool_sync after an asynchronous one. */
    assert_int_equal(ikvt_rt.memset_(dk, 0xFF, 2 * (size_t)H * D), 0); /* f16 0xFFFF: NaN */
    IKVT_EXPECT_STATUS(ikv_pool_append(pool, s[0], &a), IKV_E_INVALID, "NaN");
    IKVT_OK(ikv_pool_sync(pool));
    IKVT_OK(ikv_seq_layer_length(pool, s[0], 0, &len));
    assert_int_equal(len, kPrefill[0] + 1);
    a.flags = IKV_APPEND_ASYNC;
    IKVT_OK(ikv_pool_append(pool, s[0], &a));
    IKVT_EXPECT_STATUS(ikv_pool_sync(pool), IKV_E_INVALID, "NaN");
    IKVT_OK(ikv_seq_layer_length(pool, s[0], 0, &len));
    assert_int_equal(len, kPrefill[0] + 2);
    ikvt_rt.stream_destroy_(stream);
    ikvt_rt.free_(dk), ikvt_rt.free_(dv);
    ikv_pool_destroy(pool);
}

/* Two CUDA F16 pools with the same prefill and room, a decoder and the
 * sequences of each, a stream, one step's device buffers and host input. */
typedef struct fused_pair {
    ikv_pool *ga, *gb;
    ikv_seq_id sa[B], sb[B];
    ikv_decoder *da, *db;
    void *stream;
    bufs bf;
    uint16_t *k, *v;
    float *q, *out_a, *out_b;
} fused_pair;

static void fused_pair_make(fused_pair *x) {
    x->ga = make_pool(IKV_BACKEND_CUDA, IKV_FMT_F16);
    x->gb = make_pool(IKV_BACKEND_CUDA, IKV_FMT_F16);
    prefill(x->ga, x->sa);
    prefill(x->gb, x->sb);
    IKVT_OK(ikv_pool_reserve(x->ga, x->sa, B, ROOM));
    IKVT_OK(ikv_pool_reserve(x->gb, x->sb, B, ROOM));
    ikv_decoder_config dc = ikv_decoder_default_config();
    x->da = x->db = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &x->da));
    IKVT_OK(ikv_decoder_create(&dc, &x->db));
    x->stream = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&x->stream), 0);
    x->bf = (bufs){ikvt_dev_upload(NULL, 2 * KV_STEP), ikvt_dev_upload(NULL, 2 * KV_STEP),
                   ikvt_dev_upload(NULL, 4 * Q_STEP), ikvt_dev_upload(NULL, 4 * Q_STEP)};
    x->k = malloc(2 * KV_STEP), x->v = malloc(2 * KV_STEP);
    x->q = malloc(4 * Q_STEP), x->out_a = malloc(4 * Q_STEP), x->out_b = malloc(4 * Q_STEP);
}

static void fused_pair_free(fused_pair *x) {
    ikvt_rt.stream_destroy_(x->stream);
    ikvt_rt.free_(x->bf.dk), ikvt_rt.free_(x->bf.dv), ikvt_rt.free_(x->bf.dq), ikvt_rt.free_(x->bf.dout);
    free(x->k), free(x->v), free(x->q), free(x->out_a), free(x->out_b);
    ikv_decoder_destroy(x->da), ikv_decoder_destroy(x->db);
    ikv_pool_destroy(x->ga), ikv_pool_destroy(x->gb);
}

/* Eager decodes that append (ikv_decode_args.append) on F16 pools with room:
 * each step's outputs and the pools equal the same tokens appended by
 * separate calls; the fused path is taken; bad arguments are refused with a
 * sentence and append nothing; a NaN input is stored as 0 and reported by
 * ikv_pool_sync, as an asynchronous append's. */
static void test_fused_append_eager(void **state) {
    (void)state;
    fused_pair x;
    fused_pair_make(&x);
    enum { STEPS = 20 };
    for (uint32_t t = 0; t < STEPS; ++t) {
        step_input(t, x.k, x.v, x.q);
        assert_int_equal(ikvt_rt.memcpy_(x.bf.dk, x.k, 2 * KV_STEP, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.memcpy_(x.bf.dv, x.v, 2 * KV_STEP, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.memcpy_(x.bf.dq, x.q, 4 * Q_STEP, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.sync_(), 0);
        IKVT_OK(cuda_step(x.ga, x.da, x.sa, &x.bf, x.stream, NULL, DENSE, 1));
        assert_int_equal(ikvt_rt.stream_sync_(x.stream), 0);
        assert_int_equal(ikvt_rt.memcpy_(x.out_a, x.bf.dout, 4 * Q_STEP, IKVT_D2H), 0);
        IKVT_OK(cuda_step(x.gb, x.db, x.sb, &x.bf, x.stream, NULL, DENSE, 0));
        assert_int_equal(ikvt_rt.stream_sync_(x.stream), 0);
        assert_int_equal(ikvt_rt.memcpy_(x.out_b, x.bf.dout, 4 * Q_STEP, IKVT_D2H), 0);
        if (memcmp(x.out_a, x.out_b, 4 * Q_STEP) != 0) fail_msg("step %u: the fused step's output differs", t);
    }
    assert_int_equal(appends_fused(x.da), (uint64_t)L * STEPS);
    IKVT_OK(ikv_pool_sync(x.ga));
    IKVT_OK(ikv_pool_sync(x.gb));
    assert_same_pools(x.ga, x.sa, x.gb, x.sb);

    /* Refused before anything is appended: the append's layer or x.stream not the
     * decode's, a query longer than the sequence would be, a bad append argument. */
    ikv_append a = ikv_append_default(x.ga, 1);
    a.k = x.bf.dk;
    a.v = x.bf.dv;
    a.src_on_device = 1;
    a.stream = x.stream;
    a.flags = IKV_APPEND_ASYNC;
    ikv_decode_args d = decode_args(x.sa, 0, x.bf.dq, x.bf.dout, x.stream, NULL, DENSE);
    d.append = &a;
    a.layer = 1;
    IKVT_EXPECT_STATUS(ikv_decode(x.da, x.ga, &d), IKV_E_INVALID, "args->append->layer");
    a.layer = 0;
    a.stream = NULL;
    IKVT_EXPECT_STATUS(ikv_decode(x.da, x.ga, &d), IKV_E_INVALID, "args->append->stream");
    a.stream = x.stream;
    d.n_query_tokens = 1000;
    IKVT_EXPECT_STATUS(ikv_decode(x.da, x.ga, &d), IKV_E_INVALID, "n_query_tokens");
    d.n_query_tokens = 1;
    a.n_tokens = 0;
    IKVT_EXPECT_STATUS(ikv_decode(x.da, x.ga, &d), IKV_E_INVALID, "ikv_decode (args->append)");
    a.n_tokens = 1;
    IKVT_OK(ikv_pool_sync(x.ga));
    assert_same_pools(x.ga, x.sa, x.gb, x.sb); /* nothing was appended */

    /* A NaN: stored as 0, reported by the sync, the length advanced (as an asynchronous append). */
    assert_int_equal(ikvt_rt.memset_(x.bf.dk, 0xFF, 2 * (size_t)H * D), 0); /* f16 0xFFFF: NaN */
    IKVT_OK(ikv_decode(x.da, x.ga, &d));
    IKVT_EXPECT_STATUS(ikv_pool_sync(x.ga), IKV_E_INVALID, "NaN");
    uint32_t len = 0;
    IKVT_OK(ikv_seq_layer_length(x.ga, x.sa[0], 0, &len));
    assert_int_equal(len, kPrefill[0] + STEPS + 1);

    fused_pair_free(&x);
}

/* ikv_decoder_last_selection of decoders a and b (the same call on pools
 * holding the same tokens) agree for every sequence and kv-head; for a dense
 * step each is the one run [0, len) with len = the prefill plus `appended`
 * tokens (the step's own included: a room sequence's host length lags the
 * device's until a sync, so the test counts). */
static void assert_same_selection(const ikv_decoder *a, const ikv_decoder *b, uint32_t appended, int dense, uint32_t t) {
    for (uint32_t s = 0; s < B; ++s) {
        const uint32_t len = kPrefill[s] + appended;
        for (uint32_t h = 0; h < H; ++h) {
            ikv_token_range ra[64], rb[64];
            size_t na = 0, nb = 0;
            IKVT_OK(ikv_decoder_last_selection(a, s, h, ra, 64, &na));
            IKVT_OK(ikv_decoder_last_selection(b, s, h, rb, 64, &nb));
            if (na != nb || na > 64 || memcmp(ra, rb, na * sizeof ra[0]) != 0)
                fail_msg("step %u, seq %u, kv-head %u: the selections differ (%zu and %zu runs)", t, s, h, na, nb);
            if (dense && (na != 1 || ra[0].begin != 0 || ra[0].end != len))
                fail_msg("step %u, seq %u, kv-head %u: a dense step read %zu runs, [%u, %u), not [0, %u)", t, s, h, na,
                         na ? ra[0].begin : 0, na ? ra[0].end : 0, len);
        }
    }
}

/* Decodes that append (which read their rooms' entries whole) beside calls
 * that clip those entries, with the layers in any order and a token apart:
 * steps whose layers run forward on even steps and backward on odd ones,
 * from step 3 on one layer a token ahead of the other (one more append to
 * layer 0), and every fourth step a top-k step (its append by the append
 * kernel, its lists clipped to the length); eager, then three graphs (dense
 * forward, dense backward, top-k) captured once and replayed in turn, then
 * eager again. Outputs equal separate append calls byte for byte, and so do
 * the pools and, after eager steps, the decoders' last selections. */
static void test_fused_append_layers_apart(void **state) {
    (void)state;
    fused_pair x;
    fused_pair_make(&x);
    enum { EAGER = 12, CAPTURES = 3, REPLAYS = 9, AFTER = 4, STEPS = EAGER + CAPTURES + REPLAYS + AFTER };
    void *graphs[CAPTURES] = {NULL}, *execs[CAPTURES] = {NULL}; /* dense forward, dense backward, top-k */
    uint64_t fused_calls = 0;
    for (uint32_t t = 0; t < STEPS; ++t) {
        const int graph_step = t >= EAGER && t < EAGER + CAPTURES + REPLAYS;
        const int g = graph_step ? (int)((t - EAGER) % CAPTURES) : -1;
        const int backward = graph_step ? g == 1 : t % 2 == 1;
        const enum kind kind = graph_step ? (g == 2 ? TOPK : DENSE) : (t % 4 == 2 ? TOPK : DENSE);
        step_input(t, x.k, x.v, x.q);
        assert_int_equal(ikvt_rt.memcpy_(x.bf.dk, x.k, 2 * KV_STEP, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.memcpy_(x.bf.dv, x.v, 2 * KV_STEP, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.memcpy_(x.bf.dq, x.q, 4 * Q_STEP, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.sync_(), 0);
        if (t == 3) { /* layer 0 a token ahead from here on, in both pools */
            ikv_append a = layer_append(x.ga, &x.bf, x.stream, 0);
            IKVT_OK(ikv_pool_append_batch(x.ga, x.sa, B, &a));
            a = layer_append(x.gb, &x.bf, x.stream, 0);
            IKVT_OK(ikv_pool_append_batch(x.gb, x.sb, B, &a));
        }
        const int capture = graph_step && t < EAGER + CAPTURES;
        if (capture) assert_int_equal(ikvt_rt.begin_capture_(x.stream, IKVT_CAPTURE_GLOBAL), 0);
        if (!graph_step || capture) {
            for (uint32_t i = 0; i < L; ++i)
                IKVT_OK(layer_step(x.ga, x.da, x.sa, &x.bf, x.stream, NULL, kind, 1, backward ? L - 1 - i : i));
            fused_calls += kind == DENSE ? L : 0;
        }
        if (capture) {
            assert_int_equal(ikvt_rt.end_capture_(x.stream, &graphs[g]), 0);
            assert_int_equal(ikvt_rt.graph_instantiate_(&execs[g], graphs[g], 0), 0);
        }
        if (graph_step) assert_int_equal(ikvt_rt.graph_launch_(execs[g], x.stream), 0);
        assert_int_equal(ikvt_rt.stream_sync_(x.stream), 0);
        assert_int_equal(ikvt_rt.memcpy_(x.out_a, x.bf.dout, 4 * Q_STEP, IKVT_D2H), 0);
        for (uint32_t i = 0; i < L; ++i)
            IKVT_OK(layer_step(x.gb, x.db, x.sb, &x.bf, x.stream, NULL, kind, 0, backward ? L - 1 - i : i));
        assert_int_equal(ikvt_rt.stream_sync_(x.stream), 0);
        assert_int_equal(ikvt_rt.memcpy_(x.out_b, x.bf.dout, 4 * Q_STEP, IKVT_D2H), 0);
        if (memcmp(x.out_a, x.out_b, 4 * Q_STEP) != 0) fail_msg("step %u (kind %d): the output differs", t, kind);
        if (!graph_step) /* (a replay's selection is not the host's to read: IKV_E_STATE) */
            /* the last decode's layer: 0 backward (a token ahead from step 3), L - 1 forward */
            assert_same_selection(x.da, x.db, t + 1 + (backward && t >= 3 ? 1 : 0), kind == DENSE, t);
    }
    assert_int_equal(appends_fused(x.da), fused_calls);
    IKVT_OK(ikv_pool_sync(x.ga));
    IKVT_OK(ikv_pool_sync(x.gb));
    assert_same_pools(x.ga, x.sa, x.gb, x.sb);
    uint32_t l0 = 0, l1 = 0;
    IKVT_OK(ikv_seq_layer_length(x.ga, x.sa[0], 0, &l0));
    IKVT_OK(ikv_seq_layer_length(x.ga, x.sa[0], 1, &l1));
    assert_int_equal(l0, kPrefill[0] + STEPS + 1); /* every step appended once (a capture at its first replay) */
    assert_int_equal(l1, l0 - 1);

    for (int i = 0; i < CAPTURES; ++i) ikvt_rt.graph_exec_destroy_(execs[i]), ikvt_rt.graph_destroy_(graphs[i]);
    fused_pair_free(&x);
}

/* Fused against separate calls, eagerly, at other shapes: F16 pools of nh
 * kv-heads of head_dim hd, g query heads per kv-head, nb sequences (more than
 * the 8 whose tail records ride in the kernel's parameters), one layer.
 * Outputs and stored values equal byte for byte; the decode's kernels write
 * the token when g <= 8 (ikv_decoder_stats), the append kernel otherwise. */
static void fused_vs_separate(uint32_t nh, uint32_t hd, uint32_t g, uint32_t nb) {
    ikvt_pool_spec spec = {.backend = IKV_BACKEND_CUDA, .n_layers = 1, .n_kv_heads = nh, .head_dim = hd,
                           .page_size = P, .default_format = IKV_FMT_F16, .kv_dtype = IKV_DTYPE_F16,
                           .capacity_bytes = 64u << 20};
    ikv_pool *pa = ikvt_make_pool(spec), *pb = ikvt_make_pool(spec);
    ikv_seq_id sa[16], sb[16];
    const size_t kv = (size_t)nb * nh * hd, qn = (size_t)nb * nh * g * hd;
    float *x = malloc(4 * (kv > qn ? kv : qn) * 40);
    uint16_t *k = malloc(2 * kv * 40), *v = malloc(2 * kv * 40);
    ikvt_rng rng = {77 + nb};
    for (uint32_t b = 0; b < nb; ++b) { /* prefills of 20 + 3b tokens */
        const uint32_t n = 20 + 3 * b;
        ikvt_fill_normal(&rng, x, (size_t)n * nh * hd, 1.0f);
        ikvt_to_f16(x, k, (size_t)n * nh * hd);
        ikvt_fill_normal(&rng, x, (size_t)n * nh * hd, 1.0f);
        ikvt_to_f16(x, v, (size_t)n * nh * hd);
        ikv_pool *pools[2] = {pa, pb};
        ikv_seq_id *ids[2] = {&sa[b], &sb[b]};
        for (int i = 0; i < 2; ++i) {
            IKVT_OK(ikv_seq_create(pools[i], ids[i]));
            ikv_append a = ikv_append_default(pools[i], n);
            a.k = k;
            a.v = v;
            IKVT_OK(ikv_pool_append(pools[i], *ids[i], &a));
        }
    }
    IKVT_OK(ikv_pool_reserve(pa, sa, nb, 24));
    IKVT_OK(ikv_pool_reserve(pb, sb, nb, 24));
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *da = NULL, *db = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &da));
    IKVT_OK(ikv_decoder_create(&dc, &db));
    void *dk = ikvt_dev_upload(NULL, 2 * kv), *dv = ikvt_dev_upload(NULL, 2 * kv), *dq = ikvt_dev_upload(NULL, 4 * qn),
         *dout = ikvt_dev_upload(NULL, 4 * qn);
    float *oa = malloc(4 * qn), *ob = malloc(4 * qn);
    for (uint32_t t = 0; t < 20; ++t) {
        ikvt_fill_normal(&rng, x, kv, 1.0f);
        ikvt_to_f16(x, k, kv);
        ikvt_fill_normal(&rng, x, kv, 1.0f);
        ikvt_to_f16(x, v, kv);
        ikvt_fill_normal(&rng, x, qn, 1.0f);
        assert_int_equal(ikvt_rt.memcpy_(dk, k, 2 * kv, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.memcpy_(dv, v, 2 * kv, IKVT_H2D), 0);
        assert_int_equal(ikvt_rt.memcpy_(dq, x, 4 * qn, IKVT_H2D), 0);
        ikv_append a = ikv_append_default(pa, 1);
        a.k = dk;
        a.v = dv;
        a.src_on_device = 1;
        a.flags = IKV_APPEND_ASYNC;
        a.seq_stride = (int64_t)nh * hd;
        ikv_decode_args d = ikv_decode_args_default();
        d.n_seqs = nb;
        d.n_q_heads = nh * g;
        d.q = dq;
        d.out = dout;
        d.seqs = sa;
        d.append = &a;
        IKVT_OK(ikv_decode(da, pa, &d));
        assert_int_equal(ikvt_rt.sync_(), 0);
        assert_int_equal(ikvt_rt.memcpy_(oa, dout, 4 * qn, IKVT_D2H), 0);
        IKVT_OK(ikv_pool_append_batch(pb, sb, nb, &a));
        d.seqs = sb;
        d.append = NULL;
        IKVT_OK(ikv_decode(db, pb, &d));
        assert_int_equal(ikvt_rt.sync_(), 0);
        assert_int_equal(ikvt_rt.memcpy_(ob, dout, 4 * qn, IKVT_D2H), 0);
        if (memcmp(oa, ob, 4 * qn) != 0) fail_msg("nh %u hd %u g %u nb %u step %u: outputs differ", nh, hd, g, nb, t);
    }
    assert_int_equal(appends_fused(da), g <= 8 ? 20 : 0);
    IKVT_OK(ikv_pool_sync(pa));
    IKVT_OK(ikv_pool_sync(pb));
    for (uint32_t b = 0; b < nb; ++b) {
        uint32_t la = 0, lb = 0;
        IKVT_OK(ikv_seq_length(pa, sa[b], &la));
        IKVT_OK(ikv_seq_length(pb, sb[b], &lb));
        assert_int_equal(la, 20 + 3 * b + 20);
        assert_int_equal(la, lb);
        float *r[4];
        for (int i = 0; i < 4; ++i) r[i] = malloc(4 * (size_t)la * nh * hd);
        IKVT_OK(ikv_seq_read(pa, sa[b], 0, 0, la, r[0], r[1]));
        IKVT_OK(ikv_seq_read(pb, sb[b], 0, 0, lb, r[2], r[3]));
        assert_memory_equal(r[0], r[2], 4 * (size_t)la * nh * hd);
        assert_memory_equal(r[1], r[3], 4 * (size_t)la * nh * hd);
        for (int i = 0; i < 4; ++i) free(r[i]);
    }
    ikvt_rt.free_(dk), ikvt_rt.free_(dv), ikvt_rt.free_(dq), ikvt_rt.free_(dout);
    free(x), free(k), free(v), free(oa), free(ob);
    ikv_decoder_destroy(da), ikv_decoder_destroy(db);
    ikv_pool_destroy(pa), ikv_pool_destroy(pb);
}

/* A two-token step whose decode writes the appended token (the fused path)
 * and whose plans read only the rooms: query token 0 sits before the room and
 * reads nothing, so its rows get out 0 and lse -inf, the header's empty
 * result (the fused merge cannot know the length read, so it keeps the rule
 * for finite queries), as with a separate append call; token 1 reads the
 * token it appended. Outputs and lse equal the separate calls byte for byte. */
static void test_fused_append_row_reads_nothing(void **state) {
    (void)state;
    enum { T = 2, QN = B * T * HQ * D, ROWS = B * T * HQ };
    fused_pair x;
    fused_pair_make(&x);
    ikv_plan *plans[B];
    for (uint32_t b = 0; b < B; ++b) { /* the room, one entry per page */
        const ikv_token_range room = {kPrefill[b], kPrefill[b] + ROOM};
        IKVT_OK(ikv_plan_from_ranges(&room, 1, kPrefill[b] + ROOM, P, IKV_FMT_F16, &plans[b]));
    }
    void *dq = ikvt_dev_upload(NULL, 4 * QN), *dout = ikvt_dev_upload(NULL, 4 * QN);
    void *dlse = ikvt_dev_upload(NULL, 4 * ROWS);
    float *q = malloc(4 * QN), *out[2] = {malloc(4 * QN), malloc(4 * QN)}, *lse[2] = {malloc(4 * ROWS), malloc(4 * ROWS)};
    ikvt_rng rng = {0xE3E3};
    ikvt_fill_normal(&rng, q, QN, 1.0f);
    assert_int_equal(ikvt_rt.memcpy_(dq, q, 4 * QN, IKVT_H2D), 0);
    step_input(0, x.k, x.v, x.q);
    assert_int_equal(ikvt_rt.memcpy_(x.bf.dk, x.k, 2 * KV_STEP, IKVT_H2D), 0);
    assert_int_equal(ikvt_rt.memcpy_(x.bf.dv, x.v, 2 * KV_STEP, IKVT_H2D), 0);
    for (int fused = 1; fused >= 0; --fused) {
        ikv_pool *pool = fused ? x.ga : x.gb;
        const ikv_seq_id *seqs = fused ? x.sa : x.sb;
        ikv_append a = layer_append(pool, &x.bf, x.stream, 0);
        if (!fused) IKVT_OK(ikv_pool_append_batch(pool, seqs, B, &a));
        ikv_decode_args d = decode_args(seqs, 0, dq, dout, x.stream, (const ikv_plan *const *)plans, PLAN);
        d.n_query_tokens = T;
        d.lse = dlse;
        d.append = fused ? &a : NULL;
        IKVT_OK(ikv_decode(fused ? x.da : x.db, pool, &d));
        assert_int_equal(ikvt_rt.stream_sync_(x.stream), 0);
        assert_int_equal(ikvt_rt.memcpy_(out[fused], dout, 4 * QN, IKVT_D2H), 0);
        assert_int_equal(ikvt_rt.memcpy_(lse[fused], dlse, 4 * ROWS, IKVT_D2H), 0);
    }
    assert_int_equal(appends_fused(x.da), 1); /* the path under test was taken */
    for (size_t r = 0; r < ROWS; ++r) {
        const int token0 = r / HQ % T == 0;
        if (token0 ? lse[1][r] != -INFINITY : !isfinite(lse[1][r]))
            fail_msg("row %zu (query token %d): lse %g", r, token0 ? 0 : 1, (double)lse[1][r]);
        for (size_t dd = 0; dd < D && token0; ++dd)
            if (out[1][r * D + dd] != 0.0f) fail_msg("row %zu reads nothing: out %g", r, (double)out[1][r * D + dd]);
    }
    assert_memory_equal(out[1], out[0], 4 * QN);
    assert_memory_equal(lse[1], lse[0], 4 * ROWS);
    for (uint32_t b = 0; b < B; ++b) ikv_plan_destroy(plans[b]);
    ikvt_rt.free_(dq), ikvt_rt.free_(dout), ikvt_rt.free_(dlse);
    free(q), free(out[0]), free(out[1]), free(lse[0]), free(lse[1]);
    fused_pair_free(&x);
}

static void test_fused_append_shapes(void **state) {
    (void)state;
    fused_vs_separate(4, 128, 4, 10); /* the benchmark's group, sequences past the inline tails */
    fused_vs_separate(2, 256, 2, 3);  /* two channels per thread */
    fused_vs_separate(1, 64, 12, 2);  /* 12 query rows: the append kernel first */
}

int main(void) {
    /* The CPU pool is the fp32 model the CUDA pool is checked against: its INT8
     * value sums stay in fp32 (the AVX-512 VNNI integer path has its own float64
     * bound in test_decode). Set before the first library call picks the kernels. */
    setenv("IKV_CPU_VNNI", "off", 1);
    ikvt_require_cuda_device();
    const char *filter = getenv("IKVT_TEST_FILTER"); /* e.g. for compute-sanitizer runs of one test */
    if (filter) cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_room_append_refusals),
        cmocka_unit_test(test_dense_step_replayed),
        cmocka_unit_test(test_plan_step_replayed),
        cmocka_unit_test(test_topk_step_replayed),
        cmocka_unit_test(test_dense_step_fused),
        cmocka_unit_test(test_plan_step_fused),
        cmocka_unit_test(test_topk_step_fused),
        cmocka_unit_test(test_fused_append_eager),
        cmocka_unit_test(test_fused_append_shapes),
        cmocka_unit_test(test_fused_append_row_reads_nothing),
        cmocka_unit_test(test_fused_append_layers_apart),
    };
    return cmocka_run_group_tests_name("gpu_graph_step", tests, NULL, NULL);
}
