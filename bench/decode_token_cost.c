/* The CPU decode's cost per token and kv-head, as the fastest of many
 * back-to-back ikv_decode calls (the minimum is the statistic that a shared,
 * noisy machine disturbs least; the mean is printed beside it).
 *
 *   decode_token_cost <format 0-4> <context tokens> <calls> [threads, default 1]
 *
 * One sequence of random K/V (fp32 input) in a pool of the bench_decode shape:
 * 32 q-heads, 8 kv-heads, head_dim 128, page 16, one query token, dense. A
 * context of a few thousand tokens stays in the caches (the arithmetic alone);
 * 32K and more come from DRAM. Format numbers: ikv_format (0 F16, 1 BF16,
 * 2 FP8 E4M3, 3 INT8, 4 INT4). Environment knobs of the library apply
 * (IKV_CPU_ISA, IKV_CPU_VNNI), so A/B runs need no rebuild. The per-token
 * figure is thread-time: min x threads / (context x kv-heads).
 * DECODE_COST_TOPK=quest|hybrid|keys: a query-aware top-k step to a quarter
 * of the context with that page score instead of a dense one (the per-token
 * figure still divides by the whole context). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "intentkv.h"

enum { kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kPage = 16, kBatch = 4096 };

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, ikv_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s <format 0-4> <context tokens> <calls> [threads]\n", argv[0]);
        return 2;
    }
    long arg[4] = {0, 0, 0, 1};  /* format, context, calls, threads */
    const long lim[4] = {4, 1L << 24, 1L << 24, 1024};
    for (int i = 0; i < 4 && i + 1 < argc; ++i) {
        char *end = NULL;
        arg[i] = strtol(argv[i + 1], &end, 10);
        if (end == argv[i + 1] || *end != '\0' || arg[i] < (i == 0 ? 0 : 1) || arg[i] > lim[i]) {
            fprintf(stderr, "argument %d (\"%s\") is not a number in [%d, %ld]\n", i + 1, argv[i + 1], i == 0 ? 0 : 1, lim[i]);
            return 2;
        }
    }
    const int fmt = (int)arg[0], calls = (int)arg[2], threads = (int)arg[3];
    const unsigned ctx = (unsigned)arg[1];
    ikv_pool_config pc = ikv_pool_default_config();
    pc.n_layers = 1;
    pc.n_kv_heads = kKvHeads;
    pc.head_dim = kHeadDim;
    pc.page_size = kPage;
    pc.default_format = (ikv_format)fmt;
    pc.kv_dtype = IKV_DTYPE_F32;
    pc.capacity_bytes = (uint64_t)ctx * kKvHeads * kHeadDim * 2 * 2 * 2 + (64u << 20); /* F16 K+V, twice over */
    ikv_pool *pool = NULL;
    ikv_seq_id seq;
    if (ikv_pool_create(&pc, &pool) != IKV_OK) return die("ikv_pool_create");
    if (ikv_seq_create(pool, &seq) != IKV_OK) return die("ikv_seq_create");
    const size_t n = (size_t)kBatch * kKvHeads * kHeadDim;
    float *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    if (!k || !v) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    srand(1);
    for (size_t i = 0; i < n; ++i) {
        k[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        v[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    }
    for (unsigned t = 0; t < ctx; t += kBatch) {
        ikv_append a = ikv_append_default(pool, ctx - t < kBatch ? ctx - t : kBatch);
        a.k = k;
        a.v = v;
        if (ikv_pool_append(pool, seq, &a) != IKV_OK) return die("ikv_pool_append");
    }
    free(k);
    free(v);
    ikv_decoder_config dc = ikv_decoder_default_config();
    dc.n_threads = (uint32_t)threads;
    ikv_decoder *dec = NULL;
    if (ikv_decoder_create(&dc, &dec) != IKV_OK) return die("ikv_decoder_create");
    static float q[kQHeads * kHeadDim], out[kQHeads * kHeadDim];
    for (int i = 0; i < kQHeads * kHeadDim; ++i) q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    ikv_decode_args a = ikv_decode_args_default();
    a.seqs = &seq;
    a.n_q_heads = kQHeads;
    a.q = q;
    a.out = out;
    const char *topk = getenv("DECODE_COST_TOPK");
    if (topk && *topk) {
        static const char *const names[] = {"quest", "hybrid", "keys"};
        static const ikv_topk_score scores[] = {IKV_TOPK_SCORE_QUEST, IKV_TOPK_SCORE_HYBRID, IKV_TOPK_SCORE_KEYS};
        int found = -1;
        for (int i = 0; i < 3; ++i)
            if (strcmp(topk, names[i]) == 0) found = i;
        if (found < 0) {
            fprintf(stderr, "DECODE_COST_TOPK=%s: not quest, hybrid or keys\n", topk);
            return 2;
        }
        a.topk_token_budget = ctx / 4 > 0 ? ctx / 4 : 1;  /* (0 would turn top-k off) */
        a.topk_score = scores[found];
    }
    if (ikv_decode(dec, pool, &a) != IKV_OK) return die("ikv_decode");  /* builds the page lists: not timed */
    double best = 1e30, sum = 0.0;
    for (int c = 0; c < calls; ++c) {
        const double t0 = now_s();
        if (ikv_decode(dec, pool, &a) != IKV_OK) return die("ikv_decode");
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
        sum += dt;
    }
    ikv_runtime_info info = {.struct_size = sizeof info};
    ikv_runtime_info_get(&info);
    printf("decode_token_cost: format=%s ctx=%u threads=%d topk=%s isa=%s min_us=%.1f mean_us=%.1f "
           "ns_per_token_head_thread=%.2f\n",
           ikv_format_name((ikv_format)fmt), ctx, threads, topk && *topk ? topk : "off", info.cpu_isa, best * 1e6,
           sum / calls * 1e6,
           best * 1e9 * threads / ((double)ctx * kKvHeads));
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(pool);
    return 0;
}
