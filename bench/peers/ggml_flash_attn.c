/*
 * ggml's CPU flash attention (ggml_flash_attn_ext) timed on intentkv's decode
 * shape, as the peer a llama.cpp user would run instead. Built by
 * scripts/bench_ggml_peer.sh against a ggml source release fetched at
 * benchmark time (nothing of ggml is committed). One query token, 32 query
 * heads, 8 kv-heads, head_dim 128, F32 queries, a KV cache of `ctx` tokens
 * in F16, Q8_0 or Q4_0 (K and V alike, as llama.cpp's -ctk/-ctv), no mask, a
 * persistent thread pool of `threads` threads; prints the median of `iters`
 * calls of ggml_graph_compute (after 3 warm-up calls) in milliseconds.
 * Usage: ggml-flash-attn <f16|q8_0|q4_0> <ctx> <threads> [iters]
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

enum { Q_HEADS = 32, KV_HEADS = 8, D = 128 };

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Rows of D normal-ish values, converted or quantized into the tensor. */
static void fill(struct ggml_tensor *t, int64_t rows, uint64_t seed) {
    float *x = malloc(sizeof(float) * (size_t)rows * D);
    for (int64_t i = 0; i < rows * D; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 11) / 4503599627370496.0 - 1.0);
    }
    if (t->type == GGML_TYPE_F32)
        memcpy(t->data, x, sizeof(float) * (size_t)rows * D);
    else if (t->type == GGML_TYPE_F16)
        ggml_fp32_to_fp16_row(x, t->data, rows * D);
    else
        ggml_quantize_chunk(t->type, x, t->data, 0, rows, D, NULL);
    free(x);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s <f16|q8_0|q4_0> <ctx> <threads> [iters]\n", argv[0]);
        return 2;
    }
    const enum ggml_type type = !strcmp(argv[1], "q8_0") ? GGML_TYPE_Q8_0
                              : !strcmp(argv[1], "q4_0") ? GGML_TYPE_Q4_0
                                                         : GGML_TYPE_F16;
    const int64_t ctx = atoll(argv[2]);
    const int threads = atoi(argv[3]), iters = argc > 4 ? atoi(argv[4]) : 20;
    const size_t kv_bytes = ggml_row_size(type, D) * (size_t)ctx * KV_HEADS;
    struct ggml_init_params ip = {2 * kv_bytes + (64u << 20), NULL, false};
    struct ggml_context *c = ggml_init(ip);
    struct ggml_tensor *q = ggml_new_tensor_4d(c, GGML_TYPE_F32, D, 1, Q_HEADS, 1);
    struct ggml_tensor *k = ggml_new_tensor_4d(c, type, D, ctx, KV_HEADS, 1);
    struct ggml_tensor *v = ggml_new_tensor_4d(c, type, D, ctx, KV_HEADS, 1);
    fill(q, Q_HEADS, 1);
    fill(k, ctx * KV_HEADS, 2);
    fill(v, ctx * KV_HEADS, 3);
    struct ggml_tensor *out = ggml_flash_attn_ext(c, q, k, v, NULL, 1.0f / sqrtf((float)D), 0.0f, 0.0f);
    struct ggml_cgraph *gf = ggml_new_graph(c);
    ggml_build_forward_expand(gf, out);
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *tp = ggml_threadpool_new(&tpp);
    struct ggml_cplan plan = ggml_graph_plan(gf, threads, tp);
    plan.work_data = malloc(plan.work_size ? plan.work_size : 1);
    double *ms = malloc(sizeof(double) * (size_t)iters);
    for (int i = -3; i < iters; ++i) {
        const double t0 = now_ms();
        if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "ggml_graph_compute failed\n");
            return 1;
        }
        if (i >= 0) ms[i] = now_ms() - t0;
    }
    qsort(ms, (size_t)iters, sizeof *ms, cmp);
    const float *o = out->data;
    double norm = 0;
    for (int i = 0; i < D * Q_HEADS; ++i) norm += (double)o[i] * o[i];
    printf("ggml %s ctx %lld threads %d: %.3f ms (median of %d; |out| %.3f)\n", argv[1], (long long)ctx, threads,
           ms[iters / 2], iters, sqrt(norm));
    free(ms);
    free(plan.work_data);
    ggml_threadpool_free(tp);
    ggml_free(c);
    return 0;
}
