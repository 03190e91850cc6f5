// Changes to stored tokens after append: truncate (roll back), evict (free
// whole pages, leave a dead sentinel), and page format changes.
#include <algorithm>
#include <new>

#include "pool/pool_internal.hpp"

namespace ikv {
namespace {

// Re-store page src (owned by seq alone) into dst, of another format: every
// layer's rows are dequantized into buf (a staging-sized buffer of the store)
// and quantized again. src is not changed, so a failure leaves the sequence
// as it was. Staging is not touched here; see restage_partial_layers.
ikv_status convert_page(ikv_pool *pool, const Seq &seq, uint32_t p, PageRec &dst, const PageRec &src, float *buf) {
    const PageShape &s = pool->shape;
    float *k = buf, *v = buf + stage_floats(s) / 2;
    ikv_status st = pool->store->init(dst.format, dst.bytes);
    for (uint32_t l = 0; l < s.n_layers && st == IKV_OK; ++l) {
        const uint32_t n = tokens_in_page(seq, s, l, p);
        if (n == 0) continue;
        st = pool->store->stage_from_page(src.format, src.bytes, l, n, buf);
        if (st == IKV_OK) st = pool->store->write_layer(dst.format, dst.bytes, l, k, v, n);
    }
    return st;
}

// After a format change of page p, a layer whose tail is this partial page
// continues from the values now stored (the lost bits do not come back).
void restage_partial_layers(ikv_pool *pool, Seq &seq, uint32_t p, const PageRec &rec) {
    for (uint32_t l = 0; l < pool->shape.n_layers; ++l) {
        const uint32_t n = tokens_in_page(seq, pool->shape, l, p);
        if (n > 0 && n < pool->shape.page_size && seq.layers[l].stage != nullptr)
            restage_from_page(pool, seq, l, rec, n);
    }
}

// Release seq's pages from index keep on (under state_mu; allocates nothing).
void drop_pages_from_locked(ikv_pool *pool, Seq &seq, size_t keep) {
    for (size_t i = keep; i < seq.pages.size(); ++i) unref_page_locked(pool, seq.pages[i]);
    seq.pages.resize(keep);
    table_changed(seq);
}

}  // namespace

ikv_status seq_truncate(ikv_pool *pool, ikv_seq_id id, uint32_t n_tokens) {
    constexpr const char *fn = "ikv_seq_truncate";
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    Seq &seq = *seqp;
    const ikv_status room = refuse_with_room(seq, id, fn);
    if (room != IKV_OK) return room;
    const PageShape &s = pool->shape;
    const uint32_t P = s.page_size;
    for (const LayerState &ls : seq.layers)
        if (ls.length != seq.length)
            return fail(IKV_E_STATE,
                        "%s: the layers of sequence %u hold different token counts (%u and %u); append to every "
                        "layer before truncating",
                        fn, (unsigned)id, seq.length, ls.length);
    if (n_tokens > seq.length)
        return fail(IKV_E_RANGE, "%s: n_tokens %u exceeds the length %u of sequence %u", fn, n_tokens, seq.length,
                    (unsigned)id);
    const uint32_t new_len = seq.length - n_tokens, keep = new_len % P, tail = new_len / P;
    const uint32_t keep_pages = (new_len + P - 1) / P;
    // Pages released here may still be written by asynchronous appends (the header: truncate waits for them).
    const ikv_status waited = pool->store->wait_appends(fn);
    if (waited != IKV_OK) return waited;
    if (n_tokens == 0) {  // no token changes; a CPU room's pages past the length go (the header's rule)
        if (seq.pages.size() > keep_pages) {
            std::lock_guard<std::mutex> lock(pool->state_mu);
            drop_pages_from_locked(pool, seq, keep_pages);
        }
        return IKV_OK;
    }
    if (keep != 0 && seq.pages[tail] == nullptr)
        return fail(IKV_E_EVICTED, "%s: the new tail page %u of sequence %u was evicted; cannot cut inside it", fn,
                    tail, (unsigned)id);

    // Memory first (staging of every layer, a record for a tail copy).
    std::vector<uint32_t> new_stage;
    PageRec *copy = nullptr;
    auto unwind = [&]() {
        free_new_staging(pool, &seq, new_stage);
        delete copy;
    };
    if (keep != 0) {
        try {
            new_stage.reserve(s.n_layers);
            copy = new PageRec;
        } catch (const std::bad_alloc &) {
            unwind();
            return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
        }
        for (uint32_t l = 0; l < s.n_layers; ++l)
            if (seq.layers[l].stage == nullptr) {
                const ikv_status st = pool->store->stage_alloc(&seq.layers[l].stage);
                if (st != IKV_OK) {
                    unwind();
                    return st;
                }
                new_stage.push_back(l);
            }
    }

    // The pages dropped are seq.pages[keep_pages, end) (read in place: no
    // allocation here, so nothing can fail between the checks and the cut).
    bool copying = false;
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        if (keep != 0 && seq.pages[tail]->refs > 1) {
            const PageRec *old = seq.pages[tail];
            // The pages this rollback releases (dropped and not shared) pay for the copy:
            // a rollback that ends with fewer bytes in use never fails for lack of them.
            uint64_t freed = 0;
            for (size_t i = keep_pages; i < seq.pages.size(); ++i) {
                const PageRec *rec = seq.pages[i];
                if (rec != nullptr && rec->refs == 1 && !rec->on_host) freed += pool->page_bytes[rec->format];
            }
            ikv_status st = check_capacity_locked(pool, pool->page_bytes[old->format], freed, fn);
            if (st == IKV_OK) st = alloc_page_locked(pool, old->format, copy);
            if (st != IKV_OK) {
                unwind();
                return st;
            }
            copying = true;
        }
    }
    // Copy a shared tail outside the lock: our reference keeps it unwritten.
    const ikv_status copy_st = copying ? pool->store->copy(copy->format, copy->bytes, seq.pages[tail]->bytes) : IKV_OK;
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        if (copy_st != IKV_OK) {
            free_page_bytes_locked(pool, copy);
            unwind();
            return copy_st;
        }
        if (copying) {
            unref_page_locked(pool, seq.pages[tail]);
            seq.pages[tail] = copy;
        } else {
            delete copy;
        }
        copy = nullptr;
        drop_pages_from_locked(pool, seq, keep_pages);
    }

    // Re-stage the kept tokens of the new tail page from their stored values
    // and rewrite the page from them (scales and summaries for the kept
    // tokens only): they have now been quantized twice.
    // A device store can fail here; the truncation still stands and the
    // first failure is returned.
    ikv_status write_status = IKV_OK;
    if (keep != 0) {
        PageRec *rec = seq.pages[tail];
        for (uint32_t l = 0; l < s.n_layers; ++l) {
            LayerState &ls = seq.layers[l];
            ikv_status st = restage_from_page(pool, seq, l, *rec, keep);
            const uint64_t half = stage_floats(s) / 2;
            if (st == IKV_OK)
                st = pool->store->write_layer(rec->format, rec->bytes, l, ls.stage, ls.stage + half, keep);
            if (st != IKV_OK && write_status == IKV_OK) write_status = st;
        }
    }

    std::lock_guard<std::mutex> lock(pool->state_mu);
    int64_t stage_delta = int64_t(new_stage.size());
    for (LayerState &ls : seq.layers) {
        ls.length = new_len;
        if (keep == 0 && ls.stage != nullptr) {
            pool->store->stage_free(ls.stage);
            ls.stage = nullptr;
            --stage_delta;
        }
    }
    pool->tokens_total -= n_tokens;
    pool->staging_bytes += stage_delta * int64_t(stage_bytes(s));
    seq.length = new_len;
    return write_status;
}

ikv_status seq_evict(ikv_pool *pool, ikv_seq_id id, uint32_t begin, uint32_t end) {
    constexpr const char *fn = "ikv_seq_evict";
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    Seq &seq = *seqp;
    const uint32_t P = pool->shape.page_size;
    if (begin % P != 0 || end % P != 0)
        return fail(IKV_E_INVALID, "%s: [%u, %u) is not page aligned (page_size %u)", fn, begin, end, P);
    const uint32_t tail_start = seq.length / P * P;
    if (begin > end || end > tail_start)
        return fail(IKV_E_RANGE,
                    "%s: [%u, %u) must satisfy begin <= end <= %u, the start of the tail page of sequence %u", fn,
                    begin, end, tail_start, (unsigned)id);
    std::lock_guard<std::mutex> lock(pool->state_mu);
    bool changed = false;  // evicting evicted pages does nothing (decoders keep their lists)
    for (uint32_t p = begin / P; p < end / P; ++p) {
        if (seq.pages[p] == nullptr) continue;
        unref_page_locked(pool, seq.pages[p]);
        seq.pages[p] = nullptr;
        changed = true;
    }
    if (changed) table_changed(seq);
    return IKV_OK;
}

ikv_status seq_set_page_format(ikv_pool *pool, ikv_seq_id id, uint32_t page, ikv_format format) {
    constexpr const char *fn = "ikv_seq_set_page_format";
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    Seq &seq = *seqp;
    ikv_status room = refuse_with_room(seq, id, fn);
    if (room == IKV_OK) room = pool->store->wait_appends(fn);  // the header: format changes wait for them
    if (room != IKV_OK) return room;
    if (page >= seq.pages.size())
        return fail(IKV_E_RANGE, "%s: page %u is out of range; sequence %u has %zu pages", fn, page, (unsigned)id,
                    seq.pages.size());
    PageRec *rec = seq.pages[page];
    if (rec == nullptr)
        return fail(IKV_E_EVICTED, "%s: page %u of sequence %u was evicted", fn, page, (unsigned)id);
    TempStage buf(pool->store.get());
    PageRec fresh;
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        if (rec->refs > 1)
            return fail(IKV_E_SHARED, "%s: page %u of sequence %u is shared with %u other sequence(s) by fork", fn,
                        page, (unsigned)id, rec->refs - 1);
        if (rec->format == format) return IKV_OK;
        ikv_status st = buf.alloc();
        if (st != IKV_OK) return st;
        // the new page is a device page; the old one frees device room only if it was one
        st = check_capacity_locked(pool, pool->page_bytes[format], rec->on_host ? 0 : pool->page_bytes[rec->format],
                                   fn);
        if (st == IKV_OK) st = alloc_page_locked(pool, format, &fresh);
        if (st != IKV_OK) return st;
    }
    const ikv_status st = convert_page(pool, seq, page, fresh, *rec, buf.get());
    std::lock_guard<std::mutex> lock(pool->state_mu);
    if (st != IKV_OK) {
        free_page_bytes_locked(pool, &fresh);
        return st;
    }
    free_page_bytes_locked(pool, rec);
    rec->bytes = fresh.bytes;
    rec->format = fresh.format;
    table_changed(seq);
    restage_partial_layers(pool, seq, page, *rec);
    return IKV_OK;
}

ikv_status seq_apply_plan_formats(ikv_pool *pool, ikv_seq_id id, const ikv_plan *plan) {
    constexpr const char *fn = "ikv_seq_apply_plan_formats";
    auto seqp = find_seq(pool, id);
    if (!seqp) return seq_not_found(fn, id);
    Seq &seq = *seqp;
    const uint32_t P = pool->shape.page_size;
    ikv_status st = refuse_with_room(seq, id, fn);
    if (st == IKV_OK) st = pool->store->wait_appends(fn);  // the header: format changes wait for them
    if (st != IKV_OK) return st;
    ikv_plan_summary sum;
    st = ikv_plan_get_summary(plan, &sum);
    if (st != IKV_OK) return st;
    if (sum.page_size != P)
        return fail(IKV_E_INVALID, "%s: the plan has page_size %u but the pool's page_size is %u", fn, sum.page_size,
                    P);
    const uint32_t full_pages = seq.length / P;
    std::vector<std::pair<uint32_t, PageRec>> changes;  // page, new storage
    TempStage buf(pool->store.get());
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        uint64_t extra = 0, freed = 0;
        try {
            for (uint32_t p = 0; p < full_pages && p < sum.pages_total; ++p) {
                PageRec *rec = seq.pages[p];
                ikv_format f = IKV_FMT_AUTO;
                if (rec == nullptr || rec->refs > 1) continue;
                if (ikv_plan_page_format(plan, p, &f) != IKV_OK || int(f) < 0 || f >= IKV_FMT_COUNT) continue;
                if (f == rec->format) continue;
                PageRec r;
                r.format = f;
                changes.emplace_back(p, r);
                extra += pool->page_bytes[f];
                if (!rec->on_host) freed += pool->page_bytes[rec->format];
            }
        } catch (const std::bad_alloc &) {
            return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
        }
        if (changes.empty()) return IKV_OK;
        st = buf.alloc();
        if (st == IKV_OK) st = check_capacity_locked(pool, extra, freed, fn);
        if (st != IKV_OK) return st;
        for (size_t i = 0; i < changes.size(); ++i) {
            st = alloc_page_locked(pool, changes[i].second.format, &changes[i].second);
            if (st != IKV_OK) {
                for (size_t j = 0; j < i; ++j) free_page_bytes_locked(pool, &changes[j].second);
                return st;
            }
        }
    }
    for (auto &c : changes)
        if (st == IKV_OK) st = convert_page(pool, seq, c.first, c.second, *seq.pages[c.first], buf.get());
    std::lock_guard<std::mutex> lock(pool->state_mu);
    if (st != IKV_OK) {
        for (auto &c : changes) free_page_bytes_locked(pool, &c.second);
        return st;
    }
    for (auto &c : changes) {
        PageRec *rec = seq.pages[c.first];
        free_page_bytes_locked(pool, rec);
        rec->bytes = c.second.bytes;
        rec->format = c.second.format;
    }
    table_changed(seq);
    return IKV_OK;
}

}  // namespace ikv
