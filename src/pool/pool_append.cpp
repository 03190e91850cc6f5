// ikv_pool_append: quantize on write. Every page a layer's tokens land in is
// rewritten from that layer's fp32 staging (the tail page's tokens so far plus
// the new ones), so a partial page's scales always cover its true range and
// appending token by token stores the same bytes as one bulk append.
//
// Order of work, so that a rejected append changes nothing:
//   1. check every input value is finite, and the plan's page size;
//   2. reserve host memory (staging, block-table slots, page records);
//   3. under state_mu: find pages to create and shared pages to copy, check
//      capacity, allocate (undo all on failure);
//   4. outside the lock: initialize new pages and copy shared ones;
//   5. under state_mu: commit the block table (drop the shared pages' refs);
//   6. outside the lock: quantize into pages this sequence now owns alone.
#include <algorithm>
#include <new>

#include "pool/pool_internal.hpp"

namespace ikv {
namespace {

constexpr const char *kFn = "ikv_pool_append";

int64_t row_offset(const ikv_append &a, bool all_layers, uint32_t l, uint32_t t, uint32_t h) {
    return (all_layers ? int64_t(l) * a.layer_stride : 0) + int64_t(t) * a.token_stride + int64_t(h) * a.head_stride;
}

// True if any of D elements at src+off is NaN or inf, testing exponent bits
// only (all ones) so no conversion is needed.
bool row_has_nonfinite(const void *src, ikv_dtype dt, int64_t off, uint32_t D) {
    uint32_t bad = 0;
    if (dt == IKV_DTYPE_F32) {
        const uint32_t *p = static_cast<const uint32_t *>(src) + off;
        for (uint32_t d = 0; d < D; ++d) bad |= uint32_t((p[d] & 0x7F800000u) == 0x7F800000u);
    } else {
        const uint16_t mask = dt == IKV_DTYPE_F16 ? 0x7C00u : 0x7F80u;
        const uint16_t *p = static_cast<const uint16_t *>(src) + off;
        for (uint32_t d = 0; d < D; ++d) bad |= uint32_t((p[d] & mask) == mask);
    }
    return bad != 0;
}

ikv_status check_finite(const ikv_pool *pool, const ikv_append &a, uint32_t l0, uint32_t l1) {
    const PageShape &s = pool->shape;
    const bool all = a.layer == IKV_ALL_LAYERS;
    const ikv_dtype dt = pool->config.kv_dtype;
    for (int which = 0; which < 2; ++which) {
        const void *src = which == 0 ? a.k : a.v;
        for (uint32_t l = l0; l < l1; ++l)
            for (uint32_t t = 0; t < a.n_tokens; ++t)
                for (uint32_t h = 0; h < s.n_kv_heads; ++h) {
                    const int64_t off = row_offset(a, all, l, t, h);
                    if (!row_has_nonfinite(src, dt, off, s.head_dim)) continue;
                    std::vector<float> row(s.head_dim);  // slow path: name the element
                    load_row(src, dt, off, s.head_dim, row.data());
                    uint32_t d = 0;
                    while (d + 1 < s.head_dim && std::isfinite(row[d])) ++d;
                    return fail(IKV_E_INVALID,
                                "%s: %s[layer %u, token %u, head %u, channel %u] is %s; the pool stores finite "
                                "values only",
                                kFn, which == 0 ? "k" : "v", l, t, h, d, std::isnan(row[d]) ? "NaN" : "inf");
                }
    }
    return IKV_OK;
}

ikv_format format_for_new_page(const ikv_pool *pool, const ikv_plan *plan, uint32_t pages_in_plan, uint32_t p) {
    if (plan != nullptr && p < pages_in_plan) {
        ikv_format f = IKV_FMT_AUTO;
        if (ikv_plan_page_format(plan, p, &f) == IKV_OK && int(f) >= 0 && f < IKV_FMT_COUNT) return f;
    }
    return default_page_format(pool);
}

// Device input (CUDA pools, src_on_device): bring the extent of K and V the
// strides address to host memory, then append from there (staging is on host).
ikv_status download_input(ikv_pool *pool, ikv_append &a, std::vector<uint8_t> &k, std::vector<uint8_t> &v) {
    const PageShape &s = pool->shape;
    const bool all = a.layer == IKV_ALL_LAYERS;
    const uint64_t elems = uint64_t(row_offset(a, all, all ? s.n_layers - 1 : 0, a.n_tokens - 1, s.n_kv_heads - 1)) +
                           s.head_dim;
    const uint64_t bytes = elems * (pool->config.kv_dtype == IKV_DTYPE_F32 ? 4 : 2);
    try {
        k.resize(bytes);
        v.resize(bytes);
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory for a %llu-byte copy of device K/V", kFn,
                    (unsigned long long)bytes);
    }
    ikv_status st = pool->store->download(k.data(), a.k, bytes, a.stream);
    if (st == IKV_OK) st = pool->store->download(v.data(), a.v, bytes, a.stream);
    if (st == IKV_E_UNSUPPORTED)
        return fail(IKV_E_UNSUPPORTED, "%s: args->src_on_device is set but this pool's storage cannot read device "
                    "pointers", kFn);
    if (st != IKV_OK) return st;
    a.k = k.data();
    a.v = v.data();
    a.src_on_device = 0;
    return IKV_OK;
}

}  // namespace

ikv_status seq_append(ikv_pool *pool, ikv_seq_id id, const ikv_append &args) {
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(kFn, id);
    ikv_append a = args;
    std::vector<uint8_t> host_k, host_v;
    if (a.src_on_device) {
        const ikv_status st = download_input(pool, a, host_k, host_v);
        if (st != IKV_OK) return st;
    }
    Seq &seq = *seqp;
    const PageShape &s = pool->shape;
    const uint32_t P = s.page_size, n = a.n_tokens;
    const bool all = a.layer == IKV_ALL_LAYERS;
    const uint32_t l0 = all ? 0 : a.layer, l1 = all ? s.n_layers : a.layer + 1;

    uint32_t plan_pages = 0;
    if (a.formats != nullptr) {
        ikv_plan_summary sum;
        const ikv_status st = ikv_plan_get_summary(a.formats, &sum);
        if (st != IKV_OK) return st;
        if (sum.page_size != P)
            return fail(IKV_E_INVALID, "%s: args->formats has page_size %u but the pool's page_size is %u", kFn,
                        sum.page_size, P);
        plan_pages = sum.pages_total;
    }
    for (uint32_t l = l0; l < l1; ++l)
        if (uint64_t(seq.layers[l].length) + n > UINT32_MAX)
            return fail(IKV_E_RANGE, "%s: layer %u would hold more than 2^32-1 tokens", kFn, l);
    ikv_status st = check_finite(pool, a, l0, l1);
    if (st != IKV_OK) return st;

    // Pages the tokens land in, over all layers appended.
    uint32_t pmin = UINT32_MAX, pmax = 0;
    for (uint32_t l = l0; l < l1; ++l) {
        pmin = std::min(pmin, seq.layers[l].length / P);
        pmax = std::max(pmax, uint32_t((uint64_t(seq.layers[l].length) + n - 1) / P));
    }
    const uint32_t n_touched = pmax - pmin + 1;

    // Host memory first: nothing is visible yet, so a failure just unwinds.
    std::vector<uint32_t> new_stage;  // layers whose staging this call allocated
    std::vector<PageRec *> recs;      // spare page records
    std::vector<std::pair<uint32_t, PageRec *>> fresh, copies;
    auto unwind = [&]() {
        for (uint32_t l : new_stage) StageVec().swap(seq.layers[l].stage);
        for (PageRec *r : recs) delete r;
    };
    try {
        seq.pages.reserve(size_t(pmax) + 1);
        fresh.reserve(n_touched);
        copies.reserve(n_touched);
        for (uint32_t l = l0; l < l1; ++l)
            if (seq.layers[l].stage.empty()) {
                new_stage.push_back(l);
                seq.layers[l].stage.resize(stage_floats(s));
            }
        for (uint32_t i = 0; i < n_touched; ++i) recs.push_back(new PageRec);
    } catch (const std::bad_alloc &) {
        unwind();
        return fail(IKV_E_NOMEM, "%s: out of host memory", kFn);
    }

    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        uint64_t extra = 0;
        for (uint32_t p = pmin; p <= pmax; ++p) {
            if (p < seq.pages.size()) {
                PageRec *rec = seq.pages[p];
                if (rec == nullptr) {
                    unwind();
                    return fail(IKV_E_EVICTED, "%s: tokens of sequence %u land in page %u, which was evicted", kFn,
                                (unsigned)id, p);
                }
                if (rec->refs > 1) {  // shared with a fork: copy before writing
                    copies.emplace_back(p, nullptr);
                    extra += pool->page_bytes[rec->format];
                }
            } else {
                const ikv_format f = format_for_new_page(pool, a.formats, plan_pages, p);
                fresh.emplace_back(p, nullptr);
                recs[fresh.size() - 1]->format = f;
                extra += pool->page_bytes[f];
            }
        }
        st = check_capacity_locked(pool, extra, 0, kFn);
        if (st != IKV_OK) {
            unwind();
            return st;
        }
        size_t next = 0;
        for (auto &e : fresh) e.second = recs[next++];
        for (auto &e : copies) e.second = recs[next++];
        for (size_t i = next; i < recs.size(); ++i) delete recs[i];
        recs.resize(next);  // from here, recs are exactly the new pages' records
        for (size_t i = 0; i < recs.size(); ++i) {
            const ikv_format f = i < fresh.size() ? recs[i]->format : seq.pages[copies[i - fresh.size()].first]->format;
            st = alloc_page_locked(pool, f, recs[i]);
            if (st != IKV_OK) {
                for (size_t j = 0; j < i; ++j) free_page_bytes_locked(pool, recs[j]);
                unwind();
                return st;
            }
        }
    }
    // Fill the new pages outside the lock. Copying a shared page is safe here:
    // we still hold our reference, so no other sequence writes it in place.
    st = IKV_OK;
    for (auto &e : fresh)
        if (st == IKV_OK) st = pool->store->init(e.second->format, e.second->bytes);
    for (auto &e : copies) {
        const PageRec *old = seq.pages[e.first];
        if (st == IKV_OK) st = pool->store->copy(old->format, e.second->bytes, old->bytes);
    }
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        if (st != IKV_OK) {
            for (PageRec *r : recs) free_page_bytes_locked(pool, r);
            unwind();
            return st;
        }
        // Commit: nothing below fails.
        for (auto &e : copies) {
            unref_page_locked(pool, seq.pages[e.first]);  // usually still held by the fork
            seq.pages[e.first] = e.second;
        }
        for (auto &e : fresh) seq.pages.push_back(e.second);  // fresh pages are consecutive from pages.size()
        recs.clear();
    }

    // Quantize, page by page, from staging. A device store can fail here;
    // lengths are still committed (the pages hold what the store wrote) and
    // the first failure is returned.
    ikv_status write_status = IKV_OK;
    const uint64_t head_floats = uint64_t(P) * s.head_dim;
    for (uint32_t l = l0; l < l1; ++l) {
        LayerState &ls = seq.layers[l];
        float *k = ls.stage.data(), *v = ls.stage.data() + stage_floats(s) / 2;
        uint32_t pos = ls.length, t = 0;
        while (t < n) {
            const uint32_t p = pos / P, off = pos % P, take = std::min(P - off, n - t);
            for (uint32_t i = 0; i < take; ++i)
                for (uint32_t h = 0; h < s.n_kv_heads; ++h) {
                    const int64_t src = row_offset(a, all, l, t + i, h);
                    const uint64_t dst = h * head_floats + uint64_t(off + i) * s.head_dim;
                    load_row(a.k, pool->config.kv_dtype, src, s.head_dim, k + dst);
                    load_row(a.v, pool->config.kv_dtype, src, s.head_dim, v + dst);
                }
            PageRec *rec = seq.pages[p];
            const ikv_status ws = pool->store->write_layer_tail(rec->format, rec->bytes, l, k, v, off + take, off);
            if (ws != IKV_OK && write_status == IKV_OK) write_status = ws;
            pos += take;
            t += take;
        }
    }

    // Lengths, staging and token accounting.
    std::lock_guard<std::mutex> lock(pool->state_mu);
    const uint32_t old_length = seq.length;
    int64_t stage_delta = int64_t(new_stage.size());
    for (uint32_t l = l0; l < l1; ++l) {
        LayerState &ls = seq.layers[l];
        ls.length += n;
        if (ls.length % P == 0) {
            StageVec().swap(ls.stage);
            --stage_delta;
        }
    }
    uint32_t len = UINT32_MAX;
    for (const LayerState &ls : seq.layers) len = std::min(len, ls.length);
    seq.length = len;
    pool->tokens_total += seq.length - old_length;
    pool->staging_bytes += stage_delta * int64_t(stage_bytes(s));
    return write_status;
}

}  // namespace ikv
