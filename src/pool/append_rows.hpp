// What an append hands to a PageStore: the engine's rows as ikv_append
// addresses them (host or device memory), the first non-finite element if
// any, and the page writes the pool core decided on. Plus the host-side
// readers of engine rows, shared by the host store and by the CUDA store for
// host-pointer input.
#pragma once

#include <cstdint>

#include "common/page_format.hpp"
#include "intentkv.h"

namespace ikv {

// The engine rows of one append. Element (t, h, d) of layer l is at
// k[(all_layers ? l*layer_stride : 0) + t*token_stride + h*head_stride + d].
// A batch append (several sequences, seq_tokens tokens each) numbers its
// tokens across the batch: token t is token t % seq_tokens of the batch's
// sequence t / seq_tokens, whose rows start seq_stride elements after the
// previous sequence's. A one-sequence append has seq_tokens == n_tokens.
struct AppendSource {
    const char *fn = "ikv_pool_append";  // the entry point, for messages
    const void *k = nullptr;
    const void *v = nullptr;
    ikv_dtype dtype = IKV_DTYPE_F16;
    bool all_layers = false;
    bool on_device = false;  // k, v are device pointers (CUDA pools)
    bool async = false;      // IKV_APPEND_ASYNC on a CUDA pool: enqueue on `stream`, do not wait
    bool room = false;       // to sequences with room whose lengths the device keeps (capturable)
    void *stream = nullptr;  // the engine's cudaStream_t that produced them (device input)
    uint32_t n_tokens = 0;    // over the whole batch
    uint32_t seq_tokens = 0;  // per sequence (n_tokens / sequences in the batch)
    int64_t token_stride = 0, head_stride = 0, layer_stride = 0, seq_stride = 0;
};

// The first non-finite input element in check order (K before V, then layer,
// token, head, channel), as the error sentence names it.
struct NonFinite {
    bool found = false;
    bool is_nan = false;
    bool negative = false;      // -inf
    bool sign_unknown = false;  // an infinity found on the device (its checks keep no sign)
    int which = 0;  // 0: k, 1: v
    uint32_t layer = 0, token = 0, head = 0, channel = 0;
    const char *value_name() const { return is_nan ? "NaN" : sign_unknown ? "infinite" : negative ? "-inf" : "inf"; }
};

// One page write of an append: input tokens [token0, token0 + rows) (batch
// numbering; all of one sequence) of
// `layer` become rows [row0, row0 + rows) of the layer's staging (which
// already holds rows [0, row0) of the page), then the layer of `page` is
// quantized from staging rows [0, row0 + rows). Writes of one layer come in
// token order and share its staging.
struct AppendWrite {
    uint8_t *page;
    ikv_format format;
    float *stage;  // K [H][P][D] then V [H][P][D], in the store's memory
    uint32_t layer, token0, row0, rows;
    ikv_seq_id seq;  // the sequence written (names it in an asynchronous append's error)
};

inline int64_t source_offset(const AppendSource &s, uint32_t layer, uint32_t token, uint32_t head) {
    const uint32_t seq = token / s.seq_tokens, t = token % s.seq_tokens;
    return (s.all_layers ? int64_t(layer) * s.layer_stride : 0) + int64_t(seq) * s.seq_stride +
           int64_t(t) * s.token_stride + int64_t(head) * s.head_stride;
}

// Elements from k (or v) to the last element the strides address, + 1.
inline uint64_t source_extent(const AppendSource &s, const PageShape &shape, uint32_t l0, uint32_t l1) {
    return uint64_t(source_offset(s, s.all_layers ? l1 - 1 : l0, s.n_tokens - 1, shape.n_kv_heads - 1)) +
           shape.head_dim;
}

inline uint32_t dtype_bytes(ikv_dtype dt) { return dt == IKV_DTYPE_F32 ? 4 : 2; }

// Host input: the first non-finite element of layers [l0, l1).
void find_nonfinite_host(const AppendSource &s, const PageShape &shape, uint32_t l0, uint32_t l1, NonFinite *out);

// Host input: convert write w's rows into its staging (as fp32).
void stage_rows_host(const AppendSource &s, const PageShape &shape, const AppendWrite &w);

}  // namespace ikv
