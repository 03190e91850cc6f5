// extern "C" boundary of the decoder: every argument of ikv_decode is checked
// here, against the pool's shape, before either backend runs, so a rejected
// call writes nothing.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/config.hpp"
#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "common/raw_enum.hpp"
#include "api/api_append.hpp"
#include "cuda/cuda_backend.hpp"
#include "decode/decoder.hpp"
#include "feedback/page_feedback.hpp"
#include "pool/room_append.hpp"
#include "query_memory/query_memory.hpp"

namespace {

constexpr uint32_t kMaxThreads = 1024;
// ikv_decode_args as first published (through `stream`): callers built
// against that header pass this struct_size and get the later fields' defaults.
constexpr size_t kDecodeArgsV1Size = offsetof(ikv_decode_args, stream) + sizeof(void *);

bool valid_dtype(int dt) { return dt == IKV_DTYPE_F32 || dt == IKV_DTYPE_F16 || dt == IKV_DTYPE_BF16; }

// extra: tokens args->append adds to each sequence before the decode reads it.
ikv_status check_args(const ikv_pool *pool, const ikv_decode_args &a, ikv::ListMemory &lists, uint32_t extra = 0) {
    const char *fn = "ikv_decode";
    const ikv::PageShape &shape = ikv::pool_shape(pool);
    IKV_CHECK_NULL_AS(a.seqs, "args->seqs", fn);
    IKV_CHECK_NULL_AS(a.q, "args->q", fn);
    IKV_CHECK_NULL_AS(a.out, "args->out", fn);
    if (a.n_seqs == 0) return ikv::fail(IKV_E_INVALID, "%s: args->n_seqs is 0, expected at least 1", fn);
    if (a.layer >= shape.n_layers)
        return ikv::fail(IKV_E_RANGE, "%s: args->layer %u is out of range, the pool has %u layers", fn, a.layer,
                         shape.n_layers);
    if (a.n_q_heads == 0 || a.n_q_heads % shape.n_kv_heads != 0)
        return ikv::fail(IKV_E_INVALID, "%s: args->n_q_heads %u is not a positive multiple of the pool's n_kv_heads %u",
                         fn, a.n_q_heads, shape.n_kv_heads);
    if (a.n_query_tokens == 0 || a.n_query_tokens > IKV_MAX_QUERY_TOKENS)
        return ikv::fail(IKV_E_INVALID, "%s: args->n_query_tokens %u is outside [1, %u]", fn, a.n_query_tokens,
                         (unsigned)IKV_MAX_QUERY_TOKENS);
    if (!valid_dtype(ikv::raw_enum(a.q_dtype)))
        return ikv::fail(IKV_E_INVALID, "%s: args->q_dtype %d is not F32, F16 or BF16", fn, ikv::raw_enum(a.q_dtype));
    if (!valid_dtype(ikv::raw_enum(a.out_dtype)))
        return ikv::fail(IKV_E_INVALID, "%s: args->out_dtype %d is not F32, F16 or BF16", fn, ikv::raw_enum(a.out_dtype));
    if (!std::isfinite(a.scale) || a.scale < 0.0f)
        return ikv::fail(IKV_E_INVALID, "%s: args->scale %.9g must be finite and >= 0 (0 = 1/sqrt(head_dim))", fn,
                         (double)a.scale);
    if (!std::isfinite(a.softcap) || a.softcap < 0.0f)
        return ikv::fail(IKV_E_INVALID, "%s: args->softcap %.9g must be finite and >= 0 (0 = off)", fn,
                         (double)a.softcap);
    const int mode = ikv::raw_enum(a.topk_mode);
    if (mode != IKV_TOPK_FIXED && mode != IKV_TOPK_MASS)
        return ikv::fail(IKV_E_INVALID, "%s: args->topk_mode %d is not IKV_TOPK_FIXED or IKV_TOPK_MASS", fn, mode);
    const int score = ikv::raw_enum(a.topk_score);
    if (score != IKV_TOPK_SCORE_QUEST && score != IKV_TOPK_SCORE_HYBRID && score != IKV_TOPK_SCORE_KEYS)
        return ikv::fail(IKV_E_INVALID,
                         "%s: args->topk_score %d is not IKV_TOPK_SCORE_QUEST, IKV_TOPK_SCORE_HYBRID or "
                         "IKV_TOPK_SCORE_KEYS",
                         fn, score);
    if (a.query_memory != nullptr) {
        if (a.query_memory->pool != pool)
            return ikv::fail(IKV_E_INVALID, "%s: args->query_memory was created for another pool", fn);
        if (a.query_memory->n_q_heads != a.n_q_heads)
            return ikv::fail(IKV_E_INVALID, "%s: args->query_memory remembers %u query heads, the call has %u", fn,
                             a.query_memory->n_q_heads, a.n_q_heads);
    }
    if (a.feedback != nullptr && a.feedback->pool != pool)
        return ikv::fail(IKV_E_INVALID, "%s: args->feedback was created for another pool", fn);
    if (!(a.topk_feedback_weight >= 0.0f && a.topk_feedback_weight <= 1.0f))
        return ikv::fail(IKV_E_INVALID, "%s: args->topk_feedback_weight %.9g is outside [0, 1]", fn,
                         (double)a.topk_feedback_weight);
    if (mode == IKV_TOPK_MASS) {
        if (!(a.topk_mass > 0.0f && a.topk_mass <= 1.0f))
            return ikv::fail(IKV_E_INVALID, "%s: args->topk_mass %.9g is outside (0, 1] (IKV_TOPK_MASS)", fn,
                             (double)a.topk_mass);
        if (a.topk_token_budget > 0 && a.topk_min_tokens > a.topk_token_budget)
            return ikv::fail(IKV_E_INVALID,
                             "%s: args->topk_min_tokens %u exceeds args->topk_token_budget %u (IKV_TOPK_MASS)", fn,
                             a.topk_min_tokens, a.topk_token_budget);
    }
    if (a.plans != nullptr)
        for (uint32_t b = 0; b < a.n_seqs; ++b) {
            if (a.plans[b] == nullptr) continue;
            ikv_plan_summary sum;
            if (ikv_plan_get_summary(a.plans[b], &sum) != IKV_OK)
                return ikv::fail(IKV_E_INVALID, "%s: args->plans[%u] cannot be read", fn, b);
            if (sum.page_size != shape.page_size)
                return ikv::fail(IKV_E_INVALID, "%s: args->plans[%u] has page_size %u, the pool's page_size is %u", fn,
                                 b, sum.page_size, shape.page_size);
        }
    // The sequences' states (lengths, block table generations): enough to
    // check the call and to tell whether the decoder's page lists still hold.
    ikv_status st = lists.observe(pool, a);
    if (st != IKV_OK) return st;
    for (uint32_t b = 0; b < a.n_seqs; ++b)
        if (a.n_query_tokens > uint64_t(lists.state(b).length) + extra)
            return ikv::fail(IKV_E_INVALID,
                             "%s: args->n_query_tokens %u exceeds the %llu tokens layer %u of sequence %u holds%s", fn,
                             a.n_query_tokens, (unsigned long long)(uint64_t(lists.state(b).length) + extra), a.layer,
                             a.seqs[b], extra ? " with args->append's" : "");
    return IKV_OK;
}

// args->append: what ikv_pool_append_batch would check, plus that it appends
// to the decode's layer on the decode's stream.
ikv_status check_append_arg(const ikv_decode_args &a) {
    const char *fn = "ikv_decode";
    const ikv_append &ap = *a.append;
    if (ap.struct_size < offsetof(ikv_append, seq_stride))
        return ikv::fail(IKV_E_INVALID, "%s: args->append->struct_size %u is smaller than any ikv_append", fn,
                         ap.struct_size);
    if (ap.layer != a.layer)
        return ikv::fail(IKV_E_INVALID, "%s: args->append->layer is %u, args->layer %u; a decode appends to its own layer",
                         fn, ap.layer, a.layer);
    if (ap.stream != a.stream)
        return ikv::fail(IKV_E_INVALID, "%s: args->append->stream differs from args->stream; a decode appends on its "
                         "own stream", fn);
    return IKV_OK;
}

}  // namespace

extern "C" {

IKV_API ikv_decoder_config ikv_decoder_default_config(void) {
    ikv_decoder_config c{};
    c.struct_size = sizeof c;
    c.n_threads = 0;
    return c;
}

IKV_API ikv_status ikv_decoder_create(const ikv_decoder_config *config, ikv_decoder **out) {
    const char *fn = "ikv_decoder_create";
    IKV_CHECK_NULL(config, fn);
    IKV_CHECK_NULL(out, fn);
    IKV_CHECK_STRUCT(config, sizeof(uint32_t) * 2, fn);
    const ikv_decoder_config c = ikv::read_config(*config, ikv_decoder_default_config());
    if (c.n_threads > kMaxThreads)
        return ikv::fail(IKV_E_INVALID, "%s: config->n_threads %u exceeds %u", fn, c.n_threads, kMaxThreads);
    unsigned n = c.n_threads;
    if (n == 0) n = std::thread::hardware_concurrency();
    if (n == 0) n = 1;
    void *mem = ikv::host_malloc(sizeof(ikv_decoder));
    if (mem == nullptr) return ikv::fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    try {
        *out = new (mem) ikv_decoder(n);
    } catch (const std::exception &e) {  // bad_alloc or a thread that could not start
        ikv::host_free(mem);
        return ikv::fail(IKV_E_NOMEM, "%s: cannot start %u worker threads (%s)", fn, n - 1, e.what());
    }
    return IKV_OK;
}

IKV_API void ikv_decoder_destroy(ikv_decoder *decoder) {
    if (decoder == nullptr) return;
    decoder->~ikv_decoder();
    ikv::host_free(decoder);
}

IKV_API ikv_decode_args ikv_decode_args_default_v3(void) {
    ikv_decode_args a{};
    a.struct_size = sizeof a;
    a.n_seqs = 1;
    a.n_query_tokens = 1;
    a.q_dtype = IKV_DTYPE_F32;
    a.out_dtype = IKV_DTYPE_F32;
    a.topk_mode = IKV_TOPK_FIXED;
    a.topk_mass = 0.9f;
    a.topk_min_tokens = 0;
    a.topk_score = IKV_TOPK_SCORE_QUEST;
    return a;
}

IKV_API ikv_status ikv_decode(ikv_decoder *decoder, ikv_pool *pool, const ikv_decode_args *args) {
    const char *fn = "ikv_decode";
    const ikv::CallName call(fn);  // for sentences written below (page stores: a decode that appends)
    IKV_CHECK_NULL(decoder, fn);
    decoder->last.valid = false;  // every failed call, the earliest refusals too (ikv_decoder_last_selection)
    IKV_CHECK_NULL(pool, fn);
    IKV_CHECK_NULL(args, fn);
    IKV_CHECK_STRUCT(args, kDecodeArgsV1Size, fn);
    const ikv_decode_args a = ikv::read_config(*args, ikv_decode_args_default_v3());
    ikv::ListMemory &mem = decoder->lists;
    try {
        ikv::RoomAppendReady ready;  // args->append to sequences with room, not yet enqueued
        ikv_status st = IKV_OK;
        if (a.append != nullptr) {  // checked as a whole first: a rejected call appends nothing
            st = check_append_arg(a);
            if (st == IKV_OK) st = check_args(pool, a, mem, a.append->n_tokens);
            if (st == IKV_OK && ikv::pool_backend(pool) == IKV_BACKEND_CUDA)
                st = ikv::cuda_decode_check(&decoder->cuda, pool, &a);  // the CUDA limits, before anything is appended
            if (st == IKV_OK) {
                const ikv::CallName names("ikv_decode (args->append)", "args->append");  // the sentences' names
                st = ikv::append_entry(pool, a.seqs, a.n_seqs, a.append, ikv::current_call(), &ready);
            }
            if (st == IKV_OK && ready.pending && ikv::pool_backend(pool) != IKV_BACKEND_CUDA)
                st = ikv::room_append_run(pool, ready);  // only a CUDA decode does it in its own kernels
            if (st != IKV_OK) return st;
        }
        st = check_args(pool, a, mem);  // after an append, at the lengths it left
        if (st != IKV_OK) return st;
        ikv::StepLists lists;
        lists.append = ready.pending ? &ready : nullptr;
        lists.reuse = mem.reusable();
        mem.forget();  // until this call succeeds: a failed one may have rewritten the lists
        lists.snaps = &mem.snaps;
        lists.pool = pool;
        lists.args = &a;
        uint64_t bytes = 0;
        if (ikv::pool_backend(pool) == IKV_BACKEND_CUDA)
            st = ikv::cuda_decode(&decoder->cuda, pool, &a, lists, &bytes);
        else
            st = ikv::cpu_decode(decoder->threads, decoder->scratch, pool, a, lists, &bytes);
        if (st != IKV_OK) return st;
        if (ready.pending)  // every backend path enqueues a ready append or fails
            return ikv::fail(IKV_E_INTERNAL, "%s: args->append was neither enqueued nor done by the decode", fn);
        mem.finish(lists.reuse, lists.keep);
        decoder->appends_fused += lists.append_fused ? 1 : 0;
        decoder->last_bytes = bytes;
        decoder->last = {true, ikv::pool_backend(pool) == IKV_BACKEND_CUDA, lists.captured,
                         a.n_seqs, ikv::pool_shape(pool).n_kv_heads};
        return IKV_OK;
    } catch (const std::bad_alloc &) {
        return ikv::fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    } catch (const std::exception &e) {
        return ikv::fail(IKV_E_INTERNAL, "%s: %s", fn, e.what());
    }
}

IKV_API ikv_status ikv_decoder_last_bytes_read(const ikv_decoder *decoder, uint64_t *bytes_out) {
    IKV_CHECK_NULL(decoder, "ikv_decoder_last_bytes_read");
    IKV_CHECK_NULL(bytes_out, "ikv_decoder_last_bytes_read");
    *bytes_out = decoder->last_bytes;
    return IKV_OK;
}

IKV_API ikv_status ikv_decoder_last_selection(const ikv_decoder *decoder, uint32_t seq_index, uint32_t kv_head,
                                              ikv_token_range *ranges, size_t capacity, size_t *n_out) {
    const char *fn = "ikv_decoder_last_selection";
    IKV_CHECK_NULL(decoder, fn);
    IKV_CHECK_NULL(n_out, fn);
    if (capacity > 0) IKV_CHECK_NULL(ranges, fn);
    const ikv_decoder::LastCall &last = decoder->last;
    if (!last.valid)
        return ikv::fail(IKV_E_STATE, "%s: the decoder has no successful ikv_decode since it was created or since "
                                      "its last failed call", fn);
    if (last.captured)
        return ikv::fail(IKV_E_STATE, "%s: the decoder's last call was captured into a CUDA graph; its selection "
                                      "exists only when the graph replays", fn);
    if (seq_index >= last.n_seqs)
        return ikv::fail(IKV_E_RANGE, "%s: seq_index %u is out of range, the last call decoded %u sequences", fn,
                         seq_index, last.n_seqs);
    if (kv_head >= last.n_kv_heads)
        return ikv::fail(IKV_E_RANGE, "%s: kv_head %u is out of range, the pool has %u kv-heads", fn, kv_head,
                         last.n_kv_heads);
    try {
        std::vector<ikv_token_range> runs;
        if (last.cuda) {
            const ikv_status st = ikv::cuda_last_selection(decoder->cuda, seq_index, kv_head, runs);
            if (st != IKV_OK) return st;
        } else {
            ikv::cpu_last_selection(decoder->scratch, seq_index * last.n_kv_heads + kv_head, runs);
        }
        std::copy_n(runs.begin(), std::min(capacity, runs.size()), ranges);
        *n_out = runs.size();
        return IKV_OK;
    } catch (const std::bad_alloc &) {
        return ikv::fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
}

IKV_API ikv_status ikv_decoder_get_stats(const ikv_decoder *decoder, ikv_decoder_stats *out) {
    const char *fn = "ikv_decoder_get_stats";
    IKV_CHECK_NULL(decoder, fn);
    IKV_CHECK_NULL(out, fn);
    IKV_CHECK_STRUCT(out, 2 * sizeof(uint32_t) + sizeof(uint64_t), fn);  // up to `steps`, the first field
    ikv_decoder_stats v{};
    v.struct_size = sizeof v;
    v.steps = decoder->lists.steps;
    v.lists_built = decoder->lists.built;
    v.lists_reused = decoder->lists.reused;
    v.last_bytes_read = decoder->last_bytes;
    v.appends_fused = decoder->appends_fused;
    ikv::write_versioned(out, v);
    return IKV_OK;
}

// The first header's ikv_decode_args (through `stream`) and its default, for
// programs built against it: they call the unversioned symbol with a return
// slot of that size, so it must write exactly those bytes.
struct ikv_decode_args_v1 {
    uint32_t struct_size;
    uint32_t layer;
    uint32_t n_seqs;
    const ikv_seq_id *seqs;
    const ikv_plan *const *plans;
    uint32_t n_query_tokens;
    uint32_t n_q_heads;
    const void *q;
    ikv_dtype q_dtype;
    void *out;
    ikv_dtype out_dtype;
    float *lse;
    float scale;
    float softcap;
    uint32_t topk_token_budget;
    void *stream;
};
static_assert(sizeof(ikv_decode_args_v1) == kDecodeArgsV1Size, "the first ikv_decode_args layout");
static_assert(offsetof(ikv_decode_args_v1, stream) == offsetof(ikv_decode_args, stream), "a prefix of today's");

#undef ikv_decode_args_default
IKV_API ikv_decode_args_v1 ikv_decode_args_default(void) {
    return ikv::first_layout<ikv_decode_args_v1>(ikv_decode_args_default_v3());
}

// The second header's ikv_decode_args (through topk_feedback_weight; today's
// up to `append`) and its default, for programs and bindings built against
// it: the same bytes as today's default, struct_size that version's.
struct alignas(ikv_decode_args) ikv_decode_args_v2 {
    unsigned char bytes[offsetof(ikv_decode_args, append)];
};
// The second header's struct ended with topk_feedback_weight, padded to its
// alignment: exactly where `append` starts today.
static_assert(sizeof(ikv_decode_args_v2) == offsetof(ikv_decode_args, append), "the second ikv_decode_args layout");

IKV_API ikv_decode_args_v2 ikv_decode_args_default_v2(void) {
    ikv_decode_args a = ikv_decode_args_default_v3();
    a.struct_size = uint32_t(sizeof(ikv_decode_args_v2));
    ikv_decode_args_v2 old;
    std::memcpy(old.bytes, &a, sizeof old);
    return old;
}

}  // extern "C"
