/*
 * engine_loop.c: where each intentkv call goes in an engine's decode loop.
 * The template an engine author copies (docs/INTEGRATION.md explains the
 * calls). A Llama-shaped model (32 query heads, 8 kv-heads, head_dim 128)
 * serves a batch of sequences of different lengths; the "model" is random
 * numbers, the calls and their order are the real thing:
 *
 *   prefill   route each sequence's layout, append its prompt in chunks
 *             (every layer at once; new pages take the plan's precisions)
 *   each step, for each layer l:
 *             append the batch's new token (one batch call; asynchronous
 *             from device memory on CUDA), then decode the batch through
 *             each sequence's plan and query-aware top-k (hybrid score)
 *   each turn the layouts gain the new turn and are re-routed; at turn 2
 *             memory pressure rises: new plans demote precisions and the
 *             existing pages are re-stored at them; an append refused for
 *             capacity is retried after that relief
 *   mid-run   sequence 0 forks for a parallel tool call, the branch reads a
 *             tool result and decodes, then is dropped
 *
 * Prints the time per layer (append + decode) of each phase and the pool's
 * memory by format. Usage:
 *   engine-loop [cpu|cuda] [layers=N] [seqs=N] [ctx=N] [steps=N] [turn=N]
 * Defaults: the GPU when there is one (32 layers, 8 sequences, contexts up to
 * 32K, 48 steps), else the CPU (4 layers, 4 sequences, up to 8K, 24 steps).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "intentkv.h"

#ifdef IKV_DEMO_CUDA
#include <cuda_runtime_api.h>
#endif

enum { N_Q_HEADS = 32, N_KV_HEADS = 8, HEAD_DIM = 128, PAGE = 16, PREFILL_CHUNK = 512, TOOL_TOKENS = 48,
       MAX_SEQS = 64, MAX_STEPS = 4096 };

/* Stop on a failed call with its status and sentence (a real engine maps
 * statuses to actions: docs/INTEGRATION.md, "What to do on each error status"). */
#define CHECK(call)                                                                                         \
    do {                                                                                                    \
        const ikv_status st_ = (call);                                                                      \
        if (st_ != IKV_OK) {                                                                                \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, ikv_status_name(st_),        \
                    ikv_last_error());                                                                      \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)

typedef struct options {
    int cuda;
    uint32_t layers, seqs, ctx, steps, turn;
} options;

/* ---- the engine's tensors: F16, on the device for CUDA pools ---- */

static uint16_t f32_to_f16(float x) { /* round to nearest even; |x| < 65504, tiny values flush to 0 */
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a < 0x38800000u) return (uint16_t)sign;
    return (uint16_t)(sign | ((a + 0xC8000FFFu + ((a >> 13) & 1u)) >> 13));
}

static uint64_t rng_state = 42;
static float rnd(void) { /* uniform in (-1, 1), deterministic */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / 4503599627370496.0 - 1.0);
}

static void *host_f16(size_t n, float amp) {
    uint16_t *p = malloc(n * sizeof *p);
    if (!p) exit(1);
    for (size_t i = 0; i < n; ++i) p[i] = f32_to_f16(amp * rnd());
    return p;
}

/* A buffer the model "writes": host memory, or device memory with the same contents. */
static void *tensor(const options *o, size_t n_f16, float amp) {
    void *h = host_f16(n_f16, amp);
#ifdef IKV_DEMO_CUDA
    if (o->cuda) {
        void *d = NULL;
        if (cudaMalloc(&d, n_f16 * 2) != cudaSuccess || cudaMemcpy(d, h, n_f16 * 2, cudaMemcpyHostToDevice)) {
            fprintf(stderr, "cudaMalloc/cudaMemcpy failed\n");
            exit(1);
        }
        free(h);
        return d;
    }
#endif
    (void)o;
    return h;
}
static void tensor_free(const options *o, void *p) {
#ifdef IKV_DEMO_CUDA
    if (o->cuda) {
        cudaFree(p);
        return;
    }
#endif
    (void)o;
    free(p);
}

/* ---- time: wall clock on the CPU; CUDA events around GPU work ---- */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

typedef struct timer {
    const options *o;
    double t0;
#ifdef IKV_DEMO_CUDA
    cudaEvent_t e0, e1;
#endif
} timer;

static void timer_start(timer *t, void *stream) {
    (void)stream;
#ifdef IKV_DEMO_CUDA
    if (t->o->cuda) {
        cudaEventRecord(t->e0, (cudaStream_t)stream);
        return;
    }
#endif
    t->t0 = now_ms();
}
/* Milliseconds since timer_start (waits for the GPU work enqueued since). */
static double timer_stop(timer *t, void *stream) {
    (void)stream;
#ifdef IKV_DEMO_CUDA
    if (t->o->cuda) {
        float ms = 0;
        cudaEventRecord(t->e1, (cudaStream_t)stream);
        cudaEventSynchronize(t->e1);
        cudaEventElapsedTime(&ms, t->e0, t->e1);
        return ms;
    }
#endif
    return now_ms() - t->t0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

/* ---- the engine's per-sequence state ---- */

typedef struct sequence {
    ikv_seq_id id;
    ikv_layout *layout;
    ikv_plan *plan;
    uint32_t turn_block;  /* the newest turn's block (RECENT) */
    uint32_t planned_end; /* the plan covers [0, planned_end): the current turn's end */
} sequence;

/* A new turn: the previous one becomes ordinary history (ATTEND), the new
 * one covers the tokens this turn will add (RECENT), and the layout is
 * routed for the turn's end. Decode clips a plan to the tokens stored, so one
 * route per turn serves every step of it. */
static void start_turn(ikv_router *router, sequence *s, uint32_t length, uint32_t turn_tokens, uint32_t turn) {
    if (s->turn_block != UINT32_MAX) {
        ikv_block_info info;
        CHECK(ikv_layout_get(s->layout, s->turn_block, &info));
        ikv_block_desc d = ikv_block_desc_default();
        d.name = info.name;
        d.kind = info.kind;
        d.start = info.start;
        d.end = length; /* the turn ended where the sequence is now */
        d.policy = IKV_POLICY_ATTEND;
        d.score = 0.6f;
        d.turn = info.turn;
        CHECK(ikv_layout_update(s->layout, s->turn_block, &d));
    }
    char name[32];
    snprintf(name, sizeof name, "turn %u", turn);
    ikv_block_desc d = ikv_block_desc_default();
    d.name = name;
    d.kind = IKV_KIND_CONVERSATION;
    d.start = length;
    d.end = length + turn_tokens;
    d.policy = IKV_POLICY_RECENT;
    d.turn = turn;
    CHECK(ikv_layout_add(s->layout, &d, &s->turn_block));
    ikv_plan_destroy(s->plan);
    s->plan = NULL;
    s->planned_end = length + turn_tokens;
    CHECK(ikv_router_route(router, s->layout, s->planned_end, &s->plan));
}

/* An append that runs out of pool capacity changed nothing: relieve the
 * pressure (demote the plans, re-store existing pages at the new
 * precisions) and retry once. */
static void append_batch_or_relieve(ikv_pool *pool, ikv_router *router, sequence *seqs, uint32_t n,
                                    const ikv_seq_id *ids, const ikv_plan **plans, const ikv_append *ap) {
    ikv_status st = ikv_pool_append_batch(pool, ids, n, ap);
    if (st != IKV_E_NOMEM) {
        CHECK(st);
        return;
    }
    printf("  pool full: raising memory pressure and re-storing pages at the demoted precisions\n");
    CHECK(ikv_router_set_pressure(router, 0.9f));
    for (uint32_t b = 0; b < n; ++b) {
        uint32_t len = 0;
        CHECK(ikv_seq_length(pool, seqs[b].id, &len));
        ikv_plan_destroy(seqs[b].plan);
        seqs[b].plan = NULL;
        CHECK(ikv_router_route(router, seqs[b].layout, seqs[b].planned_end, &seqs[b].plan));
        plans[b] = seqs[b].plan; /* the step's decodes take the new plan: the old one is gone */
        CHECK(ikv_seq_apply_plan_formats(pool, seqs[b].id, seqs[b].plan));
    }
    CHECK(ikv_pool_append_batch(pool, ids, n, ap));
}

static void print_memory(const ikv_pool *pool, const char *when) {
    ikv_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(ikv_pool_get_stats(pool, &st));
    printf("  pool %s: %.1f MiB in %llu pages (", when, st.used_bytes / 1048576.0, (unsigned long long)st.pages_used);
    for (int f = 0; f < IKV_FMT_COUNT; ++f)
        if (st.pages_by_format[f])
            printf(" %s %.0f%%", ikv_format_name((ikv_format)f), 100.0 * st.bytes_by_format[f] / st.used_bytes);
    printf(" ), %llu tokens\n", (unsigned long long)st.tokens_total);
}

static options parse(int argc, char **argv, int have_gpu) {
    options o = {have_gpu, 0, 0, 0, 0, 8};
    for (int i = 1; i < argc; ++i) {
        unsigned v = 0;
        if (!strcmp(argv[i], "cpu")) o.cuda = 0;
        else if (!strcmp(argv[i], "cuda")) o.cuda = 1;
        else if (sscanf(argv[i], "layers=%u", &v) == 1) o.layers = v;
        else if (sscanf(argv[i], "seqs=%u", &v) == 1) o.seqs = v;
        else if (sscanf(argv[i], "ctx=%u", &v) == 1) o.ctx = v;
        else if (sscanf(argv[i], "steps=%u", &v) == 1) o.steps = v;
        else if (sscanf(argv[i], "turn=%u", &v) == 1) o.turn = v;
        else {
            fprintf(stderr, "usage: %s [cpu|cuda] [layers=N] [seqs=N] [ctx=N] [steps=N] [turn=N]\n", argv[0]);
            exit(2);
        }
    }
    if (!o.layers) o.layers = o.cuda ? 32 : 4;
    if (!o.seqs) o.seqs = o.cuda ? 8 : 4;
    if (!o.ctx) o.ctx = o.cuda ? 32768 : 8192;
    if (!o.steps) o.steps = o.cuda ? 48 : 24;
    if (o.seqs < 1 || o.seqs > MAX_SEQS || o.ctx < 2048 || o.steps < 1 || o.steps > MAX_STEPS || o.turn < 1 ||
        o.layers < 1) {
        fprintf(stderr, "seqs must be 1..%d, ctx >= 2048, steps 1..%d, layers and turn >= 1\n", MAX_SEQS, MAX_STEPS);
        exit(2);
    }
    return o;
}

int main(int argc, char **argv) {
    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(ikv_runtime_info_get(&info));
    int have_gpu = info.cuda_built && info.cuda_device_count > 0;
#ifndef IKV_DEMO_CUDA
    have_gpu = 0; /* this program was built without the CUDA runtime */
#endif
    const options o = parse(argc, argv, have_gpu);
    if (o.cuda && !have_gpu) {
        fprintf(stderr, "cuda asked for, but %s\n", info.cuda_built ? "no GPU is visible" : "CUDA is not built in");
        return 2;
    }
    const uint32_t L = o.layers, B = o.seqs, H = N_KV_HEADS, D = HEAD_DIM;
    printf("engine loop on %s: %u layers, %u sequences (contexts %u..%u tokens), %u steps, a turn every %u steps\n",
           o.cuda ? info.cuda_device_name : info.cpu_isa, L, B, o.ctx / 2, o.ctx, o.steps, o.turn);

    /* ---- objects the engine holds for its lifetime ---- */
    ikv_pool_config pc = ikv_pool_default_config();
    pc.backend = o.cuda ? IKV_BACKEND_CUDA : IKV_BACKEND_CPU;
    pc.n_layers = L;
    pc.n_kv_heads = H;
    pc.head_dim = D;
    pc.page_size = PAGE;
    pc.kv_dtype = IKV_DTYPE_F16;
    /* room for every sequence at F16 plus a little: pressure relief is exercised only when it runs short */
    const uint64_t f16_token_bytes = 2ull * L * H * D * 2;
    pc.capacity_bytes = (uint64_t)((double)B * (o.ctx + o.steps + TOOL_TOKENS + 2 * PAGE) * f16_token_bytes * 1.1);
    ikv_pool *pool = NULL;
    CHECK(ikv_pool_create(&pc, &pool));

    ikv_router_config rc = ikv_router_default_config();
    rc.page_size = PAGE;
    rc.token_budget = o.ctx / 4; /* the plan may read a quarter of the longest context */
    rc.recent_window = 512;
    rc.over_budget = IKV_OVER_BUDGET_KEEP;
    ikv_router *router = NULL;
    CHECK(ikv_router_create(&rc, &router));

    ikv_decoder_config dc = ikv_decoder_default_config();
    ikv_decoder *dec = NULL;
    CHECK(ikv_decoder_create(&dc, &dec));

    void *stream = NULL; /* CUDA: the engine's stream; NULL = the default stream */
#ifdef IKV_DEMO_CUDA
    cudaStream_t cs = NULL;
    if (o.cuda) {
        cudaStreamCreate(&cs);
        stream = cs;
    }
#endif
    timer tm = {&o, 0};
#ifdef IKV_DEMO_CUDA
    if (o.cuda) {
        cudaEventCreate(&tm.e0);
        cudaEventCreate(&tm.e1);
    }
#endif

    /* ---- the model's outputs for one step (reused: values do not matter here) ---- */
    const size_t kv_step = (size_t)L * B * H * D;                /* [layer][seq][kv_head][d] */
    void *k_step = tensor(&o, kv_step, 1.0f), *v_step = tensor(&o, kv_step, 1.0f);
    void *q = tensor(&o, (size_t)L * B * N_Q_HEADS * D, 1.0f);  /* [layer][seq][q_head][d] */
    void *out = tensor(&o, (size_t)B * N_Q_HEADS * D, 0.0f);
    const size_t kv_chunk = (size_t)L * PREFILL_CHUNK * H * D;   /* [layer][token][kv_head][d] */
    void *k_chunk = tensor(&o, kv_chunk, 1.0f), *v_chunk = tensor(&o, kv_chunk, 1.0f);

    /* ---- prefill: route each prompt's layout, append the prompt ---- */
    sequence seqs[MAX_SEQS];
    ikv_seq_id ids[MAX_SEQS];
    const ikv_plan *plans[MAX_SEQS];
    double t = now_ms();
    for (uint32_t b = 0; b < B; ++b) {
        const uint32_t len = o.ctx / 2 + (B > 1 ? (uint32_t)((uint64_t)(o.ctx / 2) * b / (B - 1)) : o.ctx / 2);
        ikv_synth_config sc = ikv_synth_default_config();
        sc.seq_len = len;
        sc.seed = 1000 + b;
        seqs[b].layout = NULL;
        seqs[b].plan = NULL;
        seqs[b].turn_block = UINT32_MAX;
        CHECK(ikv_synth_layout(&sc, &seqs[b].layout));
        CHECK(ikv_router_route(router, seqs[b].layout, len, &seqs[b].plan));
        CHECK(ikv_seq_create(pool, &seqs[b].id));
        ids[b] = seqs[b].id;
        for (uint32_t done = 0; done < len; done += PREFILL_CHUNK) {
            const uint32_t n = len - done < PREFILL_CHUNK ? len - done : PREFILL_CHUNK;
            ikv_append ap = ikv_append_default(pool, n);
            ap.layer = IKV_ALL_LAYERS;
            ap.k = k_chunk;
            ap.v = v_chunk;
            ap.layer_stride = (int64_t)PREFILL_CHUNK * H * D; /* the chunk buffer's layout, whatever n is */
            ap.formats = seqs[b].plan;                        /* new pages: the plan's precision per page */
            ap.src_on_device = o.cuda;
            ap.stream = stream;
            CHECK(ikv_pool_append(pool, seqs[b].id, &ap));
        }
        start_turn(router, &seqs[b], len, o.turn, 1); /* the first decode turn */
    }
    printf("prefill: %.0f ms\n", now_ms() - t);
    print_memory(pool, "after prefill");

    /* ---- decode steps ---- */
    double *layer_ms = malloc(sizeof(double) * o.steps);
    size_t phase_begin = 0;
    uint32_t turn = 1;
    const char *phase = "turn 1";
    int output_ok = 1;
    for (uint32_t step = 0; step < o.steps; ++step) {
        if (step > 0 && step % o.turn == 0) { /* turn boundary */
            printf("  %-28s %7.3f ms per layer (median of %zu steps: batch append + decode of %u sequences)\n", phase,
                   median(layer_ms + phase_begin, step - phase_begin), (size_t)(step - phase_begin), B);
            phase_begin = step;
            ++turn;
            if (turn == 2) {
                /* memory pressure rises: demote, and re-store the existing pages */
                CHECK(ikv_router_set_pressure(router, 0.6f));
                phase = "turn 2 (pressure 0.6)";
            } else {
                phase = turn == 3 ? "turn 3 (after the fork)" : "later turns";
            }
            for (uint32_t b = 0; b < B; ++b) {
                uint32_t len = 0;
                CHECK(ikv_seq_length(pool, seqs[b].id, &len));
                start_turn(router, &seqs[b], len, o.turn, turn);
                if (turn == 2) CHECK(ikv_seq_apply_plan_formats(pool, seqs[b].id, seqs[b].plan));
            }
            if (turn == 2) print_memory(pool, "after demotion");
        }
        for (uint32_t b = 0; b < B; ++b) plans[b] = seqs[b].plan;

        timer_start(&tm, stream);
        for (uint32_t l = 0; l < L; ++l) {
            /* the step's own token first: it attends to itself */
            ikv_append ap = ikv_append_default(pool, 1);
            ap.layer = l;
            ap.k = (const uint16_t *)k_step + (size_t)l * B * H * D;
            ap.v = (const uint16_t *)v_step + (size_t)l * B * H * D;
            ap.seq_stride = (int64_t)H * D;
            ap.src_on_device = o.cuda;
            ap.flags = o.cuda ? IKV_APPEND_ASYNC : 0; /* CUDA: enqueue, never wait for the GPU */
            ap.stream = stream;
            append_batch_or_relieve(pool, router, seqs, B, ids, plans, &ap);

            ikv_decode_args a = ikv_decode_args_default();
            a.layer = l;
            a.n_seqs = B;
            a.seqs = ids;
            a.plans = plans;
            a.n_q_heads = N_Q_HEADS;
            a.q = (const uint16_t *)q + (size_t)l * B * N_Q_HEADS * D;
            a.q_dtype = IKV_DTYPE_F16;
            a.out = out;
            a.out_dtype = IKV_DTYPE_F16;
            a.topk_token_budget = o.ctx / 8; /* query-aware pages inside the plan: 12.5% of the longest */
            a.topk_score = IKV_TOPK_SCORE_HYBRID;
            a.stream = stream;
            CHECK(ikv_decode(dec, pool, &a));
            /* ... the model's output projection and MLP for layer l would run here ... */
        }
        layer_ms[step] = timer_stop(&tm, stream) / L;

        if (step == o.turn + o.turn / 2) { /* mid turn 2: a parallel tool call on a branch of sequence 0 */
            ikv_seq_id branch;
            const double t0 = now_ms();
            CHECK(ikv_seq_fork(pool, seqs[0].id, &branch)); /* shares every page */
            ikv_append ap = ikv_append_default(pool, TOOL_TOKENS);
            ap.layer = IKV_ALL_LAYERS;
            ap.k = k_chunk;
            ap.v = v_chunk;
            ap.layer_stride = (int64_t)PREFILL_CHUNK * H * D;
            ap.src_on_device = o.cuda;
            ap.stream = stream;
            CHECK(ikv_pool_append(pool, branch, &ap)); /* the tool's result; copies the shared tail page */
            for (uint32_t l = 0; l < L; ++l) {
                ikv_decode_args a = ikv_decode_args_default();
                a.layer = l;
                a.seqs = &branch;
                a.plans = plans; /* sequence 0's plan: clipped to what the branch stores */
                a.n_q_heads = N_Q_HEADS;
                a.q = q;
                a.q_dtype = IKV_DTYPE_F16;
                a.out = out;
                a.out_dtype = IKV_DTYPE_F16;
                a.stream = stream;
                CHECK(ikv_decode(dec, pool, &a));
            }
            CHECK(ikv_seq_destroy(pool, branch)); /* the branch's own pages are freed, shared ones stay */
            (void)timer_stop(&tm, stream);        /* wait for the branch's GPU work */
            printf("  tool-call branch of sequence 0: fork, %u-token append, %u-layer decode, drop: %.2f ms\n",
                   TOOL_TOKENS, L, now_ms() - t0);
        }
    }
    printf("  %-28s %7.3f ms per layer (median of %zu steps)\n", phase,
           median(layer_ms + phase_begin, o.steps - phase_begin), (size_t)(o.steps - phase_begin));
    CHECK(ikv_pool_sync(pool)); /* end of the session: any non-finite input an async append met */

    /* The last step's output, checked finite (a real engine feeds it to the next layer). */
    const size_t n_out = (size_t)B * N_Q_HEADS * D;
    uint16_t *host_out = malloc(n_out * 2);
#ifdef IKV_DEMO_CUDA
    if (o.cuda)
        cudaMemcpy(host_out, out, n_out * 2, cudaMemcpyDeviceToHost);
    else
#endif
        memcpy(host_out, out, n_out * 2);
    for (size_t i = 0; i < n_out; ++i) output_ok &= (host_out[i] & 0x7C00u) != 0x7C00u;
    print_memory(pool, "at the end");
    ikv_decoder_stats ds;
    memset(&ds, 0, sizeof ds);
    ds.struct_size = sizeof ds;
    CHECK(ikv_decoder_get_stats(dec, &ds));
    printf("decoder: %llu decode calls, %llu built their page lists, %llu reused the previous layer's\n",
           (unsigned long long)ds.steps, (unsigned long long)ds.lists_built, (unsigned long long)ds.lists_reused);
    printf("outputs %s\n", output_ok ? "finite: ok" : "NOT FINITE");

    free(host_out);
    free(layer_ms);
    for (uint32_t b = 0; b < B; ++b) {
        CHECK(ikv_seq_destroy(pool, seqs[b].id));
        ikv_plan_destroy(seqs[b].plan);
        ikv_layout_destroy(seqs[b].layout);
    }
    tensor_free(&o, k_step);
    tensor_free(&o, v_step);
    tensor_free(&o, q);
    tensor_free(&o, out);
    tensor_free(&o, k_chunk);
    tensor_free(&o, v_chunk);
#ifdef IKV_DEMO_CUDA
    if (o.cuda) {
        cudaEventDestroy(tm.e0);
        cudaEventDestroy(tm.e1);
        cudaStreamDestroy(cs);
    }
#endif
    ikv_decoder_destroy(dec);
    ikv_router_destroy(router);
    ikv_pool_destroy(pool);
    return output_ok ? 0 : 1;
}
