/*
 * intentkv-demo: one agentic session, end to end, on K/V where relevance exists.
 *
 *   1. a synthetic agentic layout (system prompt, memory, documents, tool
 *      output, scratchpad, turns) of --tokens tokens, and K/V built on it
 *      where attention has structure (below);
 *   2. what one decode step reads under a few selections (dense, the router's
 *      plan, query-aware top-k, top-k inside the plan, the adaptive mass
 *      mode): tokens, bytes, the share of the true attention kept and the
 *      output error against dense attention computed here in float64;
 *   3. the router under a few configs (budget, memory pressure): what it
 *      reads, at which precision, and the pool stored at the plan's precision
 *      per page: memory against all-F16, and the output error that adds.
 *
 * The K/V (seeded, built here, as bench/quality/synthetic.py builds its
 * contexts): the first 4 tokens are attention sinks, keys along a direction
 * every query of their kv-head shares; every block of the layout has a topic
 * direction added to its keys; each kv-head gets two of the 4 highest-scored
 * ATTEND blocks and each of its query heads reads one of them or both (its
 * query contains their topic), so the layout's scores say where attention
 * goes, as an engine's retriever would; the newest turn is mildly aligned
 * with every query. Key noise is small (0.3 per channel) so the structure
 * dominates; values are N(0, 1). The reference is dense attention over the
 * stored K/V (ikv_seq_read) in float64; which tokens each step read comes
 * from ikv_decoder_last_selection.
 *
 * Runs on the GPU when one is present (CUDA build), else on the CPU.
 *
 * Usage: intentkv-demo [--tokens N] [--cpu] [--steps N] [--seed N]
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
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
#define GROUP (N_Q_HEADS / N_KV_HEADS)
#define HEAD_DIM 128
#define PAGE_SIZE 16

/* The data's structure (logits are q.k / sqrt(HEAD_DIM); background logits have a std of about 1). */
#define N_SINKS 4          /* attention-sink tokens at the start */
#define N_CANDIDATES 4     /* the highest-scored ATTEND blocks: each kv-head's query heads read 2 of them */
#define KEY_NOISE 0.3f     /* per channel */
#define KEY_TOPIC 2.0f     /* norm of a block's topic direction in its keys */
#define KEY_SINK 4.0f
#define KEY_RECENT 1.5f
#define Q_TOPIC_ONE 3.0f   /* query weight (x sqrt(HEAD_DIM)) of its relevant block's topic: logit +6 */
#define Q_TOPIC_TWO 2.5f   /* each of two relevant blocks: logit +5 */
#define Q_SINK 2.0f        /* sinks: logit +8 */
#define Q_RECENT 1.0f      /* newest turn: logit +1.5 */

#define CHECK(call)                                                                        \
    do {                                                                                   \
        ikv_status st_ = (call);                                                           \
        if (st_ != IKV_OK) {                                                               \
            fprintf(stderr, "%s failed: %s: %s\n", #call, ikv_status_name(st_), ikv_last_error()); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Seeded RNG: splitmix64 and Box-Muller (polar form)                        */
/* ------------------------------------------------------------------------ */

static uint64_t rng_state = 42;
static int rng_has_spare = 0;
static double rng_spare = 0;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform01(void) { return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0); }
/* Box-Muller in Marsaglia's polar form (no sin/cos), two normals per accepted pair. */
static float normal(void) {
    if (rng_has_spare) {
        rng_has_spare = 0;
        return (float)rng_spare;
    }
    double u, v, r;
    do {
        u = 2.0 * uniform01() - 1.0;
        v = 2.0 * uniform01() - 1.0;
        r = u * u + v * v;
    } while (r >= 1.0 || r == 0.0);
    const double f = sqrt(-2.0 * log(r) / r);
    rng_spare = v * f;
    rng_has_spare = 1;
    return (float)(u * f);
}
static void unit_vector(float *u) {
    double n = 0;
    for (int d = 0; d < HEAD_DIM; ++d) {
        u[d] = normal();
        n += (double)u[d] * u[d];
    }
    for (int d = 0; d < HEAD_DIM; ++d) u[d] = (float)(u[d] / sqrt(n));
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* ------------------------------------------------------------------------ */
/* The session: layout, queries, K/V                                          */
/* ------------------------------------------------------------------------ */

typedef struct session {
    uint32_t n_tokens;
    size_t n_blocks;
    ikv_block_info *blocks;
    uint32_t *block_of; /* token -> block index */
    uint8_t *relevant;  /* [block][q_head]: the q-head's query contains the block's topic */
    float *q;           /* [q_head][dim] */
    float *k, *v;       /* [token][kv_head][dim] */
} session;

static void make_session(const ikv_layout *layout, uint32_t n_tokens, session *s) {
    const size_t nb = ikv_layout_count(layout);
    s->n_tokens = n_tokens;
    s->n_blocks = nb;
    s->blocks = calloc(nb, sizeof *s->blocks);
    s->block_of = malloc(sizeof(uint32_t) * n_tokens);
    s->relevant = calloc(nb * N_Q_HEADS, 1);
    s->q = malloc(sizeof(float) * N_Q_HEADS * HEAD_DIM);
    s->k = malloc(sizeof(float) * n_tokens * N_KV_HEADS * HEAD_DIM);
    s->v = malloc(sizeof(float) * n_tokens * N_KV_HEADS * HEAD_DIM);
    float *topic = malloc(sizeof(float) * nb * HEAD_DIM);
    if (!s->blocks || !s->block_of || !s->relevant || !s->q || !s->k || !s->v || !topic) exit(1);
    for (uint32_t t = 0; t < n_tokens; ++t) s->block_of[t] = UINT32_MAX; /* synth layouts tile, but stay safe */
    for (size_t b = 0; b < nb; ++b) {
        CHECK(ikv_layout_at(layout, b, &s->blocks[b]));
        for (uint32_t t = s->blocks[b].start; t < s->blocks[b].end && t < n_tokens; ++t) s->block_of[t] = (uint32_t)b;
    }

    /* The blocks a query head may read: the N_CANDIDATES highest-scored ATTEND blocks. */
    size_t cand[N_CANDIDATES], n_cand = 0;
    while (n_cand < N_CANDIDATES) {
        size_t best = nb;
        for (size_t b = 0; b < nb; ++b) {
            int taken = 0;
            for (size_t c = 0; c < n_cand; ++c) taken |= cand[c] == b;
            if (s->blocks[b].policy == IKV_POLICY_ATTEND && !taken &&
                (best == nb || s->blocks[b].score > s->blocks[best].score))
                best = b;
        }
        if (best == nb) break;
        cand[n_cand++] = best;
    }

    const float sd = sqrtf((float)HEAD_DIM);
    for (uint32_t h = 0; h < N_KV_HEADS; ++h) {
        float sink[HEAD_DIM], recent[HEAD_DIM];
        for (size_t b = 0; b < nb; ++b) unit_vector(topic + b * HEAD_DIM);
        unit_vector(sink);
        unit_vector(recent);
        /* The kv-head's pair of blocks, two of the candidates; each of its query heads reads one of them or both. */
        size_t pair[2] = {0, 0};
        if (n_cand > 0) {
            const size_t first = rng_next() % n_cand;
            size_t second = rng_next() % (n_cand > 1 ? n_cand - 1 : 1);
            if (second >= first) ++second; /* a different block */
            pair[0] = cand[first];
            pair[1] = cand[second % n_cand];
        }
        for (uint32_t g = 0; g < GROUP; ++g) {
            const uint32_t hq = h * GROUP + g;
            size_t reads[2];
            const int n_reads = n_cand == 0 ? 0 : n_cand == 1 ? 1 : 1 + (uniform01() < 0.5);
            if (n_reads == 1) reads[0] = pair[rng_next() % 2];
            if (n_reads == 2) {
                reads[0] = pair[0];
                reads[1] = pair[1];
            }
            const float w = n_reads == 1 ? Q_TOPIC_ONE : Q_TOPIC_TWO;
            for (int d = 0; d < HEAD_DIM; ++d) {
                float x = Q_SINK * sink[d] + Q_RECENT * recent[d];
                for (int r = 0; r < n_reads; ++r) x += w * topic[reads[r] * HEAD_DIM + d];
                s->q[hq * HEAD_DIM + d] = sd * x + normal();
            }
            for (int r = 0; r < n_reads; ++r) s->relevant[reads[r] * N_Q_HEADS + hq] = 1;
        }
        for (uint32_t t = 0; t < n_tokens; ++t) {
            const uint32_t b = s->block_of[t];
            const float *bd = b == UINT32_MAX ? NULL : topic + (size_t)b * HEAD_DIM;
            const int is_recent = b != UINT32_MAX && s->blocks[b].policy == IKV_POLICY_RECENT;
            float *kr = s->k + ((size_t)t * N_KV_HEADS + h) * HEAD_DIM;
            float *vr = s->v + ((size_t)t * N_KV_HEADS + h) * HEAD_DIM;
            for (int d = 0; d < HEAD_DIM; ++d) {
                float x = KEY_NOISE * normal();
                if (bd) x += KEY_TOPIC * bd[d];
                if (t < N_SINKS) x += KEY_SINK * sink[d];
                if (is_recent) x += KEY_RECENT * recent[d];
                kr[d] = x;
                vr[d] = normal();
            }
        }
    }
    free(topic);
}

static void free_session(session *s) {
    free(s->blocks);
    free(s->block_of);
    free(s->relevant);
    free(s->q);
    free(s->k);
    free(s->v);
}

/*
 * Dense attention in float64 over the K/V a pool stores (ikv_seq_read): p
 * [q_head][token] the softmax probabilities, out [q_head][dim].
 */
static void reference_attention(const ikv_pool *pool, ikv_seq_id seq, uint32_t n_tokens, const float *q, double *p,
                                double *out) {
    float *k = malloc(sizeof(float) * n_tokens * N_KV_HEADS * HEAD_DIM);
    float *v = malloc(sizeof(float) * n_tokens * N_KV_HEADS * HEAD_DIM);
    if (!k || !v) exit(1);
    CHECK(ikv_seq_read(pool, seq, 0, 0, n_tokens, k, v));
    const double scale = 1.0 / sqrt((double)HEAD_DIM);
    for (uint32_t hq = 0; hq < N_Q_HEADS; ++hq) {
        const uint32_t h = hq / GROUP;
        double *ph = p + (size_t)hq * n_tokens, mx = -INFINITY, sum = 0;
        for (uint32_t t = 0; t < n_tokens; ++t) {
            const float *kr = k + ((size_t)t * N_KV_HEADS + h) * HEAD_DIM;
            double dot = 0;
            for (int d = 0; d < HEAD_DIM; ++d) dot += (double)q[hq * HEAD_DIM + d] * kr[d];
            ph[t] = dot * scale;
            if (ph[t] > mx) mx = ph[t];
        }
        for (uint32_t t = 0; t < n_tokens; ++t) sum += (ph[t] = exp(ph[t] - mx));
        double acc[HEAD_DIM] = {0};
        for (uint32_t t = 0; t < n_tokens; ++t) {
            ph[t] /= sum;
            const float *vr = v + ((size_t)t * N_KV_HEADS + h) * HEAD_DIM;
            for (int d = 0; d < HEAD_DIM; ++d) acc[d] += ph[t] * vr[d];
        }
        for (int d = 0; d < HEAD_DIM; ++d) out[hq * HEAD_DIM + d] = acc[d];
    }
    free(k);
    free(v);
}

/* ------------------------------------------------------------------------ */
/* Pools, plans, decode steps                                                 */
/* ------------------------------------------------------------------------ */

typedef struct device_bufs {
    int on_gpu;
    void *q, *out;
} device_bufs;

static ikv_pool *make_pool(ikv_backend backend, const session *s, const ikv_plan *formats, ikv_seq_id *seq) {
    ikv_pool_config pc = ikv_pool_default_config();
    pc.backend = backend;
    pc.n_layers = N_LAYERS;
    pc.n_kv_heads = N_KV_HEADS;
    pc.head_dim = HEAD_DIM;
    pc.page_size = PAGE_SIZE;
    pc.kv_dtype = IKV_DTYPE_F32;
    pc.default_format = IKV_FMT_F16;
    pc.capacity_bytes = (uint64_t)s->n_tokens * N_LAYERS * N_KV_HEADS * HEAD_DIM * 2 * 2 * 3 / 2 + (64u << 20);
    ikv_pool *pool = NULL;
    CHECK(ikv_pool_create(&pc, &pool));
    CHECK(ikv_seq_create(pool, seq));
    ikv_append ap = ikv_append_default(pool, s->n_tokens);
    ap.layer = IKV_ALL_LAYERS;
    ap.k = s->k;
    ap.v = s->v;
    ap.formats = formats;
    CHECK(ikv_pool_append(pool, *seq, &ap));
    return pool;
}

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
    {"budget-12.5%+pressure", 125, 0.9f},
};
#define N_CONFIGS (sizeof kConfigs / sizeof *kConfigs)
#define MAIN_CONFIG 2 /* budget-25%: the plan the decode table uses */

static ikv_plan *route_config(const demo_config *cfg, const ikv_layout *layout, uint32_t n_tokens,
                              uint32_t recent_window) {
    ikv_router_config rc = ikv_router_default_config();
    rc.page_size = PAGE_SIZE;
    rc.token_budget = (uint32_t)((uint64_t)n_tokens * cfg->budget_per_mille / 1000);
    rc.memory_pressure = cfg->pressure;
    rc.over_budget = IKV_OVER_BUDGET_KEEP;
    rc.recent_window = recent_window;
    ikv_router *router = NULL;
    ikv_plan *plan = NULL;
    CHECK(ikv_router_create(&rc, &router));
    CHECK(ikv_router_route(router, layout, n_tokens, &plan));
    ikv_router_destroy(router);
    return plan;
}

/* A selection: the plan (NULL: every token) and query-aware top-k on top. */
typedef struct selection {
    const char *name;
    const ikv_plan *plan;
    ikv_topk_mode mode;
    uint32_t topk_tokens; /* FIXED: the budget; MASS: the cap (0 = none) */
    float mass;
    ikv_topk_score score; /* what top-k ranks pages by */
} selection;

/* What one selection's decode step did, measured. */
typedef struct measured {
    ikv_status status; /* IKV_OK, or why the step could not run (IKV_E_UNSUPPORTED) */
    char why[160];     /* ikv_last_error() when it could not */
    double ms;
    uint64_t bytes;
    double tokens_mean; /* tokens read per kv-head */
    uint32_t tokens_min, tokens_max;
    double recall_mean, recall_min; /* over query heads */
    double err;
} measured;

static double rel_err(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/*
 * Run `steps` timed decode steps (after one warm-up) of a selection, then
 * read back exactly which tokens the last one read (ikv_decoder_last_selection)
 * and score them against the float64 reference (p, ref_out).
 */
static measured measure(ikv_decoder *dec, ikv_pool *pool, ikv_seq_id seq, const selection *sel, const session *s,
                        const device_bufs *dev, int steps, const double *p, const double *ref_out) {
    measured m;
    memset(&m, 0, sizeof m);
    const ikv_plan *plans[1] = {sel->plan};
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = 0;
    a.n_seqs = 1;
    a.seqs = &seq;
    a.plans = plans;
    a.n_query_tokens = 1;
    a.n_q_heads = N_Q_HEADS;
    a.q = dev->on_gpu ? dev->q : s->q;
    a.q_dtype = IKV_DTYPE_F32;
    float out[N_Q_HEADS * HEAD_DIM];
    a.out = dev->on_gpu ? dev->out : out;
    a.out_dtype = IKV_DTYPE_F32;
    a.topk_mode = sel->mode;
    a.topk_score = sel->score;
    a.topk_token_budget = sel->topk_tokens;
    if (sel->mode == IKV_TOPK_MASS) a.topk_mass = sel->mass;
    m.status = ikv_decode(dec, pool, &a); /* warm-up; a selection this build or device cannot serve is shown as such */
    if (m.status == IKV_E_UNSUPPORTED) {
        snprintf(m.why, sizeof m.why, "%s", ikv_last_error());
        return m;
    }
    CHECK(m.status);
#ifdef IKV_DEMO_CUDA
    if (dev->on_gpu) cudaDeviceSynchronize();
#endif
    if (dev->on_gpu) { /* the mean over `steps` steps enqueued back to back */
        double t0 = now_ms();
        for (int i = 0; i < steps; ++i) CHECK(ikv_decode(dec, pool, &a));
#ifdef IKV_DEMO_CUDA
        cudaDeviceSynchronize();
        cudaMemcpy(out, dev->out, sizeof out, cudaMemcpyDeviceToHost);
#endif
        m.ms = (now_ms() - t0) / steps;
    } else { /* the median of `steps` steps (done on return): steadier than the mean on a busy host */
        double *t = malloc(sizeof(double) * steps);
        if (!t) exit(1);
        for (int i = 0; i < steps; ++i) {
            const double t0 = now_ms();
            CHECK(ikv_decode(dec, pool, &a));
            t[i] = now_ms() - t0;
            for (int j = i; j > 0 && t[j - 1] > t[j]; --j) { /* insertion sort */
                const double x = t[j];
                t[j] = t[j - 1];
                t[j - 1] = x;
            }
        }
        m.ms = steps % 2 ? t[steps / 2] : 0.5 * (t[steps / 2 - 1] + t[steps / 2]);
        free(t);
    }
    CHECK(ikv_decoder_last_bytes_read(dec, &m.bytes));
    m.err = rel_err(out, ref_out, N_Q_HEADS * HEAD_DIM);

    static ikv_token_range *runs = NULL;
    static size_t cap = 0;
    m.recall_min = INFINITY;
    m.tokens_min = UINT32_MAX;
    for (uint32_t h = 0; h < N_KV_HEADS; ++h) {
        size_t n = 0;
        CHECK(ikv_decoder_last_selection(dec, 0, h, NULL, 0, &n));
        if (n > cap) {
            cap = n;
            runs = realloc(runs, sizeof *runs * cap);
            if (!runs) exit(1);
        }
        CHECK(ikv_decoder_last_selection(dec, 0, h, runs, cap, &n));
        uint32_t tokens = 0;
        for (size_t r = 0; r < n; ++r) tokens += runs[r].end - runs[r].begin;
        m.tokens_mean += tokens / (double)N_KV_HEADS;
        if (tokens < m.tokens_min) m.tokens_min = tokens;
        if (tokens > m.tokens_max) m.tokens_max = tokens;
        for (uint32_t g = 0; g < GROUP; ++g) {
            const double *ph = p + (size_t)(h * GROUP + g) * s->n_tokens;
            double recall = 0;
            for (size_t r = 0; r < n; ++r)
                for (uint32_t t = runs[r].begin; t < runs[r].end; ++t) recall += ph[t];
            m.recall_mean += recall / N_Q_HEADS;
            if (recall < m.recall_min) m.recall_min = recall;
        }
    }
    return m;
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    uint32_t n_tokens = 16384;
    int force_cpu = 0, steps = 10;
    uint64_t seed = 42;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) n_tokens = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu")) force_cpu = 1;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [--tokens N] [--cpu] [--steps N] [--seed N]\n", argv[0]);
            return 2;
        }
    }
    if (steps < 1) steps = 1;
    rng_state = seed;

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
    sc.seed = seed;
    ikv_layout *layout = NULL;
    CHECK(ikv_synth_layout(&sc, &layout));
    session s;
    make_session(layout, n_tokens, &s);
    /* The router reads the newest tokens whole: here the newest turn (the layout's RECENT block). */
    uint32_t recent_window = PAGE_SIZE;
    for (size_t b = 0; b < s.n_blocks; ++b)
        if (s.blocks[b].policy == IKV_POLICY_RECENT && n_tokens - s.blocks[b].start > recent_window)
            recent_window = n_tokens - s.blocks[b].start;
    recent_window = (recent_window + PAGE_SIZE - 1) / PAGE_SIZE * PAGE_SIZE;

#ifdef IKV_DEMO_CUDA
    if (backend == IKV_BACKEND_CUDA) {
        dev.on_gpu = 1;
        if (cudaMalloc(&dev.q, sizeof(float) * N_Q_HEADS * HEAD_DIM) != cudaSuccess ||
            cudaMalloc(&dev.out, sizeof(float) * N_Q_HEADS * HEAD_DIM) != cudaSuccess)
            return 1;
        cudaMemcpy(dev.q, s.q, sizeof(float) * N_Q_HEADS * HEAD_DIM, cudaMemcpyHostToDevice);
    }
#endif

    /* Every selection decodes the same F16 pool; the reference is dense attention over what it stores, in float64. */
    ikv_seq_id seq_f16;
    ikv_pool *pool_f16 = make_pool(backend, &s, NULL, &seq_f16);
    double *p = malloc(sizeof(double) * N_Q_HEADS * n_tokens);
    double *ref_out = malloc(sizeof(double) * N_Q_HEADS * HEAD_DIM);
    if (!p || !ref_out) return 1;
    reference_attention(pool_f16, seq_f16, n_tokens, s.q, p, ref_out);

    ikv_decoder *dec = NULL;
    ikv_decoder_config dc = ikv_decoder_default_config();
    CHECK(ikv_decoder_create(&dc, &dec));

    ikv_plan *plans[N_CONFIGS];
    for (size_t c = 0; c < N_CONFIGS; ++c) plans[c] = route_config(&kConfigs[c], layout, n_tokens, recent_window);
    const ikv_plan *main_plan = plans[MAIN_CONFIG];

    /* The layout, where the true attention lies, and what the router's plan does with each block. */
    const ikv_block_decision *dcs = NULL;
    size_t n_dcs = 0;
    CHECK(ikv_plan_decisions(main_plan, &dcs, &n_dcs));
    printf("Synthetic agentic session: %u tokens, %zu blocks; %u kv-heads x %u query heads, head_dim %u (seed %llu)\n",
           n_tokens, s.n_blocks, N_KV_HEADS, GROUP, HEAD_DIM, (unsigned long long)seed);
    /* What the query heads of one kv-head read together (their blocks' union): top-k below it must drop some. */
    double union_mean = 0, union_max = 0;
    for (uint32_t h = 0; h < N_KV_HEADS; ++h) {
        uint32_t tokens = 0;
        for (size_t b = 0; b < s.n_blocks; ++b) {
            int read = 0;
            for (uint32_t g = 0; g < GROUP; ++g) read |= s.relevant[b * N_Q_HEADS + h * GROUP + g];
            if (read) tokens += s.blocks[b].end - s.blocks[b].start;
        }
        union_mean += (double)tokens / n_tokens / N_KV_HEADS;
        if ((double)tokens / n_tokens > union_max) union_max = (double)tokens / n_tokens;
    }
    printf("  K/V built so that attention has structure: %d sink tokens every query sees; each kv-head gets two of the\n"
           "  %d highest-scored ATTEND blocks and each of its %d query heads reads one or both (the query holds their\n"
           "  topic): %.1f%% of the context per kv-head (mean; at most %.1f%%); key noise %.1f per channel; values N(0,1).\n",
           N_SINKS, N_CANDIDATES, GROUP, 100.0 * union_mean, 100.0 * union_max, KEY_NOISE);
    printf("  heads: query heads that read the block; attention: its share of the true attention (mean over the %d\n"
           "  query heads); plan: the router's decision at a %.1f%% budget (recent window %u tokens)\n",
           N_Q_HEADS, kConfigs[MAIN_CONFIG].budget_per_mille / 10.0, recent_window);
    double *block_attn = calloc(s.n_blocks, sizeof(double));
    if (!block_attn) return 1;
    printf("  %-11s %-14s %-7s %13s %5s %5s %9s  %s\n", "block", "kind", "policy", "tokens", "score", "heads",
           "attention", "plan");
    for (size_t b = 0; b < s.n_blocks; ++b) {
        const ikv_block_info *bi = &s.blocks[b];
        int heads = 0;
        double attn = 0;
        for (uint32_t hq = 0; hq < N_Q_HEADS; ++hq) {
            heads += s.relevant[b * N_Q_HEADS + hq];
            for (uint32_t t = bi->start; t < bi->end; ++t) attn += p[(size_t)hq * n_tokens + t] / N_Q_HEADS;
        }
        block_attn[b] = attn;
        char plan_txt[96] = "?";
        for (size_t i = 0; i < n_dcs; ++i)
            if (dcs[i].block_id == bi->id) {
                if (dcs[i].selected)
                    snprintf(plan_txt, sizeof plan_txt, "read %u tokens, %s (%s)", dcs[i].tokens_selected,
                             ikv_format_name((ikv_format)dcs[i].format), ikv_reason_name((ikv_reason)dcs[i].reason));
                else
                    snprintf(plan_txt, sizeof plan_txt, "skip (%s)", ikv_reason_name((ikv_reason)dcs[i].reason));
            }
        char range[32];
        snprintf(range, sizeof range, "%u..%u", bi->start, bi->end);
        printf("  %-11s %-14s %-7s %13s %5.2f %5d %8.1f%%  %s\n", bi->name, ikv_block_kind_name(bi->kind),
               ikv_policy_name(bi->policy), range, bi->score, heads, 100.0 * attn, plan_txt);
    }

    /* 2. what one decode step reads under each selection */
    const uint32_t t25 = n_tokens / 4, t12 = n_tokens / 8;
    char name_plan[48];
    snprintf(name_plan, sizeof name_plan, "router plan, budget %.1f%%", kConfigs[MAIN_CONFIG].budget_per_mille / 10.0);
    enum { ROW_DENSE, ROW_PLAN_ALL, ROW_PLAN, ROW_K25, ROW_K12, ROW_PLAN_K25, ROW_MASS, ROW_H25, ROW_H12 };
    const selection sels[] = {
        {"dense (every token)", NULL, IKV_TOPK_FIXED, 0, 0.0f, IKV_TOPK_SCORE_QUEST},
        {"router plan, no budget", plans[0], IKV_TOPK_FIXED, 0, 0.0f, IKV_TOPK_SCORE_QUEST},
        {name_plan, main_plan, IKV_TOPK_FIXED, 0, 0.0f, IKV_TOPK_SCORE_QUEST},
        {"top-k 25%", NULL, IKV_TOPK_FIXED, t25, 0.0f, IKV_TOPK_SCORE_QUEST},
        {"top-k 12.5%", NULL, IKV_TOPK_FIXED, t12, 0.0f, IKV_TOPK_SCORE_QUEST},
        {"top-k 25% inside the plan", plans[0], IKV_TOPK_FIXED, t25, 0.0f, IKV_TOPK_SCORE_QUEST},
        {"adaptive: mass 0.9, cap 25%, hybrid", NULL, IKV_TOPK_MASS, t25, 0.9f, IKV_TOPK_SCORE_HYBRID},
        {"top-k 25%, hybrid score", NULL, IKV_TOPK_FIXED, t25, 0.0f, IKV_TOPK_SCORE_HYBRID},
        {"top-k 12.5%, hybrid score", NULL, IKV_TOPK_FIXED, t12, 0.0f, IKV_TOPK_SCORE_HYBRID},
    };
    const size_t n_sels = sizeof sels / sizeof *sels;
    measured res[sizeof sels / sizeof *sels];
    for (size_t i = 0; i < n_sels; ++i) res[i] = measure(dec, pool_f16, seq_f16, &sels[i], &s, &dev, steps, p, ref_out);

    printf("\nOne decode step (layer 0, %u query heads, %s pool in F16, page %u; ms/step: %s of %d steps)\n", N_Q_HEADS,
           backend == IKV_BACKEND_CUDA ? "CUDA" : "CPU", PAGE_SIZE, backend == IKV_BACKEND_CUDA ? "mean" : "median",
           steps);
    printf("  tokens: tokens the step read per kv-head (mean; min-max when heads differ), as a share of the context\n");
    printf("  bytes:  K/V bytes it read (ikv_decoder_last_bytes_read; top-k adds the page summaries it scores),\n"
           "          as a share of the dense step's\n");
    printf("  recall: share of the true attention that the tokens read hold (mean over query heads, and the worst head)\n");
    printf("  error:  ||out - dense|| / ||dense||, how far the output moves from full attention (both against float64)\n");
    printf("  Reading everything gives recall 1.00 and error 0 (up to float32 rounding).\n");
    printf("  %-36s %17s %7s %6s %6s %9s %8s %7s\n", "selection", "tokens", "bytes", "recall", "worst", "error",
           "ms/step", "speedup");
    for (size_t i = 0; i < n_sels; ++i) {
        const measured *m = &res[i];
        if (m->status != IKV_OK) {
            printf("  %-36s not run: %s: %s\n", sels[i].name, ikv_status_name(m->status), m->why);
            continue;
        }
        char tok[40];
        if (m->tokens_min == m->tokens_max)
            snprintf(tok, sizeof tok, "%u (%.1f%%)", m->tokens_min, 100.0 * m->tokens_min / n_tokens);
        else
            snprintf(tok, sizeof tok, "%u-%u (%.1f%%)", m->tokens_min, m->tokens_max, 100.0 * m->tokens_mean / n_tokens);
        printf("  %-36s %17s %6.1f%% %6.3f %6.3f %9.2e %8.3f %6.2fx\n", sels[i].name, tok,
               100.0 * m->bytes / res[0].bytes, m->recall_mean, m->recall_min, m->err, m->ms, res[0].ms / m->ms);
    }
    /* The result in plain words, from the numbers above. */
    {
        const measured *k25 = &res[ROW_K25], *k12 = &res[ROW_K12];
        printf("  In words: top-k at 25%% keeps %.0f%% of the attention (worst head %.0f%%) and moves the output %.1f%%;\n"
               "  at 12.5%%%s it keeps %.0f%% (worst head %.0f%%) and moves it %.1f%%.\n",
               100.0 * k25->recall_mean, 100.0 * k25->recall_min, 100.0 * k25->err,
               t12 < union_mean * n_tokens ? ", less than a kv-head's query heads read together," : "",
               100.0 * k12->recall_mean, 100.0 * k12->recall_min, 100.0 * k12->err);
        const measured *h25 = &res[ROW_H25], *h12 = &res[ROW_H12];
        if (h25->status == IKV_OK && h12->status == IKV_OK)
            printf("  Ranked by the hybrid score (IKV_TOPK_SCORE_HYBRID) it keeps %.0f%% at 25%% (worst head %.0f%%) and\n"
                   "  %.0f%% at 12.5%% (worst head %.0f%%), reading %.1f and %.1f points more bytes for k_mean.\n",
                   100.0 * h25->recall_mean, 100.0 * h25->recall_min, 100.0 * h12->recall_mean, 100.0 * h12->recall_min,
                   100.0 * (h25->bytes - k25->bytes) / res[0].bytes, 100.0 * (h12->bytes - k12->bytes) / res[0].bytes);
        /* The router's plan: whole blocks by score; name the block holding the most attention it did not read. */
        size_t worst_block = s.n_blocks;
        double worst_attn = 0;
        const char *worst_reason = "";
        for (size_t b = 0; b < s.n_blocks; ++b)
            for (size_t i = 0; i < n_dcs; ++i)
                if (dcs[i].block_id == s.blocks[b].id && !dcs[i].selected && block_attn[b] > worst_attn) {
                    worst_block = b;
                    worst_attn = block_attn[b];
                    worst_reason = ikv_reason_name((ikv_reason)dcs[i].reason);
                }
        printf("  The router's plan at %.1f%% keeps %.0f%%", kConfigs[MAIN_CONFIG].budget_per_mille / 10.0,
               100.0 * res[ROW_PLAN].recall_mean);
        if (worst_block < s.n_blocks)
            printf(": it reads whole blocks by score, and %s (%.0f%% of the attention) was not read (%s)",
                   s.blocks[worst_block].name, 100.0 * worst_attn, worst_reason);
        printf(".\n");
    }

    /* 3. the router under a few configs, and the pool stored at each plan's precisions */
    ikv_model_shape shape = ikv_model_shape_default();
    printf("\nRouter configs (tokens by the format the plan gives them; bytes and FLOPs: cost model for %u layers, %u "
           "q-heads,\n%u kv-heads, head_dim %u; recall and error: the plan's tokens read from the F16 pool)\n",
           shape.n_layers, shape.n_q_heads, shape.n_kv_heads, shape.head_dim);
    printf("  %-22s %7s %6s %6s %6s %6s %6s %9s %8s %6s %6s %9s\n", "config", "tokens", "f16", "bf16", "fp8", "int8",
           "int4", "bytes/dns", "flop/dns", "recall", "worst", "error");
    measured cres[N_CONFIGS];
    for (size_t c = 0; c < N_CONFIGS; ++c) {
        ikv_plan_summary sm;
        ikv_plan_cost cost;
        CHECK(ikv_plan_get_summary(plans[c], &sm));
        CHECK(ikv_plan_get_cost(plans[c], &shape, &cost));
        const selection sel = {kConfigs[c].name, plans[c], IKV_TOPK_FIXED, 0, 0.0f, IKV_TOPK_SCORE_QUEST};
        cres[c] = measure(dec, pool_f16, seq_f16, &sel, &s, &dev, 1, p, ref_out);
        printf("  %-22s %7u %6u %6u %6u %6u %6u %8.1f%% %7.1f%% %6.3f %6.3f %9.2e\n", kConfigs[c].name,
               sm.tokens_selected, sm.tokens_by_format[IKV_FMT_F16], sm.tokens_by_format[IKV_FMT_BF16],
               sm.tokens_by_format[IKV_FMT_FP8_E4M3], sm.tokens_by_format[IKV_FMT_INT8],
               sm.tokens_by_format[IKV_FMT_INT4], 100.0 * cost.bytes_total / cost.bytes_dense_f16,
               100.0 * cost.flops / cost.flops_dense, cres[c].recall_mean, cres[c].recall_min, cres[c].err);
    }

    ikv_pool_stats f16_stats;
    f16_stats.struct_size = sizeof f16_stats;
    CHECK(ikv_pool_get_stats(pool_f16, &f16_stats));
    printf("\nPool stored at each plan's precision per page (every token kept), MiB; error: the plan's step decoded "
           "from it\n");
    printf("  %-22s %7s %7s %7s %7s %7s %8s %6s %9s\n", "config", "f16", "bf16", "fp8", "int8", "int4", "total", "saved",
           "error");
    printf("  %-22s %7.1f %7.1f %7.1f %7.1f %7.1f %8.1f %5.0f%% %9s\n", "all F16 (dense)",
           f16_stats.bytes_by_format[IKV_FMT_F16] / 1048576.0, 0.0, 0.0, 0.0, 0.0, f16_stats.used_bytes / 1048576.0,
           0.0, "-");
    for (size_t c = 0; c < N_CONFIGS; ++c) {
        ikv_seq_id seq;
        ikv_pool *pool = make_pool(backend, &s, plans[c], &seq);
        ikv_pool_stats st;
        st.struct_size = sizeof st;
        CHECK(ikv_pool_get_stats(pool, &st));
        const selection sel = {kConfigs[c].name, plans[c], IKV_TOPK_FIXED, 0, 0.0f, IKV_TOPK_SCORE_QUEST};
        const measured m = measure(dec, pool, seq, &sel, &s, &dev, 1, p, ref_out);
        printf("  %-22s", kConfigs[c].name);
        for (int f = 0; f < IKV_FMT_COUNT; ++f) printf(" %7.1f", st.bytes_by_format[f] / 1048576.0);
        printf(" %8.1f %5.0f%% %9.2e\n", st.used_bytes / 1048576.0,
               100.0 - 100.0 * st.used_bytes / f16_stats.used_bytes, m.err);
        ikv_pool_destroy(pool);
    }

    for (size_t c = 0; c < N_CONFIGS; ++c) ikv_plan_destroy(plans[c]);
    ikv_pool_destroy(pool_f16);
    ikv_decoder_destroy(dec);
    ikv_layout_destroy(layout);
#ifdef IKV_DEMO_CUDA
    if (dev.on_gpu) {
        cudaFree(dev.q);
        cudaFree(dev.out);
    }
#endif
    free(p);
    free(ref_out);
    free(block_attn);
    free_session(&s);
    return 0;
}
