/* Helpers of the CUDA-pool contract checks (tests/gpu_contracts/contract_*.c):
 * each check is a program that calls the public header on a CUDA pool and
 * prints "OK: ..." or "BREAK: ..." lines; it exits 0 when every promise held,
 * 1 when one broke, 2 when it could not tell (no device, a library without
 * CUDA, a CUDA call that failed): CTest counts 2 as skipped. They use the
 * CUDA runtime directly (streams held on purpose by host functions, device
 * memory filled up), which the other GPU tests' dlopen shim does not offer. */
#ifndef IKV_CONTRACT_UTIL_H
#define IKV_CONTRACT_UTIL_H

#include <cuda_runtime.h>
#include <intentkv.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>

static int g_break = 0, g_inconclusive = 0;
#define BREAK(...) do { printf("BREAK: "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); g_break = 1; } while (0)
#define OKMSG(...) do { printf("OK: "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)
#define INCONCL(...) do { printf("INCONCLUSIVE: "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); g_inconclusive = 1; } while (0)
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    printf("INCONCLUSIVE: %s failed: %s\n", #x, cudaGetErrorString(e_)); exit(2); } } while (0)
#define IK(x) do { ikv_status s_ = (x); if (s_ != IKV_OK) { \
    printf("INCONCLUSIVE: %s -> %s: %s\n", #x, ikv_status_name(s_), ikv_last_error()); exit(2); } } while (0)

static inline int probe_exit(void) {
    if (g_break) return 1;
    if (g_inconclusive) return 2;
    return 0;
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint32_t g_lcg = 12345u;
static inline float rnd(void) {
    g_lcg = g_lcg * 1664525u + 1013904223u;
    return ((g_lcg >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

/* n random floats in device memory (seeded). */
static inline float *dev_floats(size_t n, uint32_t seed) {
    g_lcg = seed;
    float *h = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) h[i] = rnd();
    float *d = NULL;
    CK(cudaMalloc((void **)&d, n * sizeof(float)));
    CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static inline void require_gpu(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("INCONCLUSIVE: no CUDA device visible\n");
        exit(2);
    }
    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (ikv_runtime_info_get(&info) != IKV_OK || !info.cuda_built) {
        printf("INCONCLUSIVE: libintentkv was built without CUDA\n");
        exit(2);
    }
}

/* A small CUDA pool: n_layers, one kv-head, head_dim 32, F32 K/V input. */
static inline ikv_pool *small_cuda_pool(uint32_t n_layers, uint32_t page_size, uint64_t capacity, uint64_t host_capacity) {
    ikv_pool_config c = ikv_pool_default_config();
    c.backend = IKV_BACKEND_CUDA;
    c.device = 0;
    c.n_layers = n_layers;
    c.n_kv_heads = 1;
    c.head_dim = 32;
    c.page_size = page_size;
    c.capacity_bytes = capacity;
    c.default_format = IKV_FMT_F16;
    c.kv_dtype = IKV_DTYPE_F32;
    c.host_capacity_bytes = host_capacity;
    ikv_pool *p = NULL;
    IK(ikv_pool_create(&c, &p));
    return p;
}

/* Append n tokens (layer, or IKV_ALL_LAYERS) from device K/V. */
static inline ikv_status dev_append(ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t n, const float *dk,
                             const float *dv, cudaStream_t s, int async) {
    ikv_append a = ikv_append_default(pool, n);
    a.layer = layer;
    a.k = dk;
    a.v = dv;
    a.src_on_device = 1;
    a.stream = s;
    a.flags = async ? IKV_APPEND_ASYNC : 0u;
    return ikv_pool_append(pool, seq, &a);
}

/* A host function that keeps its stream busy until g_release is set. */
#include <stdatomic.h>
static atomic_int g_release;
static void CUDART_CB blocker_fn(void *user) {
    (void)user;
    while (!atomic_load(&g_release)) sleep_ms(1);
}
static inline void block_stream(cudaStream_t s) {
    atomic_store(&g_release, 0);
    CK(cudaLaunchHostFunc(s, blocker_fn, NULL));
}

/* A watchdog thread that releases the blocked stream after ms milliseconds. */
#include <pthread.h>
static long g_watch_ms;
static atomic_int g_watch_fired;
static inline void *watchdog_fn(void *u) {
    (void)u;
    const double end = now_s() + g_watch_ms / 1000.0;
    while (!atomic_load(&g_release) && now_s() < end) sleep_ms(1);
    if (!atomic_load(&g_release)) {
        atomic_store(&g_watch_fired, 1);
        atomic_store(&g_release, 1);
    }
    return NULL;
}
static inline pthread_t start_watchdog(long ms) {
    pthread_t t;
    g_watch_ms = ms;
    atomic_store(&g_watch_fired, 0);
    pthread_create(&t, NULL, watchdog_fn, NULL);
    return t;
}

/* The arguments of one decode step of one sequence at layer 0: one query token, one q-head, F32 q/out
 * (device), on stream s. */
static inline ikv_decode_args step1_args(ikv_seq_id *seq, const float *q, float *out, cudaStream_t s) {
    ikv_decode_args d = ikv_decode_args_default();
    d.layer = 0;
    d.n_seqs = 1;
    d.seqs = seq;
    d.n_query_tokens = 1;
    d.n_q_heads = 1;
    d.q = q;
    d.q_dtype = IKV_DTYPE_F32;
    d.out = out;
    d.out_dtype = IKV_DTYPE_F32;
    d.stream = s;
    return d;
}

/* That step (step1_args). */
static inline ikv_status decode1(ikv_decoder *dec, ikv_pool *pool, ikv_seq_id *seq, const float *q, float *out,
                          cudaStream_t s) {
    const ikv_decode_args d = step1_args(seq, q, out, s);
    return ikv_decode(dec, pool, &d);
}

#endif
