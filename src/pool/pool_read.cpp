// Read side of the pool: dequantized reads, key summaries, page queries and
// the block-table snapshot decode uses (pool_view.hpp).
#include <algorithm>

#include "common/quant.hpp"
#include "pool/pool_internal.hpp"
#include "pool/pool_view.hpp"

namespace ikv {

ikv_status seq_read(const ikv_pool *pool, ikv_seq_id id, uint32_t layer, uint32_t begin, uint32_t end, float *k_out,
                    float *v_out) {
    constexpr const char *fn = "ikv_seq_read";
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    const Seq &seq = *seqp;
    const PageShape &s = pool->shape;
    const uint32_t P = s.page_size, len = seq.layers[layer].length;
    if (begin > end || end > len)
        return fail(IKV_E_RANGE, "%s: [%u, %u) is not inside [0, %u), the tokens of layer %u of sequence %u", fn,
                    begin, end, len, layer, (unsigned)id);
    for (uint32_t p = begin / P; begin < end && p * P < end; ++p)  // an empty range reads no page
        if (seq.pages[p] == nullptr)
            return fail(IKV_E_EVICTED, "%s: tokens [%u, %u) of sequence %u were evicted", fn, p * P, (p + 1) * P,
                        (unsigned)id);
    const uint64_t row = uint64_t(s.n_kv_heads) * s.head_dim;
    for (uint32_t t = begin; t < end;) {
        const uint32_t p = t / P, off = t % P, n = std::min(P - off, end - t);
        const PageRec *rec = seq.pages[p];
        for (uint32_t h = 0; h < s.n_kv_heads; ++h) {
            const uint64_t o = uint64_t(t - begin) * row + uint64_t(h) * s.head_dim;
            const ikv_status st =
                pool->store->read_rows(rec->format, rec->bytes, layer, h, off, n, k_out + o, v_out + o, row);
            if (st != IKV_OK) return st;
        }
        t += n;
    }
    return IKV_OK;
}

ikv_status seq_page_summary(const ikv_pool *pool, ikv_seq_id id, uint32_t layer, uint32_t kv_head, uint32_t page,
                            float *k_min, float *k_max, float *k_mean, uint32_t *n_tokens_out) {
    constexpr const char *fn = "ikv_seq_page_summary";
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    const Seq &seq = *seqp;
    const PageShape &s = pool->shape;
    const uint32_t n = page < seq.pages.size() ? tokens_in_page(seq, s, layer, page) : 0;
    if (n == 0)
        return fail(IKV_E_RANGE, "%s: page %u holds no tokens of layer %u in sequence %u (layer length %u)", fn, page,
                    layer, (unsigned)id, seq.layers[layer].length);
    const PageRec *rec = seq.pages[page];
    if (rec == nullptr) return fail(IKV_E_EVICTED, "%s: page %u of sequence %u was evicted", fn, page, (unsigned)id);
    std::vector<uint16_t> stored(3ull * s.head_dim);
    const ikv_status st = pool->store->read_summary(rec->format, rec->bytes, layer, kv_head, stored.data());
    if (st != IKV_OK) return st;
    std::vector<float> rec3(3ull * s.head_dim);
    decode_summary(stored.data(), s.head_dim, rec3.data());
    const size_t bytes = s.head_dim * sizeof(float);
    if (k_min) std::memcpy(k_min, rec3.data(), bytes);
    if (k_max) std::memcpy(k_max, rec3.data() + s.head_dim, bytes);
    if (k_mean) std::memcpy(k_mean, rec3.data() + 2 * s.head_dim, bytes);
    if (n_tokens_out) *n_tokens_out = n;
    return IKV_OK;
}

ikv_status seq_is_evicted(const ikv_pool *pool, ikv_seq_id id, uint32_t token, int *evicted_out) {
    constexpr const char *fn = "ikv_seq_is_evicted";
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    uint32_t stored = 0;
    for (const LayerState &ls : seqp->layers) stored = std::max(stored, ls.length);
    if (token >= stored)
        return fail(IKV_E_RANGE, "%s: token %u is out of range; sequence %u stores %u tokens", fn, token,
                    (unsigned)id, stored);
    *evicted_out = seqp->pages[token / pool->shape.page_size] == nullptr ? 1 : 0;
    return IKV_OK;
}

ikv_status seq_page_format(const ikv_pool *pool, ikv_seq_id id, uint32_t page, ikv_format *out) {
    constexpr const char *fn = "ikv_seq_page_format";
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    if (page >= seqp->pages.size())
        return fail(IKV_E_RANGE, "%s: page %u is out of range; sequence %u has %zu pages", fn, page, (unsigned)id,
                    seqp->pages.size());
    const PageRec *rec = seqp->pages[page];
    if (rec == nullptr) return fail(IKV_E_EVICTED, "%s: page %u of sequence %u was evicted", fn, page, (unsigned)id);
    *out = rec->format;
    return IKV_OK;
}

// ---- pool_view.hpp ----

const PageShape &pool_shape(const ikv_pool *pool) { return pool->shape; }
ikv_backend pool_backend(const ikv_pool *pool) { return pool->config.backend; }
void pool_count_host_reads(const ikv_pool *pool, uint64_t n) {
    // The counter is the only state a decode changes in a pool; relaxed: it orders nothing.
    pool->host_page_reads.fetch_add(n, std::memory_order_relaxed);
}
int pool_device(const ikv_pool *pool) { return pool->config.device; }
ikv_status pool_order_after_moves(const ikv_pool *pool, void *stream, const char *fn) {
    return pool->store->order_after_moves(stream, fn);
}

namespace {

// The sequence decode reads, or nullptr with the error set.
std::shared_ptr<Seq> decode_seq(const ikv_pool *pool, ikv_seq_id id, uint32_t index, uint32_t layer,
                                ikv_status *st) {
    auto seqp = find_seq(pool, id);
    if (!seqp) {
        *st = fail(IKV_E_NOT_FOUND, "ikv_decode: args->seqs[%u] is %u, a sequence that does not exist in this pool",
                   index, (unsigned)id);
    } else if (layer >= pool->shape.n_layers) {
        *st = fail(IKV_E_RANGE, "ikv_decode: layer %u is out of range; the pool has %u layers", layer,
                   pool->shape.n_layers);
        seqp.reset();
    }
    return seqp;
}

// The tokens decode lists at `layer`: the stored length, or for a sequence
// whose length the device keeps (room reserved on a CUDA pool) the room's
// end, which the device's length never passes.
uint32_t decode_length(const Seq &seq, uint32_t layer) {
    return seq.reservation ? seq.reserved_end : seq.layers[layer].length;
}

}  // namespace

ikv_status pool_seq_state(const ikv_pool *pool, ikv_seq_id id, uint32_t index, uint32_t layer, SeqState *out) {
    ikv_status st = IKV_OK;
    auto seqp = decode_seq(pool, id, index, layer, &st);
    if (!seqp) return st;
    out->length = decode_length(*seqp, layer);
    out->table_gen = seqp->table_gen;
    return IKV_OK;
}

ikv_status pool_snapshot(const ikv_pool *pool, ikv_seq_id id, uint32_t index, uint32_t layer, SeqSnapshot *out) {
    ikv_status st = IKV_OK;
    auto seqp = decode_seq(pool, id, index, layer, &st);
    if (!seqp) return st;
    const Seq &seq = *seqp;
    const uint32_t len = decode_length(seq, layer), P = pool->shape.page_size;
    const uint32_t n_pages = (len + P - 1) / P;
    try {
        out->pages.resize(n_pages);
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "ikv_decode: out of host memory");
    }
    for (uint32_t p = 0; p < n_pages; ++p) {  // fields stored one by one (decode/selection.cpp: put_clipped)
        const PageRec *rec = seq.pages[p];
        PageRef &r = out->pages[p];
        r.base = rec ? rec->bytes : nullptr;
        r.format = rec ? rec->format : IKV_FMT_F16;
        r.on_host = rec && rec->on_host;
    }
    out->length = len;
    out->host_length = seq.layers[layer].length;
    out->room = nullptr;
    if (seq.reservation != nullptr) {
        for (const LayerState &ls : seq.layers) out->host_length = std::min(out->host_length, ls.length);
        out->room = pool->store->room_on_device(seq.reservation);
        out->room_generation = pool->store->room_generation(seq.reservation);
    }
    return IKV_OK;
}

}  // namespace ikv
