/* ikv_pool_append_batch against one ikv_pool_append per sequence (see
 * batch_append.h). Two pools of the backend go through the same history: the
 * "batched" pool takes every step's tokens in one batch call, the "single"
 * pool one call per sequence with the same input. After each step both must
 * hold the same bytes (ikv_seq_read, ikv_seq_page_summary) and the same
 * accounting. The history covers every page format; one token to one layer
 * at a time (an engine's layer loop), several tokens to all layers, pages
 * filled and opened in the middle of a batch, a fork whose shared tail page
 * is copied by the batch, a sequence left out of the batch, strides with
 * padding (NaN, so a stride bug shows) that do and do not allow 16-byte
 * loads, and a caller built with the first ikv_append (no seq_stride). On a
 * CUDA pool the batched pool reads device memory in some steps and host
 * memory in others. Then rejected batches (a NaN in one sequence's input,
 * too little capacity for the whole batch, bad arguments) must leave every
 * sequence as it was. With `async` (CUDA), the device-input batches carry
 * IKV_APPEND_ASYNC on a stream of the test: a decode enqueued right after
 * each one-layer batch must equal the single pool's, a NaN is accepted,
 * stored as 0 and reported once by ikv_pool_sync, and an append on a stream
 * capturing a graph is refused. */
#include "batch_append.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "support.h"

enum { L = 3, H = 2, D = 64, P = 8, ROW = H * D, B = 5, NS = B + 1 };

typedef struct world {
    ikv_backend backend;
    int async;    /* CUDA: device-input batches with IKV_APPEND_ASYNC on `stream` */
    void *stream;
    ikv_pool *pool[2]; /* 0: batched, 1: single */
    ikv_seq_id id[2][NS];
    uint32_t len[NS][L]; /* tokens per sequence and layer (same in both pools) */
    ikvt_rng rng;
} world;

/* Batch order: sequences 3, 0, the fork of 2, 1, 2; sequence 4 stays out. */
static const int kOrder[B] = {3, 0, 5, 1, 2};

static ikv_pool *make_pool(ikv_backend be, ikv_format fmt, uint64_t capacity) {
    return ikvt_make_pool((ikvt_pool_spec){.backend = be, .n_layers = L, .n_kv_heads = H, .head_dim = D, .page_size = P,
                                           .capacity_bytes = capacity, .default_format = fmt});
}

/* The input of one step: n tokens for each of nb sequences, of one layer or
 * all, with padded strides; every element the strides skip is NaN. */
typedef struct input {
    ikv_append a;
    float *k, *v;
    void *k_dev, *v_dev; /* CUDA: device copies */
    size_t floats;
} input;

static size_t elem(const ikv_append *a, uint32_t l, uint32_t i, uint32_t t, uint32_t h) {
    return (size_t)((a->layer == IKV_ALL_LAYERS ? l * a->layer_stride : 0) + i * a->seq_stride +
                    t * a->token_stride + h * a->head_stride);
}

/* vec4: strides that are multiples of 4 floats (16-byte rows on the device). */
static input make_input(world *w, uint32_t layer, uint32_t nb, uint32_t n, int vec4) {
    input in;
    memset(&in, 0, sizeof in);
    in.a = ikv_append_default(w->pool[0], n);
    in.a.layer = layer;
    in.a.head_stride = vec4 ? D + 4 : D + 1;
    in.a.token_stride = H * in.a.head_stride + (vec4 ? 4 : 3);
    in.a.seq_stride = n * in.a.token_stride + (vec4 ? 8 : 5);
    in.a.layer_stride = nb * in.a.seq_stride + (vec4 ? 16 : 7);
    const uint32_t nl = layer == IKV_ALL_LAYERS ? L : 1;
    in.floats = elem(&in.a, nl - 1, nb - 1, n - 1, H - 1) + D;
    in.k = malloc(in.floats * sizeof(float));
    in.v = malloc(in.floats * sizeof(float));
    for (size_t i = 0; i < in.floats; ++i) in.k[i] = in.v[i] = NAN;
    for (uint32_t l = 0; l < nl; ++l)
        for (uint32_t i = 0; i < nb; ++i)
            for (uint32_t t = 0; t < n; ++t)
                for (uint32_t h = 0; h < H; ++h) {
                    ikvt_fill_normal(&w->rng, in.k + elem(&in.a, l, i, t, h), D, 1.0f);
                    ikvt_fill_normal(&w->rng, in.v + elem(&in.a, l, i, t, h), D, 1.0f);
                }
    return in;
}

static void upload(const world *w, input *in) {
    if (w->backend != IKV_BACKEND_CUDA) return;
    if (in->k_dev == NULL) {
        in->k_dev = ikvt_dev_upload(NULL, in->floats * sizeof(float));
        in->v_dev = ikvt_dev_upload(NULL, in->floats * sizeof(float));
    }
    assert_int_equal(ikvt_rt.memcpy_(in->k_dev, in->k, in->floats * sizeof(float), IKVT_H2D), 0);
    assert_int_equal(ikvt_rt.memcpy_(in->v_dev, in->v, in->floats * sizeof(float), IKVT_H2D), 0);
}

static void free_input(input *in) {
    free(in->k);
    free(in->v);
    if (in->k_dev) ikvt_rt.free_(in->k_dev), ikvt_rt.free_(in->v_dev);
}

/* The arguments of the batch call: host or (CUDA, from_device) device memory. */
static ikv_append batch_args(const world *w, const input *in, int from_device) {
    ikv_append a = in->a;
    const int dev = from_device && w->backend == IKV_BACKEND_CUDA;
    a.k = dev ? in->k_dev : (const void *)in->k;
    a.v = dev ? in->v_dev : (const void *)in->v;
    a.src_on_device = dev;
    if (dev && w->async) {
        a.flags = IKV_APPEND_ASYNC;
        a.stream = w->stream;
    }
    return a;
}

/* Asynchronous batches: the K/V written on the stream behind a memset that
 * keeps it busy (so neither has happened when the append is called), then a
 * decode of the appended layer enqueued right after the append with no wait
 * in between: the decode must equal the single pool's (synchronous appends),
 * and so must the stored bytes. Checks that the append's device work is
 * ordered after the engine's writes and before its decode. */
enum { HQ = 2 * H, BUSY_BYTES = 256 << 20 };
typedef struct decode_check {
    void *q_dev, *out_dev[2], *busy;
    ikv_decoder *dec[2];
} decode_check;

static decode_check decode_prepare(void) {
    decode_check c;
    const size_t nq = (size_t)B * HQ * D;
    float *q = malloc(nq * sizeof(float));
    ikvt_rng r = {0xdec0de};
    ikvt_fill_normal(&r, q, nq, 1.0f);
    c.q_dev = ikvt_dev_upload(q, nq * sizeof(float));
    free(q);
    c.busy = ikvt_dev_upload(NULL, BUSY_BYTES);
    for (int p = 0; p < 2; ++p) {
        c.out_dev[p] = ikvt_dev_upload(NULL, nq * sizeof(float));
        ikv_decoder_config dc = ikv_decoder_default_config();
        IKVT_OK(ikv_decoder_create(&dc, &c.dec[p]));
    }
    return c;
}

static void decode_run(const decode_check *c, const world *w, int p, uint32_t layer) {
    ikv_seq_id ids[B];
    for (int i = 0; i < B; ++i) ids[i] = w->id[p][kOrder[i]];
    ikv_decode_args a = ikv_decode_args_default();
    a.layer = layer;
    a.n_seqs = B;
    a.seqs = ids;
    a.n_q_heads = HQ;
    a.q = c->q_dev;
    a.q_dtype = IKV_DTYPE_F32;
    a.out = c->out_dev[p];
    a.out_dtype = IKV_DTYPE_F32;
    a.stream = w->stream;
    IKVT_OK(ikv_decode(c->dec[p], w->pool[p], &a));
}

static void decode_compare(decode_check *c, const world *w) {
    const size_t nq = (size_t)B * HQ * D;
    float *out[2];
    assert_int_equal(ikvt_rt.stream_sync_(w->stream), 0);
    for (int p = 0; p < 2; ++p) {
        out[p] = malloc(nq * sizeof(float));
        assert_int_equal(ikvt_rt.memcpy_(out[p], c->out_dev[p], nq * sizeof(float), IKVT_D2H), 0);
        ikvt_rt.free_(c->out_dev[p]);
        ikv_decoder_destroy(c->dec[p]);
    }
    assert_memory_equal(out[0], out[1], nq * sizeof(float));
    free(out[0]), free(out[1]);
    ikvt_rt.free_(c->q_dev);
    ikvt_rt.free_(c->busy);
}

/* One step: the batched pool in one call, the single pool one call per sequence (host input). */
static void step(world *w, uint32_t layer, uint32_t n, int vec4, int from_device) {
    input in = make_input(w, layer, B, n, vec4);
    upload(w, &in);
    ikv_seq_id ids[B];
    for (int i = 0; i < B; ++i) ids[i] = w->id[0][kOrder[i]];
    const ikv_append a = batch_args(w, &in, from_device);
    const int check_decode = (a.flags & IKV_APPEND_ASYNC) && layer != IKV_ALL_LAYERS;
    decode_check dc;
    if (check_decode) {
        /* As an engine: the stream is busy, then writes this step's K/V (the
         * device buffers hold NaN until then), then appends and decodes. */
        dc = decode_prepare();
        const size_t bytes = in.floats * sizeof(float);
        assert_int_equal(ikvt_rt.memset_(in.k_dev, 0xFF, bytes), 0);
        assert_int_equal(ikvt_rt.memset_(in.v_dev, 0xFF, bytes), 0);
        assert_int_equal(ikvt_rt.memset_async_(dc.busy, 0, BUSY_BYTES, w->stream), 0);
        assert_int_equal(ikvt_rt.memcpy_async_(in.k_dev, in.k, bytes, IKVT_H2D, w->stream), 0);
        assert_int_equal(ikvt_rt.memcpy_async_(in.v_dev, in.v, bytes, IKVT_H2D, w->stream), 0);
    }
    IKVT_OK(ikv_pool_append_batch(w->pool[0], ids, B, &a));
    if (check_decode) decode_run(&dc, w, 0, layer);
    for (int i = 0; i < B; ++i) {
        ikv_append one = in.a;
        one.k = in.k + (size_t)i * in.a.seq_stride;
        one.v = in.v + (size_t)i * in.a.seq_stride;
        one.seq_stride = 1; /* ignored by ikv_pool_append */
        IKVT_OK(ikv_pool_append(w->pool[1], w->id[1][kOrder[i]], &one));
        for (uint32_t l = 0; l < L; ++l)
            if (layer == IKV_ALL_LAYERS || layer == l) w->len[kOrder[i]][l] += n;
    }
    if (check_decode) {
        decode_run(&dc, w, 1, layer);
        decode_compare(&dc, w);
    }
    free_input(&in);
}

/* What a pool holds for every sequence: values of every layer, key summaries, accounting. */
typedef struct image {
    ikv_pool_stats stats;
    uint32_t length[NS];
    float *rows[NS][L]; /* K then V of tokens [0, len) */
    float *sums[NS][L]; /* per page and head: k_min, k_max, k_mean, then the token count */
} image;

static image take_image(const world *w, int which) {
    image im;
    memset(&im, 0, sizeof im);
    im.stats.struct_size = sizeof im.stats;
    IKVT_OK(ikv_pool_get_stats(w->pool[which], &im.stats));
    im.stats.reserved_bytes = 0; /* slab sizes depend on allocation order */
    for (int s = 0; s < NS; ++s) {
        const ikv_seq_id id = w->id[which][s];
        IKVT_OK(ikv_seq_length(w->pool[which], id, &im.length[s]));
        for (uint32_t l = 0; l < L; ++l) {
            const uint32_t n = w->len[s][l], pages = (n + P - 1) / P;
            im.rows[s][l] = calloc(2 * (size_t)n * ROW + 1, sizeof(float));
            IKVT_OK(ikv_seq_read(w->pool[which], id, l, 0, n, im.rows[s][l], im.rows[s][l] + (size_t)n * ROW));
            im.sums[s][l] = calloc((size_t)pages * H * (3 * D + 1) + 1, sizeof(float));
            float *out = im.sums[s][l];
            for (uint32_t pg = 0; pg < pages; ++pg)
                for (uint32_t h = 0; h < H; ++h, out += 3 * D + 1) {
                    uint32_t count = 0;
                    IKVT_OK(ikv_seq_page_summary(w->pool[which], id, l, h, pg, out, out + D, out + 2 * D, &count));
                    out[3 * D] = (float)count;
                }
        }
    }
    return im;
}

static void expect_same_image(const world *w, const image *a, const image *b) {
    assert_memory_equal(&a->stats, &b->stats, sizeof a->stats);
    assert_memory_equal(a->length, b->length, sizeof a->length);
    for (int s = 0; s < NS; ++s)
        for (uint32_t l = 0; l < L; ++l) {
            const size_t n = w->len[s][l], pages = (n + P - 1) / P;
            assert_memory_equal(a->rows[s][l], b->rows[s][l], 2 * n * ROW * sizeof(float));
            assert_memory_equal(a->sums[s][l], b->sums[s][l], pages * H * (3 * D + 1) * sizeof(float));
        }
}

static void free_image(image *im) {
    for (int s = 0; s < NS; ++s)
        for (uint32_t l = 0; l < L; ++l) free(im->rows[s][l]), free(im->sums[s][l]);
}

static void expect_pools_equal(const world *w) {
    image a = take_image(w, 0), b = take_image(w, 1);
    expect_same_image(w, &a, &b);
    free_image(&a);
    free_image(&b);
}

/* Rejected batches: each returns `expected` naming `needle` and changes nothing. */
static void expect_rejected(world *w, const ikv_seq_id *ids, uint32_t nb, const ikv_append *a, ikv_status expected,
                            const char *needle) {
    image before = take_image(w, 0);
    IKVT_EXPECT_STATUS(ikv_pool_append_batch(w->pool[0], ids, nb, a), expected, needle);
    image after = take_image(w, 0);
    expect_same_image(w, &before, &after);
    free_image(&before);
    free_image(&after);
}

static void rejections(world *w) {
    ikv_seq_id ids[B];
    for (int i = 0; i < B; ++i) ids[i] = w->id[0][kOrder[i]];

    /* A NaN in V of the last sequence (layer 1, token 1, head 1, channel 5),
     * and an inf later in check order (layer 2, the first sequence). */
    input in = make_input(w, IKV_ALL_LAYERS, B, 2, 1);
    in.v[elem(&in.a, 1, B - 1, 1, 1) + 5] = NAN;
    in.v[elem(&in.a, 2, 0, 0, 0) + 3] = INFINITY;
    upload(w, &in);
    char needle[96];
    snprintf(needle, sizeof needle, "v[sequence %u, layer 1, token 1, head 1, channel 5] is NaN",
             (unsigned)ids[B - 1]);
    for (int dev = 0; dev < (w->backend == IKV_BACKEND_CUDA ? 2 : 1); ++dev) {
        ikv_append a = batch_args(w, &in, dev);
        a.flags = 0; /* checked (asynchronous appends: async_nonfinite) */
        expect_rejected(w, ids, B, &a, IKV_E_INVALID, needle);
    }
    free_input(&in);

    in = make_input(w, 0, B, 1, 1);
    upload(w, &in);
    ikv_append a = batch_args(w, &in, 0);
    ikv_seq_id twice[B];
    memcpy(twice, ids, sizeof twice);
    twice[3] = twice[1];
    expect_rejected(w, twice, B, &a, IKV_E_INVALID, "listed twice");
    ikv_seq_id unknown[B];
    memcpy(unknown, ids, sizeof unknown);
    unknown[B - 1] = 9999;
    expect_rejected(w, unknown, B, &a, IKV_E_NOT_FOUND, "9999");
    expect_rejected(w, ids, 0, &a, IKV_E_INVALID, "n_seqs");
    IKVT_EXPECT_STATUS(ikv_pool_append_batch(w->pool[0], NULL, B, &a), IKV_E_NULL, "seqs");
    IKVT_EXPECT_STATUS(ikv_pool_append_batch(NULL, ids, B, &a), IKV_E_NULL, "pool");
    IKVT_EXPECT_STATUS(ikv_pool_append_batch(w->pool[0], ids, B, NULL), IKV_E_NULL, "args");
    ikv_append bad = a;
    bad.seq_stride = D - 1;
    expect_rejected(w, ids, B, &bad, IKV_E_INVALID, "seq_stride");
    bad = a;
    bad.struct_size = 8;
    expect_rejected(w, ids, B, &bad, IKV_E_INVALID, "struct_size");
    bad = a;
    bad.flags = 0x80;
    expect_rejected(w, ids, B, &bad, IKV_E_INVALID, "flags");
    if (w->backend == IKV_BACKEND_CPU) {
        bad = a;
        bad.src_on_device = 1;
        expect_rejected(w, ids, B, &bad, IKV_E_INVALID, "src_on_device");
        /* A CPU pool appends IKV_APPEND_ASYNC batches synchronously and checked. */
        input nan_in = make_input(w, 0, B, 1, 1);
        nan_in.k[elem(&nan_in.a, 0, 2, 0, 1) + 7] = NAN;
        bad = batch_args(w, &nan_in, 0);
        bad.flags = IKV_APPEND_ASYNC;
        snprintf(needle, sizeof needle, "k[sequence %u, layer 0, token 0, head 1, channel 7] is NaN", (unsigned)ids[2]);
        expect_rejected(w, ids, B, &bad, IKV_E_INVALID, needle);
        free_input(&nan_in);
        IKVT_OK(ikv_pool_sync(w->pool[0]));
    } else {
        bad = a; /* host input */
        bad.flags = IKV_APPEND_ASYNC;
        expect_rejected(w, ids, B, &bad, IKV_E_INVALID, "IKV_APPEND_ASYNC needs device input");
    }
    IKVT_EXPECT_STATUS(ikv_pool_sync(NULL), IKV_E_NULL, "pool");
    free_input(&in);
}

/* Asynchronous batches with a NaN (V, last sequence, layer 1, token 1, head
 * 1, channel 5): accepted; ikv_pool_sync names the element once; the pool
 * holds what a checked append of the input with that element 0 stores. */
static void async_nonfinite(world *w) {
    ikv_seq_id ids[B];
    for (int i = 0; i < B; ++i) ids[i] = w->id[0][kOrder[i]];
    input in = make_input(w, IKV_ALL_LAYERS, B, 2, 1);
    const size_t at = elem(&in.a, 1, B - 1, 1, 1) + 5;
    in.v[at] = 0.0f;
    for (int i = 0; i < B; ++i) {
        ikv_append one = in.a;
        one.k = in.k + (size_t)i * in.a.seq_stride;
        one.v = in.v + (size_t)i * in.a.seq_stride;
        IKVT_OK(ikv_pool_append(w->pool[1], w->id[1][kOrder[i]], &one));
        for (uint32_t l = 0; l < L; ++l) w->len[kOrder[i]][l] += 2;
    }
    in.v[at] = NAN;
    upload(w, &in);
    const ikv_append a = batch_args(w, &in, 1);
    assert_true(a.flags & IKV_APPEND_ASYNC);
    IKVT_OK(ikv_pool_append_batch(w->pool[0], ids, B, &a));
    char needle[112];
    snprintf(needle, sizeof needle, "v[sequence %u, layer 1, token 1, head 1, channel 5] = NaN", (unsigned)ids[B - 1]);
    IKVT_EXPECT_STATUS(ikv_pool_sync(w->pool[0]), IKV_E_INVALID, needle);
    IKVT_OK(ikv_pool_sync(w->pool[0])); /* reported once */
    IKVT_OK(ikv_pool_sync(w->pool[1]));
    free_input(&in);
    expect_pools_equal(w);
}

/* Capacity for only B-1 of the B pages a one-token batch opens: refused as a
 * whole; B-1 sequences then fit. */
static void capacity(ikv_backend be) {
    ikv_pool *probe = make_pool(be, IKV_FMT_INT8, 1u << 20);
    const uint64_t page = ikv_pool_page_bytes(probe, IKV_FMT_INT8);
    ikv_pool_destroy(probe);
    ikv_pool *pool = make_pool(be, IKV_FMT_INT8, (2 * B - 1) * page);
    ikv_seq_id ids[B];
    static float k[B * P * L * ROW], v[B * P * L * ROW];
    ikvt_rng rng = {77};
    ikvt_fill_normal(&rng, k, sizeof k / sizeof k[0], 1.0f);
    ikvt_fill_normal(&rng, v, sizeof v / sizeof v[0], 1.0f);
    ikv_append a = ikv_append_default(pool, P);
    a.layer = IKV_ALL_LAYERS;
    a.layer_stride = (int64_t)B * P * ROW;
    a.k = k;
    a.v = v;
    for (int i = 0; i < B; ++i) IKVT_OK(ikv_seq_create(pool, &ids[i]));
    IKVT_OK(ikv_pool_append_batch(pool, ids, B, &a)); /* one whole page each */
    ikv_pool_stats before, after;
    memset(&before, 0, sizeof before);
    memset(&after, 0, sizeof after);
    before.struct_size = after.struct_size = sizeof before;
    IKVT_OK(ikv_pool_get_stats(pool, &before));
    assert_int_equal(before.pages_used, B);
    a = ikv_append_default(pool, 1);
    a.k = k;
    a.v = v;
    IKVT_EXPECT_STATUS(ikv_pool_append_batch(pool, ids, B, &a), IKV_E_NOMEM, "capacity_bytes");
    IKVT_OK(ikv_pool_get_stats(pool, &after));
    assert_memory_equal(&before, &after, sizeof before);
    for (int i = 0; i < B; ++i) {
        uint32_t len = 0;
        IKVT_OK(ikv_seq_length(pool, ids[i], &len));
        assert_int_equal(len, P);
    }
    IKVT_OK(ikv_pool_append_batch(pool, ids, B - 1, &a));
    IKVT_OK(ikv_pool_get_stats(pool, &after));
    assert_int_equal(after.pages_used, 2 * B - 1);
    ikv_pool_destroy(pool);
}

/* An append on a stream that is capturing a CUDA graph is refused and changes nothing. */
static void capture_refused(world *w) {
    ikv_seq_id ids[B];
    for (int i = 0; i < B; ++i) ids[i] = w->id[0][kOrder[i]];
    input in = make_input(w, 0, B, 1, 1);
    upload(w, &in);
    const ikv_append a = batch_args(w, &in, 1);
    image before = take_image(w, 0);
    assert_int_equal(ikvt_rt.begin_capture_(w->stream, IKVT_CAPTURE_RELAXED), 0);
    IKVT_EXPECT_STATUS(ikv_pool_append_batch(w->pool[0], ids, B, &a), IKV_E_INVALID, "capturing a CUDA graph");
    void *graph = NULL;
    assert_int_equal(ikvt_rt.end_capture_(w->stream, &graph), 0);
    if (graph) ikvt_rt.graph_destroy_(graph);
    image after = take_image(w, 0);
    expect_same_image(w, &before, &after);
    free_image(&before);
    free_image(&after);
    free_input(&in);
}

void ikvt_batch_append_scenario(ikv_backend backend, int async) {
    void *stream = NULL;
    if (async) assert_int_equal(ikvt_rt.stream_create_(&stream), 0);
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        world w;
        memset(&w, 0, sizeof w);
        w.backend = backend;
        w.async = async;
        w.stream = stream;
        w.rng.state = 0xba7c0000u + (uint64_t)f;
        for (int p = 0; p < 2; ++p) {
            w.pool[p] = make_pool(backend, (ikv_format)f, 16u << 20);
            for (int s = 0; s < B; ++s) IKVT_OK(ikv_seq_create(w.pool[p], &w.id[p][s]));
        }
        /* Sequence s starts with 5s + 3 tokens (tails 3, 0, 5, 2, 7 of 8), appended one sequence at a time. */
        for (int s = 0; s < B; ++s) {
            input in = make_input(&w, IKV_ALL_LAYERS, 1, 5 * s + 3, 1);
            const ikv_append a = batch_args(&w, &in, 0);
            for (int p = 0; p < 2; ++p) IKVT_OK(ikv_pool_append(w.pool[p], w.id[p][s], &a));
            free_input(&in);
            for (uint32_t l = 0; l < L; ++l) w.len[s][l] = 5 * s + 3;
        }
        for (int p = 0; p < 2; ++p) IKVT_OK(ikv_seq_fork(w.pool[p], w.id[p][2], &w.id[p][B]));
        memcpy(w.len[B], w.len[2], sizeof w.len[B]);
        expect_pools_equal(&w);

        for (uint32_t l = 0; l < L; ++l) step(&w, l, 1, 1, 1); /* the layer loop: the fork's tail is copied */
        expect_pools_equal(&w);
        step(&w, IKV_ALL_LAYERS, 3, 0, 0);
        expect_pools_equal(&w);
        step(&w, IKV_ALL_LAYERS, 11, 1, 1); /* whole pages inside the batch */
        expect_pools_equal(&w);
        step(&w, 1, 2, 0, 1);
        expect_pools_equal(&w);
        step(&w, IKV_ALL_LAYERS, 40, 1, 1); /* more than 64 page writes: the job ring and scratch stages on CUDA */
        expect_pools_equal(&w);

        /* A caller built with the first ikv_append: seq_stride is the default, n_tokens rows. */
        {
            enum { N = 2 };
            ikv_seq_id ids[B];
            for (int i = 0; i < B; ++i) ids[i] = w.id[0][kOrder[i]];
            ikv_append old = ikv_append_default(w.pool[0], N);
            old.struct_size = (uint32_t)offsetof(ikv_append, seq_stride);
            old.seq_stride = 1; /* beyond the old struct: not read */
            float *k = malloc(sizeof(float) * B * N * ROW), *v = malloc(sizeof(float) * B * N * ROW);
            ikvt_fill_normal(&w.rng, k, (size_t)B * N * ROW, 1.0f);
            ikvt_fill_normal(&w.rng, v, (size_t)B * N * ROW, 1.0f);
            old.k = k;
            old.v = v;
            IKVT_OK(ikv_pool_append_batch(w.pool[0], ids, B, &old));
            for (int i = 0; i < B; ++i) {
                ikv_append one = ikv_append_default(w.pool[1], N);
                one.k = k + (size_t)i * N * ROW;
                one.v = v + (size_t)i * N * ROW;
                IKVT_OK(ikv_pool_append(w.pool[1], w.id[1][kOrder[i]], &one));
                w.len[kOrder[i]][0] += N;
            }
            free(k);
            free(v);
            expect_pools_equal(&w);
        }

        if (async) {
            async_nonfinite(&w);
            capture_refused(&w);
        }
        rejections(&w);
        ikv_pool_destroy(w.pool[0]);
        ikv_pool_destroy(w.pool[1]);
    }
    if (stream) ikvt_rt.stream_destroy_(stream);
    capacity(backend);
}
