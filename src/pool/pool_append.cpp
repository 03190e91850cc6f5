// ikv_pool_append: quantize on write. Every page a layer's tokens land in is
// rewritten from that layer's fp32 staging (the tail page's tokens so far plus
// the new ones), so a partial page's scales always cover its true range and
// appending token by token stores the same bytes as one bulk append.
//
// Order of work, so that a rejected append changes nothing:
//   1. check every input value is finite (the store reads the input where it
//      is: a CUDA store checks device input on the device), and the plan's
//      page size;
//   2. reserve memory (staging buffers of the store, block-table slots, page
//      records);
//   3. under state_mu: find pages to create and shared pages to copy, check
//      capacity, allocate (undo all on failure);
//   4. outside the lock: initialize new pages and copy shared ones;
//   5. under state_mu: commit the block table (drop the shared pages' refs);
//   6. outside the lock: the store stages the new rows and quantizes into
//      pages this sequence now owns alone (PageStore::write_append).
#include <algorithm>
#include <new>
#include <vector>

#include "pool/pool_internal.hpp"

namespace ikv {
namespace {

constexpr const char *kFn = "ikv_pool_append";

ikv_format format_for_new_page(const ikv_pool *pool, const ikv_plan *plan, uint32_t pages_in_plan, uint32_t p) {
    if (plan != nullptr && p < pages_in_plan) {
        ikv_format f = IKV_FMT_AUTO;
        if (ikv_plan_page_format(plan, p, &f) == IKV_OK && int(f) >= 0 && f < IKV_FMT_COUNT) return f;
    }
    return default_page_format(pool);
}

}  // namespace

ikv_status seq_append(ikv_pool *pool, ikv_seq_id id, const ikv_append &args) {
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(kFn, id);
    const ikv_append &a = args;
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
    AppendSource src;
    src.k = a.k;
    src.v = a.v;
    src.dtype = pool->config.kv_dtype;
    src.all_layers = all;
    src.on_device = a.src_on_device != 0;
    src.stream = a.stream;
    src.n_tokens = n;
    src.token_stride = a.token_stride;
    src.head_stride = a.head_stride;
    src.layer_stride = a.layer_stride;
    NonFinite bad;
    ikv_status st = pool->store->find_nonfinite(src, l0, l1, &bad);
    if (st != IKV_OK) return st;
    if (bad.found)
        return fail(IKV_E_INVALID,
                    "%s: %s[layer %u, token %u, head %u, channel %u] is %s; the pool stores finite values only", kFn,
                    bad.which == 0 ? "k" : "v", bad.layer, bad.token, bad.head, bad.channel,
                    bad.is_nan ? "NaN" : "inf");

    // Pages the tokens land in, over all layers appended.
    uint32_t pmin = UINT32_MAX, pmax = 0;
    for (uint32_t l = l0; l < l1; ++l) {
        pmin = std::min(pmin, seq.layers[l].length / P);
        pmax = std::max(pmax, uint32_t((uint64_t(seq.layers[l].length) + n - 1) / P));
    }
    const uint32_t n_touched = pmax - pmin + 1;

    // Memory first: nothing is visible yet, so a failure just unwinds.
    std::vector<uint32_t> new_stage;  // layers whose staging this call allocated
    std::vector<PageRec *> recs;      // spare page records
    std::vector<std::pair<uint32_t, PageRec *>> fresh, copies;
    std::vector<AppendWrite> writes;  // one per (layer, page) the tokens land in
    auto unwind = [&]() {
        for (uint32_t l : new_stage) {
            pool->store->stage_free(seq.layers[l].stage);
            seq.layers[l].stage = nullptr;
        }
        for (PageRec *r : recs) delete r;
    };
    try {
        seq.pages.reserve(size_t(pmax) + 1);
        fresh.reserve(n_touched);
        copies.reserve(n_touched);
        size_t n_writes = 0;
        for (uint32_t l = l0; l < l1; ++l)
            n_writes += (uint64_t(seq.layers[l].length) + n - 1) / P - seq.layers[l].length / P + 1;
        writes.reserve(n_writes);
        new_stage.reserve(l1 - l0);
        for (uint32_t i = 0; i < n_touched; ++i) recs.push_back(new PageRec);
    } catch (const std::bad_alloc &) {
        unwind();
        return fail(IKV_E_NOMEM, "%s: out of host memory", kFn);
    }
    for (uint32_t l = l0; l < l1; ++l)
        if (seq.layers[l].stage == nullptr) {
            st = pool->store->stage_alloc(&seq.layers[l].stage);
            if (st != IKV_OK) {
                unwind();
                return st;
            }
            new_stage.push_back(l);
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
    try {
        std::vector<PageStore::PageInit> inits;
        inits.reserve(fresh.size());
        for (auto &e : fresh) inits.push_back(PageStore::PageInit{e.second->format, e.second->bytes});
        st = pool->store->init_pages(inits.data(), inits.size());
    } catch (const std::bad_alloc &) {
        st = fail(IKV_E_NOMEM, "ikv_pool_append: out of host memory");
    }
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
        if (!copies.empty() || !fresh.empty()) table_changed(seq);
        recs.clear();
    }

    // Stage and quantize, page by page, in the store. A device store can fail
    // here; lengths are still committed (the pages hold what the store wrote)
    // and the failure is returned.
    for (uint32_t l = l0; l < l1; ++l) {
        uint32_t pos = seq.layers[l].length, t = 0;
        while (t < n) {
            const uint32_t p = pos / P, off = pos % P, take = std::min(P - off, n - t);
            PageRec *rec = seq.pages[p];
            writes.push_back(AppendWrite{rec->bytes, rec->format, seq.layers[l].stage, l, t, off, take});
            pos += take;
            t += take;
        }
    }
    const ikv_status write_status = pool->store->write_append(src, writes.data(), writes.size());

    // Lengths, staging and token accounting.
    std::lock_guard<std::mutex> lock(pool->state_mu);
    const uint32_t old_length = seq.length;
    int64_t stage_delta = int64_t(new_stage.size());
    for (uint32_t l = l0; l < l1; ++l) {
        LayerState &ls = seq.layers[l];
        ls.length += n;
        if (ls.length % P == 0) {
            pool->store->stage_free(ls.stage);
            ls.stage = nullptr;
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
