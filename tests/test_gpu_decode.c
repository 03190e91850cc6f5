/* The CUDA backend through the public API.
 *
 * Everywhere (CI without a GPU included): a CUDA pool on a build without CUDA
 * or on a machine without a GPU, or on a device ordinal that does not exist,
 * is refused with IKV_E_NO_DEVICE and a sentence, and nothing is created.
 * Then, without a GPU, the program prints "SKIPPED: no CUDA device" and
 * exits 77 (CTest reports it as skipped).
 *
 * With a GPU: a CUDA pool and a CPU pool get identical appends in every
 * format; their stored values and key summaries must be identical (the
 * device quantize-on-write writes the same bytes), and CUDA decode (device
 * q/out/lse, dense, a plan with partial pages, causal multi-token steps,
 * query-aware top-k, long multi-token steps) must match the CPU decode and a
 * float64 reference. CTest runs the program once per CUDA multi-token path
 * (IKV_CUDA_MULTI_TOKEN = auto, fused, gemm), so every step above runs on the
 * fused kernel and on the cuBLASLt GEMM path.
 * The pools have head_dim 128; the *_head_dim_32 tests repeat the format
 * matrix and the long multi-token step at head_dim 32, the smallest the CUDA
 * kernels take (SIMT: 4 lanes per row; tensor cores: 2 k-steps for S and 4
 * n-tiles for P V; score kernel: one lane per page; 16-byte INT4 rows).
 * IKV_GPU_DECODE_BENCH=1 adds a timing run of ikv_decode itself (no
 * assertion on times; lines start with "BENCH"): run_decode_bench below;
 * =only runs just the timing run.
 * Device memory for q/out/lse comes from the CUDA runtime loaded with dlopen,
 * so the test needs nothing beyond the public header.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cuda_rt.h"
#include "list_reuse.h"
#include "support.h"

/* ---- runs everywhere ---- */

static void test_cuda_pool_refused_without_device(void **state) {
    (void)state;
    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    IKVT_OK(ikv_runtime_info_get(&info));
    ikv_pool_config c = ikv_pool_default_config();
    c.backend = IKV_BACKEND_CUDA;
    c.n_layers = 1;
    c.n_kv_heads = 1;
    c.head_dim = 64;
    c.capacity_bytes = 1 << 20;
    ikv_pool *pool = NULL;
    if (!info.cuda_built || info.cuda_device_count == 0) {
        IKVT_EXPECT_STATUS(ikv_pool_create(&c, &pool), IKV_E_NO_DEVICE, "CUDA");
        assert_null(pool);
    }
    /* A device ordinal that does not exist is refused in every build. */
    c.device = 999;
    IKVT_EXPECT_STATUS(ikv_pool_create(&c, &pool), IKV_E_NO_DEVICE, NULL);
    assert_null(pool);
}

/* ---- GPU: CUDA pool + decode against the CPU pool + decode and float64 ---- */

enum { L = 2, HKV = 2, P = 16, G = 4, HQ = HKV * G, D_MAX = 256 };
/* head_dim of the pools the GPU tests make: 128, or 32 / 64 / 256 between
 * the use_head_dim_* setups and their teardown (at most D_MAX). */
static uint32_t D = 128;

/* use_head_dim_<n>: a cmocka setup making the pools' head_dim n. */
#define USE_HEAD_DIM(n)                         \
    static int use_head_dim_##n(void **state) { \
        (void)state;                            \
        D = n;                                  \
        return 0;                               \
    }
USE_HEAD_DIM(32)
USE_HEAD_DIM(64)
USE_HEAD_DIM(256)
static int use_head_dim_128(void **state) {
    (void)state;
    D = 128;
    return 0;
}

static ikv_pool *make_pool(ikv_backend backend, ikv_format fmt) {
    return ikvt_make_pool((ikvt_pool_spec){.backend = backend, .n_layers = L, .n_kv_heads = HKV, .head_dim = D,
                                           .page_size = P, .capacity_bytes = 64u << 20, .default_format = fmt});
}

/* Appends the same random tokens to both pools, in uneven chunks (the tail page is re-quantized). */
static void fill_both(ikv_pool *a, ikv_pool *b, ikv_seq_id *sa, ikv_seq_id *sb, uint32_t n_tokens, ikvt_rng *rng) {
    IKVT_OK(ikv_seq_create(a, sa));
    IKVT_OK(ikv_seq_create(b, sb));
    uint32_t done = 0;
    while (done < n_tokens) {
        uint32_t n = 1 + (uint32_t)(ikvt_uniform(rng) * 40);
        if (n > n_tokens - done) n = n_tokens - done;
        const size_t per_layer = (size_t)n * HKV * D;
        float *k = malloc(sizeof(float) * per_layer * L), *v = malloc(sizeof(float) * per_layer * L);
        ikvt_fill_normal(rng, k, per_layer * L, 1.0f);
        ikvt_fill_normal(rng, v, per_layer * L, 1.0f);
        for (size_t i = 0; i < per_layer * L; i += 7) k[i] += 2.0f; /* uneven channels */
        ikv_append ap = ikv_append_default(a, n);
        ap.layer = IKV_ALL_LAYERS;
        ap.k = k;
        ap.v = v;
        ap.layer_stride = (int64_t)per_layer;
        IKVT_OK(ikv_pool_append(a, *sa, &ap));
        IKVT_OK(ikv_pool_append(b, *sb, &ap));
        free(k);
        free(v);
        done += n;
    }
}

static void expect_same_storage(ikv_pool *cpu, ikv_seq_id sc, ikv_pool *gpu, ikv_seq_id sg, uint32_t len) {
    const size_t n = (size_t)len * HKV * D;
    float *k1 = malloc(4 * n), *v1 = malloc(4 * n), *k2 = malloc(4 * n), *v2 = malloc(4 * n);
    for (uint32_t l = 0; l < L; ++l) {
        IKVT_OK(ikv_seq_read(cpu, sc, l, 0, len, k1, v1));
        IKVT_OK(ikv_seq_read(gpu, sg, l, 0, len, k2, v2));
        assert_memory_equal(k1, k2, 4 * n);
        assert_memory_equal(v1, v2, 4 * n);
        for (uint32_t pg = 0; pg * P < len; ++pg)
            for (uint32_t h = 0; h < HKV; ++h) {
                float a[3 * D_MAX], b[3 * D_MAX];
                uint32_t na = 0, nb = 0;
                IKVT_OK(ikv_seq_page_summary(cpu, sc, l, h, pg, a, a + D, a + 2 * D, &na));
                IKVT_OK(ikv_seq_page_summary(gpu, sg, l, h, pg, b, b + D, b + 2 * D, &nb));
                assert_int_equal(na, nb);
                assert_memory_equal(a, b, sizeof(float) * 3 * D);
            }
    }
    free(k1), free(v1), free(k2), free(v2);
}

/* Float64 attention of one sequence over the token ranges (NULL = all), causal. */
static void reference(ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t len, const ikv_token_range *ranges,
                      size_t n_ranges, uint32_t T, const float *q, float scale, double *out, double *lse) {
    const size_t n = (size_t)len * HKV * D;
    float *k = malloc(4 * n), *v = malloc(4 * n);
    IKVT_OK(ikv_seq_read(pool, seq, layer, 0, len, k, v));
    double *kk = malloc(8 * (size_t)len * D), *vv = malloc(8 * (size_t)len * D), qd[D_MAX];
    for (uint32_t t = 0; t < T; ++t)
        for (uint32_t h = 0; h < HQ; ++h) {
            const uint32_t kvh = h / G, qpos = len - T + t;
            size_t m = 0;
            for (uint32_t j = 0; j <= qpos; ++j) {
                int in = ranges == NULL;
                for (size_t r = 0; r < n_ranges && !in; ++r) in = j >= ranges[r].begin && j < ranges[r].end;
                if (!in) continue;
                for (uint32_t d = 0; d < D; ++d) {
                    kk[m * D + d] = k[((size_t)j * HKV + kvh) * D + d];
                    vv[m * D + d] = v[((size_t)j * HKV + kvh) * D + d];
                }
                ++m;
            }
            for (uint32_t d = 0; d < D; ++d) qd[d] = q[((size_t)t * HQ + h) * D + d];
            ikvt_ref_attention(qd, kk, vv, m, D, scale, 0.0, out + ((size_t)t * HQ + h) * D, lse + (size_t)t * HQ + h);
        }
    free(k), free(v), free(kk), free(vv);
}

typedef struct {
    uint32_t T;
    const ikv_plan *plan;
    uint32_t topk;
    ikv_dtype q_dtype; /* F32 or F16 (q must then hold f16-representable values) */
    int hybrid;        /* top-k ranks by IKV_TOPK_SCORE_HYBRID (2: IKV_TOPK_SCORE_KEYS) */
    int mass;          /* IKV_TOPK_MASS at share 0.8, 2: at share 1 (topk: the cap; 0 = none) */
    const ikv_query_memory *mem_cpu, *mem_gpu; /* query memories of the two pools (optional) */
    ikv_page_feedback *fb_cpu, *fb_gpu;        /* attention feedback of the two pools (optional) */
    float prior;                               /* topk_feedback_weight (with feedback and top-k) */
} step_cfg;

/* A decoder with two worker threads (the CPU side of the comparisons). */
static ikv_decoder *two_thread_decoder(void) {
    ikv_decoder_config dc = ikv_decoder_default_config();
    dc.n_threads = 2;
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    return dec;
}

/* Tolerance (rel. L2 of out vs the CPU decode and vs float64) of a step of T
 * query tokens on the path IKV_CUDA_MULTI_TOKEN selects: the fused kernel
 * works in fp32 on fp32 queries (1e-4); F16 queries get 2e-3, the bound of
 * its tensor-core compute (f16 operands; the default for long steps over
 * INT8/FP8/INT4 pages, forced by IKV_CUDA_DECODE_COMPUTE=tensor-cores in CTest's
 * test_gpu_decode_tensor_cores), also met by its fp32 compute; the GEMM path multiplies 16-bit operands (q rounded
 * to f16, P in f16; 3e-3). Under auto the GEMM path is taken from
 * kMultiTokenGemmMinRows = 64 query rows (16 tokens at G = 4). */
static double step_tol(uint32_t T, ikv_dtype q_dtype) {
    const char *mode = getenv("IKV_CUDA_MULTI_TOKEN");
    const int gemm = mode && strcmp(mode, "gemm") == 0;
    const int fused = mode && strcmp(mode, "fused") == 0;
    if (gemm || (!fused && T * G >= 64)) return 3e-3;
    return q_dtype == IKV_DTYPE_F16 ? 2e-3 : 1e-4;
}

/* CUDA output (and lse, unless NULL) of each of n_seqs sequences, layer 1, vs
 * the float64 reference over the given token ranges (NULL: dense): rel. L2
 * within tol, lse within 1e-3 x (1 + |lse|). */
static void expect_reference(ikv_pool *gpu, const ikv_seq_id *sg, const uint32_t *lens, int n_seqs,
                             const ikv_token_range *ranges, int n_ranges, uint32_t T, const float *q,
                             const float *out, const float *lse, double tol) {
    const size_t per = (size_t)T * HQ * D, rows = (size_t)T * HQ;
    for (int b = 0; b < n_seqs; ++b) {
        double *ref = malloc(8 * per), *rl = malloc(8 * rows);
        reference(gpu, sg[b], 1, lens[b], ranges, n_ranges, T, q + b * per, 1.0f / sqrtf((float)D), ref, rl);
        const double e = ikvt_rel_l2(out + b * per, ref, per);
        if (!(e <= tol)) fail_msg("head_dim %u T=%u seq %d vs float64: rel L2 %.3g > %.3g", D, T, b, e, tol);
        for (size_t i = 0; lse && i < rows; ++i)
            assert_true(fabs((double)lse[b * rows + i] - rl[i]) <= 1e-3 * (1 + fabs(rl[i])));
        free(ref), free(rl);
    }
}

/* Set by a test: decode_both passes no lse to either pool (the CUDA decode then keeps the rows' lse in
 * its workspace, which attention feedback reads), and lse_gpu is left as it was. */
static int g_no_lse = 0;

/* Decodes seqs on both pools; returns rel L2 of CUDA vs CPU output; fills the CUDA output and lse. */
static double decode_both(ikv_decoder *dec, ikv_pool *cpu, const ikv_seq_id *sc, ikv_pool *gpu, const ikv_seq_id *sg,
                          uint32_t B, uint32_t layer, const float *q, step_cfg cfg, float *out_gpu, float *lse_gpu) {
    const size_t n_out = (size_t)B * cfg.T * HQ * D, n_lse = (size_t)B * cfg.T * HQ;
    const ikv_plan *plans[4] = {cfg.plan, cfg.plan, cfg.plan, cfg.plan};
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = layer;
    a.n_seqs = B;
    a.plans = cfg.plan ? plans : NULL;
    a.n_query_tokens = cfg.T;
    a.n_q_heads = HQ;
    a.q_dtype = cfg.q_dtype == IKV_DTYPE_F16 ? IKV_DTYPE_F16 : IKV_DTYPE_F32;
    a.out_dtype = IKV_DTYPE_F32;
    a.topk_token_budget = cfg.topk;
    a.topk_score = cfg.hybrid == 2 ? IKV_TOPK_SCORE_KEYS : cfg.hybrid ? IKV_TOPK_SCORE_HYBRID : IKV_TOPK_SCORE_QUEST;
    a.topk_feedback_weight = cfg.prior;
    if (cfg.mass) {
        a.topk_mode = IKV_TOPK_MASS;
        a.topk_mass = cfg.mass == 2 ? 1.0f : 0.8f;
        a.topk_min_tokens = 16;
    }
    float *out_cpu = malloc(4 * n_out), *lse_cpu = malloc(4 * n_lse);
    uint16_t *qh = malloc(2 * n_out);
    ikvt_to_f16(q, qh, n_out);
    const void *qin = a.q_dtype == IKV_DTYPE_F16 ? (const void *)qh : (const void *)q;
    const size_t q_bytes = (a.q_dtype == IKV_DTYPE_F16 ? 2 : 4) * n_out;
    a.seqs = sc;
    a.q = qin;
    a.out = out_cpu;
    a.lse = g_no_lse ? NULL : lse_cpu;
    a.query_memory = cfg.mem_cpu;
    a.feedback = cfg.fb_cpu;
    IKVT_OK(ikv_decode(dec, cpu, &a));
    /* What each (sequence, kv-head) read on the CPU; the CUDA step must read the same. */
    enum { kMaxRuns = 4096 };
    ikv_token_range *runs_cpu = malloc(sizeof(ikv_token_range) * kMaxRuns * B * HKV);
    size_t n_runs_cpu[4 * HKV];
    for (uint32_t i = 0; i < B * HKV; ++i)
        IKVT_OK(ikv_decoder_last_selection(dec, i / HKV, i % HKV, runs_cpu + (size_t)i * kMaxRuns, kMaxRuns,
                                           &n_runs_cpu[i]));
    void *dq = ikvt_dev_upload(qin, q_bytes), *dout = ikvt_dev_upload(NULL, 4 * n_out), *dlse = ikvt_dev_upload(NULL, 4 * n_lse);
    a.seqs = sg;
    a.q = dq;
    a.out = dout;
    a.lse = g_no_lse ? NULL : dlse;
    a.query_memory = cfg.mem_gpu;
    a.feedback = cfg.fb_gpu;
    IKVT_OK(ikv_decode(dec, gpu, &a));
    for (uint32_t i = 0; i < B * HKV; ++i) {
        size_t n = 0;
        IKVT_OK(ikv_decoder_last_selection(dec, i / HKV, i % HKV, NULL, 0, &n));
        assert_int_equal(n, n_runs_cpu[i]);
        ikv_token_range *got = malloc(sizeof(ikv_token_range) * (n + 1));
        size_t n_got = 0;
        IKVT_OK(ikv_decoder_last_selection(dec, i / HKV, i % HKV, got, n, &n_got));
        assert_int_equal(n_got, n);
        assert_memory_equal(got, runs_cpu + (size_t)i * kMaxRuns, sizeof(ikv_token_range) * n);
        free(got);
    }
    free(runs_cpu);
    assert_int_equal(ikvt_rt.sync_(), 0);
    assert_int_equal(ikvt_rt.memcpy_(out_gpu, dout, 4 * n_out, IKVT_D2H), 0);
    if (!g_no_lse) assert_int_equal(ikvt_rt.memcpy_(lse_gpu, dlse, 4 * n_lse, IKVT_D2H), 0);
    ikvt_rt.free_(dq), ikvt_rt.free_(dout), ikvt_rt.free_(dlse);
    double *ref = malloc(8 * n_out);
    for (size_t i = 0; i < n_out; ++i) ref[i] = out_cpu[i];
    const double err = ikvt_rel_l2(out_gpu, ref, n_out);
    for (size_t i = 0; !g_no_lse && i < n_lse; ++i)
        assert_true(fabs((double)lse_gpu[i] - lse_cpu[i]) <= 1e-3 * (1 + fabs(lse_cpu[i])));
    free(ref), free(out_cpu), free(lse_cpu), free(qh);
    return err;
}

/* n queries from N(0, 1); for F16 queries rounded to f16 values, so the
 * float64 reference sees the values the decoders read. */
static void fill_queries(ikvt_rng *rng, float *q, size_t n, ikv_dtype dt) {
    ikvt_fill_normal(rng, q, n, 1.0f);
    if (dt == IKV_DTYPE_F16)
        for (size_t i = 0; i < n; ++i) {
            uint16_t h;
            ikvt_to_f16(q + i, &h, 1);
            q[i] = ikvt_f16_to_f32(h);
        }
}

static void test_cuda_pool_and_decode_match_cpu(void **state) {
    (void)state;
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_BF16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    ikvt_rng rng = {0xC0DA};
    ikv_decoder *dec = two_thread_decoder();
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; ++fi) {
        ikv_pool *cpu = make_pool(IKV_BACKEND_CPU, fmts[fi]), *gpu = make_pool(IKV_BACKEND_CUDA, fmts[fi]);
        enum { B = 2 };
        const uint32_t lens[B] = {301, 97};
        ikv_seq_id sc[B], sg[B];
        for (int b = 0; b < B; ++b) {
            fill_both(cpu, gpu, &sc[b], &sg[b], lens[b], &rng);
            expect_same_storage(cpu, sc[b], gpu, sg[b], lens[b]);
        }
        /* Dense (T = 1), causal multi-token (T = 3), a plan with partial pages, and top-k;
         * F32 queries and F16 queries (these short steps run SIMT by default; CTest forces
         * each compute path through IKV_CUDA_DECODE_COMPUTE). */
        /* Variants 8-9: top-k by IKV_TOPK_SCORE_HYBRID, dense and inside the plan;
         * 10-11: IKV_TOPK_MASS (Quest capped, hybrid uncapped inside the plan);
         * 12-13: the same at mass share 1 (the device takes its threshold from double sums there);
         * 14-17: IKV_TOPK_SCORE_KEYS as 8-11 (the mass rule's budget, both hybrid). */
        for (int variant = 0; variant < 18; ++variant) {
            const int v = variant >= 14 ? variant - 6 : variant;  /* the keys variants' shape */
            step_cfg cfg = {v % 4 == 1 && v < 8 ? 3u : 1u, NULL, 0,
                            v < 4 || v == 8 || v == 10 || v == 12 ? IKV_DTYPE_F32 : IKV_DTYPE_F16,
                            variant >= 14 ? 2 : v == 8 || v == 9 || v == 11 || v == 13,
                            v >= 12 ? 2 : v >= 10, NULL, NULL, NULL, NULL, 0.0f};
            ikv_plan *plan = NULL;
            ikv_token_range ranges[3] = {{0, 21}, {50, 83}, {90, 97}};
            if (v % 4 == 2 || v == 9 || v == 11 || v == 13) {
                IKVT_OK(ikv_plan_from_ranges(ranges, 3, 97, P, fmts[fi], &plan));
                cfg.plan = plan;
            }
            if (v % 4 == 3 || (v >= 8 && v != 11 && v != 13)) cfg.topk = v == 9 ? 40 : 64;
            const size_t n_out = (size_t)B * cfg.T * HQ * D;
            float *q = malloc(4 * n_out), *out = malloc(4 * n_out), *lse = malloc(4 * (size_t)B * cfg.T * HQ);
            fill_queries(&rng, q, n_out, cfg.q_dtype);
            const double vs_cpu = decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
            if (!(vs_cpu <= step_tol(cfg.T, cfg.q_dtype)))
                fail_msg("head_dim %u format %d variant %d vs CPU: rel L2 %.3g", D, (int)fmts[fi], variant, vs_cpu);
            if (cfg.topk == 0 && !cfg.mass) /* top-k has no independent float64 selection here; it is compared with the CPU */
                expect_reference(gpu, sg, lens, B, plan ? ranges : NULL, plan ? 3 : 0, cfg.T, q, out, NULL,
                                 step_tol(cfg.T, cfg.q_dtype));
            free(q), free(out), free(lse);
            ikv_plan_destroy(plan);
        }
        ikv_pool_destroy(cpu);
        ikv_pool_destroy(gpu);
    }
    ikv_decoder_destroy(dec);
}

/* Pages of mixed formats in one step: the fused decode switches format per
 * chunk inside one warp's ring, and its default compute follows the formats
 * a step's lists hold (DecodeParams::formats: tensor cores once INT8/FP8/INT4
 * pages are listed and long enough). Each phase decodes two sequences whose
 * pages cycle through its formats (INT4 only; INT8, FP8 and INT4; INT4, F16
 * and INT8), dense at T = 1 and T = 3, F32 and F16 queries (CTest's _simt and
 * _tensor_cores runs force each compute path), against the CPU pool and
 * float64; at head_dim 128 and 64 (the format matrix above runs 128 and 32). */
static void test_mixed_page_formats(void **state) {
    (void)state;
    static const ikv_format phases[3][3] = {{IKV_FMT_INT4, IKV_FMT_INT4, IKV_FMT_INT4},
                                            {IKV_FMT_INT8, IKV_FMT_FP8_E4M3, IKV_FMT_INT4},
                                            {IKV_FMT_INT4, IKV_FMT_F16, IKV_FMT_INT8}};
    ikvt_rng rng = {0x717E5};
    ikv_decoder *dec = two_thread_decoder();
    ikv_pool *cpu = make_pool(IKV_BACKEND_CPU, IKV_FMT_INT8), *gpu = make_pool(IKV_BACKEND_CUDA, IKV_FMT_INT8);
    enum { B = 2 };
    const uint32_t lens[B] = {211, 90};
    ikv_seq_id sc[B], sg[B];
    for (int b = 0; b < B; ++b) fill_both(cpu, gpu, &sc[b], &sg[b], lens[b], &rng);
    for (int ph = 0; ph < 3; ++ph) {
        for (int b = 0; b < B; ++b)
            for (uint32_t pg = 0; pg * P < lens[b]; ++pg) {
                const ikv_format f = phases[ph][(pg + (uint32_t)b) % 3];
                IKVT_OK(ikv_seq_set_page_format(cpu, sc[b], pg, f));
                IKVT_OK(ikv_seq_set_page_format(gpu, sg[b], pg, f));
            }
        for (int variant = 0; variant < 4; ++variant) {
            step_cfg cfg = {variant % 2 ? 3u : 1u, NULL, 0, variant < 2 ? IKV_DTYPE_F32 : IKV_DTYPE_F16,
                            0, 0, NULL, NULL, NULL, NULL, 0.0f};
            const size_t n_out = (size_t)B * cfg.T * HQ * D;
            float *q = malloc(4 * n_out), *out = malloc(4 * n_out), *lse = malloc(4 * (size_t)B * cfg.T * HQ);
            fill_queries(&rng, q, n_out, cfg.q_dtype);
            const double e = decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
            if (!(e <= step_tol(cfg.T, cfg.q_dtype)))
                fail_msg("head_dim %u phase %d variant %d vs CPU: rel L2 %.3g", D, ph, variant, e);
            expect_reference(gpu, sg, lens, B, NULL, 0, cfg.T, q, out, lse, step_tol(cfg.T, cfg.q_dtype));
            free(q), free(out), free(lse);
        }
    }
    ikv_pool_destroy(cpu);
    ikv_pool_destroy(gpu);
    ikv_decoder_destroy(dec);
}

/* FNV-1a over every (sequence, kv-head)'s runs of the decoder's last selection. */
static uint64_t selection_digest(ikv_decoder *dec, uint32_t B) {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < B * HKV; ++i) {
        ikv_token_range runs[512];
        size_t n = 0;
        IKVT_OK(ikv_decoder_last_selection(dec, i / HKV, i % HKV, runs, 512, &n));
        const unsigned char *b = (const unsigned char *)runs;
        for (size_t j = 0; j < n * sizeof runs[0]; ++j) h = (h ^ b[j]) * 1099511628211ull;
        h = (h ^ 0xFF) * 1099511628211ull;
    }
    return h;
}

/* Remembers n_tokens random queries (x amp) of seq at layer in both memories. */
static void remember_both(ikv_query_memory *mc, ikv_seq_id sc, ikv_query_memory *mg, ikv_seq_id sg, uint32_t layer,
                          uint32_t n_tokens, float amp, ikvt_rng *rng) {
    const size_t n = (size_t)n_tokens * HQ * D;
    float *q = malloc(4 * n);
    ikvt_fill_normal(rng, q, n, amp);
    IKVT_OK(ikv_query_memory_remember(mc, sc, layer, q, IKV_DTYPE_F32, n_tokens));
    IKVT_OK(ikv_query_memory_remember(mg, sg, layer, q, IKV_DTYPE_F32, n_tokens));
    free(q);
}

/* A query memory on a CUDA pool: the device recall and scores select exactly
 * what the CPU pool's decode selects (Quest, hybrid, IKV_TOPK_MASS; both
 * memory forms; a sequence with an ended turn beside one with only a turn in
 * progress), across ended turns that wrap the ring and after forget; and the
 * memory does change the selection. */
static void test_query_memory_matches_cpu(void **state) {
    (void)state;
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8};
    ikvt_rng rng = {0x3E3};
    ikv_decoder *dec = two_thread_decoder();
    enum { B = 2 };
    const uint32_t lens[B] = {397, 250};
    for (size_t fi = 0; fi < 2; ++fi)
        for (uint32_t turns = 0; turns <= 4; turns += 4) {
            ikv_pool *cpu = make_pool(IKV_BACKEND_CPU, fmts[fi]), *gpu = make_pool(IKV_BACKEND_CUDA, fmts[fi]);
            ikv_seq_id sc[B], sg[B];
            for (int b = 0; b < B; ++b) fill_both(cpu, gpu, &sc[b], &sg[b], lens[b], &rng);
            ikv_query_memory_config mc = ikv_query_memory_default_config();
            mc.n_q_heads = HQ;
            mc.turns = turns;
            ikv_query_memory *mem_cpu = NULL, *mem_gpu = NULL;
            IKVT_OK(ikv_query_memory_create(cpu, &mc, &mem_cpu));
            IKVT_OK(ikv_query_memory_create(gpu, &mc, &mem_gpu));
            remember_both(mem_cpu, sc[1], mem_gpu, sg[1], 1, 2, 1.0f, &rng); /* a turn in progress only */
            const size_t n_out = (size_t)B * HQ * D;
            float *q = malloc(4 * n_out), *out = malloc(4 * n_out), *lse = malloc(4 * (size_t)B * HQ);
            int changed = 0;
            for (int turn = 0; turn < 6; ++turn) { /* six ended turns wrap a ring of four */
                /* Earlier turns ask louder than the step's query, so their pages win places. */
                remember_both(mem_cpu, sc[0], mem_gpu, sg[0], 1, 3, 3.0f, &rng);
                if (turn % 2 == 0) remember_both(mem_cpu, sc[0], mem_gpu, sg[0], 0, 1, 1.0f, &rng);
                IKVT_OK(ikv_query_memory_end_turn(mem_cpu, sc[0]));
                IKVT_OK(ikv_query_memory_end_turn(mem_gpu, sg[0]));
                ikvt_fill_normal(&rng, q, n_out, 1.0f);
                for (int kind = 0; kind < 4; ++kind) { /* Quest top-k, hybrid top-k, IKV_TOPK_MASS (hybrid), keys */
                    step_cfg cfg = {1, NULL, kind == 2 ? 0u : 64u, IKV_DTYPE_F32, kind == 3 ? 2 : kind >= 1, kind == 2,
                                    NULL, NULL, NULL, NULL, 0.0f};
                    const double tol = step_tol(1, IKV_DTYPE_F32);
                    double e = decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
                    if (!(e <= tol)) fail_msg("memory off, kind %d: rel L2 %.3g vs CPU", kind, e);
                    const uint64_t without = selection_digest(dec, B);
                    cfg.mem_cpu = mem_cpu;
                    cfg.mem_gpu = mem_gpu;
                    e = decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
                    if (!(e <= tol))
                        fail_msg("format %d turns %u turn %d kind %d: rel L2 %.3g vs CPU", (int)fmts[fi], turns, turn,
                                 kind, e);
                    changed += selection_digest(dec, B) != without;
                }
            }
            assert_true(changed > 0);
            /* Forgotten: selected as without a memory. */
            IKVT_OK(ikv_query_memory_forget(mem_cpu, sc[0]));
            IKVT_OK(ikv_query_memory_forget(mem_gpu, sg[0]));
            step_cfg cfg = {1, NULL, 64u, IKV_DTYPE_F32, 1, 0, NULL, NULL, NULL, NULL, 0.0f};
            (void)decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
            const uint64_t without = selection_digest(dec, B);
            cfg.mem_cpu = mem_cpu;
            cfg.mem_gpu = mem_gpu;
            (void)decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
            assert_true(selection_digest(dec, B) == without);
            free(q), free(out), free(lse);
            ikv_query_memory_destroy(mem_cpu);
            ikv_query_memory_destroy(mem_gpu);
            ikv_pool_destroy(cpu);
            ikv_pool_destroy(gpu);
        }
    ikv_decoder_destroy(dec);
}

/* ikv_decode of one sequence of `pool` with a's other fields. */
static ikv_status decode_on(ikv_decoder *dec, ikv_pool *pool, ikv_decode_args *a, const ikv_seq_id *seq,
                            const void *q, void *out) {
    a->seqs = seq;
    a->q = q;
    a->out = out;
    return ikv_decode(dec, pool, a);
}

/* IKV_TOPK_SCORE_KEYS with a query row holding an inf or a NaN beside a
 * finite one (one kv-head, a group of 2): the CUDA pool leaves the bad row
 * out of the shares as the CPU pool does, so both select what head 0 alone
 * selects. The +inf row has one +inf logit (token 25: the only positive key
 * in that channel), so its Z_r is +inf (test_decode's
 * test_keys_score_skips_bad_rows on the CPU). */
static void test_keys_score_skips_bad_rows(void **state) {
    (void)state;
    enum { KD = 32, KP = 8, KN = 128 };
    ikv_pool *pools[2];
    ikv_seq_id seqs[2];
    static float k[KN * KD], v[KN * KD];
    ikvt_rng rng = {0xBAD};
    ikvt_fill_normal(&rng, k, KN * KD, 1.0f);
    ikvt_fill_normal(&rng, v, KN * KD, 1.0f);
    for (int t = 0; t < KN; ++t) k[t * KD + 3] = t == 25 ? 1.0f : -1.0f;
    for (int pi = 0; pi < 2; ++pi) {
        pools[pi] = ikvt_make_pool((ikvt_pool_spec){.backend = pi ? IKV_BACKEND_CUDA : IKV_BACKEND_CPU, .n_layers = 1,
                                                    .n_kv_heads = 1, .head_dim = KD, .page_size = KP,
                                                    .capacity_bytes = 4u << 20, .default_format = IKV_FMT_F16});
        IKVT_OK(ikv_seq_create(pools[pi], &seqs[pi]));
        ikv_append ap = ikv_append_default(pools[pi], KN);
        ap.k = k;
        ap.v = v;
        IKVT_OK(ikv_pool_append(pools[pi], seqs[pi], &ap));
    }
    float q[2 * KD], out[2 * KD];
    ikvt_fill_normal(&rng, q, 2 * KD, 2.0f);
    q[3] = 20.0f; /* head 0 favours token 25's page */
    void *dq = ikvt_dev_upload(NULL, sizeof q), *dout = ikvt_dev_upload(NULL, sizeof out);
    ikv_decoder *dec = two_thread_decoder();
    ikv_token_range want[64], got[64];
    size_t n_want = 0, n_got = 0;
    const float bad[3] = {INFINITY, NAN, -INFINITY};
    for (int b = -1; b < 3; ++b) {
        if (b >= 0) q[KD + 3] = bad[b];
        for (int pi = 0; pi < 2; ++pi) {
            ikv_decode_args a = ikv_decode_args_default();
            a.seqs = &seqs[pi];
            a.n_q_heads = b < 0 ? 1 : 2; /* head 0 alone (on the CPU pool), then beside a bad head */
            a.topk_token_budget = 24;
            a.topk_score = IKV_TOPK_SCORE_KEYS;
            if (b < 0 && pi == 1) continue;
            if (pi == 0) {
                a.q = q, a.out = out;
                IKVT_OK(ikv_decode(dec, pools[0], &a));
            } else {
                assert_int_equal(ikvt_rt.memcpy_(dq, q, sizeof q, IKVT_H2D), 0);
                a.q = dq, a.out = dout;
                IKVT_OK(ikv_decode(dec, pools[1], &a));
                assert_int_equal(ikvt_rt.sync_(), 0);
            }
            IKVT_OK(ikv_decoder_last_selection(dec, 0, 0, b < 0 ? want : got, 64, b < 0 ? &n_want : &n_got));
            if (b >= 0 && (n_got != n_want || memcmp(got, want, n_want * sizeof *want) != 0))
                fail_msg("%s pool: a head holding %g in q changed head 0's selection (%zu runs, head 0 alone %zu)",
                         pi ? "CUDA" : "CPU", (double)bad[b], n_got, n_want);
        }
    }
    ikvt_rt.free_(dq), ikvt_rt.free_(dout);
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(pools[0]), ikv_pool_destroy(pools[1]);
}

/* IKV_TOPK_SCORE_KEYS on a CUDA pool scores at most 16 rows per kv-head: 17
 * query heads per kv-head are refused with a sentence and write nothing
 * (a CPU pool runs them); with top-k off the score is not used and the step
 * runs; 16 run as on the CPU. */
static void test_keys_score_limits(void **state) {
    (void)state;
    ikvt_rng rng = {0x4E4};
    ikv_pool *cpu = make_pool(IKV_BACKEND_CPU, IKV_FMT_F16), *gpu = make_pool(IKV_BACKEND_CUDA, IKV_FMT_F16);
    ikv_seq_id sc, sg;
    fill_both(cpu, gpu, &sc, &sg, 100, &rng);
    const uint32_t nq = 17 * HKV;
    const size_t n_out = (size_t)nq * D;
    float *q = malloc(4 * n_out), *out = malloc(4 * n_out);
    ikvt_fill_normal(&rng, q, n_out, 1.0f);
    void *dq = ikvt_dev_upload(q, 4 * n_out), *dout = ikvt_dev_upload(NULL, 4 * n_out);
    assert_int_equal(ikvt_rt.memset_(dout, 0x5A, 4 * n_out), 0);
    ikv_decoder *dec = two_thread_decoder();
    ikv_decode_args a = ikv_decode_args_default();
    a.n_seqs = 1;
    a.seqs = &sg;
    a.n_q_heads = nq;
    a.q = dq;
    a.out = dout;
    a.topk_score = IKV_TOPK_SCORE_KEYS;
    a.topk_token_budget = 32;
    IKVT_EXPECT_STATUS(ikv_decode(dec, gpu, &a), IKV_E_UNSUPPORTED, "IKV_TOPK_SCORE_KEYS");
    assert_int_equal(ikvt_rt.sync_(), 0);
    assert_int_equal(ikvt_rt.memcpy_(out, dout, 4 * n_out, IKVT_D2H), 0);
    for (size_t i = 0; i < n_out; ++i)
        if (memcmp(out + i, &(uint32_t){0x5A5A5A5Au}, 4) != 0) fail_msg("element %zu written by a refused call", i);
    IKVT_OK(decode_on(dec, cpu, &a, &sc, q, out)); /* the CPU pool runs it (host buffers) */
    a.topk_token_budget = 0;
    IKVT_OK(decode_on(dec, gpu, &a, &sg, dq, dout));
    assert_int_equal(ikvt_rt.sync_(), 0);
    /* 16 query heads per kv-head, the most the device scores: the CUDA pool
     * selects and reads what the CPU pool does (candidates for 64 of the 100
     * tokens, 32 kept). */
    {
        const size_t n16 = (size_t)16 * HKV * D;
        float *out_gpu = malloc(4 * n16);
        double *ref = malloc(8 * n16);
        a.n_q_heads = 16 * HKV;
        a.topk_token_budget = 32;
        IKVT_OK(decode_on(dec, cpu, &a, &sc, q, out));
        IKVT_OK(decode_on(dec, gpu, &a, &sg, dq, dout));
        assert_int_equal(ikvt_rt.sync_(), 0);
        assert_int_equal(ikvt_rt.memcpy_(out_gpu, dout, 4 * n16, IKVT_D2H), 0);
        for (size_t i = 0; i < n16; ++i) ref[i] = out[i];
        const double e = ikvt_rel_l2(out_gpu, ref, n16);
        if (!(e <= step_tol(1, IKV_DTYPE_F32))) fail_msg("16 scored rows: rel L2 %.3g vs CPU", e);
        free(out_gpu), free(ref);
    }
    ikvt_rt.free_(dq), ikvt_rt.free_(dout);
    free(q), free(out);
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(cpu);
    ikv_pool_destroy(gpu);
}

/* The feedback tests' setting: a CPU and a CUDA pool of one format holding the
 * same two sequences (301 and 97 tokens), attention feedback on each, and a
 * plan of three ranges of the shorter one (clipped for neither). */
enum { FB_SEQS = 2 };
typedef struct {
    ikv_pool *cpu, *gpu;
    ikv_seq_id sc[FB_SEQS], sg[FB_SEQS];
    ikv_page_feedback *fb_cpu, *fb_gpu;
    ikv_plan *plan;
} feedback_pools;

static feedback_pools feedback_pools_make(ikv_format fmt, ikvt_rng *rng) {
    static const uint32_t lens[FB_SEQS] = {301, 97};
    ikv_token_range ranges[3] = {{0, 21}, {50, 83}, {90, 97}};
    feedback_pools f;
    f.cpu = make_pool(IKV_BACKEND_CPU, fmt), f.gpu = make_pool(IKV_BACKEND_CUDA, fmt);
    for (int b = 0; b < FB_SEQS; ++b) fill_both(f.cpu, f.gpu, &f.sc[b], &f.sg[b], lens[b], rng);
    ikv_page_feedback_config fc = ikv_page_feedback_default_config();
    IKVT_OK(ikv_page_feedback_create(f.cpu, &fc, &f.fb_cpu));
    IKVT_OK(ikv_page_feedback_create(f.gpu, &fc, &f.fb_gpu));
    IKVT_OK(ikv_plan_from_ranges(ranges, 3, 97, P, fmt, &f.plan));
    return f;
}

static void feedback_pools_free(feedback_pools *f) {
    ikv_plan_destroy(f->plan);
    ikv_page_feedback_destroy(f->fb_cpu);
    ikv_page_feedback_destroy(f->fb_gpu);
    ikv_pool_destroy(f->cpu);
    ikv_pool_destroy(f->gpu);
}

/* Layer 1's feedback averages of the CPU and CUDA pools' sequences, page by page. */
static void expect_same_feedback(ikv_page_feedback *fb_cpu, const ikv_seq_id *sc, ikv_page_feedback *fb_gpu,
                                 const ikv_seq_id *sg, int n_seqs, double tol, ikv_format fmt) {
    float mc[64], mg[64];
    for (int b = 0; b < n_seqs; ++b)
        for (uint32_t h = 0; h < HKV; ++h) {
            uint32_t nc = 0, ng = 0;
            IKVT_OK(ikv_page_feedback_get(fb_cpu, sc[b], 1, h, mc, 64, &nc));
            IKVT_OK(ikv_page_feedback_get(fb_gpu, sg[b], 1, h, mg, 64, &ng));
            assert_int_equal(nc, ng);
            assert_true(nc > 0 && nc <= 64);
            for (uint32_t i = 0; i < nc; ++i)
                if (!(fabs((double)mg[i] - mc[i]) <= 1e-6 + 10 * tol * fabs((double)mc[i])))
                    fail_msg("format %d seq %d head %u page %u: feedback %.7g on CUDA, %.7g on the CPU", (int)fmt, b,
                             h, i, (double)mg[i], (double)mc[i]);
        }
}

/* Attention feedback on a CUDA pool: after dense, planned, top-k and causal
 * multi-token steps the averages equal the CPU pool's (every format; within
 * the step's tolerance: the device sums in fp32 from the lse its path
 * computed); a capturing stream and the top-k prior are refused and change
 * nothing. */
static void test_feedback_matches_cpu(void **state) {
    (void)state;
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    ikvt_rng rng = {0xFEED};
    ikv_decoder *dec = two_thread_decoder();
    enum { B = FB_SEQS, T_MAX = 3 };
    float *q = malloc(4 * (size_t)B * T_MAX * HQ * D), *out = malloc(4 * (size_t)B * T_MAX * HQ * D);
    float *lse = malloc(4 * (size_t)B * T_MAX * HQ), *mc = malloc(4 * 64), *mg = malloc(4 * 64);
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; ++fi) {
        feedback_pools f = feedback_pools_make(fmts[fi], &rng);
        ikv_pool *cpu = f.cpu, *gpu = f.gpu;
        const ikv_seq_id *sc = f.sc, *sg = f.sg;
        ikv_page_feedback *fb_cpu = f.fb_cpu, *fb_gpu = f.fb_gpu;
        const ikv_plan *plan = f.plan;
        double tol = 0.0;
        /* dense, plan, Quest top-k, hybrid top-k, T = 3 dense; the last two without an lse output */
        for (int step = 0; step < 5; ++step) {
            const uint32_t T = step == 4 ? 3u : 1u;
            g_no_lse = step >= 3;
            step_cfg cfg = {T, step == 1 ? plan : NULL, step == 2 || step == 3 ? 64u : 0u, IKV_DTYPE_F32, step == 3,
                            0, NULL, NULL, fb_cpu, fb_gpu, 0.0f};
            ikvt_fill_normal(&rng, q, (size_t)B * T * HQ * D, 1.0f);
            const double e = decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
            if (!(e <= step_tol(T, IKV_DTYPE_F32))) fail_msg("format %d step %d: rel L2 %.3g vs CPU", (int)fmts[fi], step, e);
            if (step_tol(T, IKV_DTYPE_F32) > tol) tol = step_tol(T, IKV_DTYPE_F32);
        }
        g_no_lse = 0;
        /* One step whose queries point at token 40 (page 2) of every sequence, so that a
         * page holds a large average the prior can lift above pages that score higher. */
        {
            float *k40 = malloc(4 * (size_t)HKV * D), *v40 = malloc(4 * (size_t)HKV * D);
            for (int b = 0; b < B; ++b) {
                IKVT_OK(ikv_seq_read(cpu, sc[b], 1, 40, 41, k40, v40));
                for (uint32_t h = 0; h < HQ; ++h)
                    for (uint32_t d = 0; d < D; ++d)
                        q[((size_t)b * HQ + h) * D + d] = 6.0f * k40[(size_t)(h / (HQ / HKV)) * D + d];
            }
            step_cfg cfg = {1, NULL, 0u, IKV_DTYPE_F32, 0, 0, NULL, NULL, fb_cpu, fb_gpu, 0.0f};
            const double e = decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
            if (!(e <= step_tol(1, IKV_DTYPE_F32))) fail_msg("format %d focus step: rel L2 %.3g vs CPU", (int)fmts[fi], e);
            free(k40), free(v40);
        }
        /* The averages as a prior of top-k (Quest, hybrid, hybrid with mass budgets):
         * the CUDA pool selects what the CPU pool selects (decode_both checks the runs). */
        for (int step = 0; step < 3; ++step) {
            step_cfg cfg = {1, NULL, 64u, IKV_DTYPE_F32, step >= 1, step == 2, NULL, NULL, fb_cpu, fb_gpu, 0.5f};
            ikvt_fill_normal(&rng, q, (size_t)B * HQ * D, 1.0f);
            const double e = decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
            if (!(e <= step_tol(1, IKV_DTYPE_F32))) fail_msg("format %d prior step %d: rel L2 %.3g vs CPU", (int)fmts[fi], step, e);
        }
        /* The averages, page by page (a share is exp(logit - lse): its error is the lse's). */
        expect_same_feedback(fb_cpu, sc, fb_gpu, sg, B, tol, fmts[fi]);
        /* The prior changes what is read (the prior steps' checks could fail otherwise); after the
         * comparison of the averages above: these CPU decodes feed back too. Quest scores: under the
         * hybrid score a budget of <= group pages is all heads' own best pages (RESULTS 6y). */
        {
            size_t runs_with = 0, runs_without = 0, differ = 0;
            ikv_token_range r0[256], r1[256];
            ikv_decode_args a = ikv_decode_args_default();
            a.layer = 1;
            a.n_seqs = B;
            a.seqs = sc;
            a.n_q_heads = HQ;
            a.q = q;
            a.out = out;
            a.topk_token_budget = 64;
            for (int draw = 0; draw < 4; ++draw) {
                ikvt_fill_normal(&rng, q, (size_t)B * HQ * D, 1.0f);
                for (uint32_t i = 0; i < B * HKV; ++i) {
                    a.feedback = NULL;
                    a.topk_feedback_weight = 0.0f;
                    IKVT_OK(ikv_decode(dec, cpu, &a));
                    IKVT_OK(ikv_decoder_last_selection(dec, i / HKV, i % HKV, r0, 256, &runs_without));
                    a.feedback = fb_cpu;
                    a.topk_feedback_weight = 1.0f;
                    IKVT_OK(ikv_decode(dec, cpu, &a));
                    IKVT_OK(ikv_decoder_last_selection(dec, i / HKV, i % HKV, r1, 256, &runs_with));
                    differ += runs_with != runs_without || memcmp(r0, r1, sizeof r0[0] * runs_with) != 0;
                }
            }
            assert_true(differ > 0);
        }
        /* Refused on CUDA: a capturing stream; the averages stay. */
        uint32_t n0 = 0;
        IKVT_OK(ikv_page_feedback_get(fb_gpu, sg[0], 1, 0, mg, 64, &n0));
        void *dq = ikvt_dev_upload(q, 4 * (size_t)B * HQ * D), *dout = ikvt_dev_upload(NULL, 4 * (size_t)B * HQ * D);
        ikv_decode_args a = ikv_decode_args_default();
        a.layer = 1;
        a.n_seqs = B;
        a.seqs = sg;
        a.n_q_heads = HQ;
        a.q = dq;
        a.out = dout;
        a.feedback = fb_gpu;
        a.topk_token_budget = 64;
        void *stream = NULL, *graph = NULL;
        assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
        a.stream = stream;
        assert_int_equal(ikvt_rt.begin_capture_(stream, IKVT_CAPTURE_RELAXED), 0);
        const ikv_status st = ikv_decode(dec, gpu, &a);
        assert_int_equal(ikvt_rt.end_capture_(stream, &graph), 0);
        IKVT_EXPECT_STATUS(st, IKV_E_INVALID, "capturing");
        if (graph) ikvt_rt.graph_destroy_(graph);
        ikvt_rt.stream_destroy_(stream);
        uint32_t n1 = 0;
        IKVT_OK(ikv_page_feedback_get(fb_gpu, sg[0], 1, 0, mc, 64, &n1));
        assert_int_equal(n0, n1);
        assert_memory_equal(mg, mc, 4 * (size_t)n0);
        ikvt_rt.free_(dq), ikvt_rt.free_(dout);
        feedback_pools_free(&f);
    }
    free(q), free(out), free(lse), free(mc), free(mg);
    ikv_decoder_destroy(dec);
}

/* A decode with a query memory captured in a CUDA graph (global mode):
 * after a turn ends, a replay equals an eager call that sees the new turn. */
static void test_query_memory_in_graph(void **state) {
    (void)state;
    ikvt_rng rng = {0x9A7};
    ikv_pool *gpu = make_pool(IKV_BACKEND_CUDA, IKV_FMT_F16);
    ikv_seq_id s;
    IKVT_OK(ikv_seq_create(gpu, &s));
    {
        const size_t n = (size_t)397 * HKV * D * L;
        float *k = malloc(4 * n), *v = malloc(4 * n);
        ikvt_fill_normal(&rng, k, n, 1.0f);
        ikvt_fill_normal(&rng, v, n, 1.0f);
        ikv_append ap = ikv_append_default(gpu, 397);
        ap.layer = IKV_ALL_LAYERS;
        ap.k = k;
        ap.v = v;
        ap.layer_stride = (int64_t)n / L;
        IKVT_OK(ikv_pool_append(gpu, s, &ap));
        free(k), free(v);
    }
    ikv_query_memory_config mc = ikv_query_memory_default_config();
    mc.n_q_heads = HQ;
    mc.turns = 1; /* the new turn replaces the old one: the recall must change */
    ikv_query_memory *mem = NULL;
    IKVT_OK(ikv_query_memory_create(gpu, &mc, &mem));
    float *mq = malloc(4 * (size_t)HQ * D);
    ikvt_fill_normal(&rng, mq, (size_t)HQ * D, 3.0f);
    IKVT_OK(ikv_query_memory_remember(mem, s, 1, mq, IKV_DTYPE_F32, 1));
    IKVT_OK(ikv_query_memory_end_turn(mem, s));
    const size_t n_out = (size_t)HQ * D;
    float *q = malloc(4 * n_out), *eager = malloc(4 * n_out), *replay = malloc(4 * n_out), *before = malloc(4 * n_out);
    ikvt_fill_normal(&rng, q, n_out, 1.0f);
    void *dq = ikvt_dev_upload(q, 4 * n_out), *dout = ikvt_dev_upload(NULL, 4 * n_out);
    void *stream = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = 1;
    a.seqs = &s;
    a.n_q_heads = HQ;
    a.q = dq;
    a.out = dout;
    a.stream = stream;
    /* Quest bounds, 8 of 25 pages: the remembered queries (3x louder than the step's) win places. (Under
     * the hybrid score every query head's own best page scores 0, so 4 heads' bests fill a 4-page
     * budget and no recalled query could enter.) */
    a.topk_token_budget = 128;
    a.topk_score = IKV_TOPK_SCORE_QUEST;
    a.query_memory = mem;
    IKVT_OK(ikv_decode(dec, gpu, &a)); /* sizes everything the capture needs */
    assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
    assert_int_equal(ikvt_rt.memcpy_(before, dout, 4 * n_out, IKVT_D2H), 0);
    void *graph = NULL, *exec = NULL;
    assert_int_equal(ikvt_rt.begin_capture_(stream, IKVT_CAPTURE_GLOBAL), 0);
    const ikv_status st = ikv_decode(dec, gpu, &a);
    assert_int_equal(ikvt_rt.end_capture_(stream, &graph), 0);
    IKVT_OK(st);
    assert_int_equal(ikvt_rt.graph_instantiate_(&exec, graph, 0), 0);
    /* A new turn that asks something else, then a replay and an eager call. */
    ikvt_fill_normal(&rng, mq, (size_t)HQ * D, 3.0f);
    IKVT_OK(ikv_query_memory_remember(mem, s, 1, mq, IKV_DTYPE_F32, 1));
    IKVT_OK(ikv_query_memory_end_turn(mem, s));
    assert_int_equal(ikvt_rt.memset_(dout, 0xFF, 4 * n_out), 0);
    assert_int_equal(ikvt_rt.graph_launch_(exec, stream), 0);
    assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
    assert_int_equal(ikvt_rt.memcpy_(replay, dout, 4 * n_out, IKVT_D2H), 0);
    IKVT_OK(ikv_decode(dec, gpu, &a));
    assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
    assert_int_equal(ikvt_rt.memcpy_(eager, dout, 4 * n_out, IKVT_D2H), 0);
    assert_memory_equal(eager, replay, 4 * n_out);
    assert_true(memcmp(before, eager, 4 * n_out) != 0); /* the new turn changed what was read */
    ikvt_rt.graph_exec_destroy_(exec);
    ikvt_rt.graph_destroy_(graph);
    ikv_decoder_destroy(dec);
    ikv_query_memory_destroy(mem);
    ikvt_rt.stream_destroy_(stream);
    ikvt_rt.free_(dq), ikvt_rt.free_(dout);
    free(q), free(eager), free(replay), free(before), free(mq);
    ikv_pool_destroy(gpu);
}

/* Chunked prefill: T = 130 query tokens at the end of sequences of 700 and 400
 * tokens, dense and with a plan of partial pages, F16 and INT8 pages: CUDA vs
 * CPU decode and vs float64, on whichever path IKV_CUDA_MULTI_TOKEN selects. */
static void test_long_multi_token_step(void **state) {
    (void)state;
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8};
    ikvt_rng rng = {0x5EED};
    ikv_decoder *dec = two_thread_decoder();
    enum { B = 2, T = 130 };
    const uint32_t lens[B] = {700, 400};
    for (size_t fi = 0; fi < 2; ++fi) {
        ikv_pool *cpu = make_pool(IKV_BACKEND_CPU, fmts[fi]), *gpu = make_pool(IKV_BACKEND_CUDA, fmts[fi]);
        ikv_seq_id sc[B], sg[B];
        for (int b = 0; b < B; ++b) fill_both(cpu, gpu, &sc[b], &sg[b], lens[b], &rng);
        /* One plan for both sequences: routed for 400 tokens, clipped for neither. */
        ikv_token_range ranges[3] = {{3, 40}, {100, 251}, {290, 400}};
        for (int planned = 0; planned < 2; ++planned) {
            ikv_plan *plan = NULL;
            if (planned) IKVT_OK(ikv_plan_from_ranges(ranges, 3, 400, P, fmts[fi], &plan));
            step_cfg cfg = {T, plan, 0, IKV_DTYPE_F32, 0, 0, NULL, NULL, NULL, NULL, 0.0f};
            const size_t per = (size_t)T * HQ * D, n_out = B * per;
            float *q = malloc(4 * n_out), *out = malloc(4 * n_out), *lse = malloc(4 * (size_t)B * T * HQ);
            ikvt_fill_normal(&rng, q, n_out, 1.0f);
            const double vs_cpu = decode_both(dec, cpu, sc, gpu, sg, B, 1, q, cfg, out, lse);
            const double tol = step_tol(T, IKV_DTYPE_F32);
            if (!(vs_cpu <= tol)) fail_msg("head_dim %u T=%d vs CPU: rel L2 %.3g > %.3g", D, T, vs_cpu, tol);
            expect_reference(gpu, sg, lens, B, plan ? ranges : NULL, plan ? 3 : 0, T, q, out, lse, tol);
            free(q), free(out), free(lse);
            ikv_plan_destroy(plan);
        }
        ikv_pool_destroy(cpu);
        ikv_pool_destroy(gpu);
    }
    ikv_decoder_destroy(dec);
}

/* Steps of 5 query tokens: 20 query rows per kv-head, which the fused
 * decode's feedback variants take in several row chunks (SIMT 8 rows, tensor
 * cores 16: three and two CTAs per kv-head, each writing its rows' chunk
 * sums) and the GEMM path's feedback kernel (IKV_CUDA_MULTI_TOKEN=gemm) in
 * tiles of 16 (two, the second partly empty); then a top-k step by
 * IKV_TOPK_SCORE_KEYS (its lse kernel reads keys as the feedback kernel
 * does); then F16-query steps (T = 5 and 1), which CTest's _tensor_cores run
 * takes to the tensor-core feedback variants (F32 queries always run SIMT).
 * The averages equal the CPU pool's. The head_dim variants cover every lane
 * layout of kernels/warp_key_dots.cuh (4, 8, 16 and 32 lanes per key row)
 * and of the SIMT chunk sums (32 / (head_dim / 8) key-row slots). */
static void test_feedback_many_rows(void **state) {
    (void)state;
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8};
    ikvt_rng rng = {0xFEED5};
    ikv_decoder *dec = two_thread_decoder();
    enum { B = FB_SEQS, T = 5 };
    float *q = malloc(4 * (size_t)B * T * HQ * D), *out = malloc(4 * (size_t)B * T * HQ * D);
    float *lse = malloc(4 * (size_t)B * T * HQ);
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; ++fi) {
        feedback_pools f = feedback_pools_make(fmts[fi], &rng);
        /* dense and a plan at T = 5; IKV_TOPK_SCORE_KEYS at T = 1; F16 queries: a plan at T = 5, top-k at T = 1 */
        for (int step = 0; step < 5; ++step) {
            const uint32_t t = step == 0 || step == 1 || step == 3 ? (uint32_t)T : 1u;
            const ikv_dtype qd = step >= 3 ? IKV_DTYPE_F16 : IKV_DTYPE_F32;
            step_cfg cfg = {t,  step == 1 || step == 3 ? f.plan : NULL, step == 2 || step == 4 ? 64u : 0u, qd,
                            step == 2 ? 2 : 0, 0, NULL, NULL, f.fb_cpu, f.fb_gpu, 0.0f};
            fill_queries(&rng, q, (size_t)B * t * HQ * D, qd);
            const double e = decode_both(dec, f.cpu, f.sc, f.gpu, f.sg, B, 1, q, cfg, out, lse);
            if (!(e <= step_tol(t, qd))) fail_msg("format %d step %d: rel L2 %.3g vs CPU", (int)fmts[fi], step, e);
        }
        expect_same_feedback(f.fb_cpu, f.sc, f.fb_gpu, f.sg, B, step_tol(T, IKV_DTYPE_F16), fmts[fi]);
        feedback_pools_free(&f);
    }
    free(q), free(out), free(lse);
    ikv_decoder_destroy(dec);
}


/* Logits beyond fp32's range (finite q and keys, scale 3.4e38): a row none
 * of whose logits comes out finite gets NaN outputs on both backends, never
 * the empty result, with or without a softcap (the header). Keys all -1 (every
 * logit -inf) or +1 (+inf); dense, a plan, softcap; T = 1 and 3 (the GEMM
 * path under IKV_CUDA_MULTI_TOKEN=gemm); F32 and F16 queries. */
static void test_overflowing_logits(void **state) {
    (void)state;
    enum { LEN = 40, T_MAX = 3 };
    ikv_decoder *dec = two_thread_decoder();
    const size_t n_max = (size_t)T_MAX * HQ * D, rows_max = (size_t)T_MAX * HQ;
    float *q = malloc(4 * n_max), *out = malloc(4 * n_max), *lse = malloc(4 * rows_max);
    uint16_t *qh = malloc(2 * n_max);
    float *k = malloc(4 * (size_t)L * LEN * HKV * D), *v = malloc(4 * (size_t)L * LEN * HKV * D);
    void *dq = ikvt_dev_upload(NULL, 4 * n_max), *dout = ikvt_dev_upload(NULL, 4 * n_max);
    void *dlse = ikvt_dev_upload(NULL, 4 * rows_max);
    static const ikv_token_range first[] = {{0, 3}};
    for (int sign = -1; sign <= 1; sign += 2)
        for (int fi = 0; fi < 2; ++fi) {
            const ikv_format fmt = fi ? IKV_FMT_INT8 : IKV_FMT_F16;
            ikv_pool *pools[2] = {make_pool(IKV_BACKEND_CPU, fmt), make_pool(IKV_BACKEND_CUDA, fmt)};
            ikv_seq_id seqs[2];
            for (size_t i = 0; i < (size_t)L * LEN * HKV * D; ++i) k[i] = (float)sign, v[i] = (float)(i % 5) - 2.0f;
            ikv_plan *plan = NULL;
            IKVT_OK(ikv_plan_from_ranges(first, 1, LEN, P, fmt, &plan));
            for (int pi = 0; pi < 2; ++pi) {
                IKVT_OK(ikv_seq_create(pools[pi], &seqs[pi]));
                ikv_append ap = ikv_append_default(pools[pi], LEN);
                ap.layer = IKV_ALL_LAYERS;
                ap.k = k;
                ap.v = v;
                ap.layer_stride = (int64_t)LEN * HKV * D;
                IKVT_OK(ikv_pool_append(pools[pi], seqs[pi], &ap));
            }
            for (int c = 0; c < 8; ++c) { /* bit 0: T = 3; bit 1: F16 q; c 4-5: a plan; 6-7: a softcap */
                const uint32_t T = c & 1 ? T_MAX : 1;
                const ikv_dtype qd = c & 2 ? IKV_DTYPE_F16 : IKV_DTYPE_F32;
                const size_t n = (size_t)T * HQ * D, rows = (size_t)T * HQ, qb = (qd == IKV_DTYPE_F16 ? 2 : 4) * n;
                for (size_t i = 0; i < n; ++i) q[i] = 0.5f;
                ikvt_to_f16(q, qh, n);
                const ikv_plan *plans[1] = {plan};
                ikv_decode_args a = ikv_decode_args_default();
                a.layer = 1;
                a.n_query_tokens = T;
                a.n_q_heads = HQ;
                a.q_dtype = qd;
                a.scale = 3.4e38f;
                a.softcap = c >= 6 ? 10.0f : 0.0f;
                a.plans = c == 4 || c == 5 ? plans : NULL;
                for (int pi = 0; pi < 2; ++pi) {
                    const void *qin = qd == IKV_DTYPE_F16 ? (const void *)qh : (const void *)q;
                    a.seqs = &seqs[pi];
                    if (pi == 0) {
                        a.q = qin, a.out = out, a.lse = lse;
                        IKVT_OK(ikv_decode(dec, pools[pi], &a));
                    } else {
                        assert_int_equal(ikvt_rt.memcpy_(dq, qin, qb, IKVT_H2D), 0);
                        a.q = dq, a.out = dout, a.lse = dlse;
                        IKVT_OK(ikv_decode(dec, pools[pi], &a));
                        assert_int_equal(ikvt_rt.sync_(), 0);
                        assert_int_equal(ikvt_rt.memcpy_(out, dout, 4 * n, IKVT_D2H), 0);
                        assert_int_equal(ikvt_rt.memcpy_(lse, dlse, 4 * rows, IKVT_D2H), 0);
                    }
                    for (size_t r = 0; r < rows; ++r) {
                        if (!isnan(lse[r]))
                            fail_msg("%s sign %d format %d case %d row %zu: lse %g, not NaN", pi ? "CUDA" : "CPU", sign,
                                     (int)fmt, c, r, (double)lse[r]);
                        for (size_t d = 0; d < D; ++d)
                            if (!isnan(out[r * D + d]))
                                fail_msg("%s sign %d format %d case %d row %zu channel %zu: %g, not NaN",
                                         pi ? "CUDA" : "CPU", sign, (int)fmt, c, r, d, (double)out[r * D + d]);
                    }
                }
            }
            ikv_plan_destroy(plan);
            ikv_pool_destroy(pools[0]);
            ikv_pool_destroy(pools[1]);
        }
    ikvt_rt.free_(dq), ikvt_rt.free_(dout), ikvt_rt.free_(dlse);
    free(q), free(out), free(lse), free(qh), free(k), free(v);
    ikv_decoder_destroy(dec);
}

/* A query row holding a NaN or an inf: on the CUDA pool, as on the CPU pool,
 * every channel of its out and its lse are NaN, it adds nothing to the
 * feedback averages, and every other row matches the CPU's. Dense steps of
 * 1 and 3 tokens, F32 and F16 queries, on whatever paths CTest's runs force
 * (SIMT, tensor cores; T = 3 on the GEMM path under IKV_CUDA_MULTI_TOKEN=gemm),
 * with a softcap, and a NaN row that reads nothing (0 and -inf); then a row
 * whose only logit is -inf (the merge kernel's rare path). */
static void test_non_finite_query_rows(void **state) {
    (void)state;
    const ikv_format fmts[] = {IKV_FMT_F16, IKV_FMT_INT8};
    ikvt_rng rng = {0x7A7A};
    ikv_decoder *dec = two_thread_decoder();
    enum { B = FB_SEQS, TM = 3 };
    const size_t n_max = (size_t)B * TM * HQ * D, rows_max = (size_t)B * TM * HQ;
    float *q = malloc(4 * n_max), *out_c = malloc(4 * n_max), *out_g = malloc(4 * n_max);
    float *lse_c = malloc(4 * rows_max), *lse_g = malloc(4 * rows_max);
    uint16_t *qh = malloc(2 * n_max);
    void *dq = ikvt_dev_upload(NULL, 4 * n_max), *dout = ikvt_dev_upload(NULL, 4 * n_max);
    void *dlse = ikvt_dev_upload(NULL, 4 * rows_max);
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; ++fi) {
        feedback_pools f = feedback_pools_make(fmts[fi], &rng);
        /* steps 0-3: dense, T = 1 and 3, F32 and F16 queries; 4: dense with a softcap (which would cap an
         * infinite logit); 5: T = 3 over each sequence's last two tokens (a plan), where query token 0 reads
         * nothing: its NaN row (0, 0, 1) keeps out 0 and lse -inf */
        static const uint32_t last_lens[B] = {301, 97};
        ikv_plan *last_two[B];
        for (int b = 0; b < B; ++b) {
            const ikv_token_range r = {last_lens[b] - 2, last_lens[b]};
            IKVT_OK(ikv_plan_from_ranges(&r, 1, last_lens[b], P, fmts[fi], &last_two[b]));
        }
        for (int step = 0; step < 6; ++step) {
            const uint32_t T = step == 4 ? 1 : step == 5 ? TM : step % 2 ? TM : 1;
            const ikv_dtype qd = step < 2 || step == 4 ? IKV_DTYPE_F32 : IKV_DTYPE_F16;
            const size_t n = (size_t)B * T * HQ * D, rows = (size_t)B * T * HQ;
            ikvt_fill_normal(&rng, q, n, 1.0f);
            /* rows (b * T + t) * HQ + hq: NaN in (0, 0, 1), +inf in (1, T-1, HQ-1), -inf in (0, T-1, 2) */
            const size_t bad[3] = {1, ((size_t)T + T - 1) * HQ + HQ - 1, (size_t)(T - 1) * HQ + 2};
            q[bad[0] * D + 3] = NAN, q[bad[1] * D + 100 % D] = INFINITY, q[bad[2] * D] = -INFINITY;
            ikvt_to_f16(q, qh, n); /* (which saturates infinities: the f16 ones are set by their bits) */
            qh[bad[0] * D + 3] = 0x7E00, qh[bad[1] * D + 100 % D] = 0x7C00, qh[bad[2] * D] = 0xFC00;
            const void *qin = qd == IKV_DTYPE_F16 ? (const void *)qh : (const void *)q;
            const size_t q_bytes = (qd == IKV_DTYPE_F16 ? 2 : 4) * n;
            if (qd == IKV_DTYPE_F16) /* the CPU reads the values the device reads */
                for (size_t i = 0; i < n; ++i) q[i] = ikvt_f16_to_f32(qh[i]);
            ikv_decode_args a = ikv_decode_args_default();
            a.layer = 1;
            a.n_seqs = B;
            a.n_query_tokens = T;
            a.n_q_heads = HQ;
            a.q_dtype = qd;
            a.softcap = step == 4 ? 30.0f : 0.0f;
            a.plans = step == 5 ? (const ikv_plan *const *)last_two : NULL;
            a.seqs = f.sc, a.q = qin, a.out = out_c, a.lse = lse_c, a.feedback = f.fb_cpu;
            IKVT_OK(ikv_decode(dec, f.cpu, &a));
            assert_int_equal(ikvt_rt.memcpy_(dq, qin, q_bytes, IKVT_H2D), 0);
            a.seqs = f.sg, a.q = dq, a.out = dout, a.lse = dlse, a.feedback = f.fb_gpu;
            IKVT_OK(ikv_decode(dec, f.gpu, &a));
            assert_int_equal(ikvt_rt.sync_(), 0);
            assert_int_equal(ikvt_rt.memcpy_(out_g, dout, 4 * n, IKVT_D2H), 0);
            assert_int_equal(ikvt_rt.memcpy_(lse_g, dlse, 4 * rows, IKVT_D2H), 0);
            double num = 0, den = 0;
            for (size_t r = 0; r < rows; ++r) {
                const int reads_nothing = step == 5 && r / HQ % T == 0; /* query token 0 */
                const int is_bad = (r == bad[0] || r == bad[1] || r == bad[2]) && !reads_nothing;
                if (is_bad != (isnan(lse_c[r]) != 0) || is_bad != (isnan(lse_g[r]) != 0))
                    fail_msg("format %d step %d row %zu: lse %g on the CPU, %g on CUDA", (int)fmts[fi], step, r,
                             (double)lse_c[r], (double)lse_g[r]);
                if (reads_nothing && !(lse_c[r] == -INFINITY && lse_g[r] == -INFINITY))
                    fail_msg("format %d row %zu reads nothing: lse %g on the CPU, %g on CUDA", (int)fmts[fi], r,
                             (double)lse_c[r], (double)lse_g[r]);
                for (size_t d = 0; d < D; ++d) {
                    const float c = out_c[r * D + d], g = out_g[r * D + d];
                    if (reads_nothing && (c != 0.0f || g != 0.0f))
                        fail_msg("format %d row %zu reads nothing: out %g on the CPU, %g on CUDA", (int)fmts[fi], r,
                                 (double)c, (double)g);
                    if (is_bad) {
                        if (!isnan(c) || !isnan(g))
                            fail_msg("format %d step %d row %zu channel %zu: %g on the CPU, %g on CUDA, not NaN",
                                     (int)fmts[fi], step, r, d, (double)c, (double)g);
                        continue;
                    }
                    num += ((double)g - c) * ((double)g - c), den += (double)c * c;
                }
            }
            if (!(sqrt(num / den) <= step_tol(T, qd)))
                fail_msg("format %d step %d: the finite rows' rel L2 %.3g vs CPU", (int)fmts[fi], step, sqrt(num / den));
        }
        for (int b = 0; b < B; ++b) ikv_plan_destroy(last_two[b]);
        /* Only -inf logits: each sequence reads its last token alone (a plan), and row 1 (kv-head 0)
         * holds -inf in a channel where that token's key is positive: its one logit is -inf, which
         * the kernels read as masked; the row still gets NaN outputs (it read a key). */
        {
            static const uint32_t lens[B] = {301, 97};
            ikv_plan *plans[B];
            float k[HKV * D_MAX], v[HKV * D_MAX];
            ikvt_fill_normal(&rng, q, (size_t)B * HQ * D, 1.0f);
            for (int b = 0; b < B; ++b) {
                const ikv_token_range last = {lens[b] - 1, lens[b]};
                IKVT_OK(ikv_plan_from_ranges(&last, 1, lens[b], P, fmts[fi], &plans[b]));
                IKVT_OK(ikv_seq_read(f.cpu, f.sc[b], 1, lens[b] - 1, lens[b], k, v));
                uint32_t d = 0;
                while (d + 1 < D && !(k[d] > 0.0f)) ++d;
                assert_true(k[d] > 0.0f);
                q[((size_t)b * HQ + 1) * D + d] = -INFINITY;
            }
            ikv_decode_args a = ikv_decode_args_default();
            a.layer = 1;
            a.n_seqs = B;
            a.n_q_heads = HQ;
            a.plans = (const ikv_plan *const *)plans;
            a.seqs = f.sc, a.q = q, a.out = out_c, a.lse = lse_c;
            IKVT_OK(ikv_decode(dec, f.cpu, &a));
            assert_int_equal(ikvt_rt.memcpy_(dq, q, 4 * (size_t)B * HQ * D, IKVT_H2D), 0);
            a.seqs = f.sg, a.q = dq, a.out = dout, a.lse = dlse;
            IKVT_OK(ikv_decode(dec, f.gpu, &a));
            assert_int_equal(ikvt_rt.sync_(), 0);
            assert_int_equal(ikvt_rt.memcpy_(out_g, dout, 4 * (size_t)B * HQ * D, IKVT_D2H), 0);
            assert_int_equal(ikvt_rt.memcpy_(lse_g, dlse, 4 * (size_t)B * HQ, IKVT_D2H), 0);
            for (size_t r = 0; r < (size_t)B * HQ; ++r) {
                const int is_bad = r % HQ == 1;
                if (is_bad != (isnan(lse_c[r]) != 0) || is_bad != (isnan(lse_g[r]) != 0) ||
                    is_bad != (isnan(out_c[r * D]) != 0) || is_bad != (isnan(out_g[r * D]) != 0))
                    fail_msg("format %d, -inf logits only, row %zu: lse %g / %g, out %g / %g (CPU / CUDA)",
                             (int)fmts[fi], r, (double)lse_c[r], (double)lse_g[r], (double)out_c[r * D],
                             (double)out_g[r * D]);
            }
            for (int b = 0; b < B; ++b) ikv_plan_destroy(plans[b]);
        }
        expect_same_feedback(f.fb_cpu, f.sc, f.fb_gpu, f.sg, B, step_tol(TM, IKV_DTYPE_F16), fmts[fi]);
        feedback_pools_free(&f);
    }
    ikvt_rt.free_(dq), ikvt_rt.free_(dout), ikvt_rt.free_(dlse);
    free(q), free(out_c), free(out_g), free(lse_c), free(lse_g), free(qh);
    ikv_decoder_destroy(dec);
}

/* A CUDA decode with feedback returns with its shares still on their way to
 * the host (cuda/cuda_feedback.cpp); they are added before the feedback is
 * read. Against the CPU pool (which adds them at once), through the
 * bookkeeping of those copies: a wider decode after a narrower one (a slot's
 * buffer grows), a second decoder, forget and reset right after a decode (its
 * shares are forgotten too, not added after), destroying the feedback after
 * a decode. decode_both synchronizes the stream, so the copies have finished
 * here; tests/gpu_contracts/contract_feedback_waits.c holds them in flight
 * (which calls wait, which do not). */
static void test_feedback_in_flight(void **state) {
    (void)state;
    ikvt_rng rng = {0xF11E};
    ikv_decoder *dec = two_thread_decoder(), *dec2 = two_thread_decoder();
    enum { B = FB_SEQS };
    float *q = malloc(4 * (size_t)B * HQ * D), *out = malloc(4 * (size_t)B * HQ * D), *lse = malloc(4 * (size_t)B * HQ);
    feedback_pools f = feedback_pools_make(IKV_FMT_F16, &rng);
    const double tol = step_tol(1, IKV_DTYPE_F32);
    for (int step = 0; step < 5; ++step) {
        const uint32_t n = step == 0 ? 1u : (uint32_t)B; /* step 1 is wider than step 0 */
        step_cfg cfg = {1, NULL, step == 3 ? 64u : 0u, IKV_DTYPE_F32, 0, 0, NULL, NULL, f.fb_cpu, f.fb_gpu, 0.0f};
        ikvt_fill_normal(&rng, q, (size_t)n * HQ * D, 1.0f);
        const double e = decode_both(step == 2 ? dec2 : dec, f.cpu, f.sc, f.gpu, f.sg, n, 1, q, cfg, out, lse);
        if (!(e <= tol)) fail_msg("step %d: rel L2 %.3g vs CPU", step, e);
        if (step == 1) { /* forget sequence 1 while step 1's shares are in flight */
            IKVT_OK(ikv_page_feedback_forget(f.fb_cpu, f.sc[1]));
            IKVT_OK(ikv_page_feedback_forget(f.fb_gpu, f.sg[1]));
            uint32_t n1 = 99;
            IKVT_OK(ikv_page_feedback_get(f.fb_gpu, f.sg[1], 1, 0, NULL, 0, &n1));
            assert_int_equal(n1, 0);
        }
    }
    /* sequence 0: five steps' averages; sequence 1: those of steps 2-4 only */
    expect_same_feedback(f.fb_cpu, f.sc, f.fb_gpu, f.sg, B, tol, IKV_FMT_F16);
    {
        step_cfg cfg = {1, NULL, 0u, IKV_DTYPE_F32, 0, 0, NULL, NULL, f.fb_cpu, f.fb_gpu, 0.0f};
        ikvt_fill_normal(&rng, q, (size_t)B * HQ * D, 1.0f);
        (void)decode_both(dec, f.cpu, f.sc, f.gpu, f.sg, B, 1, q, cfg, out, lse);
        IKVT_OK(ikv_page_feedback_reset(f.fb_gpu));
        for (int b = 0; b < B; ++b) {
            uint32_t nb = 99;
            IKVT_OK(ikv_page_feedback_get(f.fb_gpu, f.sg[b], 1, 0, NULL, 0, &nb));
            assert_int_equal(nb, 0);
        }
        /* and a decode whose copy is still in flight when its feedback is destroyed */
        (void)decode_both(dec, f.cpu, f.sc, f.gpu, f.sg, B, 1, q, cfg, out, lse);
    }
    feedback_pools_free(&f);
    free(q), free(out), free(lse);
    ikv_decoder_destroy(dec);
    ikv_decoder_destroy(dec2);
}

/* <test>_head_dim_<n>: the test again at head_dim n (run between
 * use_head_dim_<n> and use_head_dim_128). The format matrix at head_dim 32:
 * every format, dense / causal T = 3 / plan / Quest, hybrid and mass top-k,
 * F32 and F16 queries (CTest's _simt and _tensor_cores runs force each
 * compute path), and the T = 130 step on the fused kernel and the GEMM path
 * (IKV_CUDA_MULTI_TOKEN), each against the CPU pool and float64. At head_dim 32 a key row spans 4
 * lanes of kernels/warp_key_dots.cuh (the GEMM path's feedback kernel), and
 * each lane holds the sums of 4 of the 16 query rows it reads keys for at
 * once; at 256, 32 lanes, 8 of which hold each of 4 rows' sums. */
#define AT_HEAD_DIM(test, n)                        \
    static void test##_head_dim_##n(void **state) { \
        assert_int_equal(D, n);                     \
        test(state);                                \
    }
AT_HEAD_DIM(test_cuda_pool_and_decode_match_cpu, 32)
AT_HEAD_DIM(test_long_multi_token_step, 32)
AT_HEAD_DIM(test_feedback_many_rows, 32)
AT_HEAD_DIM(test_feedback_many_rows, 64)
AT_HEAD_DIM(test_feedback_many_rows, 256)
AT_HEAD_DIM(test_mixed_page_formats, 64)

/* CUDA-graph capture through the public API: an ikv_decode call on a CUDA
 * pool (plan upload, query-aware scoring + top-k, decode, merge) captured on
 * an engine stream and replayed must write exactly what the same call wrote
 * eagerly. Two eager calls first (the decoder grows its device buffer and
 * fills both staging halves; the captured call then allocates nothing and
 * skips its host wait, as cuda_decode does while its stream is capturing);
 * relaxed capture mode, the most permissive an engine may use. */
/* Page lists kept across calls on a CUDA pool: the scenario of test_decode
 * (support/list_reuse.c) with device q/out/lse. */
static void test_page_lists_reused_across_layers(void **state) {
    (void)state;
    ikvt_list_reuse_scenario(IKV_BACKEND_CUDA);
}

/* Capture in every mode engines use (torch.cuda.graph captures in global
 * mode): dense, plan and top-k steps, each captured after ONE eager call on a
 * fresh decoder (dense and top-k reuse that call's device lists; the plan's
 * eager call runs on another stream, so its capture uploads its own), replay
 * twice and write what the eager call wrote; a capture on a fresh decoder
 * (nothing sized yet) is refused with IKV_E_STATE. */
static void test_capture_modes(void **state) {
    (void)state;
    ikvt_rng rng = {0xCA97};
    ikv_pool *cpu = make_pool(IKV_BACKEND_CPU, IKV_FMT_F16), *gpu = make_pool(IKV_BACKEND_CUDA, IKV_FMT_F16);
    ikv_seq_id sc, sg;
    fill_both(cpu, gpu, &sc, &sg, 301, &rng);
    const size_t n_out = (size_t)HQ * D;
    float *q = malloc(4 * n_out), *eager = malloc(4 * n_out), *replay = malloc(4 * n_out);
    ikvt_fill_normal(&rng, q, n_out, 1.0f);
    void *dq = ikvt_dev_upload(q, 4 * n_out), *dout = ikvt_dev_upload(NULL, 4 * n_out);
    static const ikv_token_range ranges[] = {{0, 37}, {100, 250}};
    ikv_plan *plan = NULL;
    IKVT_OK(ikv_plan_from_ranges(ranges, 2, 301, P, IKV_FMT_F16, &plan));
    const ikv_plan *plans[1] = {plan};
    const int modes[] = {IKVT_CAPTURE_GLOBAL, IKVT_CAPTURE_THREAD_LOCAL, IKVT_CAPTURE_RELAXED};
    for (int m = 0; m < 3; ++m)
        for (int kind = 0; kind < 3; ++kind) { /* dense, plan, hybrid top-k */
            void *stream = NULL;
            assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
            ikv_decoder_config dc = ikv_decoder_default_config();
            ikv_decoder *dec = NULL;
            IKVT_OK(ikv_decoder_create(&dc, &dec));
            ikv_decode_args a = ikv_decode_args_default();
            a.layer = 1;
            a.seqs = &sg;
            a.n_q_heads = HQ;
            a.q = dq;
            a.out = dout;
            a.stream = stream;
            a.plans = kind == 1 ? plans : NULL;
            a.topk_token_budget = kind == 2 ? 96 : 0;
            a.topk_score = IKV_TOPK_SCORE_HYBRID;
            void *graph = NULL, *exec = NULL;
            if (kind == 0) { /* nothing sized yet: refused, nothing captured but the refusal */
                assert_int_equal(ikvt_rt.begin_capture_(stream, modes[m]), 0);
                const ikv_status st = ikv_decode(dec, gpu, &a);
                assert_int_equal(ikvt_rt.end_capture_(stream, &graph), 0);
                IKVT_EXPECT_STATUS(st, IKV_E_STATE, "eagerly");
                if (graph) ikvt_rt.graph_destroy_(graph);
                graph = NULL;
            }
            /* The one eager call; for the plan step on the default stream, so that the capture
             * (on `stream`) builds its own lists: an upload node from pinned staging. */
            if (kind == 1) a.stream = NULL;
            IKVT_OK(ikv_decode(dec, gpu, &a));
            a.stream = stream;
            assert_int_equal(ikvt_rt.sync_(), 0);
            assert_int_equal(ikvt_rt.memcpy_(eager, dout, 4 * n_out, IKVT_D2H), 0);
            assert_int_equal(ikvt_rt.memset_(dout, 0xFF, 4 * n_out), 0);
            assert_int_equal(ikvt_rt.begin_capture_(stream, modes[m]), 0);
            const ikv_status st = ikv_decode(dec, gpu, &a);
            assert_int_equal(ikvt_rt.end_capture_(stream, &graph), 0);
            if (st != IKV_OK) fail_msg("mode %d kind %d: %s: %s", modes[m], kind, ikv_status_name(st), ikv_last_error());
            assert_int_equal(ikvt_rt.graph_instantiate_(&exec, graph, 0), 0);
            for (int rep = 0; rep < 2; ++rep) {
                assert_int_equal(ikvt_rt.memset_(dout, 0xFF, 4 * n_out), 0);
                assert_int_equal(ikvt_rt.graph_launch_(exec, stream), 0);
                assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
                assert_int_equal(ikvt_rt.memcpy_(replay, dout, 4 * n_out, IKVT_D2H), 0);
                assert_memory_equal(eager, replay, 4 * n_out);
            }
            ikvt_rt.graph_exec_destroy_(exec);
            ikvt_rt.graph_destroy_(graph);
            ikv_decoder_destroy(dec);
            ikvt_rt.stream_destroy_(stream);
        }
    ikv_plan_destroy(plan);
    ikvt_rt.free_(dq), ikvt_rt.free_(dout);
    free(q), free(eager), free(replay);
    ikv_pool_destroy(cpu);
    ikv_pool_destroy(gpu);
}

static void test_decode_step_captured_in_cuda_graph(void **state) {
    (void)state;
    ikvt_rng rng = {0x6A7F};
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    ikv_pool *cpu = make_pool(IKV_BACKEND_CPU, IKV_FMT_INT8), *gpu = make_pool(IKV_BACKEND_CUDA, IKV_FMT_INT8);
    ikv_seq_id sc, sg;
    fill_both(cpu, gpu, &sc, &sg, 333, &rng);
    const size_t n_out = (size_t)HQ * D;
    float *q = malloc(4 * n_out), *eager = malloc(4 * n_out), *replay = malloc(4 * n_out);
    ikvt_fill_normal(&rng, q, n_out, 1.0f);
    void *dq = ikvt_dev_upload(q, 4 * n_out), *dout = ikvt_dev_upload(NULL, 4 * n_out);
    void *stream = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = 1;
    a.n_seqs = 1;
    a.seqs = &sg;
    a.n_q_heads = HQ;
    a.q = dq;
    a.out = dout;
    a.topk_token_budget = 96;
    a.stream = stream;
    for (int warm = 0; warm < 2; ++warm) IKVT_OK(ikv_decode(dec, gpu, &a));
    assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
    assert_int_equal(ikvt_rt.memcpy_(eager, dout, 4 * n_out, IKVT_D2H), 0);

    assert_int_equal(ikvt_rt.memset_(dout, 0xFF, 4 * n_out), 0); /* NaN: the replay must write every element */
    void *graph = NULL, *exec = NULL;
    assert_int_equal(ikvt_rt.begin_capture_(stream, IKVT_CAPTURE_RELAXED), 0);
    const ikv_status st = ikv_decode(dec, gpu, &a);
    assert_int_equal(ikvt_rt.end_capture_(stream, &graph), 0);
    IKVT_OK(st);
    size_t n_runs = 0;
    IKVT_EXPECT_STATUS(ikv_decoder_last_selection(dec, 0, 0, NULL, 0, &n_runs), IKV_E_STATE, "captured");
    a.topk_mass = 2.0f; /* a refused call enqueues nothing and keeps the graph's lists */
    a.topk_mode = IKV_TOPK_MASS;
    IKVT_EXPECT_STATUS(ikv_decode(dec, gpu, &a), IKV_E_INVALID, "topk_mass");
    a.topk_mode = IKV_TOPK_FIXED;
    assert_int_equal(ikvt_rt.graph_instantiate_(&exec, graph, 0), 0);
    assert_int_equal(ikvt_rt.graph_launch_(exec, stream), 0);
    assert_int_equal(ikvt_rt.graph_launch_(exec, stream), 0); /* replays repeat */
    assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
    assert_int_equal(ikvt_rt.memcpy_(replay, dout, 4 * n_out, IKVT_D2H), 0);
    assert_memory_equal(eager, replay, 4 * n_out);
    /* The capture, on the warm-up calls' stream with their lists still exact,
     * reused those device lists (no upload in the graph). Eager calls on the
     * same decoder after it run and write the same, reusing them as well, the
     * last one on another stream (the default one, ordered after the lists'
     * copy on the device). */
    ikv_decoder_stats counts;
    memset(&counts, 0, sizeof counts);
    counts.struct_size = sizeof counts;
    IKVT_OK(ikv_decoder_get_stats(dec, &counts));
    assert_int_equal(counts.lists_built, 1); /* the first warm-up call */
    assert_int_equal(counts.lists_reused, 2); /* the second and the captured one */
    for (int i = 0; i < 4; ++i) {
        assert_int_equal(ikvt_rt.memset_(dout, 0xFF, 4 * n_out), 0);
        if (i == 3) {
            assert_int_equal(ikvt_rt.sync_(), 0);
            a.stream = NULL;
        }
        IKVT_OK(ikv_decode(dec, gpu, &a));
        assert_int_equal(ikvt_rt.sync_(), 0);
        assert_int_equal(ikvt_rt.memcpy_(replay, dout, 4 * n_out, IKVT_D2H), 0);
        assert_memory_equal(eager, replay, 4 * n_out);
    }
    IKVT_OK(ikv_decoder_get_stats(dec, &counts));
    assert_int_equal(counts.lists_built, 1);
    assert_int_equal(counts.lists_reused, 6);

    ikvt_rt.graph_exec_destroy_(exec);
    ikvt_rt.graph_destroy_(graph);
    ikvt_rt.stream_destroy_(stream);
    ikvt_rt.free_(dq), ikvt_rt.free_(dout);
    free(q), free(eager), free(replay);
    ikv_pool_destroy(cpu);
    ikv_pool_destroy(gpu);
    ikv_decoder_destroy(dec);
}

/* ---- IKV_GPU_DECODE_BENCH=1: a decode step through the public API (reported, not asserted) ----
 * What an engine pays per layer call, next to the kernels alone (bench/gpu
 * gpu_decode_check --bench times launch_decode on device lists it built
 * once): ikv_decode on a CUDA pool also checks the sequences and, unless the
 * decoder's page lists still hold (ikv_decoder_get_stats), snapshots them,
 * builds the lists on the host, copies them to the device and launches. The
 * bench shape: 4 layers, 8 kv-heads, 32 q-heads, head_dim 128, page 16, F16
 * pages (IKV_BENCH_PAGE_FMT=int8, bf16, fp8 or int4: that format), F16 q/out
 * on the device, one stream. Two loops per case:
 *   layers  STEPS calls cycling over the layers with the same batch (one
 *           engine step after another with no new token): the step time
 *           (calls back to back, then one stream sync), the host time of
 *           one call (median, p90), bytes read per second;
 *   append  an engine's decode loop: per layer, append one token to every
 *           sequence (device K/V) and decode that layer; time per layer
 *           (append included); the sequences are truncated back afterwards;
 *   batch   the same loop with one ikv_pool_append_batch per layer;
 *   async   the batch loop with IKV_APPEND_ASYNC (no host wait in the loop);
 *   async-only  its appends without the decodes (time per layer: the appends'
 *           device time where it exceeds their host time).
 * Sequences hold ctx - 16 tokens (the append loop adds 12 a layer), so top-k
 * at 128K stays within its 8192 candidate pages. Each line ends with how
 * many calls built their lists and how many reused them. */
/* Element n*num/den of x sorted (num/den = 1/2: the median). */
static double percentile_of(const double *x, int n, int num, int den) {
    double *sorted = malloc(sizeof(double) * n);
    memcpy(sorted, x, sizeof(double) * n);
    qsort(sorted, n, sizeof sorted[0], ikvt_cmp_double);
    const double m = sorted[n * num / den];
    free(sorted);
    return m;
}

static void bench_line(const char *mode, uint32_t B, uint32_t ctx, const char *sel, double step_us, const double *host,
                       int n, ikv_decoder *dec, const ikv_decoder_stats *before) {
    ikv_decoder_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    IKVT_OK(ikv_decoder_get_stats(dec, &st));
    printf("BENCH decode B=%-2u ctx=%-6u %-6s %-6s step %.4f ms  %6.0f GB/s of %.1f MB read  host %.1f us per call "
           "(p90 %.1f)  lists built %llu reused %llu\n",
           B, ctx, sel, mode, step_us * 1e-3, (double)st.last_bytes_read / (step_us * 1e3),
           st.last_bytes_read / 1e6, percentile_of(host, n, 1, 2), percentile_of(host, n, 9, 10),
           (unsigned long long)(st.lists_built - before->lists_built),
           (unsigned long long)(st.lists_reused - before->lists_reused));
}

static void run_decode_bench(void) {
    enum { BL = 4, BH = 8, BD = 128, BP = 16, BHQ = 32, CHUNK = 4096, WARM = 8, STEPS = 48 };
    static const uint32_t cases[][2] = {{1, 8192}, {1, 32768}, {1, 131072}, {8, 8192}, {8, 32768}, {32, 32768}};
    ikvt_rng rng = {7};
    const size_t chunk_elems = (size_t)CHUNK * BH * BD;
    float *tmp = malloc(4 * chunk_elems);
    uint16_t *h16 = malloc(2 * chunk_elems);
    ikvt_fill_normal(&rng, tmp, chunk_elems, 1.0f);
    ikvt_to_f16(tmp, h16, chunk_elems);
    void *dk = ikvt_dev_upload(h16, 2 * chunk_elems);
    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    IKVT_OK(ikv_decoder_create(&dc, &dec));
    void *stream = NULL;
    assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
    /* IKV_BENCH_PAGE_FMT=int8 (or bf16, fp8, int4): the pages' format; F16 by default. */
    ikv_format page_format = IKV_FMT_F16;
    const char *pf = getenv("IKV_BENCH_PAGE_FMT");
    for (int f = 0; pf && f < IKV_FMT_COUNT; ++f)
        if (strcasecmp(pf, ikv_format_name((ikv_format)f)) == 0 ||
            (f == IKV_FMT_FP8_E4M3 && strcasecmp(pf, "fp8") == 0))
            page_format = (ikv_format)f;
    printf("BENCH ikv_decode on a CUDA pool: %d layers, %d kv-heads, %d q-heads, head_dim %d, page %d, %s pages, F16 "
           "q/out\n",
           BL, BH, BHQ, BD, BP, ikv_format_name(page_format));
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
        const uint32_t B = cases[ci][0], ctx = cases[ci][1];
        ikv_pool *pool = ikvt_make_pool((ikvt_pool_spec){
            .backend = IKV_BACKEND_CUDA, .n_layers = BL, .n_kv_heads = BH, .head_dim = BD, .page_size = BP,
            /* 4 KiB of K+V per token and layer, summaries, the append loops' tokens, margin */
            .capacity_bytes = (uint64_t)B * (ctx + 2 * STEPS + BP) * BL * 5000u + (64u << 20),
            .default_format = page_format, .kv_dtype = IKV_DTYPE_F16});
        ikv_seq_id seqs[32];
        for (uint32_t b = 0; b < B; ++b) {
            IKVT_OK(ikv_seq_create(pool, &seqs[b]));
            for (uint32_t l = 0; l < BL; ++l) /* every layer gets the same K/V */
                for (uint32_t t = 0; t < ctx - BP; t += CHUNK) {
                    ikv_append a = ikv_append_default(pool, t + CHUNK <= ctx - BP ? CHUNK : ctx - BP - t);
                    a.layer = l;
                    a.k = dk;
                    a.v = dk;
                    a.src_on_device = 1;
                    IKVT_OK(ikv_pool_append(pool, seqs[b], &a));
                }
        }
        const size_t n_q = (size_t)B * BHQ * BD;
        float *qf = malloc(4 * n_q);
        uint16_t *qh = malloc(2 * n_q);
        ikvt_fill_normal(&rng, qf, n_q, 1.0f);
        ikvt_to_f16(qf, qh, n_q);
        void *dq = ikvt_dev_upload(qh, 2 * n_q), *dout = ikvt_dev_upload(NULL, 2 * n_q);
        /* dense; top-k at 25% (Quest); the same by IKV_TOPK_SCORE_HYBRID; IKV_TOPK_MASS 0.9 on
         * hybrid scores capped at 25% (the last two: the decode alone, no engine loops) */
        static const char *const kSel[] = {"dense", "topk25", "hyb25", "mass25"};
        for (int topk = 0; topk < 4; ++topk) {
            ikv_decode_args a = ikv_decode_args_default();
            a.n_seqs = B;
            a.seqs = seqs;
            a.n_q_heads = BHQ;
            a.q = dq;
            a.q_dtype = IKV_DTYPE_F16;
            a.out = dout;
            a.out_dtype = IKV_DTYPE_F16;
            a.topk_token_budget = topk ? ctx / 4 : 0;
            a.topk_score = topk >= 2 ? IKV_TOPK_SCORE_HYBRID : IKV_TOPK_SCORE_QUEST;
            if (topk == 3) {
                a.topk_mode = IKV_TOPK_MASS;
                a.topk_mass = 0.9f;
            }
            a.stream = stream;
            for (int i = 0; i < WARM; ++i) {
                a.layer = i % BL;
                IKVT_OK(ikv_decode(dec, pool, &a));
            }
            assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
            double host[STEPS], append_host[STEPS];
            ikv_decoder_stats before;
            memset(&before, 0, sizeof before);
            before.struct_size = sizeof before;
            IKVT_OK(ikv_decoder_get_stats(dec, &before));
            double t0 = ikvt_now_us();
            for (int i = 0; i < STEPS; ++i) {
                a.layer = i % BL;
                const double h0 = ikvt_now_us();
                IKVT_OK(ikv_decode(dec, pool, &a));
                host[i] = ikvt_now_us() - h0;
            }
            assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
            bench_line("layers", B, ctx, kSel[topk], (ikvt_now_us() - t0) / STEPS, host, STEPS, dec, &before);
            { /* the same step as a CUDA graph (global capture mode, as torch.cuda.graph), replayed back to back */
                void *graph = NULL, *exec = NULL;
                a.layer = 0;
                IKVT_OK(ikv_decode(dec, pool, &a)); /* the eager call the capture follows */
                assert_int_equal(ikvt_rt.begin_capture_(stream, IKVT_CAPTURE_GLOBAL), 0);
                const ikv_status st = ikv_decode(dec, pool, &a);
                assert_int_equal(ikvt_rt.end_capture_(stream, &graph), 0);
                IKVT_OK(st);
                assert_int_equal(ikvt_rt.graph_instantiate_(&exec, graph, 0), 0);
                for (int i = 0; i < WARM; ++i) assert_int_equal(ikvt_rt.graph_launch_(exec, stream), 0);
                assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
                const double g0 = ikvt_now_us();
                for (int i = 0; i < STEPS; ++i) assert_int_equal(ikvt_rt.graph_launch_(exec, stream), 0);
                assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
                printf("BENCH decode B=%-2u ctx=%-6u %-6s graph  step %.4f ms  (replays of one captured ikv_decode)\n", B,
                       ctx, kSel[topk], (ikvt_now_us() - g0) / STEPS * 1e-3);
                ikvt_rt.graph_exec_destroy_(exec);
                ikvt_rt.graph_destroy_(graph);
            }
            if (topk >= 2) continue;  /* the engine loops: dense and Quest top-k only */

            /* The engine loop: a token per layer (to each sequence, then to all
             * in one batch, checked and asynchronous; sequence b's token is
             * row b of dk), then that layer's decode. */
            static const struct {
                const char *mode;
                int per_seq, decode;
                uint32_t flags;
            } loops[] = {{"append", 1, 1, 0},
                         {"batch", 0, 1, 0},
                         {"async", 0, 1, IKV_APPEND_ASYNC},
                         {"async-only", 0, 0, IKV_APPEND_ASYNC}};  /* no decode: the appends' own time */
            for (size_t li = 0; li < sizeof loops / sizeof loops[0]; ++li) {
                ikv_append ap = ikv_append_default(pool, 1);
                ap.k = dk;
                ap.v = dk;
                ap.src_on_device = 1;
                ap.stream = stream;
                ap.flags = loops[li].flags;
                IKVT_OK(ikv_decoder_get_stats(dec, &before));
                t0 = ikvt_now_us();
                for (int i = 0; i < STEPS; ++i) {
                    a.layer = ap.layer = i % BL;
                    const double a0 = ikvt_now_us();
                    if (loops[li].per_seq)
                        for (uint32_t b = 0; b < B; ++b) IKVT_OK(ikv_pool_append(pool, seqs[b], &ap));
                    else
                        IKVT_OK(ikv_pool_append_batch(pool, seqs, B, &ap));
                    append_host[i] = ikvt_now_us() - a0;
                    const double h0 = ikvt_now_us();
                    if (loops[li].decode) IKVT_OK(ikv_decode(dec, pool, &a));
                    host[i] = ikvt_now_us() - h0;
                }
                assert_int_equal(ikvt_rt.stream_sync_(stream), 0);
                const double per_layer_us = (ikvt_now_us() - t0) / STEPS;
                if (loops[li].decode)
                    bench_line(loops[li].mode, B, ctx, kSel[topk], per_layer_us, host, STEPS, dec, &before);
                else
                    printf("BENCH decode B=%-2u ctx=%-6u %-6s %-6s step %.4f ms  (appends only)\n", B, ctx,
                           topk ? "topk25" : "dense", loops[li].mode, per_layer_us * 1e-3);
                printf("BENCH   %s: host %.1f us per layer's appends (median)\n", loops[li].mode,
                       percentile_of(append_host, STEPS, 1, 2));
                IKVT_OK(ikv_pool_sync(pool));
                for (uint32_t b = 0; b < B; ++b) IKVT_OK(ikv_seq_truncate(pool, seqs[b], STEPS / BL));
            }
        }
        ikvt_rt.free_(dq), ikvt_rt.free_(dout);
        free(qf), free(qh);
        ikv_pool_destroy(pool);
    }
    ikvt_rt.stream_destroy_(stream);
    ikv_decoder_destroy(dec);
    ikvt_rt.free_(dk);
    free(tmp), free(h16);
}

int main(void) {
    /* The CPU pool is the fp32 model the CUDA pool is checked against: its INT8
     * value sums stay in fp32 (the AVX-512 VNNI integer path has its own float64
     * bound in test_decode). Set before the first library call picks the kernels. */
    setenv("IKV_CPU_VNNI", "off", 1);
    const struct CMUnitTest everywhere[] = {
        cmocka_unit_test(test_cuda_pool_refused_without_device),
    };
    const int failed = cmocka_run_group_tests_name("cuda_everywhere", everywhere, NULL, NULL);
    if (failed) return failed;
    ikvt_require_cuda_device();
    const char *bench = getenv("IKV_GPU_DECODE_BENCH");
    if (bench && strcmp(bench, "only") == 0) {  /* the timing run alone, in a fresh process */
        run_decode_bench();
        return 0;
    }
    /* IKVT_TEST_FILTER=<pattern>: only the matching tests (e.g. under compute-sanitizer). */
    if (getenv("IKVT_TEST_FILTER")) cmocka_set_test_filter(getenv("IKVT_TEST_FILTER"));
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test(test_cuda_pool_and_decode_match_cpu),
        cmocka_unit_test(test_mixed_page_formats),
        cmocka_unit_test_setup_teardown(test_mixed_page_formats_head_dim_64, use_head_dim_64, use_head_dim_128),
        cmocka_unit_test(test_keys_score_limits),
        cmocka_unit_test(test_keys_score_skips_bad_rows),
        cmocka_unit_test(test_long_multi_token_step),
        cmocka_unit_test_setup_teardown(test_cuda_pool_and_decode_match_cpu_head_dim_32, use_head_dim_32,
                                        use_head_dim_128),
        cmocka_unit_test_setup_teardown(test_long_multi_token_step_head_dim_32, use_head_dim_32, use_head_dim_128),
        cmocka_unit_test(test_decode_step_captured_in_cuda_graph),
        cmocka_unit_test(test_capture_modes),
        cmocka_unit_test(test_page_lists_reused_across_layers),
        cmocka_unit_test(test_query_memory_matches_cpu),
        cmocka_unit_test(test_query_memory_in_graph),
        cmocka_unit_test(test_feedback_matches_cpu),
        cmocka_unit_test(test_non_finite_query_rows),
        cmocka_unit_test(test_overflowing_logits),
        cmocka_unit_test(test_feedback_in_flight),
        cmocka_unit_test(test_feedback_many_rows),
        cmocka_unit_test_setup_teardown(test_feedback_many_rows_head_dim_32, use_head_dim_32, use_head_dim_128),
        cmocka_unit_test_setup_teardown(test_feedback_many_rows_head_dim_64, use_head_dim_64, use_head_dim_128),
        cmocka_unit_test_setup_teardown(test_feedback_many_rows_head_dim_256, use_head_dim_256, use_head_dim_128),
    };
    const int rc = cmocka_run_group_tests_name("cuda_gpu", gpu, NULL, NULL);
    if (rc == 0 && bench && strcmp(bench, "1") == 0) run_decode_bench();
    return rc;
}
