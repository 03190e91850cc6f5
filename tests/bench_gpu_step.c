/* An engine's whole decode step through the public API (issue 19): 32 layers,
 * 32 q-heads, 8 kv-heads, head_dim 128, page 16, F16 pages, K/V input,
 * queries and output; per layer one ikv_pool_append_batch of one token per
 * sequence from device memory (IKV_APPEND_ASYNC) and one dense ikv_decode.
 * Shapes B x context: 1 x 32K, 8 x 8K, 8 x 32K, 32 x 4K. Columns, each the
 * median of 3 runs of STEPS back-to-back steps on one stream between host
 * clocks (stream synchronized at both ends), in ms per step; every column
 * starts from the same lengths (sequences truncated back to the context),
 * those without appends at the mean length the appending ones see:
 *   decode-only        the 32 decodes alone, eager;
 *   decode-only-graph  the 32 decodes captured once and replayed;
 *   step-eager         appends + decodes, eager, sequences without room;
 *   step-room-eager    the same with room reserved (ikv_pool_reserve);
 *   step-graph         the whole step (room) captured once and replayed;
 *   step-fused-eager, step-fused-graph: the room steps with each layer's
 *                      append passed to its decode (ikv_decode_args.append:
 *                      the decode's kernels write the token);
 *   append-only[-room][-graph], decode-only-room[-graph]: the parts alone.
 * Lines `STEP <B> <ctx> <column> <ms>`, then the ratios to decode-only.
 * IKV_STEP_SHAPE=<i> runs shape i alone (for a profiler); IKV_STEP_COLUMNS=
 * <name>,<name>,... only those columns (the others print nan; a name that is
 * not a column fails the run).
 * Not a CTest test: `build/tests/bench_gpu_step` on the device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "support.h"

enum { L = 32, HQ = 32, HKV = 8, D = 128, P = 16, CHUNK = 4096, WARM = 10, STEPS = 100, RUNS = 3 };
enum { GROWTH = WARM + RUNS * (STEPS + 2) }; /* tokens a column appends to every sequence */
enum { ROOM = GROWTH + 16 };

typedef struct step {
    ikv_pool *pool;
    ikv_decoder *dec;
    const ikv_seq_id *seqs;
    uint32_t B;
    void *dk, *dv, *dq, *dout; /* one step's input and output, every layer */
    void *stream;
    int appends, decodes;
    int fused; /* appends through the decodes' args->append */
} step;

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run_step(const step *s) {
    for (uint32_t l = 0; l < L; ++l) {
        ikv_append a = ikv_append_default(s->pool, 1);
        a.layer = l;
        a.k = (const uint16_t *)s->dk + (size_t)l * s->B * HKV * D;
        a.v = (const uint16_t *)s->dv + (size_t)l * s->B * HKV * D;
        a.src_on_device = 1;
        a.stream = s->stream;
        a.flags = IKV_APPEND_ASYNC;
        const int fused = s->fused && s->appends && s->decodes;
        if (s->appends && !fused) IKVT_OK(ikv_pool_append_batch(s->pool, s->seqs, s->B, &a));
        if (!s->decodes) continue;
        ikv_decode_args d = ikv_decode_args_default();
        d.layer = l;
        d.n_seqs = s->B;
        d.seqs = s->seqs;
        d.n_q_heads = HQ;
        d.q = (const uint16_t *)s->dq + (size_t)l * s->B * HQ * D;
        d.q_dtype = IKV_DTYPE_F16;
        d.out = (uint16_t *)s->dout + (size_t)l * s->B * HQ * D;
        d.out_dtype = IKV_DTYPE_F16;
        d.stream = s->stream;
        d.append = fused ? &a : NULL;
        IKVT_OK(ikv_decode(s->dec, s->pool, &d));
    }
}

/* Median over RUNS of the mean time of STEPS steps (exec: graph replays). */
static double time_steps(const step *s, void *exec) {
    double runs[RUNS];
    for (int r = 0; r < RUNS; ++r) {
        for (int i = 0; i < (r == 0 ? WARM : 2); ++i) {
            if (exec)
                assert_int_equal(ikvt_rt.graph_launch_(exec, s->stream), 0);
            else
                run_step(s);
        }
        assert_int_equal(ikvt_rt.stream_sync_(s->stream), 0);
        const double t0 = ikvt_now_us();
        for (int i = 0; i < STEPS; ++i) {
            if (exec)
                assert_int_equal(ikvt_rt.graph_launch_(exec, s->stream), 0);
            else
                run_step(s);
        }
        assert_int_equal(ikvt_rt.stream_sync_(s->stream), 0);
        runs[r] = (ikvt_now_us() - t0) / STEPS * 1e-3;
    }
    qsort(runs, RUNS, sizeof runs[0], cmp_double);
    return runs[RUNS / 2];
}

/* Every sequence back to ctx tokens (no room): each column starts from the same lengths. */
static void reset(const step *s, uint32_t ctx) {
    IKVT_OK(ikv_pool_reserve(s->pool, s->seqs, s->B, 0));
    for (uint32_t b = 0; b < s->B; ++b) {
        uint32_t len = 0;
        IKVT_OK(ikv_seq_length(s->pool, s->seqs[b], &len));
        IKVT_OK(ikv_seq_truncate(s->pool, s->seqs[b], len - ctx));
    }
}

/* The step captured once (global mode), after one eager step (so the capture
 * reuses its page lists, as an engine's would), and replayed. */
static double time_graph(const step *s) {
    void *graph = NULL, *exec = NULL;
    run_step(s);
    assert_int_equal(ikvt_rt.begin_capture_(s->stream, IKVT_CAPTURE_GLOBAL), 0);
    run_step(s);
    assert_int_equal(ikvt_rt.end_capture_(s->stream, &graph), 0);
    assert_int_equal(ikvt_rt.graph_instantiate_(&exec, graph, 0), 0);
    const double ms = time_steps(s, exec);
    ikvt_rt.graph_exec_destroy_(exec);
    ikvt_rt.graph_destroy_(graph);
    return ms;
}

/* The columns, in the order they run and print (see the header comment). */
enum { NCOL = 12 };
static const char *const names[NCOL] = {"decode-only", "decode-only-graph", "step-eager", "step-room-eager",
                                      "step-graph", "append-only", "append-only-room", "append-only-room-graph",
                                      "decode-only-room", "decode-only-room-graph", "step-fused-eager",
                                      "step-fused-graph"};

/* The column named by IKV_STEP_COLUMNS's item [at, at + len), or -1. */
static int column_index(const char *at, size_t len) {
    for (int c = 0; c < NCOL; ++c)
        if (strlen(names[c]) == len && strncmp(at, names[c], len) == 0) return c;
    return -1;
}

/* wanted[c]: whether IKV_STEP_COLUMNS (comma-separated names; unset or
 * empty: all) names column c. An unknown name fails the run, naming it. */
static void wanted_columns(int wanted[NCOL]) {
    const char *list = getenv("IKV_STEP_COLUMNS");
    for (int c = 0; c < NCOL; ++c) wanted[c] = !list || !*list;
    if (!list || !*list) return;
    for (const char *at = list;;) {
        const char *end = strchr(at, ',');
        const size_t len = end ? (size_t)(end - at) : strlen(at);
        if (len > 0) { /* empty items (",," or a trailing comma) name nothing */
            const int c = column_index(at, len);
            if (c < 0) fail_msg("IKV_STEP_COLUMNS: no column is named '%.*s'", (int)len, at);
            wanted[c] = 1;
        }
        if (!end) break;
        at = end + 1;
    }
}

static void test_engine_step(void **state) {
    (void)state;
    static const uint32_t shapes[][2] = {{1, 32768}, {8, 8192}, {8, 32768}, {32, 4096}};
    int wanted[NCOL];
    wanted_columns(wanted); /* before any work: a misspelled name fails at once */
    ikvt_rng rng = {0x57E9};
    const size_t chunk_elems = (size_t)CHUNK * HKV * D;
    void *dk = ikvt_dev_normal_f16(&rng, chunk_elems), *dv = ikvt_dev_normal_f16(&rng, chunk_elems);
    printf("engine step: %d layers, %d q-heads, %d kv-heads, head_dim %d, page %d, F16; %d steps, median of %d runs\n",
           L, HQ, HKV, D, P, STEPS, RUNS);
    const char *only = getenv("IKV_STEP_SHAPE"); /* an index into shapes: that one alone (profiling) */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; ++si) {
        if (only && *only && (size_t)atoi(only) != si) continue;
        const uint32_t B = shapes[si][0], ctx = shapes[si][1];
        ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){
            .backend = IKV_BACKEND_CUDA, .n_layers = L, .n_kv_heads = HKV, .head_dim = D, .page_size = P,
            .capacity_bytes = (uint64_t)B * (ctx + 2 * ROOM + 2 * P) * L * 4608u + (256u << 20),
            .default_format = IKV_FMT_F16, .kv_dtype = IKV_DTYPE_F16});
        ikv_seq_id seqs[32];
        for (uint32_t b = 0; b < B; ++b) {
            IKVT_OK(ikv_seq_create(pool, &seqs[b]));
            for (uint32_t t = 0; t < ctx; t += CHUNK)
                for (uint32_t l = 0; l < L; ++l) { /* every layer from the same rows */
                    ikv_append ap = ikv_append_default(pool, CHUNK);
                    ap.layer = l;
                    ap.k = dk;
                    ap.v = dv;
                    ap.src_on_device = 1;
                    IKVT_OK(ikv_pool_append(pool, seqs[b], &ap));
                }
        }
        const size_t n_kv = (size_t)L * B * HKV * D, n_q = (size_t)L * B * HQ * D;
        float *qf = malloc(4 * n_q);
        uint16_t *qh = malloc(2 * n_q);
        ikvt_fill_normal(&rng, qf, n_q, 1.0f);
        ikvt_to_f16(qf, qh, n_q);
        ikv_decoder_config dc = ikv_decoder_default_config();
        ikv_decoder *dec = NULL;
        IKVT_OK(ikv_decoder_create(&dc, &dec));
        step s = {pool, dec, seqs, B, ikvt_dev_upload(NULL, 2 * n_kv), ikvt_dev_upload(NULL, 2 * n_kv),
                  ikvt_dev_upload(qh, 2 * n_q), ikvt_dev_upload(NULL, 2 * n_q), NULL, 0, 1, 0};
        assert_int_equal(ikvt_rt.memset_(s.dk, 0x3C, 2 * n_kv), 0); /* the steps' K/V: f16 0x3C3C = 1.06 */
        assert_int_equal(ikvt_rt.memset_(s.dv, 0x3C, 2 * n_kv), 0);
        assert_int_equal(ikvt_rt.stream_create_(&s.stream), 0);

        /* Columns that append start at ctx tokens and end GROWTH later; the
         * decode-only columns run at ctx + GROWTH/2, their mean length. */
        double ms[NCOL];
        const int appends[NCOL] = {0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1}, decodes[NCOL] = {1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1};
        const int room[NCOL] = {0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1}, graph[NCOL] = {0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 0, 1};
        const int fused[NCOL] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
        for (int c = 0; c < NCOL; ++c) {
            ms[c] = NAN;
            if (!wanted[c]) continue;
            reset(&s, ctx);
            if (!appends[c]) { /* to the mean length of an appending column */
                s.appends = 1, s.decodes = 0;
                for (uint32_t t = 0; t < GROWTH / 2; ++t) run_step(&s);
            }
            if (room[c]) IKVT_OK(ikv_pool_reserve(pool, seqs, B, ROOM));
            s.appends = appends[c], s.decodes = decodes[c], s.fused = fused[c];
            ms[c] = graph[c] ? time_graph(&s) : time_steps(&s, NULL);
            IKVT_OK(ikv_pool_sync(pool)); /* takes the lengths replays reached; reports an overrun */
        }
        s.appends = 1, s.decodes = 1, s.fused = 0;
        for (int c = 0; c < NCOL; ++c) printf("STEP %u %u %s %.4f\n", B, ctx, names[c], ms[c]);
        printf("  B=%u ctx=%u: step-eager %.3fx, step-room-eager %.3fx, step-graph %.3fx, step-fused-eager %.3fx, "
               "step-fused-graph %.3fx the eager decodes alone; step-graph %.3fx, step-fused-graph %.3fx the "
               "decode-only graph\n",
               B, ctx, ms[2] / ms[0], ms[3] / ms[0], ms[4] / ms[0], ms[10] / ms[0], ms[11] / ms[0], ms[4] / ms[1],
               ms[11] / ms[1]);
        fflush(stdout);
        ikvt_rt.stream_destroy_(s.stream);
        ikvt_rt.free_(s.dk), ikvt_rt.free_(s.dv), ikvt_rt.free_(s.dq), ikvt_rt.free_(s.dout);
        free(qf), free(qh);
        ikv_decoder_destroy(dec);
        ikv_pool_destroy(pool);
    }
    ikvt_rt.free_(dk), ikvt_rt.free_(dv);
}

int main(void) {
    ikvt_require_cuda_device();
    const struct CMUnitTest t[] = {cmocka_unit_test(test_engine_step)};
    return cmocka_run_group_tests_name("bench_gpu_step", t, NULL, NULL);
}
