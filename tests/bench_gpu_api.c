/* The intentkv side of the GPU decode table (bench/RESULTS.md opening table,
 * issue 18), through the public API as an engine calls it: per shape and
 * column, 20 warm-up calls, then 200 back-to-back ikv_decode calls on one
 * stream (or 200 replays of one captured call) between two host clocks with
 * the stream synchronized at both ends; the median of 3 such runs. Shapes:
 * 32 q-heads, 8 kv-heads, head_dim 128, page 16, F16 queries and output, one
 * query token, one layer; B x context 1 x 32K, 1 x 128K, 8 x 32K, 32 x 16K.
 * Columns: dense per page format; "plan25": a plan of the pages
 * bench/gpu/peer_table.py hands FlashInfer (page 4k + (7k + 3b) % 4 of
 * sequence b: exactly a quarter, scattered); "topk25": device Quest top-k to
 * a quarter of the tokens; "-graph": the same step captured (global mode)
 * after one eager call and replayed; "-graph4": four such calls captured in
 * one graph, the time per call; "hyb25" / "hyb25-mem": top-k on the
 * hybrid score without / with a query memory of 4 ended turns; "keys25":
 * IKV_TOPK_SCORE_KEYS (hybrid candidates for half the tokens, ranked again
 * by their keys);
 * "dense-feedback": dense with attention feedback (its shares copied back behind the step);
 * "plan25-t4" / "topk25-t4": those with 4 query tokens;
 * "dense-t<T>" (T = 2, 4, ..., 512): T query tokens a step (a speculative
 * decode's draft; 4T query rows per kv-head); "dense-feedback-t8": 8 tokens
 * with feedback (32 rows per kv-head: two row chunks of the fused kernel's feedback variant).
 * Prints `RESULT <B> <ctx> <column> <ms>` lines (read by peer_table.py) and
 * the K/V bytes each column reads. Not a CTest test: run by the device
 * scripts, `build/tests/bench_gpu_api`; IKV_API_ONLY=<column>[,...] runs only
 * those columns, IKV_API_SHAPES=<B>x<ctx>[,...] only those shapes (for a
 * profiler: e.g. 8x32768). Skips without a CUDA device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "support.h"

enum { HQ = 32, HKV = 8, D = 128, P = 16, CHUNK = 4096, WARM = 20, STEPS = 200, RUNS = 3, T_MAX = 512 };

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median over RUNS of the mean time of STEPS back-to-back calls (eager) or replays (exec). */
static double time_steps(ikv_decoder *dec, ikv_pool *pool, const ikv_decode_args *a, void *exec, void *stream) {
    double runs[RUNS];
    for (int r = 0; r < RUNS; ++r) {
        for (int i = 0; i < (r == 0 ? WARM : 2); ++i) {
            if (exec)
                assert_int_equal(ikvt_rt.graph_launch_(exec, stream), 0);
            else
                IKVT_OK(ikv_decode(dec, pool, a));
        }
        assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
        const double t0 = ikvt_now_us();
        for (int i = 0; i < STEPS; ++i) {
            if (exec)
                assert_int_equal(ikvt_rt.graph_launch_(exec, stream), 0);
            else
                IKVT_OK(ikv_decode(dec, pool, a));
        }
        assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
        runs[r] = (ikvt_now_us() - t0) / STEPS * 1e-3;
    }
    qsort(runs, RUNS, sizeof runs[0], cmp_double);
    return runs[RUNS / 2];
}

/* Whether the comma-separated list in environment variable `var` names
 * `name` (an unset or empty variable names everything). */
static int env_lists(const char *var, const char *name) {
    const char *only = getenv(var);
    if (only == NULL || *only == '\0') return 1;
    const size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p += len + (end != NULL);
    }
    return 0;
}

/* IKV_API_ONLY=<name>[,<name>...]: only the columns named (for a quick device run). */
static int wanted(const char *column) { return env_lists("IKV_API_ONLY", column); }

/* IKV_API_SHAPES=<B>x<ctx>[,...]: only the shapes named. */
static int wanted_shape(uint32_t B, uint32_t ctx) {
    char name[32];
    snprintf(name, sizeof name, "%ux%u", B, ctx);
    return env_lists("IKV_API_SHAPES", name);
}

/* The eager time, then (with_graph) the replay time of one captured call. */
static void time_column(ikv_decoder *dec, ikv_pool *pool, ikv_decode_args *a, void *stream, uint32_t B, uint32_t ctx,
                        const char *column, int with_graph) {
    if (!wanted(column)) return;
    const double eager = time_steps(dec, pool, a, NULL, stream);
    uint64_t bytes = 0;
    IKVT_OK(ikv_decoder_last_bytes_read(dec, &bytes));
    printf("RESULT %u %u %s %.5f\n", B, ctx, column, eager);
    printf("  (%s: %.1f MB read per call by the library's count, %.0f GB/s)\n", column, bytes / 1e6,
           bytes / (eager * 1e-3) / 1e9);
    if (!with_graph) return;
    void *graph = NULL, *exec = NULL;
    IKVT_OK(ikv_decode(dec, pool, a)); /* the eager call the capture follows */
    assert_int_equal(ikvt_rt.begin_capture_(stream, IKVT_CAPTURE_GLOBAL), 0);
    const ikv_status st = ikv_decode(dec, pool, a);
    assert_int_equal(ikvt_rt.end_capture_(stream, &graph), 0);
    IKVT_OK(st);
    assert_int_equal(ikvt_rt.graph_instantiate_(&exec, graph, 0), 0);
    printf("RESULT %u %u %s-graph %.5f\n", B, ctx, column, time_steps(dec, pool, a, exec, stream));
    ikvt_rt.graph_exec_destroy_(exec);
    ikvt_rt.graph_destroy_(graph);
    /* Four calls in one graph, as an engine captures a step's layers: the
     * time per call, without one graph launch per call. */
    enum { PER_GRAPH = 4 };
    assert_int_equal(ikvt_rt.begin_capture_(stream, IKVT_CAPTURE_GLOBAL), 0);
    ikv_status st4 = IKV_OK;
    for (int i = 0; i < PER_GRAPH && st4 == IKV_OK; ++i) st4 = ikv_decode(dec, pool, a);
    assert_int_equal(ikvt_rt.end_capture_(stream, &graph), 0);
    IKVT_OK(st4);
    assert_int_equal(ikvt_rt.graph_instantiate_(&exec, graph, 0), 0);
    printf("RESULT %u %u %s-graph%d %.5f\n", B, ctx, column, PER_GRAPH,
           time_steps(dec, pool, a, exec, stream) / PER_GRAPH);
    ikvt_rt.graph_exec_destroy_(exec);
    ikvt_rt.graph_destroy_(graph);
}

/* Sequence b's plan: page 4k + (7k + 3b) % 4 of every four (as peer_table.py selects). */
static ikv_plan *quarter_plan(uint32_t b, uint32_t ctx, ikv_format fmt) {
    const uint32_t n = ctx / P / 4;
    ikv_token_range *r = malloc(sizeof *r * n);
    for (uint32_t k = 0; k < n; ++k) {
        const uint32_t page = 4 * k + (7 * k + 3 * b) % 4;
        r[k].begin = page * P;
        r[k].end = page * P + P;
    }
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_plan_from_ranges(r, n, ctx, P, fmt, &plan));
    free(r);
    return plan;
}

static void test_api_table(void **state) {
    (void)state;
    static const uint32_t shapes[][2] = {{1, 32768}, {1, 131072}, {8, 32768}, {32, 16384}};
    static const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_BF16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    static const char *const names[] = {"f16", "bf16", "fp8", "int8", "int4"};
    ikvt_rng rng = {0x7AB1E};
    const size_t chunk_elems = (size_t)CHUNK * HKV * D;
    void *dk = ikvt_dev_normal_f16(&rng, chunk_elems), *dv = ikvt_dev_normal_f16(&rng, chunk_elems);
    void *stream = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
    printf("intentkv GPU decode table: %d q-heads, %d kv-heads, head_dim %d, page %d, F16 q/out, one query token (the -t<T> columns: T); "
           "%d back-to-back calls, median of %d runs\n", HQ, HKV, D, P, STEPS, RUNS);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; ++si) {
        const uint32_t B = shapes[si][0], ctx = shapes[si][1];
        if (!wanted_shape(B, ctx)) continue;
        for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; ++fi) {
            char dense_name[32];
            snprintf(dense_name, sizeof dense_name, "dense-%s", names[fi]);
            if (fmts[fi] != IKV_FMT_F16 && !wanted(dense_name)) continue;  /* the other columns need F16 pages */
            ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){
                .backend = IKV_BACKEND_CUDA, .n_layers = 1, .n_kv_heads = HKV, .head_dim = D, .page_size = P,
                .capacity_bytes = (uint64_t)B * ctx * 4400u + (64u << 20), /* 4 KiB K+V per token, summaries */
                .default_format = fmts[fi], .kv_dtype = IKV_DTYPE_F16});
            ikv_seq_id seqs[32];
            for (uint32_t b = 0; b < B; ++b) {
                IKVT_OK(ikv_seq_create(pool, &seqs[b]));
                for (uint32_t t = 0; t < ctx; t += CHUNK) {
                    ikv_append ap = ikv_append_default(pool, CHUNK);
                    ap.k = dk;
                    ap.v = dv;
                    ap.src_on_device = 1;
                    IKVT_OK(ikv_pool_append(pool, seqs[b], &ap));
                }
            }
            const size_t n_q = (size_t)B * T_MAX * HQ * D; /* room for the multi-token columns */
            float *qf = malloc(4 * n_q);
            uint16_t *qh = malloc(2 * n_q);
            ikvt_fill_normal(&rng, qf, n_q, 1.0f);
            ikvt_to_f16(qf, qh, n_q);
            void *dq = ikvt_dev_upload(qh, 2 * n_q), *dout = ikvt_dev_upload(NULL, 2 * n_q);
            ikv_decoder_config dc = ikv_decoder_default_config();
            ikv_decoder *dec = NULL;
            IKVT_OK(ikv_decoder_create(&dc, &dec));
            ikv_decode_args a = ikv_decode_args_default();
            a.n_seqs = B;
            a.seqs = seqs;
            a.n_q_heads = HQ;
            a.q = dq;
            a.q_dtype = IKV_DTYPE_F16;
            a.out = dout;
            a.out_dtype = IKV_DTYPE_F16;
            a.stream = stream;
            char column[32];
            snprintf(column, sizeof column, "dense-%s", names[fi]);
            const int f16 = fmts[fi] == IKV_FMT_F16;
            time_column(dec, pool, &a, stream, B, ctx, column, f16);
            if (f16) {
                const ikv_plan *plans[32];
                for (uint32_t b = 0; b < B; ++b) plans[b] = quarter_plan(b, ctx, fmts[fi]);
                a.plans = plans;
                time_column(dec, pool, &a, stream, B, ctx, "plan25", 1);
                a.n_query_tokens = 4; /* a 4-token draft over the same pages */
                time_column(dec, pool, &a, stream, B, ctx, "plan25-t4", 0);
                a.n_query_tokens = 1;
                a.plans = NULL;
                for (uint32_t b = 0; b < B; ++b) ikv_plan_destroy((ikv_plan *)plans[b]);
                a.topk_token_budget = ctx / 4;
                time_column(dec, pool, &a, stream, B, ctx, "topk25", 1);
                a.n_query_tokens = 4;
                time_column(dec, pool, &a, stream, B, ctx, "topk25-t4", 0);
                a.n_query_tokens = 1;
                /* What issue 17's selection adds: the hybrid score, then with a query
                 * memory of 4 ended turns per sequence (recall + twice the scored rows). */
                a.topk_score = IKV_TOPK_SCORE_HYBRID;
                time_column(dec, pool, &a, stream, B, ctx, "hyb25", 0);
                a.topk_score = IKV_TOPK_SCORE_KEYS; /* hybrid candidates for 50%, ranked again by their keys */
                time_column(dec, pool, &a, stream, B, ctx, "keys25", 0);
                a.topk_score = IKV_TOPK_SCORE_HYBRID;
                ikv_query_memory_config mc = ikv_query_memory_default_config();
                mc.n_q_heads = HQ;
                ikv_query_memory *mem = NULL;
                IKVT_OK(ikv_query_memory_create(pool, &mc, &mem));
                for (uint32_t b = 0; b < B; ++b)
                    for (int turn = 0; turn < 4; ++turn) {
                        ikvt_fill_normal(&rng, qf, (size_t)HQ * D, 1.0f);
                        IKVT_OK(ikv_query_memory_remember(mem, seqs[b], 0, qf, IKV_DTYPE_F32, 1));
                        IKVT_OK(ikv_query_memory_end_turn(mem, seqs[b]));
                    }
                a.query_memory = mem;
                time_column(dec, pool, &a, stream, B, ctx, "hyb25-mem", 0);
                a.query_memory = NULL;
                ikv_query_memory_destroy(mem);
                a.topk_score = IKV_TOPK_SCORE_QUEST;
                a.topk_token_budget = 0;
                /* A dense step with attention feedback (its shares copied to the host behind it, folded by the next call). */
                ikv_page_feedback_config fc = ikv_page_feedback_default_config();
                ikv_page_feedback *fb = NULL;
                IKVT_OK(ikv_page_feedback_create(pool, &fc, &fb));
                a.feedback = fb;
                time_column(dec, pool, &a, stream, B, ctx, "dense-feedback", 0);
                /* More query rows per kv-head than one 16-row feedback tile. */
                a.n_query_tokens = 8;
                time_column(dec, pool, &a, stream, B, ctx, "dense-feedback-t8", 0);
                a.feedback = NULL;
                for (uint32_t t = 2; t <= T_MAX; t *= 2) {
                    snprintf(column, sizeof column, "dense-t%u", t);
                    a.n_query_tokens = t;
                    time_column(dec, pool, &a, stream, B, ctx, column, 0);
                }
                a.n_query_tokens = 1;
                ikv_page_feedback_destroy(fb);
            }
            ikv_decoder_destroy(dec);
            ikvt_rt.free_(dq), ikvt_rt.free_(dout);
            free(qf), free(qh);
            ikv_pool_destroy(pool);
            fflush(stdout);
        }
    }
    ikvt_rt.stream_destroy_(stream);
    ikvt_rt.free_(dk), ikvt_rt.free_(dv);
}

int main(void) {
    ikvt_require_cuda_device();
    const struct CMUnitTest t[] = {cmocka_unit_test(test_api_table)};
    return cmocka_run_group_tests_name("bench_gpu_api", t, NULL, NULL);
}
