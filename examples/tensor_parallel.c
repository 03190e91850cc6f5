/*
 * tensor_parallel.c: attention sharded by heads, the way a tensor-parallel
 * engine runs it. Each GPU holds the K/V of its share of the kv-heads in its
 * own pool (ikv_pool_config.device) and decodes its query heads with its own
 * decoder from its own thread; one router's plans (host objects) serve every
 * GPU, and a top-k budget applies per kv-head, so each shard selects what a
 * single pool would. The outputs are gathered by head (here through host
 * memory; an engine's all-gather would do it on the GPUs) and compared with
 * one pool holding every head.
 *
 * Usage: tensor-parallel [cpu|cuda] [shards=N]
 * CUDA: shard s on device s % (visible GPUs); with one GPU every shard shares
 * it. CPU: the same program over CPU pools (no GPU needed).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "intentkv.h"

#ifdef IKV_DEMO_CUDA
#include <cuda_runtime_api.h>
#endif

enum { LAYERS = 4, KV_HEADS = 8, GROUP = 4, Q_HEADS = KV_HEADS * GROUP, D = 128, PAGE = 16, SEQS = 4, MAX_SHARDS = 8 };
static const uint32_t kLens[SEQS] = {4096, 6144, 8192, 3000};

#define CHECK(call)                                                                                         \
    do {                                                                                                    \
        const ikv_status st_ = (call);                                                                      \
        if (st_ != IKV_OK) {                                                                                \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, ikv_status_name(st_),        \
                    ikv_last_error());                                                                      \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)

static int g_cuda;

static float rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 4503599627370496.0 - 1.0);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* Memory for q/out/lse on the pool's side: the device for CUDA pools. */
static void *side_alloc(int device, const void *host, size_t bytes) {
#ifdef IKV_DEMO_CUDA
    if (g_cuda) {
        void *d = NULL;
        cudaSetDevice(device);
        if (cudaMalloc(&d, bytes) != cudaSuccess) exit(1);
        if (host) cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
        return d;
    }
#endif
    (void)device;
    void *p = calloc(1, bytes);
    if (host) memcpy(p, host, bytes);
    return p;
}
static void side_to_host(int device, void *dst, const void *src, size_t bytes) {
#ifdef IKV_DEMO_CUDA
    if (g_cuda) {
        cudaSetDevice(device);
        cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
        return;
    }
#endif
    (void)device;
    memcpy(dst, src, bytes);
}
static void side_free(int device, void *p) {
#ifdef IKV_DEMO_CUDA
    if (g_cuda) {
        cudaSetDevice(device);
        cudaFree(p);
        return;
    }
#endif
    (void)device;
    free(p);
}

typedef struct shard {
    int device;
    uint32_t h0, heads; /* kv-heads [h0, h0 + heads) */
    ikv_pool *pool;
    ikv_decoder *dec;
    ikv_seq_id seqs[SEQS];
    void *q, *out;
    ikv_decode_args args;
    double ms;
} shard;

static ikv_pool *make_pool(int device, uint32_t heads) {
    ikv_pool_config c = ikv_pool_default_config();
    c.backend = g_cuda ? IKV_BACKEND_CUDA : IKV_BACKEND_CPU;
    c.device = device;
    c.n_layers = LAYERS;
    c.n_kv_heads = heads;
    c.head_dim = D;
    c.page_size = PAGE;
    c.kv_dtype = IKV_DTYPE_F32;
    c.capacity_bytes = 1ull << 30;
    ikv_pool *pool = NULL;
    CHECK(ikv_pool_create(&c, &pool));
    return pool;
}

/* One engine worker per GPU: decode every layer of the step for its heads. */
static void *worker(void *arg) {
    shard *s = arg;
#ifdef IKV_DEMO_CUDA
    if (g_cuda) cudaSetDevice(s->device); /* this thread's device: its q/out and the pool's */
#endif
    const double t0 = now_ms();
    for (uint32_t l = 0; l < LAYERS; ++l) {
        s->args.layer = l;
        CHECK(ikv_decode(s->dec, s->pool, &s->args));
    }
#ifdef IKV_DEMO_CUDA
    if (g_cuda) cudaDeviceSynchronize();
#endif
    s->ms = now_ms() - t0;
    return NULL;
}

int main(int argc, char **argv) {
    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(ikv_runtime_info_get(&info));
    int gpus = info.cuda_built ? info.cuda_device_count : 0;
#ifndef IKV_DEMO_CUDA
    gpus = 0;
#endif
    g_cuda = gpus > 0;
    uint32_t n_shards = 2;
    for (int i = 1; i < argc; ++i) {
        unsigned v = 0;
        if (!strcmp(argv[i], "cpu")) g_cuda = 0;
        else if (!strcmp(argv[i], "cuda") && gpus > 0) g_cuda = 1;
        else if (sscanf(argv[i], "shards=%u", &v) == 1 && v >= 1 && v <= MAX_SHARDS && KV_HEADS % v == 0) n_shards = v;
        else {
            fprintf(stderr, "usage: %s [cpu|cuda] [shards=1|2|4|8]\n", argv[0]);
            return 2;
        }
    }
    const uint32_t hs = KV_HEADS / n_shards, qs = hs * GROUP;
    printf("tensor parallel over %u shards of %u kv-heads, %s\n", n_shards, hs,
           g_cuda ? (gpus > 1 ? "one per GPU" : "all on the one GPU") : "CPU pools");

    /* one router, one plan per sequence: host objects every shard reads */
    ikv_router_config rc = ikv_router_default_config();
    rc.page_size = PAGE;
    rc.token_budget = 2048;
    rc.over_budget = IKV_OVER_BUDGET_KEEP;
    ikv_router *router = NULL;
    CHECK(ikv_router_create(&rc, &router));
    const ikv_plan *plans[SEQS];
    ikv_plan *owned[SEQS];
    for (uint32_t b = 0; b < SEQS; ++b) {
        ikv_synth_config sc = ikv_synth_default_config();
        sc.seq_len = kLens[b];
        sc.seed = 7 + b;
        ikv_layout *layout = NULL;
        CHECK(ikv_synth_layout(&sc, &layout));
        CHECK(ikv_router_route(router, layout, kLens[b], &owned[b]));
        plans[b] = owned[b];
        ikv_layout_destroy(layout);
    }

    /* the model's K/V for all heads ([layer][token][kv_head][d]) and queries ([seq][q_head][d]) */
    uint64_t seed = 1;
    float *q = malloc(sizeof(float) * SEQS * Q_HEADS * D);
    for (size_t i = 0; i < (size_t)SEQS * Q_HEADS * D; ++i) q[i] = rnd(&seed);
    shard full = {0, 0, KV_HEADS, make_pool(0, KV_HEADS), NULL, {0}, NULL, NULL, {0}, 0};
    shard sh[MAX_SHARDS];
    for (uint32_t s = 0; s < n_shards; ++s) {
        sh[s] = (shard){g_cuda ? (int)(s % (uint32_t)gpus) : 0, s * hs, hs, NULL, NULL, {0}, NULL, NULL, {0}, 0};
        sh[s].pool = make_pool(sh[s].device, hs);
    }
    for (uint32_t b = 0; b < SEQS; ++b) {
        const size_t n = (size_t)LAYERS * kLens[b] * KV_HEADS * D;
        float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; ++i) k[i] = rnd(&seed), v[i] = rnd(&seed);
        shard *all[MAX_SHARDS + 1] = {&full};
        for (uint32_t s = 0; s < n_shards; ++s) all[s + 1] = &sh[s];
        for (uint32_t i = 0; i <= n_shards; ++i) { /* each pool takes its heads through the strides */
            shard *x = all[i];
            CHECK(ikv_seq_create(x->pool, &x->seqs[b]));
            ikv_append ap = ikv_append_default(x->pool, kLens[b]);
            ap.layer = IKV_ALL_LAYERS;
            ap.k = k + (size_t)x->h0 * D;
            ap.v = v + (size_t)x->h0 * D;
            ap.token_stride = (int64_t)KV_HEADS * D;
            ap.head_stride = D;
            ap.layer_stride = (int64_t)kLens[b] * KV_HEADS * D;
            ap.formats = plans[b]; /* the plan's precision per page, the same on every shard */
            CHECK(ikv_pool_append(x->pool, x->seqs[b], &ap));
        }
        free(k);
        free(v);
    }

    /* the step's decode arguments: per shard, its query heads */
    shard *all[MAX_SHARDS + 1] = {&full};
    for (uint32_t s = 0; s < n_shards; ++s) all[s + 1] = &sh[s];
    float *qpart = malloc(sizeof(float) * SEQS * Q_HEADS * D);
    for (uint32_t i = 0; i <= n_shards; ++i) {
        shard *x = all[i];
        const uint32_t nq = x->heads * GROUP;
        for (uint32_t b = 0; b < SEQS; ++b)
            memcpy(qpart + (size_t)b * nq * D, q + ((size_t)b * Q_HEADS + (size_t)x->h0 * GROUP) * D,
                   sizeof(float) * nq * D);
        x->q = side_alloc(x->device, qpart, sizeof(float) * SEQS * nq * D);
        x->out = side_alloc(x->device, NULL, sizeof(float) * SEQS * nq * D);
        ikv_decoder_config dc = ikv_decoder_default_config();
        if (!g_cuda) dc.n_threads = 1; /* CPU shards stand for GPUs: one thread each */
        CHECK(ikv_decoder_create(&dc, &x->dec));
        x->args = ikv_decode_args_default();
        x->args.n_seqs = SEQS;
        x->args.seqs = x->seqs;
        x->args.plans = plans;
        x->args.n_q_heads = nq;
        x->args.q = x->q;
        x->args.out = x->out;
        x->args.topk_token_budget = 1024; /* per (sequence, kv-head): each shard selects as one pool would */
        x->args.topk_score = IKV_TOPK_SCORE_HYBRID;
    }
    worker(&full); /* warm-up: first calls build page lists and device state */
    for (uint32_t s = 0; s < n_shards; ++s) worker(&sh[s]);
    worker(&full);
    pthread_t th[MAX_SHARDS];
    const double t0 = now_ms();
    for (uint32_t s = 0; s < n_shards; ++s) pthread_create(&th[s], NULL, worker, &sh[s]);
    for (uint32_t s = 0; s < n_shards; ++s) pthread_join(th[s], NULL);
    const double wall = now_ms() - t0;

    /* gather by head and compare with the one pool of every head */
    float *ref = malloc(sizeof(float) * SEQS * Q_HEADS * D), *part = malloc(sizeof(float) * SEQS * Q_HEADS * D);
    side_to_host(full.device, ref, full.out, sizeof(float) * SEQS * Q_HEADS * D);
    double num = 0, den = 0;
    for (uint32_t s = 0; s < n_shards; ++s) {
        side_to_host(sh[s].device, part, sh[s].out, sizeof(float) * SEQS * qs * D);
        for (uint32_t b = 0; b < SEQS; ++b)
            for (size_t i = 0; i < (size_t)qs * D; ++i) {
                const double r = ref[((size_t)b * Q_HEADS + (size_t)s * qs) * D + i], g = part[(size_t)b * qs * D + i];
                num += (g - r) * (g - r);
                den += r * r;
            }
        printf("  shard %u (device %d, kv-heads %u..%u): %.3f ms for %u layers\n", s, sh[s].device, sh[s].h0,
               sh[s].h0 + hs - 1, sh[s].ms, LAYERS);
    }
    printf("one pool of all heads: %.3f ms; shards side by side: %.3f ms wall\n", full.ms, wall);
    const double rel = sqrt(num / den);
    printf("gathered output vs one pool: relative L2 %.2e (%s)\n", rel, rel <= 2e-5 ? "equal up to fp32 rounding" : "DIFFERENT");

    for (uint32_t i = 0; i <= n_shards; ++i) {
        shard *x = all[i];
        side_free(x->device, x->q);
        side_free(x->device, x->out);
        ikv_decoder_destroy(x->dec);
        ikv_pool_destroy(x->pool);
    }
    for (uint32_t b = 0; b < SEQS; ++b) ikv_plan_destroy(owned[b]);
    ikv_router_destroy(router);
    free(q);
    free(qpart);
    free(ref);
    free(part);
    return rel <= 2e-5 ? 0 : 1;
}
