// extern "C" boundary of query memories: argument checks and error
// sentences; the memory itself lives in src/query_memory/.
#include <cmath>
#include <cstddef>
#include <vector>

#include "common/config.hpp"
#include "common/error.hpp"
#include "common/guard.hpp"
#include "common/host_memory.hpp"
#include "common/quant.hpp"
#include "common/raw_enum.hpp"
#include "query_memory/query_memory.hpp"
#include "pool/pool_view.hpp"

namespace {

// The first published ikv_query_memory_config ended at decay.
constexpr uint32_t kFirstConfigSize = uint32_t(offsetof(ikv_query_memory_config, turns));
constexpr uint32_t kMaxTurns = 64;

// The queries as fp32 after checking dtype and finiteness (nothing is kept on error).
ikv_status queries_f32(const void *q, int d, uint64_t n, uint64_t row, const char *fn, std::vector<float> &out) {
    if (d != IKV_DTYPE_F32 && d != IKV_DTYPE_F16 && d != IKV_DTYPE_BF16)
        return ikv::fail(IKV_E_INVALID, "%s: q_dtype %d is not F32, F16 or BF16", fn, d);
    out.resize(n);
    for (uint64_t i = 0; i < n; ++i) {
        const float x = ikv::load_dtype_elem(q, d, i);
        if (!std::isfinite(x))
            return ikv::fail(IKV_E_INVALID, "%s: q holds a non-finite value at token %llu, element %llu", fn,
                             (unsigned long long)(i / row), (unsigned long long)(i % row));
        out[i] = x;
    }
    return IKV_OK;
}

}  // namespace

extern "C" {

IKV_API ikv_query_memory_config ikv_query_memory_default_config_v2(void) {
    ikv_query_memory_config c{};
    c.struct_size = sizeof c;
    c.n_q_heads = 0;
    c.decay = 0.5f;
    c.turns = 4;
    return c;
}

IKV_API ikv_status ikv_query_memory_create(const ikv_pool *pool, const ikv_query_memory_config *config,
                                           ikv_query_memory **out) {
    const char *fn = "ikv_query_memory_create";
    IKV_CHECK_NULL(pool, fn);
    IKV_CHECK_NULL(config, fn);
    IKV_CHECK_NULL(out, fn);
    IKV_CHECK_STRUCT(config, kFirstConfigSize, fn);
    // Fields a caller built with the first header does not pass keep that header's behaviour.
    ikv_query_memory_config first = ikv_query_memory_default_config_v2();
    first.turns = 0;
    const ikv_query_memory_config c = ikv::read_config(*config, first);
    const ikv::PageShape &shape = ikv::pool_shape(pool);
    if (c.n_q_heads == 0 || c.n_q_heads % shape.n_kv_heads != 0)
        return ikv::fail(IKV_E_INVALID, "%s: config->n_q_heads %u is not a positive multiple of the pool's n_kv_heads %u",
                         fn, c.n_q_heads, shape.n_kv_heads);
    if (!(c.decay > 0.0f && c.decay < 1.0f))
        return ikv::fail(IKV_E_INVALID, "%s: config->decay %.9g is outside (0, 1)", fn, (double)c.decay);
    if (c.turns > kMaxTurns)
        return ikv::fail(IKV_E_INVALID, "%s: config->turns %u is above %u (0 = one decayed mean)", fn, c.turns,
                         kMaxTurns);
    ikv_query_memory *m = ikv::new_handle<ikv_query_memory>();
    if (m == nullptr) return ikv::fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    m->pool = pool;
    m->n_layers = shape.n_layers;
    m->n_q_heads = c.n_q_heads;
    m->head_dim = shape.head_dim;
    m->decay = c.decay;
    m->turns = c.turns;
    m->device = ikv::pool_backend(pool) == IKV_BACKEND_CUDA ? ikv::pool_device(pool) : -1;
    *out = m;
    return IKV_OK;
}

IKV_API void ikv_query_memory_destroy(ikv_query_memory *memory) { ikv::delete_handle(memory); }

IKV_API ikv_status ikv_query_memory_remember(ikv_query_memory *memory, ikv_seq_id seq, uint32_t layer,
                                             const void *q, ikv_dtype q_dtype, uint32_t n_tokens) {
    const char *fn = "ikv_query_memory_remember";
    IKV_CHECK_NULL(memory, fn);
    IKV_CHECK_NULL(q, fn);
    if (layer >= memory->n_layers)
        return ikv::fail(IKV_E_RANGE, "%s: layer %u is out of range, the pool has %u layers", fn, layer,
                         memory->n_layers);
    if (n_tokens == 0) return ikv::fail(IKV_E_INVALID, "%s: n_tokens is 0, expected at least 1", fn);
    const int dtype = ikv::raw_enum(q_dtype);  // a C caller may pass any int: never loaded as the enum
    return ikv::guarded(fn, [&] {
        const uint64_t row = uint64_t(memory->n_q_heads) * memory->head_dim;
        std::vector<float> f32;
        const ikv_status st = queries_f32(q, dtype, uint64_t(n_tokens) * row, row, fn, f32);
        if (st != IKV_OK) return st;
        memory->remember(seq, layer, f32.data(), n_tokens);
        return IKV_OK;
    });
}

IKV_API ikv_status ikv_query_memory_end_turn(ikv_query_memory *memory, ikv_seq_id seq) {
    const char *fn = "ikv_query_memory_end_turn";
    IKV_CHECK_NULL(memory, fn);
    return ikv::guarded(fn, [&] { return memory->end_turn_everywhere(seq, fn); });
}

IKV_API ikv_status ikv_query_memory_forget(ikv_query_memory *memory, ikv_seq_id seq) {
    IKV_CHECK_NULL(memory, "ikv_query_memory_forget");
    memory->forget(&seq);
    return IKV_OK;
}

IKV_API ikv_status ikv_query_memory_reset(ikv_query_memory *memory) {
    IKV_CHECK_NULL(memory, "ikv_query_memory_reset");
    memory->forget(nullptr);
    return IKV_OK;
}

// The first header's struct and its unversioned default (see ikv_query_memory_default_config_v2).
struct ikv_query_memory_config_v1 {
    uint32_t struct_size;
    uint32_t n_q_heads;
    float decay;
};
static_assert(sizeof(ikv_query_memory_config_v1) == kFirstConfigSize, "the first ikv_query_memory_config layout");

#undef ikv_query_memory_default_config
IKV_API ikv_query_memory_config_v1 ikv_query_memory_default_config(void) {
    return ikv::first_layout<ikv_query_memory_config_v1>(ikv_query_memory_default_config_v2());
}

}  // extern "C"
