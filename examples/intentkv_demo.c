/*
 * intentkv-demo: one agentic session, end to end.
 *
 *   1. a synthetic agentic layout (system prompt, memory, documents, tool
 *      output, scratchpad, turns) of --tokens tokens;
 *   2. routed under a few router configs: what is read, skipped, at which
 *      precision, bytes and FLOPs against dense F16;
 *   3. the session's K/V filled into a pool per config, with the router's
 *      precision per page: memory against all-F16;
 *   4. one decode step per config, timed against dense decode over an F16
 *      pool, with the bytes read and the output error against dense.
 *
 * The K/V are synthetic: keys of a block lean toward the query in proportion
 * to the block's score (SKIP blocks: not at all), so scores mean relevance
 * here as they would if an engine's scorer were good. Runs on the GPU when one is present (CUDA build),
 * else on the CPU.
 *
 * Usage: intentkv-demo [--tokens N] [--cpu] [--steps N]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "intentkv.h"

#ifdef IKV_DEMO_CUDA
#include <cuda_runtime_api.h>
#endif

#define N_LAYERS 1
#define N_KV_HEADS 8
#define N_Q_HEADS 32
#define HEAD_DIM 128
/* The router reads the newest tokens whole; 2048 covers the newest turn of the synthetic session. */
#define RECENT_WINDOW 2048

#define CHECK(call)                                                                        \
    do {                                                                                   \
        ikv_status st_ = (call);                                                           \
        if (st_ != IKV_OK) {                                                               \
            fprintf(stderr, "%s failed: %s: %s\n", #call, ikv_status_name(st_), ikv_last_error()); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

typedef struct demo_config {
    const char *name;
    uint32_t budget_per_mille; /* token budget as a share of the context; 0 = unlimited */
    float pressure;
} demo_config;

static const demo_config kConfigs[] = {
    {"all-blocks", 0, 0.0f},
    {"budget-50%", 500, 0.0f},
    {"budget-25%", 250, 0.0f},
    {"budget-25%+pressure", 250, 0.7f},
    {"budget-12%+pressure", 125, 0.9f},
};

static uint64_t rng_state = 12345;
static double uniform01(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}
static float normal(void) {
    double u1 = uniform01() + 1e-300, u2 = uniform01();
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/*
 * K/V in fp32, [token][kv_head][dim]. Each kv-head has a direction u_h that
 * its query heads share (plus noise); a token's key leans toward u_h by the
 * relevance of its block: the block's score, or 0 for SKIP blocks (what an
 * engine marks SKIP is irrelevant). So attention mass follows the scores.
 */
static void make_session(const ikv_layout *layout, uint32_t n_tokens, float *q, float *k, float *v) {
    static float u[N_KV_HEADS][HEAD_DIM];
    for (uint32_t h = 0; h < N_KV_HEADS; ++h)
        for (uint32_t d = 0; d < HEAD_DIM; ++d) u[h][d] = 0.35f * normal();
    for (uint32_t qh = 0; qh < N_Q_HEADS; ++qh)
        for (uint32_t d = 0; d < HEAD_DIM; ++d)
            q[qh * HEAD_DIM + d] = u[qh / (N_Q_HEADS / N_KV_HEADS)][d] + 0.1f * normal();
    for (uint32_t t = 0; t < n_tokens; ++t) {
        uint32_t id;
        float rel = 0.0f;
        ikv_block_info info;
        if (ikv_layout_find_token(layout, t, &id) == IKV_OK && ikv_layout_get(layout, id, &info) == IKV_OK &&
            info.policy != IKV_POLICY_SKIP)
            rel = info.score;
        for (uint32_t h = 0; h < N_KV_HEADS; ++h) {
            float *kr = k + ((size_t)t * N_KV_HEADS + h) * HEAD_DIM;
            float *vr = v + ((size_t)t * N_KV_HEADS + h) * HEAD_DIM;
            for (uint32_t d = 0; d < HEAD_DIM; ++d) {
                kr[d] = normal() + 4.0f * rel * rel * u[h][d];
                vr[d] = normal();
            }
        }
    }
}

typedef struct device_bufs {
    int on_gpu;
    void *q, *out;
} device_bufs;

static ikv_pool *make_pool(ikv_backend backend, uint32_t n_tokens, ikv_format fmt, const ikv_plan *formats,
                           const float *k, const float *v, ikv_seq_id *seq) {
    ikv_pool_config pc = ikv_pool_default_config();
    pc.backend = backend;
    pc.n_layers = N_LAYERS;
    pc.n_kv_heads = N_KV_HEADS;
    pc.head_dim = HEAD_DIM;
    pc.page_size = 16;
    pc.kv_dtype = IKV_DTYPE_F32;
    pc.default_format = fmt;
    pc.capacity_bytes = (uint64_t)n_tokens * N_LAYERS * N_KV_HEADS * HEAD_DIM * 2 * 2 * 3 / 2 + (64u << 20);
    ikv_pool *pool = NULL;
    CHECK(ikv_pool_create(&pc, &pool));
    CHECK(ikv_seq_create(pool, seq));
    ikv_append ap = ikv_append_default(pool, n_tokens);
    ap.layer = IKV_ALL_LAYERS;
    ap.k = k;
    ap.v = v;
    ap.formats = formats;
    CHECK(ikv_pool_append(pool, *seq, &ap));
    return pool;
}

/* Route the session under one demo config (the router is only needed for that). */
static ikv_plan *route_config(const demo_config *cfg, const ikv_layout *layout, uint32_t n_tokens) {
    ikv_router_config rc = ikv_router_default_config();
    rc.token_budget = (uint32_t)((uint64_t)n_tokens * cfg->budget_per_mille / 1000);
    rc.memory_pressure = cfg->pressure;
    rc.over_budget = IKV_OVER_BUDGET_KEEP;
    rc.recent_window = RECENT_WINDOW;
    ikv_router *router = NULL;
    ikv_plan *plan = NULL;
    CHECK(ikv_router_create(&rc, &router));
    CHECK(ikv_router_route(router, layout, n_tokens, &plan));
    ikv_router_destroy(router);
    return plan;
}

/* Run `steps` decode steps; returns ms per step and leaves the output in out_host. */
static double decode_ms(ikv_decoder *dec, ikv_pool *pool, ikv_seq_id seq, const ikv_plan *plan, const float *q,
                        float *out_host, const device_bufs *dev, int steps, uint64_t *bytes) {
    const ikv_plan *plans[1] = {plan};
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = 0;
    a.n_seqs = 1;
    a.seqs = &seq;
    a.plans = plans;
    a.n_query_tokens = 1;
    a.n_q_heads = N_Q_HEADS;
    a.q = dev->on_gpu ? dev->q : q;
    a.q_dtype = IKV_DTYPE_F32;
    a.out = dev->on_gpu ? dev->out : out_host;
    a.out_dtype = IKV_DTYPE_F32;
    CHECK(ikv_decode(dec, pool, &a)); /* warm-up */
#ifdef IKV_DEMO_CUDA
    if (dev->on_gpu) cudaDeviceSynchronize();
#endif
    double t0 = now_ms();
    for (int i = 0; i < steps; ++i) CHECK(ikv_decode(dec, pool, &a));
#ifdef IKV_DEMO_CUDA
    if (dev->on_gpu) {
        cudaDeviceSynchronize();
        cudaMemcpy(out_host, dev->out, sizeof(float) * N_Q_HEADS * HEAD_DIM, cudaMemcpyDeviceToHost);
    }
#endif
    double ms = (now_ms() - t0) / steps;
    CHECK(ikv_decoder_last_bytes_read(dec, bytes));
    return ms;
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

int main(int argc, char **argv) {
    uint32_t n_tokens = 32768;
    int force_cpu = 0, steps = 20;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) n_tokens = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu")) force_cpu = 1;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--tokens N] [--cpu] [--steps N]\n", argv[0]);
            return 2;
        }
    }

    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(ikv_runtime_info_get(&info));
    device_bufs dev = {0, NULL, NULL};
    ikv_backend backend = IKV_BACKEND_CPU;
    if (!force_cpu && info.cuda_built && info.cuda_device_count > 0) backend = IKV_BACKEND_CUDA;
    printf("intentkv %s | CPU path: %s (available: %s) | CUDA built: %s, devices: %d%s%s\n",
           ikv_version_string(), info.cpu_isa, info.cpu_isa_available, info.cuda_built ? "yes" : "no",
           info.cuda_device_count, info.cuda_device_name[0] ? ", " : "", info.cuda_device_name);
    printf("backend used for decode: %s\n\n", backend == IKV_BACKEND_CUDA ? "CUDA" : "CPU");

    /* 1. the session */
    ikv_synth_config sc = ikv_synth_default_config();
    sc.seq_len = n_tokens;
    ikv_layout *layout = NULL;
    CHECK(ikv_synth_layout(&sc, &layout));
    printf("Synthetic agentic session: %u tokens, %zu blocks\n", n_tokens, ikv_layout_count(layout));
    printf("  %-22s %-15s %-7s %15s %6s\n", "block", "kind", "policy", "tokens", "score");
    for (size_t i = 0; i < ikv_layout_count(layout); ++i) {
        ikv_block_info b;
        CHECK(ikv_layout_at(layout, i, &b));
        printf("  %-22s %-15s %-7s %7u..%-7u %6.2f\n", b.name, ikv_block_kind_name(b.kind),
               ikv_policy_name(b.policy), b.start, b.end, b.score);
    }

    /* query and K/V */
    size_t kv_elems = (size_t)n_tokens * N_KV_HEADS * HEAD_DIM;
    float *q = malloc(sizeof(float) * N_Q_HEADS * HEAD_DIM);
    float *k = malloc(sizeof(float) * kv_elems), *v = malloc(sizeof(float) * kv_elems);
    float *out_dense = malloc(sizeof(float) * N_Q_HEADS * HEAD_DIM), *out = malloc(sizeof(float) * N_Q_HEADS * HEAD_DIM);
    if (!q || !k || !v || !out_dense || !out) return 1;
    make_session(layout, n_tokens, q, k, v);
#ifdef IKV_DEMO_CUDA
    if (backend == IKV_BACKEND_CUDA) {
        dev.on_gpu = 1;
        if (cudaMalloc(&dev.q, sizeof(float) * N_Q_HEADS * HEAD_DIM) != cudaSuccess ||
            cudaMalloc(&dev.out, sizeof(float) * N_Q_HEADS * HEAD_DIM) != cudaSuccess)
            return 1;
        cudaMemcpy(dev.q, q, sizeof(float) * N_Q_HEADS * HEAD_DIM, cudaMemcpyHostToDevice);
    }
#endif

    ikv_decoder *dec = NULL;
    ikv_decoder_config dc = ikv_decoder_default_config();
    CHECK(ikv_decoder_create(&dc, &dec));

    /* dense baseline: every token in F16 */
    ikv_seq_id seq_dense;
    ikv_pool *pool_dense = make_pool(backend, n_tokens, IKV_FMT_F16, NULL, k, v, &seq_dense);
    uint64_t dense_bytes = 0;
    double dense_ms = decode_ms(dec, pool_dense, seq_dense, NULL, q, out_dense, &dev, steps, &dense_bytes);
    ikv_pool_stats dense_stats;
    dense_stats.struct_size = sizeof dense_stats;
    CHECK(ikv_pool_get_stats(pool_dense, &dense_stats));

    ikv_model_shape shape = ikv_model_shape_default();
    printf("\nRouting (recent window %u tokens; cost model: %u layers, %u q-heads, %u kv-heads, head_dim %u, one decode "
           "step)\n",
           RECENT_WINDOW, shape.n_layers, shape.n_q_heads, shape.n_kv_heads, shape.head_dim);
    printf("  %-21s %8s %8s %7s %6s %6s %6s %6s %6s %9s %8s\n", "config", "tokens", "skipped", "pages", "f16", "bf16",
           "fp8", "int8", "int4", "bytes/dns", "flop/dns");
    for (size_t c = 0; c < sizeof kConfigs / sizeof *kConfigs; ++c) {
        ikv_plan *plan = route_config(&kConfigs[c], layout, n_tokens);
        ikv_plan_summary s;
        ikv_plan_cost cost;
        CHECK(ikv_plan_get_summary(plan, &s));
        CHECK(ikv_plan_get_cost(plan, &shape, &cost));
        printf("  %-21s %8u %8u %7u %6u %6u %6u %6u %6u %8.1f%% %7.1f%%\n", kConfigs[c].name, s.tokens_selected,
               s.tokens_skipped, s.pages_selected, s.tokens_by_format[IKV_FMT_F16], s.tokens_by_format[IKV_FMT_BF16],
               s.tokens_by_format[IKV_FMT_FP8_E4M3], s.tokens_by_format[IKV_FMT_INT8], s.tokens_by_format[IKV_FMT_INT4],
               100.0 * cost.bytes_total / cost.bytes_dense_f16, 100.0 * cost.flops / cost.flops_dense);
        ikv_plan_destroy(plan);
    }

    printf("\nPool and decode (1 layer, %u kv-heads, %u q-heads, head_dim %u, page 16; %d steps each)\n", N_KV_HEADS,
           N_Q_HEADS, HEAD_DIM, steps);
    printf("  %-21s %10s %8s %10s %9s %8s %10s %10s\n", "config", "pool MiB", "vs f16", "ms/step", "MB read",
           "speedup", "err(sel)", "err(all)");
    printf("  %-21s %10.1f %7.0f%% %10.3f %9.2f %7.2fx %10s %10s\n", "dense f16", dense_stats.used_bytes / 1048576.0,
           100.0, dense_ms, dense_bytes / 1e6, 1.0, "0", "0");
    ikv_pool_stats mem[sizeof kConfigs / sizeof *kConfigs];
    for (size_t c = 0; c < sizeof kConfigs / sizeof *kConfigs; ++c) {
        ikv_plan *plan = route_config(&kConfigs[c], layout, n_tokens);
        ikv_seq_id seq;
        ikv_pool *pool = make_pool(backend, n_tokens, IKV_FMT_F16, plan, k, v, &seq);
        ikv_pool_stats st;
        st.struct_size = sizeof st;
        CHECK(ikv_pool_get_stats(pool, &st));
        mem[c] = st;
        uint64_t bytes = 0, sel_bytes = 0;
        decode_ms(dec, pool_dense, seq_dense, plan, q, out, &dev, 1, &sel_bytes);
        const double sel_err = rel_err(out, out_dense, N_Q_HEADS * HEAD_DIM);
        double ms = decode_ms(dec, pool, seq, plan, q, out, &dev, steps, &bytes);
        printf("  %-21s %10.1f %7.0f%% %10.3f %9.2f %7.2fx %10.2e %10.2e\n", kConfigs[c].name,
               st.used_bytes / 1048576.0, 100.0 * st.used_bytes / dense_stats.used_bytes, ms, bytes / 1e6,
               dense_ms / ms, sel_err, rel_err(out, out_dense, N_Q_HEADS * HEAD_DIM));
        ikv_pool_destroy(pool);
        ikv_plan_destroy(plan);
    }
    printf("\nPool memory by page format, MiB (pages store every token, each page at the plan's precision)\n");
    printf("  %-21s %8s %8s %8s %8s %8s %9s %8s\n", "config", "f16", "bf16", "fp8", "int8", "int4", "total",
           "saved");
    for (size_t c = 0; c < sizeof kConfigs / sizeof *kConfigs; ++c) {
        printf("  %-21s", kConfigs[c].name);
        for (int f = 0; f < IKV_FMT_COUNT; ++f) printf(" %8.1f", mem[c].bytes_by_format[f] / 1048576.0);
        printf(" %9.1f %7.0f%%\n", mem[c].used_bytes / 1048576.0,
               100.0 - 100.0 * mem[c].used_bytes / dense_stats.used_bytes);
    }
    printf("\n(pool MiB: every page stored in the router's precision for that config; errors: ||out - dense|| / ||dense|| "
           "over all heads;\n err(sel): the plan's tokens read from the F16 pool (selection only); err(all): from the "
           "pool stored at the plan's precisions)\n");

    ikv_pool_destroy(pool_dense);
    ikv_decoder_destroy(dec);
    ikv_layout_destroy(layout);
#ifdef IKV_DEMO_CUDA
    if (dev.on_gpu) {
        cudaFree(dev.q);
        cudaFree(dev.out);
    }
#endif
    free(q);
    free(k);
    free(v);
    free(out_dense);
    free(out);
    return 0;
}
