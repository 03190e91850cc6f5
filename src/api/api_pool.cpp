// extern "C" boundary of the KV page pool: argument checks that need no pool
// state, then the core in src/pool/. No exception crosses this file.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>

#include "common/config.hpp"
#include "common/error.hpp"
#include "common/guard.hpp"
#include "common/raw_enum.hpp"
#include "api/api_append.hpp"
#include "pool/pool.hpp"

namespace {

// Sizes of the first published ikv_pool_config and ikv_pool_stats (fields
// appended since are read as their defaults / not written).
constexpr uint32_t kPoolConfigFirstSize = uint32_t(offsetof(ikv_pool_config, host_capacity_bytes));
constexpr uint32_t kPoolStatsFirstSize = uint32_t(offsetof(ikv_pool_stats, host_used_bytes));
constexpr uint32_t kMaxLayers = 65536;  // keeps every page size computation far from overflow
constexpr uint32_t kMaxKvHeads = 65536;

bool valid_format(const ikv_format &f) { return ikv::raw_enum(f) >= 0 && ikv::raw_enum(f) < IKV_FMT_COUNT; }
bool valid_head_dim(uint32_t d) { return d == 32 || d == 64 || d == 80 || d == 96 || d == 128 || d == 256; }

ikv_status check_config(const ikv_pool_config &c) {
    constexpr const char *fn = "ikv_pool_create";
    if (ikv::raw_enum(c.backend) != IKV_BACKEND_CPU && ikv::raw_enum(c.backend) != IKV_BACKEND_CUDA)
        return ikv::fail(IKV_E_INVALID, "%s: config->backend is %d; use IKV_BACKEND_CPU or IKV_BACKEND_CUDA", fn,
                         ikv::raw_enum(c.backend));
    if (c.n_layers < 1 || c.n_layers > kMaxLayers)
        return ikv::fail(IKV_E_INVALID, "%s: config->n_layers is %u; it must be in [1, %u]", fn, c.n_layers,
                         kMaxLayers);
    if (c.n_kv_heads < 1 || c.n_kv_heads > kMaxKvHeads)
        return ikv::fail(IKV_E_INVALID, "%s: config->n_kv_heads is %u; it must be in [1, %u]", fn, c.n_kv_heads,
                         kMaxKvHeads);
    if (!valid_head_dim(c.head_dim))
        return ikv::fail(IKV_E_INVALID, "%s: config->head_dim is %u; supported: 32, 64, 80, 96, 128, 256", fn,
                         c.head_dim);
    if (c.page_size < 8 || c.page_size > 128 || (c.page_size & (c.page_size - 1)) != 0)
        return ikv::fail(IKV_E_INVALID, "%s: config->page_size is %u; it must be a power of two in [8, 128]", fn,
                         c.page_size);
    if (c.capacity_bytes == 0)
        return ikv::fail(IKV_E_INVALID, "%s: config->capacity_bytes is 0; it must be > 0", fn);
    if (!valid_format(c.default_format) && ikv::raw_enum(c.default_format) != IKV_FMT_AUTO)
        return ikv::fail(IKV_E_INVALID, "%s: config->default_format is %d; use an ikv_format below IKV_FMT_COUNT "
                         "or IKV_FMT_AUTO", fn, ikv::raw_enum(c.default_format));
    const int dt = ikv::raw_enum(c.kv_dtype);
    if (dt != IKV_DTYPE_F32 && dt != IKV_DTYPE_F16 && dt != IKV_DTYPE_BF16)
        return ikv::fail(IKV_E_INVALID, "%s: config->kv_dtype is %d; use IKV_DTYPE_F32, F16 or BF16", fn, dt);
    if (c.host_capacity_bytes != 0 && ikv::raw_enum(c.backend) == IKV_BACKEND_CPU)
        return ikv::fail(IKV_E_INVALID,
                         "%s: config->host_capacity_bytes is %llu but a CPU pool's pages are host memory already; "
                         "set it to 0",
                         fn, (unsigned long long)c.host_capacity_bytes);
    return IKV_OK;
}

#define CHECK_POOL(pool, fn) IKV_CHECK_NULL(pool, fn)

ikv_status check_layer(const ikv_pool *pool, uint32_t layer, const char *fn) {
    if (layer >= pool->shape.n_layers)
        return ikv::fail(IKV_E_RANGE, "%s: layer %u is out of range; the pool has %u layers", fn, layer,
                         pool->shape.n_layers);
    return IKV_OK;
}

// n_seqs: sequences of a batch append (1 for ikv_pool_append, whose
// seq_stride is ignored).
ikv_status check_append(const ikv_pool *pool, const ikv_append &a, uint32_t n_seqs, const char *fn) {
    const ikv::PageShape &s = pool->shape;
    const char *A = ikv::current_args();  // "args", or "args->append" in a decode that appends
    if (a.layer != IKV_ALL_LAYERS && a.layer >= s.n_layers)
        return ikv::fail(IKV_E_RANGE, "%s: %s->layer is %u; the pool has %u layers (or pass IKV_ALL_LAYERS)", fn,
                         A, a.layer, s.n_layers);
    if (a.n_tokens == 0) return ikv::fail(IKV_E_INVALID, "%s: %s->n_tokens is 0; it must be >= 1", fn, A);
    if (uint64_t(a.n_tokens) * n_seqs > UINT32_MAX)
        return ikv::fail(IKV_E_RANGE, "%s: n_seqs %u x %s->n_tokens %u is more than 2^32-1 tokens in one call", fn,
                         n_seqs, A, a.n_tokens);
    if (a.k == nullptr) return ikv::fail(IKV_E_NULL, "%s: %s->k is NULL", fn, A);
    if (a.v == nullptr) return ikv::fail(IKV_E_NULL, "%s: %s->v is NULL", fn, A);
    if (a.src_on_device && pool->config.backend == IKV_BACKEND_CPU)
        return ikv::fail(IKV_E_INVALID, "%s: %s->src_on_device is set but the pool is a CPU pool", fn, A);
    if (a.flags & ~IKV_APPEND_ASYNC)
        return ikv::fail(IKV_E_INVALID, "%s: %s->flags 0x%x has bits no IKV_APPEND_* flag defines", fn,
                         A, (unsigned)a.flags);
    if ((a.flags & IKV_APPEND_ASYNC) && pool->config.backend == IKV_BACKEND_CUDA && !a.src_on_device)
        return ikv::fail(IKV_E_INVALID,
                         "%s: IKV_APPEND_ASYNC needs device input (%s->src_on_device); host input is read "
                         "before the call returns, so append it without the flag",
                         fn, A);
    const bool all = a.layer == IKV_ALL_LAYERS;
    const struct {
        const char *name;
        int64_t value;
        bool used;
    } strides[] = {{"token_stride", a.token_stride, true},
                   {"head_stride", a.head_stride, true},
                   {"layer_stride", a.layer_stride, all},
                   {"seq_stride", a.seq_stride, n_seqs > 1}};
    for (const auto &st : strides)
        if (st.used && st.value < int64_t(s.head_dim))
            return ikv::fail(IKV_E_INVALID,
                             "%s: %s->%s is %lld; it must be >= head_dim %u (strides are in elements)", fn,
                             A, st.name, (long long)st.value, s.head_dim);
    // The last element read must be addressable.
    const long double last = (long double)(all ? s.n_layers - 1 : 0) * a.layer_stride +
                             (long double)(n_seqs - 1) * a.seq_stride +
                             (long double)(a.n_tokens - 1) * a.token_stride +
                             (long double)(s.n_kv_heads - 1) * a.head_stride + s.head_dim;
    if (last > (long double)(INT64_MAX / 4))
        return ikv::fail(IKV_E_INVALID, "%s: the strides address elements beyond 2^61", fn);
    return IKV_OK;
}

// The first version of ikv_append ended before seq_stride.
constexpr uint32_t kAppendMinSize = offsetof(ikv_append, seq_stride);

}  // namespace

namespace ikv {

// The append entry points (api_append.hpp): arguments read and checked, then the pool core.
ikv_status append_entry(ikv_pool *pool, const ikv_seq_id *seqs, uint32_t n_seqs, const ikv_append *args,
                        const char *fn, RoomAppendReady *defer) {
    IKV_CHECK_NULL(pool, fn);
    IKV_CHECK_NULL(args, fn);
    IKV_CHECK_STRUCT(args, kAppendMinSize, fn);
    const ikv_append a = ikv::read_config(*args, ikv_append_default(pool, args->n_tokens));
    ikv_status st = check_append(pool, a, n_seqs, fn);
    if (st != IKV_OK) return st;
    try {
        return ikv::seqs_append(pool, seqs, n_seqs, a, fn, defer);
    } catch (const std::bad_alloc &) {
        return ikv::fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
}

}  // namespace ikv

extern "C" {

IKV_API ikv_pool_config ikv_pool_default_config_v2(void) {
    ikv_pool_config c{};
    c.struct_size = sizeof c;
    c.backend = IKV_BACKEND_CPU;
    c.device = 0;
    c.n_layers = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.page_size = 16;
    c.capacity_bytes = 1ull << 30;
    c.default_format = IKV_FMT_F16;
    c.kv_dtype = IKV_DTYPE_F16;
    return c;
}

IKV_API ikv_status ikv_pool_create(const ikv_pool_config *config, ikv_pool **out) {
    constexpr const char *fn = "ikv_pool_create";
    IKV_CHECK_NULL(config, fn);
    IKV_CHECK_NULL(out, fn);
    // The first published struct ended at kv_dtype; later fields take their defaults.
    IKV_CHECK_STRUCT(config, kPoolConfigFirstSize, fn);
    const ikv_pool_config c = ikv::read_config(*config, ikv_pool_default_config());
    ikv_status st = check_config(c);
    if (st != IKV_OK) return st;
    return ikv::api_call(fn, [&] { return ikv::pool_create(c, out); });
}

IKV_API void ikv_pool_destroy(ikv_pool *pool) {
    if (pool != nullptr) ikv::pool_destroy(pool);
}

IKV_API ikv_status ikv_pool_get_config(const ikv_pool *pool, ikv_pool_config *out) {
    IKV_CHECK_NULL(pool, "ikv_pool_get_config");
    IKV_CHECK_NULL(out, "ikv_pool_get_config");
    IKV_CHECK_STRUCT(out, kPoolConfigFirstSize, "ikv_pool_get_config");
    ikv::write_versioned(out, pool->config);
    return IKV_OK;
}

IKV_API uint64_t ikv_pool_page_bytes(const ikv_pool *pool, ikv_format format) {
    if (pool == nullptr || !valid_format(format)) return 0;
    return pool->page_bytes[format];
}

IKV_API ikv_status ikv_pool_get_stats(const ikv_pool *pool, ikv_pool_stats *out) {
    IKV_CHECK_NULL(pool, "ikv_pool_get_stats");
    IKV_CHECK_NULL(out, "ikv_pool_get_stats");
    IKV_CHECK_STRUCT(out, kPoolStatsFirstSize, "ikv_pool_get_stats");
    ikv_pool_stats all;
    std::memset(&all, 0, sizeof all);
    all.struct_size = sizeof all;
    ikv::pool_stats(pool, &all);
    ikv::write_versioned(out, all);  // a caller built with an older header gets the fields it knows
    return IKV_OK;
}

IKV_API ikv_status ikv_seq_create(ikv_pool *pool, ikv_seq_id *id_out) {
    IKV_CHECK_NULL(pool, "ikv_seq_create");
    IKV_CHECK_NULL(id_out, "ikv_seq_create");
    return ikv::api_call("ikv_seq_create", [&] { return ikv::seq_create(pool, id_out); });
}

IKV_API ikv_status ikv_seq_destroy(ikv_pool *pool, ikv_seq_id seq) {
    IKV_CHECK_NULL(pool, "ikv_seq_destroy");
    return ikv::api_call("ikv_seq_destroy", [&] { return ikv::seq_destroy(pool, seq); });
}

IKV_API ikv_status ikv_seq_length(const ikv_pool *pool, ikv_seq_id seq, uint32_t *length_out) {
    IKV_CHECK_NULL(pool, "ikv_seq_length");
    IKV_CHECK_NULL(length_out, "ikv_seq_length");
    return ikv::seq_length(pool, seq, length_out);
}

IKV_API ikv_status ikv_seq_layer_length(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t *length_out) {
    IKV_CHECK_NULL(pool, "ikv_seq_layer_length");
    IKV_CHECK_NULL(length_out, "ikv_seq_layer_length");
    return ikv::seq_layer_length(pool, seq, layer, length_out);
}

IKV_API ikv_append ikv_append_default_v2(const ikv_pool *pool, uint32_t n_tokens) {
    ikv_append a{};
    a.struct_size = sizeof a;
    a.layer = 0;
    a.n_tokens = n_tokens;
    if (pool != nullptr) {
        const int64_t row = int64_t(pool->shape.n_kv_heads) * pool->shape.head_dim;
        a.token_stride = row;
        a.head_stride = pool->shape.head_dim;
        a.layer_stride = int64_t(n_tokens) * row;
        a.seq_stride = int64_t(n_tokens) * row;
    }
    return a;
}

IKV_API ikv_status ikv_pool_append(ikv_pool *pool, ikv_seq_id seq, const ikv_append *args) {
    return ikv::api_call("ikv_pool_append", [&] { return ikv::append_entry(pool, &seq, 1, args, "ikv_pool_append"); });
}

IKV_API ikv_status ikv_pool_append_batch(ikv_pool *pool, const ikv_seq_id *seqs, uint32_t n_seqs,
                                         const ikv_append *args) {
    constexpr const char *fn = "ikv_pool_append_batch";
    IKV_CHECK_NULL(pool, fn);
    IKV_CHECK_NULL(seqs, fn);
    if (n_seqs == 0) return ikv::fail(IKV_E_INVALID, "%s: n_seqs is 0; it must be >= 1", fn);
    return ikv::api_call(fn, [&] { return ikv::append_entry(pool, seqs, n_seqs, args, fn); });
}

IKV_API ikv_status ikv_pool_sync(ikv_pool *pool) {
    IKV_CHECK_NULL(pool, "ikv_pool_sync");
    return ikv::api_call("ikv_pool_sync", [&] { return ikv::pool_sync(pool); });
}

IKV_API ikv_status ikv_pool_reserve(ikv_pool *pool, const ikv_seq_id *seqs, uint32_t n_seqs, uint32_t n_tokens) {
    constexpr const char *fn = "ikv_pool_reserve";
    IKV_CHECK_NULL(pool, fn);
    IKV_CHECK_NULL(seqs, fn);
    if (n_seqs == 0) return ikv::fail(IKV_E_INVALID, "%s: n_seqs is 0; it must be >= 1", fn);
    return ikv::api_call(fn, [&] { return ikv::seqs_reserve(pool, seqs, n_seqs, n_tokens); });
}

IKV_API ikv_status ikv_seq_fork(ikv_pool *pool, ikv_seq_id parent, ikv_seq_id *child_out) {
    IKV_CHECK_NULL(pool, "ikv_seq_fork");
    IKV_CHECK_NULL(child_out, "ikv_seq_fork");
    return ikv::api_call("ikv_seq_fork", [&] { return ikv::seq_fork(pool, parent, child_out); });
}

IKV_API ikv_status ikv_seq_truncate(ikv_pool *pool, ikv_seq_id seq, uint32_t n_tokens) {
    IKV_CHECK_NULL(pool, "ikv_seq_truncate");
    return ikv::api_call("ikv_seq_truncate", [&] { return ikv::seq_truncate(pool, seq, n_tokens); });
}

IKV_API ikv_status ikv_seq_evict(ikv_pool *pool, ikv_seq_id seq, uint32_t begin, uint32_t end) {
    IKV_CHECK_NULL(pool, "ikv_seq_evict");
    return ikv::api_call("ikv_seq_evict", [&] { return ikv::seq_evict(pool, seq, begin, end); });
}

IKV_API ikv_status ikv_seq_is_evicted(const ikv_pool *pool, ikv_seq_id seq, uint32_t token, int *evicted_out) {
    IKV_CHECK_NULL(pool, "ikv_seq_is_evicted");
    IKV_CHECK_NULL(evicted_out, "ikv_seq_is_evicted");
    return ikv::seq_is_evicted(pool, seq, token, evicted_out);
}

IKV_API ikv_status ikv_seq_offload(ikv_pool *pool, ikv_seq_id seq, uint32_t begin, uint32_t end, void *stream,
                                   uint32_t *moved_out) {
    IKV_CHECK_NULL(pool, "ikv_seq_offload");
    return ikv::api_call("ikv_seq_offload", [&] {
        return ikv::seq_move_tier(pool, seq, begin, end, true, stream, moved_out, "ikv_seq_offload");
    });
}

IKV_API ikv_status ikv_seq_fetch(ikv_pool *pool, ikv_seq_id seq, uint32_t begin, uint32_t end, void *stream,
                                 uint32_t *moved_out) {
    IKV_CHECK_NULL(pool, "ikv_seq_fetch");
    return ikv::api_call("ikv_seq_fetch", [&] {
        return ikv::seq_move_tier(pool, seq, begin, end, false, stream, moved_out, "ikv_seq_fetch");
    });
}

IKV_API ikv_status ikv_pool_set_tier_policy(ikv_pool *pool, const ikv_tier_policy *policy) {
    constexpr const char *fn = "ikv_pool_set_tier_policy";
    IKV_CHECK_NULL(pool, fn);
    ikv::TierPolicy p;  // off, with the defaults
    if (policy != nullptr) {
        IKV_CHECK_STRUCT(policy, sizeof(ikv_tier_policy), fn);
        p.on = true;
        if (policy->idle_steps != 0) p.idle_steps = policy->idle_steps;
        if (policy->device_high != 0.0f) p.device_high = policy->device_high;
        p.device_low = policy->device_low != 0.0f ? policy->device_low : std::min(p.device_low, p.device_high);
        if (!(p.device_high > 0.0 && p.device_high <= 1.0))
            return ikv::fail(IKV_E_INVALID, "%s: policy->device_high is %.9g; it must be in (0, 1] (0 = 0.9)", fn,
                             (double)policy->device_high);
        if (!(p.device_low > 0.0 && p.device_low <= p.device_high))
            return ikv::fail(IKV_E_INVALID, "%s: policy->device_low is %.9g; it must be in (0, device_high = %.9g]", fn,
                             p.device_low, p.device_high);
        if ((policy->flags & ~IKV_TIER_NO_PREFETCH) != 0)
            return ikv::fail(IKV_E_INVALID, "%s: policy->flags 0x%x has bits that are not IKV_TIER_* flags", fn,
                             policy->flags);
        p.prefetch = (policy->flags & IKV_TIER_NO_PREFETCH) == 0;
    }
    return ikv::api_call(fn, [&] { return ikv::pool_set_tier_policy(pool, p); });
}

IKV_API ikv_status ikv_pool_tier_step(ikv_pool *pool, const ikv_seq_id *seqs, const ikv_plan *const *plans,
                                      uint32_t n_seqs, void *stream, ikv_tier_step_report *report) {
    constexpr const char *fn = "ikv_pool_tier_step";
    IKV_CHECK_NULL(pool, fn);
    if (n_seqs > 0) IKV_CHECK_NULL(seqs, fn);
    if (report != nullptr) IKV_CHECK_STRUCT(report, sizeof(uint32_t) * 4 + sizeof(uint64_t), fn);
    return ikv::api_call(fn, [&] { return ikv::pool_tier_step(pool, seqs, plans, n_seqs, stream, report); });
}

IKV_API ikv_status ikv_seq_page_tier(const ikv_pool *pool, ikv_seq_id seq, uint32_t page, int *on_host_out) {
    IKV_CHECK_NULL(pool, "ikv_seq_page_tier");
    IKV_CHECK_NULL(on_host_out, "ikv_seq_page_tier");
    return ikv::seq_page_tier(pool, seq, page, on_host_out);
}

IKV_API ikv_status ikv_seq_page_format(const ikv_pool *pool, ikv_seq_id seq, uint32_t page, ikv_format *out) {
    IKV_CHECK_NULL(pool, "ikv_seq_page_format");
    IKV_CHECK_NULL(out, "ikv_seq_page_format");
    return ikv::seq_page_format(pool, seq, page, out);
}

IKV_API ikv_status ikv_seq_set_page_format(ikv_pool *pool, ikv_seq_id seq, uint32_t page, ikv_format format) {
    constexpr const char *fn = "ikv_seq_set_page_format";
    IKV_CHECK_NULL(pool, fn);
    if (!valid_format(format))
        return ikv::fail(IKV_E_INVALID, "%s: format is %d; use an ikv_format below IKV_FMT_COUNT", fn,
                         ikv::raw_enum(format));
    return ikv::api_call(fn, [&] { return ikv::seq_set_page_format(pool, seq, page, format); });
}

IKV_API ikv_status ikv_seq_apply_plan_formats(ikv_pool *pool, ikv_seq_id seq, const ikv_plan *plan) {
    IKV_CHECK_NULL(pool, "ikv_seq_apply_plan_formats");
    IKV_CHECK_NULL(plan, "ikv_seq_apply_plan_formats");
    return ikv::api_call("ikv_seq_apply_plan_formats", [&] { return ikv::seq_apply_plan_formats(pool, seq, plan); });
}

IKV_API ikv_status ikv_seq_read(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t begin, uint32_t end,
                                float *k_out, float *v_out) {
    constexpr const char *fn = "ikv_seq_read";
    IKV_CHECK_NULL(pool, fn);
    IKV_CHECK_NULL(k_out, fn);
    IKV_CHECK_NULL(v_out, fn);
    ikv_status st = check_layer(pool, layer, fn);
    if (st != IKV_OK) return st;
    return ikv::api_call(fn, [&] { return ikv::seq_read(pool, seq, layer, begin, end, k_out, v_out); });
}

IKV_API ikv_status ikv_seq_page_summary(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t kv_head,
                                        uint32_t page, float *k_min, float *k_max, float *k_mean,
                                        uint32_t *n_tokens_out) {
    constexpr const char *fn = "ikv_seq_page_summary";
    IKV_CHECK_NULL(pool, fn);
    ikv_status st = check_layer(pool, layer, fn);
    if (st != IKV_OK) return st;
    if (kv_head >= pool->shape.n_kv_heads)
        return ikv::fail(IKV_E_RANGE, "%s: kv_head %u is out of range; the pool has %u kv-heads", fn, kv_head,
                         pool->shape.n_kv_heads);
    try {
        return ikv::seq_page_summary(pool, seq, layer, kv_head, page, k_min, k_max, k_mean, n_tokens_out);
    } catch (const std::bad_alloc &) {
        return ikv::fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
}

// The first header's ikv_pool_config (through kv_dtype) and its default, for
// programs built against it: they call the unversioned symbol with a return
// slot of that size, so it must write exactly those bytes.
struct ikv_pool_config_v1 {
    uint32_t struct_size;
    ikv_backend backend;
    int device;
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t page_size;
    uint64_t capacity_bytes;
    ikv_format default_format;
    ikv_dtype kv_dtype;
};
static_assert(sizeof(ikv_pool_config_v1) == kPoolConfigFirstSize, "the first ikv_pool_config layout");
static_assert(offsetof(ikv_pool_config_v1, kv_dtype) == offsetof(ikv_pool_config, kv_dtype), "a prefix of today's");

#undef ikv_pool_default_config
IKV_API ikv_pool_config_v1 ikv_pool_default_config(void) {
    return ikv::first_layout<ikv_pool_config_v1>(ikv_pool_default_config_v2());
}

// The first header's ikv_append (through `formats`) and its unversioned
// default, which programs built against it call with a return slot of that
// size (today's struct is 16 bytes longer: seq_stride, flags).
struct ikv_append_v1 {
    uint32_t struct_size;
    uint32_t layer;
    uint32_t n_tokens;
    const void *k;
    const void *v;
    int64_t token_stride;
    int64_t head_stride;
    int64_t layer_stride;
    int src_on_device;
    void *stream;
    const ikv_plan *formats;
};
static_assert(offsetof(ikv_append_v1, formats) == offsetof(ikv_append, formats), "a prefix of today's");
static_assert(sizeof(ikv_append_v1) == offsetof(ikv_append, seq_stride), "the first ikv_append layout");

#undef ikv_append_default
IKV_API ikv_append_v1 ikv_append_default(const ikv_pool *pool, uint32_t n_tokens) {
    return ikv::first_layout<ikv_append_v1>(ikv_append_default_v2(pool, n_tokens));
}

}  // extern "C"
