// ikv_pool_append and ikv_pool_append_batch: quantize on write. Every page a
// layer's tokens land in is rewritten from that layer's fp32 staging (the tail
// page's tokens so far plus the new ones), so a partial page's scales always
// cover its true range and appending token by token stores the same bytes as
// one bulk append. A batch is one append whose input numbers its tokens
// across the sequences (AppendSource::seq_tokens), so each step below runs
// once for the whole batch: one finiteness check, one capacity check, one
// store call that writes every sequence's pages.
//
// Order of work, so that a rejected append changes no sequence:
//   1. check every input value is finite (the store reads the input where it
//      is: a CUDA store checks device input on the device; an asynchronous
//      append skips this, see below), and the plan's page size;
//   2. reserve memory (staging buffers of the store, block-table slots, page
//      records);
//   3. under state_mu: find pages to create and shared pages to copy, check
//      capacity, allocate (undo all on failure);
//   4. outside the lock: initialize new pages and copy shared ones;
//   5. under state_mu: commit the block table (drop the shared pages' refs);
//   6. outside the lock: the store stages the new rows and quantizes into
//      pages this sequence now owns alone (PageStore::write_append).
// An asynchronous append (IKV_APPEND_ASYNC, CUDA pools) does the same host
// work, but steps 4 and 6 are enqueued on the engine's stream and nothing
// waits for the device; only the finiteness of the input is left to the
// device (a non-finite value is stored as 0 and reported by ikv_pool_sync).
#include <algorithm>
#include <cstdio>
#include <new>
#include <vector>

#include "pool/pool_internal.hpp"

namespace ikv {
namespace {

ikv_format format_for_new_page(const ikv_pool *pool, const ikv_plan *plan, uint32_t pages_in_plan, uint32_t p) {
    if (plan != nullptr && p < pages_in_plan) {
        ikv_format f = IKV_FMT_AUTO;
        if (ikv_plan_page_format(plan, p, &f) == IKV_OK && int(f) >= 0 && f < IKV_FMT_COUNT) return f;
    }
    return default_page_format(pool);
}


// One sequence of the call and what the call prepared for it.
struct Part {
    std::shared_ptr<Seq> seq;
    ikv_seq_id id = 0;
    uint32_t pmin = 0, pmax = 0;         // pages its tokens land in, over the layers appended
    std::vector<uint8_t> written;        // [p - pmin]: some layer's tokens land in page p (layers
                                         // of different lengths can leave pages of [pmin, pmax) untouched)
    std::vector<uint32_t> new_stage;     // layers whose staging this call allocated
    std::vector<PageRec *> recs;         // spare records, then exactly the new pages'
    std::vector<std::pair<uint32_t, PageRec *>> fresh, copies;  // (page, new record)
};

// Undo of the memory steps: staging this call allocated, records not committed.
void unwind(ikv_pool *pool, std::vector<Part> &parts) {
    for (Part &pt : parts) {
        free_new_staging(pool, pt.seq.get(), pt.new_stage);
        for (PageRec *r : pt.recs) delete r;
        pt.recs.clear();
    }
}

// The sequences, each found and listed once.
ikv_status find_parts(const ikv_pool *pool, const ikv_seq_id *ids, uint32_t n, const char *fn,
                      std::vector<Part> *parts) {
    std::vector<std::shared_ptr<Seq>> seqs;
    const ikv_status st = find_seqs_once(pool, ids, n, fn, &seqs);
    if (st != IKV_OK) return st;
    parts->resize(n);
    for (uint32_t i = 0; i < n; ++i) {
        (*parts)[i].id = ids[i];
        (*parts)[i].seq = std::move(seqs[i]);
    }
    return IKV_OK;
}

// Pages to create and shared pages to copy for one sequence (under state_mu);
// adds their bytes to *extra. IKV_E_EVICTED if the tokens land in an evicted page.
ikv_status find_new_pages_locked(const ikv_pool *pool, Part &pt, const ikv_plan *plan, uint32_t plan_pages,
                                 const char *fn, uint64_t *extra) {
    const Seq &seq = *pt.seq;
    for (uint32_t p = pt.pmin; p <= pt.pmax; ++p) {
        if (p < seq.pages.size()) {
            if (!pt.written[p - pt.pmin]) continue;  // no layer writes it: left as it is, shared or evicted
            const PageRec *rec = seq.pages[p];
            if (rec == nullptr)
                return fail(IKV_E_EVICTED, "%s: tokens of sequence %u land in page %u, which was evicted", fn,
                            (unsigned)pt.id, p);
            if (rec->refs > 1) {  // shared with a fork: copy before writing
                pt.copies.emplace_back(p, nullptr);
                *extra += pool->page_bytes[rec->format];
            }
        } else {
            const ikv_format f = format_for_new_page(pool, plan, plan_pages, p);
            pt.fresh.emplace_back(p, nullptr);
            pt.recs[pt.fresh.size() - 1]->format = f;
            *extra += pool->page_bytes[f];
        }
    }
    return IKV_OK;
}

// The layers and tokens of one call: n tokens to layers [l0, l1), pages of P.
struct Span {
    uint32_t l0, l1, n, P;
};

// The pages [first, last] that layer l's sp.n new tokens land in.
std::pair<uint32_t, uint32_t> layer_pages(const Seq &seq, uint32_t l, const Span &sp) {
    const uint32_t first = seq.layers[l].length / sp.P;
    return {first, uint32_t((uint64_t(seq.layers[l].length) + sp.n - 1) / sp.P)};
}

// Pages each sequence's tokens land in, room for its records and table, and a
// spare PageRec per page touched. Returns the page writes of the call.
// Throws std::bad_alloc (the caller unwinds).
size_t reserve_parts(std::vector<Part> &parts, const Span &sp) {
    size_t n_writes = 0;
    for (Part &pt : parts) {
        Seq &seq = *pt.seq;
        pt.pmin = UINT32_MAX;
        for (uint32_t l = sp.l0; l < sp.l1; ++l) {
            const auto [first, last] = layer_pages(seq, l, sp);
            pt.pmin = std::min(pt.pmin, first);
            pt.pmax = std::max(pt.pmax, last);
            n_writes += last - first + 1;
        }
        const uint32_t n_touched = pt.pmax - pt.pmin + 1;
        pt.written.assign(n_touched, 0);
        for (uint32_t l = sp.l0; l < sp.l1; ++l) {
            const auto [first, last] = layer_pages(seq, l, sp);
            std::fill(pt.written.begin() + (first - pt.pmin), pt.written.begin() + (last - pt.pmin) + 1, uint8_t(1));
        }
        seq.pages.reserve(size_t(pt.pmax) + 1);
        pt.fresh.reserve(n_touched);
        pt.copies.reserve(n_touched);
        pt.new_stage.reserve(sp.l1 - sp.l0);
        pt.recs.reserve(n_touched);
        for (uint32_t i = 0; i < n_touched; ++i) pt.recs.push_back(new PageRec);
    }
    return n_writes;
}

// A staging buffer for every (sequence, layer) appended that has none.
ikv_status alloc_stages(ikv_pool *pool, std::vector<Part> &parts, const Span &sp) {
    for (Part &pt : parts)
        for (uint32_t l = sp.l0; l < sp.l1; ++l)
            if (pt.seq->layers[l].stage == nullptr) {
                const ikv_status st = pool->store->stage_alloc(&pt.seq->layers[l].stage);
                if (st != IKV_OK) return st;
                pt.new_stage.push_back(l);
            }
    return IKV_OK;
}

// Under state_mu: the pages to create and to copy for every sequence, the
// capacity check for all of them, then their allocation (*allocated lists
// them; on failure the ones allocated are released and the caller unwinds).
ikv_status allocate_pages_locked(ikv_pool *pool, std::vector<Part> &parts, const ikv_plan *plan, uint32_t plan_pages,
                                 const char *fn, std::vector<PageRec *> *allocated) {
    uint64_t extra = 0;
    for (Part &pt : parts) {
        const ikv_status st = find_new_pages_locked(pool, pt, plan, plan_pages, fn, &extra);
        if (st != IKV_OK) return st;
    }
    keep_last_shared_copy_locked(parts, [&](const std::pair<uint32_t, PageRec *> &, const PageRec *old) {
        extra -= pool->page_bytes[old->format];
    });
    ikv_status st = check_capacity_locked(pool, extra, 0, fn);
    if (st != IKV_OK) return st;
    for (Part &pt : parts) {
        size_t next = 0;
        for (auto &e : pt.fresh) e.second = pt.recs[next++];
        for (auto &e : pt.copies) e.second = pt.recs[next++];
        for (size_t i = next; i < pt.recs.size(); ++i) delete pt.recs[i];
        pt.recs.resize(next);  // from here, recs are exactly the new pages' records
        for (size_t i = 0; i < pt.recs.size(); ++i) {
            const ikv_format f =
                i < pt.fresh.size() ? pt.recs[i]->format : pt.seq->pages[pt.copies[i - pt.fresh.size()].first]->format;
            st = alloc_page_locked(pool, f, pt.recs[i]);
            if (st != IKV_OK) {
                for (PageRec *r : *allocated) free_page_bytes_locked(pool, r);
                allocated->clear();
                return st;
            }
            allocated->push_back(pt.recs[i]);  // reserved: does not throw
        }
    }
    return IKV_OK;
}

// Under state_mu: the block tables take the new pages (the shared ones'
// references dropped). Nothing here fails.
void commit_pages_locked(ikv_pool *pool, std::vector<Part> &parts) {
    for (Part &pt : parts) {
        Seq &seq = *pt.seq;
        for (auto &e : pt.copies) {
            unref_page_locked(pool, seq.pages[e.first]);  // usually still held by the fork
            seq.pages[e.first] = e.second;
        }
        for (auto &e : pt.fresh) seq.pages.push_back(e.second);  // fresh pages are consecutive from pages.size()
        if (!pt.copies.empty() || !pt.fresh.empty()) table_changed(seq);
        pt.recs.clear();
    }
}

// The page writes of sequence `index` of the batch (its tokens are numbered
// from index * n in the batch's input), in layer and token order.
void add_page_writes(const Part &pt, uint32_t index, const Span &sp, std::vector<AppendWrite> *writes) {
    const Seq &seq = *pt.seq;
    for (uint32_t l = sp.l0; l < sp.l1; ++l) {
        uint32_t pos = seq.layers[l].length, t = 0;
        while (t < sp.n) {
            const uint32_t p = pos / sp.P, off = pos % sp.P, take = std::min(sp.P - off, sp.n - t);
            const PageRec *rec = seq.pages[p];
            writes->push_back(
                AppendWrite{rec->bytes, rec->format, seq.layers[l].stage, l, index * sp.n + t, off, take, pt.id});
            pos += take;
            t += take;
        }
    }
}

// Under state_mu: lengths, staging (freed where a page filled) and token accounting.
void commit_lengths_locked(ikv_pool *pool, Part &pt, const Span &sp) {
    Seq &seq = *pt.seq;
    const uint32_t old_length = seq.length;
    int64_t stage_delta = int64_t(pt.new_stage.size());
    for (uint32_t l = sp.l0; l < sp.l1; ++l) {
        LayerState &ls = seq.layers[l];
        ls.length += sp.n;
        if (ls.length % sp.P == 0) {
            pool->store->stage_free(ls.stage);
            ls.stage = nullptr;
            --stage_delta;
        }
    }
    uint32_t len = UINT32_MAX;
    for (const LayerState &ls : seq.layers) len = std::min(len, ls.length);
    seq.length = len;
    pool->tokens_total += seq.length - old_length;
    pool->staging_bytes += stage_delta * int64_t(stage_bytes(pool->shape));
}

}  // namespace

ikv_status find_seqs_once(const ikv_pool *pool, const ikv_seq_id *ids, uint32_t n, const char *fn,
                          std::vector<std::shared_ptr<Seq>> *out) {
    try {
        out->resize(n);
        for (uint32_t i = 0; i < n; ++i) {
            (*out)[i] = find_seq(pool, ids[i]);
            if (!(*out)[i]) return seq_not_found(fn, ids[i]);
        }
        if (n > 1) {
            std::vector<ikv_seq_id> sorted(ids, ids + n);
            std::sort(sorted.begin(), sorted.end());
            const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
            if (dup != sorted.end())
                return fail(IKV_E_INVALID, "%s: sequence %u is listed twice in seqs; list each sequence once", fn,
                            (unsigned)*dup);
        }
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
    return IKV_OK;
}

ikv_status seqs_append(ikv_pool *pool, const ikv_seq_id *ids, uint32_t n_seqs, const ikv_append &a, const char *fn,
                       RoomAppendReady *defer) {
    const PageShape &s = pool->shape;
    const uint32_t P = s.page_size, n = a.n_tokens;
    const bool all = a.layer == IKV_ALL_LAYERS;
    const uint32_t l0 = all ? 0 : a.layer, l1 = all ? s.n_layers : a.layer + 1;

    std::vector<Part> parts;
    ikv_status st = find_parts(pool, ids, n_seqs, fn, &parts);
    if (st != IKV_OK) return st;

    uint32_t plan_pages = 0;
    if (a.formats != nullptr) {
        ikv_plan_summary sum;
        st = ikv_plan_get_summary(a.formats, &sum);
        if (st != IKV_OK) return st;
        if (sum.page_size != P)
            return fail(IKV_E_INVALID, "%s: %s->formats has page_size %u but the pool's page_size is %u", fn,
                        current_args(), sum.page_size, P);
        plan_pages = sum.pages_total;
    }
    for (const Part &pt : parts)
        for (uint32_t l = l0; l < l1; ++l)
            if (uint64_t(pt.seq->layers[l].length) + n > UINT32_MAX)
                return fail(IKV_E_RANGE, "%s: layer %u of sequence %u would hold more than 2^32-1 tokens", fn, l,
                            (unsigned)pt.id);
    AppendSource src;
    src.fn = fn;
    src.k = a.k;
    src.v = a.v;
    src.dtype = pool->config.kv_dtype;
    src.all_layers = all;
    src.on_device = a.src_on_device != 0;
    src.stream = a.stream;
    src.n_tokens = n * n_seqs;  // checked to fit by the API layer
    src.seq_tokens = n;
    src.token_stride = a.token_stride;
    src.head_stride = a.head_stride;
    src.layer_stride = a.layer_stride;
    src.seq_stride = n_seqs > 1 ? a.seq_stride : 0;
    // An asynchronous append (CUDA pools; device input, checked by the API
    // layer) must not wait for the device, so its input is not checked here:
    // the store's staging keeps non-finite values out and records them.
    src.async = (a.flags & IKV_APPEND_ASYNC) != 0 && pool->config.backend == IKV_BACKEND_CUDA;
    bool room = false;  // sequences with room on a store that keeps their lengths take the device's path
    for (const Part &pt : parts) room = room || pt.seq->reservation != nullptr;
    if (room) {
        std::vector<std::shared_ptr<Seq>> seqs;
        try {
            for (const Part &pt : parts) seqs.push_back(pt.seq);
        } catch (const std::bad_alloc &) {
            return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
        }
        if (defer != nullptr) return room_append_prepare(pool, seqs.data(), ids, n_seqs, src, l0, l1, defer);
        return room_append(pool, seqs.data(), ids, n_seqs, src, l0, l1);
    }
    Exec ex;
    ex.stream = a.stream;
    ex.async = src.async;
    st = pool->store->check_source(src);
    if (st != IKV_OK) return st;
    NonFinite bad;
    st = src.async ? IKV_OK : pool->store->find_nonfinite(src, l0, l1, &bad);
    if (st != IKV_OK) return st;
    if (bad.found) {
        char where[48] = "";  // a batch names the sequence too
        if (n_seqs > 1) std::snprintf(where, sizeof where, "sequence %u, ", (unsigned)ids[bad.token / n]);
        return fail(IKV_E_INVALID,
                    "%s: %s[%slayer %u, token %u, head %u, channel %u] is %s; the pool stores finite values only", fn,
                    bad.which == 0 ? "k" : "v", where, bad.layer, bad.token % n, bad.head, bad.channel,
                    bad.value_name());
    }

    // Memory first: nothing is visible yet, so a failure just unwinds.
    const Span span{l0, l1, n, P};
    size_t n_writes = 0;
    std::vector<AppendWrite> writes;  // one per (sequence, layer, page) the tokens land in
    std::vector<PageStore::PageInit> inits;
    std::vector<PageStore::PageCopy> page_copies;
    std::vector<PageRec *> allocated;
    try {
        n_writes = reserve_parts(parts, span);
        writes.reserve(n_writes);
        inits.reserve(n_writes);
        page_copies.reserve(n_writes);
        allocated.reserve(n_writes);
    } catch (const std::bad_alloc &) {
        unwind(pool, parts);
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
    // The store's device buffers too: its job lists, and its scratch for the
    // pages written whole after each layer's first write.
    size_t n_whole = 0;
    for (const Part &pt : parts)
        for (uint32_t l = l0; l < l1; ++l) {
            const uint64_t len = pt.seq->layers[l].length, first = len / P, end = (len + n) / P;
            n_whole += end > first + 1 ? size_t(end - first - 1) : 0;
        }
    st = pool->store->prepare_append(src, l0, n_whole, n_writes);
    if (st == IKV_OK) st = alloc_stages(pool, parts, span);
    if (st == IKV_OK) {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        st = allocate_pages_locked(pool, parts, a.formats, plan_pages, fn, &allocated);
    }
    if (st != IKV_OK) {
        unwind(pool, parts);
        return st;
    }
    // Fill the new pages outside the lock, all in one store call. Copying a
    // shared page is safe here: we still hold our reference, so no other
    // sequence writes it in place.
    for (const Part &pt : parts) {
        for (const auto &e : pt.fresh) inits.push_back(PageStore::PageInit{e.second->format, e.second->bytes});
        for (const auto &e : pt.copies) {
            const PageRec *old = pt.seq->pages[e.first];
            page_copies.push_back(PageStore::PageCopy{old->format, e.second->bytes, old->bytes});
        }
    }
    st = pool->store->init_pages(inits.data(), inits.size(), ex);
    if (st == IKV_OK) st = pool->store->copy_pages(page_copies.data(), page_copies.size(), ex);
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        if (st != IKV_OK) {
            for (PageRec *r : allocated) free_page_bytes_locked(pool, r);
            unwind(pool, parts);
            return st;
        }
        commit_pages_locked(pool, parts);  // nothing from here on fails
    }

    // Stage and quantize, page by page, in the store: one call for the batch.
    // A device store can fail here; lengths are still committed (the pages
    // hold what the store wrote) and the failure is returned.
    for (uint32_t i = 0; i < n_seqs; ++i) add_page_writes(parts[i], i, span, &writes);
    const ikv_status write_status = pool->store->write_append(src, writes.data(), writes.size());

    std::lock_guard<std::mutex> lock(pool->state_mu);
    for (Part &pt : parts) commit_lengths_locked(pool, pt, span);
    return write_status;
}

ikv_status pool_sync(ikv_pool *pool) {
    NonFinite bad;
    ikv_seq_id seq = 0;
    ikv_status st = pool->store->take_async_error(&bad, &seq);
    if (st != IKV_OK) return st;
    // Lengths the device reached (sequences with room), taken in every case;
    // their incidents are reported unless a non-finite input comes first.
    st = take_room_reports(pool, !bad.found);
    if (st != IKV_OK || !bad.found) return st;
    return fail(IKV_E_INVALID,
                "ikv_pool_sync: an asynchronous append met %s[sequence %u, layer %u, token %u, head %u, channel %u] "
                "= %s and stored it as 0; the pool stores finite values only",
                bad.which == 0 ? "k" : "v", (unsigned)seq, bad.layer, bad.token, bad.head, bad.channel,
                bad.value_name());
}

}  // namespace ikv
