/* Tensor parallelism (issue 23): an engine shards attention by heads, so each
 * GPU holds the K/V of its kv-heads in its own pool and decodes its query
 * heads, fed by the same host plans. Two CUDA pools (devices 0 and 1 when two
 * GPUs are visible, else both on device 0) each hold half the kv-heads of the
 * same sequences; each is decoded from its own thread with its own decoder,
 * as an engine's per-GPU workers do. Their outputs, concatenated by head,
 * must equal a one-GPU pool's decode of all heads (fp32 rounding: the split
 * of work differs), and each kv-head's selection must be the same tokens:
 * every format, dense, a routed plan, top-k (Quest and hybrid, with and
 * without the plan) and IKV_TOPK_MASS. Skips without a CUDA device. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "support.h"

enum { L = 2, H = 8, SH = 2, HS = H / SH, G = 4, NQ = H * G, NQS = HS * G, D = 128, P = 16, B = 2 };
static const uint32_t kLens[B] = {700, 333};
static int g_dev[SH];

typedef struct shard {
    int device;
    ikv_pool *pool;
    ikv_decoder *dec;
    ikv_seq_id seqs[B];
    void *q, *out;     /* device buffers of this shard's device */
    float *lse;
    ikv_decode_args args;
    ikv_status status;
    char error[256]; /* the worker thread's ikv_last_error() (thread-local) */
} shard;

static ikv_pool *make_pool(int device, uint32_t heads, ikv_format f) {
    ikv_pool_config c = ikvt_pool_config((ikvt_pool_spec){.backend = IKV_BACKEND_CUDA, .n_layers = L,
                                                          .n_kv_heads = heads, .head_dim = D, .page_size = P,
                                                          .capacity_bytes = 64u << 20, .default_format = f});
    c.device = device;
    ikv_pool *pool = NULL;
    IKVT_OK(ikv_pool_create(&c, &pool));
    return pool;
}

/* kv: host [L][len][H][D]; a shard takes heads [h0, h0 + heads) through the strides. */
static void append_heads(ikv_pool *pool, ikv_seq_id seq, const float *k, const float *v, uint32_t len, uint32_t h0) {
    ikv_append a = ikv_append_default(pool, len);
    a.layer = IKV_ALL_LAYERS;
    a.k = k + (size_t)h0 * D;
    a.v = v + (size_t)h0 * D;
    a.token_stride = (int64_t)H * D;
    a.head_stride = D;
    a.layer_stride = (int64_t)len * H * D;
    IKVT_OK(ikv_pool_append(pool, seq, &a));
}

static void *decode_shard(void *arg) {
    shard *s = arg;
    if (ikvt_rt.set_device_(s->device) != 0) {
        s->status = IKV_E_DEVICE;
        return NULL;
    }
    s->status = ikv_decode(s->dec, s->pool, &s->args);
    if (s->status != IKV_OK) snprintf(s->error, sizeof s->error, "%s", ikv_last_error());
    if (s->status == IKV_OK) s->status = ikvt_rt.sync_() == 0 ? IKV_OK : IKV_E_DEVICE;
    return NULL;
}

static void *dev_buffer(int device, const void *host, size_t bytes) {
    assert_int_equal(ikvt_rt.set_device_(device), 0);
    return ikvt_dev_upload(host, bytes);
}

typedef struct variant {
    const char *name;
    int planned;
    uint32_t topk;
    ikv_topk_score score;
    ikv_topk_mode mode;
} variant;

static void check_variant(const variant *vr, ikv_pool *full, ikv_decoder *full_dec, const ikv_seq_id *full_seqs,
                          shard *sh, const ikv_plan *const *plans, const float *q_host, ikv_format f) {
    /* one GPU, all heads */
    void *q_full = dev_buffer(0, q_host, sizeof(float) * B * NQ * D);
    void *out_full = dev_buffer(0, NULL, sizeof(float) * B * NQ * D);
    float *lse_full = dev_buffer(0, NULL, sizeof(float) * B * NQ);
    ikv_decode_args a = ikv_decode_args_default();
    a.n_seqs = B;
    a.seqs = full_seqs;
    a.plans = vr->planned ? plans : NULL;
    a.n_q_heads = NQ;
    a.q = q_full;
    a.out = out_full;
    a.lse = lse_full;
    a.topk_token_budget = vr->topk;
    a.topk_score = vr->score;
    a.topk_mode = vr->mode;
    a.topk_min_tokens = vr->mode == IKV_TOPK_MASS ? 64 : 0;
    IKVT_OK(ikv_decode(full_dec, full, &a));
    float *o_full = malloc(sizeof(float) * B * NQ * D), *l_full = malloc(sizeof(float) * B * NQ);
    assert_int_equal(ikvt_rt.sync_(), 0);
    assert_int_equal(ikvt_rt.memcpy_(o_full, out_full, sizeof(float) * B * NQ * D, IKVT_D2H), 0);
    assert_int_equal(ikvt_rt.memcpy_(l_full, lse_full, sizeof(float) * B * NQ, IKVT_D2H), 0);

    /* each shard from its own thread: the same call on its heads */
    pthread_t th[SH];
    for (int s = 0; s < SH; ++s) {
        sh[s].args = a;
        sh[s].args.seqs = sh[s].seqs;
        sh[s].args.n_q_heads = NQS;
        sh[s].args.q = sh[s].q;
        sh[s].args.out = sh[s].out;
        sh[s].args.lse = sh[s].lse;
        assert_int_equal(pthread_create(&th[s], NULL, decode_shard, &sh[s]), 0);
    }
    for (int s = 0; s < SH; ++s) assert_int_equal(pthread_join(th[s], NULL), 0);
    for (int s = 0; s < SH; ++s) {
        if (sh[s].status != IKV_OK) {
            print_error("%s %s shard %d: %s %s\n", ikv_format_name(f), vr->name, s, ikv_status_name(sh[s].status),
                        sh[s].error);
            fail();
        }
        float *o = malloc(sizeof(float) * B * NQS * D), *l = malloc(sizeof(float) * B * NQS);
        assert_int_equal(ikvt_rt.set_device_(sh[s].device), 0);
        assert_int_equal(ikvt_rt.memcpy_(o, sh[s].out, sizeof(float) * B * NQS * D, IKVT_D2H), 0);
        assert_int_equal(ikvt_rt.memcpy_(l, sh[s].lse, sizeof(float) * B * NQS, IKVT_D2H), 0);
        for (uint32_t b = 0; b < B; ++b) {
            /* the shard's query heads are the full pool's heads [s * NQS, (s + 1) * NQS) */
            const float *ref = o_full + ((size_t)b * NQ + (size_t)s * NQS) * D, *got = o + (size_t)b * NQS * D;
            double num = 0, den = 0;
            for (size_t i = 0; i < (size_t)NQS * D; ++i) {
                num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
                den += (double)ref[i] * ref[i];
            }
            const double rel = sqrt(num / (den > 0 ? den : 1));
            if (!(rel <= 2e-5)) {
                print_error("%s %s shard %d seq %u: rel L2 %.3g against the one-GPU pool\n", ikv_format_name(f),
                            vr->name, s, b, rel);
                fail();
            }
            for (uint32_t r = 0; r < NQS; ++r) {
                const double want = l_full[b * NQ + s * NQS + r], have = l[b * NQS + r];
                assert_true(fabs(want - have) <= 2e-4 * fmax(1.0, fabs(want)));
            }
            /* the same tokens per kv-head */
            for (uint32_t h = 0; h < HS; ++h) {
                ikv_token_range r1[512], r2[512];
                size_t n1 = 0, n2 = 0;
                IKVT_OK(ikv_decoder_last_selection(full_dec, b, (uint32_t)s * HS + h, r1, 512, &n1));
                IKVT_OK(ikv_decoder_last_selection(sh[s].dec, b, h, r2, 512, &n2));
                assert_int_equal(n1, n2);
                assert_memory_equal(r1, r2, n1 * sizeof r1[0]);
            }
        }
        free(o);
        free(l);
    }
    assert_int_equal(ikvt_rt.set_device_(0), 0);
    ikvt_rt.free_(q_full);
    ikvt_rt.free_(out_full);
    ikvt_rt.free_(lse_full);
    free(o_full);
    free(l_full);
}

static void test_heads_split_over_two_pools_equal_one(void **state) {
    (void)state;
    static const variant variants[] = {
        {"dense", 0, 0, IKV_TOPK_SCORE_QUEST, IKV_TOPK_FIXED},
        {"plan", 1, 0, IKV_TOPK_SCORE_QUEST, IKV_TOPK_FIXED},
        {"plan+quest", 1, 160, IKV_TOPK_SCORE_QUEST, IKV_TOPK_FIXED},
        {"hybrid", 0, 160, IKV_TOPK_SCORE_HYBRID, IKV_TOPK_FIXED},
        {"plan+hybrid mass", 1, 256, IKV_TOPK_SCORE_HYBRID, IKV_TOPK_MASS},
    };
    ikvt_rng rng = {2300};
    /* one router's plans for both sequences: host objects, shared by every pool */
    ikv_router_config rc = ikv_router_default_config();
    rc.page_size = P;
    rc.token_budget = 256;
    rc.recent_window = 64;
    rc.over_budget = IKV_OVER_BUDGET_KEEP;
    ikv_router *router = NULL;
    IKVT_OK(ikv_router_create(&rc, &router));
    ikv_plan *plans[B];
    for (uint32_t b = 0; b < B; ++b) {
        ikv_layout *layout = NULL;
        ikv_synth_config sc = ikv_synth_default_config();
        sc.seq_len = 1024; /* the synthetic layout's minimum; routed for it and clipped at decode */
        sc.n_documents = 4;
        sc.seed = 50 + b;
        IKVT_OK(ikv_synth_layout(&sc, &layout));
        IKVT_OK(ikv_router_route(router, layout, sc.seq_len, &plans[b]));
        ikv_layout_destroy(layout);
    }
    float *kv[B][2];
    for (uint32_t b = 0; b < B; ++b)
        for (int w = 0; w < 2; ++w) {
            kv[b][w] = malloc(sizeof(float) * L * kLens[b] * H * D);
            ikvt_fill_normal(&rng, kv[b][w], (size_t)L * kLens[b] * H * D, 1.0f);
        }
    float *q = malloc(sizeof(float) * B * NQ * D), *qs = malloc(sizeof(float) * B * NQS * D);
    ikvt_fill_normal(&rng, q, (size_t)B * NQ * D, 1.5f);

    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        ikv_pool *full = make_pool(0, H, (ikv_format)f);
        ikv_decoder_config dc = ikv_decoder_default_config();
        ikv_decoder *full_dec = NULL;
        IKVT_OK(ikv_decoder_create(&dc, &full_dec));
        ikv_seq_id full_seqs[B];
        shard sh[SH];
        memset(sh, 0, sizeof sh);
        for (int s = 0; s < SH; ++s) {
            sh[s].device = g_dev[s];
            sh[s].pool = make_pool(g_dev[s], HS, (ikv_format)f);
            IKVT_OK(ikv_decoder_create(&dc, &sh[s].dec));
            for (uint32_t b = 0; b < B; ++b)
                memcpy(qs + (size_t)b * NQS * D, q + ((size_t)b * NQ + (size_t)s * NQS) * D, sizeof(float) * NQS * D);
            sh[s].q = dev_buffer(g_dev[s], qs, sizeof(float) * B * NQS * D);
            sh[s].out = dev_buffer(g_dev[s], NULL, sizeof(float) * B * NQS * D);
            sh[s].lse = dev_buffer(g_dev[s], NULL, sizeof(float) * B * NQS);
        }
        for (uint32_t b = 0; b < B; ++b) {
            IKVT_OK(ikv_seq_create(full, &full_seqs[b]));
            append_heads(full, full_seqs[b], kv[b][0], kv[b][1], kLens[b], 0);
            for (int s = 0; s < SH; ++s) {
                IKVT_OK(ikv_seq_create(sh[s].pool, &sh[s].seqs[b]));
                append_heads(sh[s].pool, sh[s].seqs[b], kv[b][0], kv[b][1], kLens[b], (uint32_t)s * HS);
            }
        }
        for (size_t i = 0; i < sizeof variants / sizeof variants[0]; ++i)
            check_variant(&variants[i], full, full_dec, full_seqs, sh, (const ikv_plan *const *)plans, q,
                          (ikv_format)f);
        for (int s = 0; s < SH; ++s) {
            assert_int_equal(ikvt_rt.set_device_(sh[s].device), 0);
            ikvt_rt.free_(sh[s].q);
            ikvt_rt.free_(sh[s].out);
            ikvt_rt.free_(sh[s].lse);
            ikv_decoder_destroy(sh[s].dec);
            ikv_pool_destroy(sh[s].pool);
        }
        assert_int_equal(ikvt_rt.set_device_(0), 0);
        ikv_decoder_destroy(full_dec);
        ikv_pool_destroy(full);
    }
    for (uint32_t b = 0; b < B; ++b) {
        ikv_plan_destroy(plans[b]);
        free(kv[b][0]);
        free(kv[b][1]);
    }
    free(q);
    free(qs);
    ikv_router_destroy(router);
}

/* A pool names a device that does not exist: refused, the ordinal named. */
static void test_device_ordinal_checked(void **state) {
    (void)state;
    int n = 0;
    assert_int_equal(ikvt_rt.get_device_count_(&n), 0);
    ikv_pool_config c = ikvt_pool_config((ikvt_pool_spec){.backend = IKV_BACKEND_CUDA, .n_layers = 1, .n_kv_heads = 1,
                                                          .head_dim = 64, .capacity_bytes = 1u << 20});
    ikv_pool *pool = NULL;
    c.device = n;
    IKVT_EXPECT_STATUS(ikv_pool_create(&c, &pool), IKV_E_NO_DEVICE, "config->device");
    assert_null(pool);
    c.device = -1;
    IKVT_EXPECT_STATUS(ikv_pool_create(&c, &pool), IKV_E_NO_DEVICE, "config->device");
    assert_null(pool);
}

int main(void) {
    ikvt_require_cuda_device();
    int n = 0;
    if (ikvt_rt.get_device_count_(&n) != 0 || n < 1) ikvt_skip_program("no CUDA device");
    g_dev[0] = 0;
    g_dev[1] = n > 1 ? 1 : 0;
    printf("shards on devices %d and %d (%d visible)%s\n", g_dev[0], g_dev[1], n,
           n > 1 ? "" : ": one GPU, so both shards share it; the two-GPU case needs a second device");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heads_split_over_two_pools_equal_one),
        cmocka_unit_test(test_device_ordinal_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
