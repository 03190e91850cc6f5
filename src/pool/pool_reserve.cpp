// ikv_pool_reserve: room for the next tokens of a set of sequences, allocated
// ahead, so that an engine can capture its whole decode step (every layer's
// append and decode) in one CUDA graph and replay it while the sequences grow.
//
// The pages of the room are allocated (and a shared tail copied) here, on the
// host, where allocation may happen. On a store that keeps room lengths (the
// CUDA store) the sequence then gets a record in device memory: its per-layer
// lengths, the room's pages and its layers' staging. Appends to it
// (write_room_append) write at the device's length and advance it; decodes
// read the device's length (pool_read.cpp: decode_length, the snapshot's
// device_lengths). The host's lengths count eager appends only, until
// take_room_lengths brings them up to the device's (ikv_pool_sync,
// ikv_pool_reserve itself).
#include <algorithm>
#include <new>
#include <vector>

#include "pool/pool_internal.hpp"

namespace ikv {
namespace {

constexpr const char *kFn = "ikv_pool_reserve";

uint32_t longest_layer(const Seq &seq) {
    uint32_t len = 0;
    for (const LayerState &ls : seq.layers) len = std::max(len, ls.length);
    return len;
}

// What one sequence of the call needs: pages to create, shared pages to
// copy, pages past the room to release, staging to allocate.
struct RoomPart {
    std::shared_ptr<Seq> seq;
    ikv_seq_id id = 0;
    uint32_t end = 0;       // the new room's end (0: none)
    uint32_t n_pages = 0;   // pages the sequence keeps: ceil(max(end, longest layer) / P)
    std::vector<std::pair<uint32_t, PageRec *>> fresh, copies;  // (page, new record)
    std::vector<uint32_t> new_stage;                            // layers whose staging this call allocated
    void *record = nullptr;      // the store's record prepared for the new room (device lengths)
    bool new_record = false;     // ... made by this call (goes back on failure)
    // What write_record hands the store, allocated before the room is committed.
    std::vector<uint32_t> rec_lengths;
    std::vector<float *> rec_stages;
    std::vector<uint8_t *> rec_pages;
    std::vector<ikv_format> rec_formats;
};

// A room's pages start at the shortest layer's tail page: complete_pages()
// (pool_tier.cpp), the pages complete in every layer.

void unwind(ikv_pool *pool, std::vector<RoomPart> &parts) {
    for (RoomPart &rp : parts) {
        free_new_staging(pool, rp.seq.get(), rp.new_stage);
        for (auto &e : rp.fresh) delete e.second;
        for (auto &e : rp.copies) delete e.second;
        rp.fresh.clear();
        rp.copies.clear();
    }
}

// Records for the pages a part creates and copies (host memory only).
// Throws std::bad_alloc (the caller unwinds). Under state_mu: a page's refs
// change when another sequence sharing it is forked or destroyed, which may
// run meanwhile (a page that stops being shared after this is copied all the
// same, which costs a copy and changes nothing else).
void plan_part(const ikv_pool *pool, RoomPart &rp) {
    const Seq &seq = *rp.seq;
    if (rp.end == 0) return;
    std::lock_guard<std::mutex> lock(pool->state_mu);
    for (uint32_t p = complete_pages(pool, seq); p < rp.n_pages; ++p) {
        if (p >= seq.pages.size()) {
            rp.fresh.emplace_back(p, nullptr);
            rp.fresh.back().second = new PageRec;
            rp.fresh.back().second->format = default_page_format(pool);
        } else if (seq.pages[p] != nullptr && seq.pages[p]->refs > 1) {
            rp.copies.emplace_back(p, nullptr);
            rp.copies.back().second = new PageRec;
            rp.copies.back().second->format = seq.pages[p]->format;
        }
    }
}

// Pages part rp keeps, and whether the new ones could fit at all (checked
// again when they are allocated), before a record is made for any of them.
ikv_status size_part(ikv_pool *pool, RoomPart &rp) {
    const uint32_t P = pool->shape.page_size;
    const uint64_t reach = std::max<uint64_t>(rp.end, longest_layer(*rp.seq));
    rp.n_pages = uint32_t((reach + P - 1) / P);
    const uint64_t fresh = rp.n_pages > rp.seq->pages.size() ? rp.n_pages - rp.seq->pages.size() : 0;
    std::lock_guard<std::mutex> lock(pool->state_mu);
    return check_capacity_locked(pool, fresh * pool->page_bytes[default_page_format(pool)], 0, kFn);
}

// Under state_mu: capacity for every part's new pages (less what released
// pages free), then their allocation; all or nothing.
ikv_status allocate_locked(ikv_pool *pool, std::vector<RoomPart> &parts) {
    // A fork and its parent in one call: the last keeps their shared page (plan_part planned two copies).
    keep_last_shared_copy_locked(parts, [](std::pair<uint32_t, PageRec *> &e, const PageRec *) { delete e.second; });
    uint64_t extra = 0;
    for (const RoomPart &rp : parts) {
        const Seq &seq = *rp.seq;
        for (uint32_t p = complete_pages(pool, seq); p < std::min<size_t>(rp.n_pages, seq.pages.size()); ++p)
            if (seq.pages[p] == nullptr)
                return fail(IKV_E_EVICTED, "%s: page %u of sequence %u, where its next tokens land, was evicted", kFn,
                            p, (unsigned)rp.id);
        // Pages past a shrinking room free room only once they go (after the
        // records are written): no credit for them here.
        for (const auto &e : rp.fresh) extra += pool->page_bytes[e.second->format];
        for (const auto &e : rp.copies) extra += pool->page_bytes[e.second->format];
    }
    ikv_status st = check_capacity_locked(pool, extra, 0, kFn);
    if (st != IKV_OK) return st;
    for (size_t i = 0; i < parts.size(); ++i)
        for (auto *list : {&parts[i].fresh, &parts[i].copies})
            for (size_t j = 0; j < list->size(); ++j) {
                st = alloc_page_locked(pool, (*list)[j].second->format, (*list)[j].second);
                if (st == IKV_OK) continue;
                // Release what this loop allocated before (i, list, j), in the same order.
                for (size_t i2 = 0; i2 <= i; ++i2)
                    for (auto *l2 : {&parts[i2].fresh, &parts[i2].copies})
                        for (size_t j2 = 0; j2 < l2->size(); ++j2) {
                            if (i2 == i && l2 == list && j2 == j) return st;
                            free_page_bytes_locked(pool, (*l2)[j2].second);
                        }
                return st;
            }
    return IKV_OK;
}

// Under state_mu: the block table takes the new pages (fresh ones follow the
// last page: a room that grows has no pages past its old end to drop).
// Nothing here fails (capacity reserved by plan_part, the block table's
// room by seqs_reserve right after the pages were allocated).
void commit_locked(ikv_pool *pool, RoomPart &rp) {
    Seq &seq = *rp.seq;
    for (auto &e : rp.copies) {
        unref_page_locked(pool, seq.pages[e.first]);
        seq.pages[e.first] = e.second;
    }
    for (auto &e : rp.fresh) seq.pages.push_back(e.second);  // consecutive from pages.size()
    table_changed(seq);  // also when no page changed: the decode's lists follow the room (pool_read.cpp)
    rp.fresh.clear();
    rp.copies.clear();
}

// Under state_mu, once no record points at them: the pages past the room go.
void drop_past_room_locked(ikv_pool *pool, RoomPart &rp) {
    Seq &seq = *rp.seq;
    for (size_t p = rp.n_pages; p < seq.pages.size(); ++p)
        if (seq.pages[p] != nullptr) unref_page_locked(pool, seq.pages[p]);
    if (seq.pages.size() > rp.n_pages) {
        seq.pages.resize(rp.n_pages);
        table_changed(seq);
    }
}

// The store's record of rp's room, prepared by room_prepare (the vectors
// have their capacity: nothing allocates here).
ikv_status write_record(ikv_pool *pool, RoomPart &rp) {
    const Seq &seq = *rp.seq;
    const uint32_t P = pool->shape.page_size, L = pool->shape.n_layers;
    const uint32_t first = complete_pages(pool, seq), last = (rp.end + P - 1) / P;  // pages [first, last)
    rp.rec_lengths.clear();
    rp.rec_stages.clear();
    rp.rec_pages.clear();
    rp.rec_formats.clear();
    for (uint32_t l = 0; l < L; ++l) {
        rp.rec_lengths.push_back(seq.layers[l].length);
        rp.rec_stages.push_back(seq.layers[l].stage);
    }
    for (uint32_t p = first; p < last; ++p) {
        rp.rec_pages.push_back(seq.pages[p]->bytes);
        rp.rec_formats.push_back(seq.pages[p]->format);
    }
    const PageStore::Room room{rp.id,          rp.rec_lengths.data(), first,
                               last - first,   rp.end,                rp.rec_pages.data(),
                               rp.rec_formats.data(), rp.rec_stages.data()};
    return pool->store->room_set(room, rp.record);
}

// Records for every part whose new room the device keeps, all or none.
ikv_status prepare_records(ikv_pool *pool, std::vector<RoomPart> &parts) {
    for (RoomPart &rp : parts) {
        if (rp.end == 0) continue;
        void *rec = nullptr;
        {
            std::lock_guard<std::mutex> lock(pool->state_mu);
            rec = rp.seq->reservation;
        }
        rp.new_record = rec == nullptr;
        const uint32_t n_pages = (rp.end + pool->shape.page_size - 1) / pool->shape.page_size -
                                 complete_pages(pool, *rp.seq);
        ikv_status st = IKV_OK;
        try {
            rp.rec_lengths.reserve(pool->shape.n_layers);
            rp.rec_stages.reserve(pool->shape.n_layers);
            rp.rec_pages.reserve(n_pages);
            rp.rec_formats.reserve(n_pages);
        } catch (const std::bad_alloc &) {
            st = fail(IKV_E_NOMEM, "%s: out of host memory", kFn);
        }
        if (st == IKV_OK) st = pool->store->room_prepare(n_pages, &rec);
        if (st != IKV_OK) {
            for (RoomPart &q : parts)
                if (q.new_record && q.record != nullptr) pool->store->room_free(q.record);
            for (RoomPart &q : parts) q.record = nullptr;
            return st;
        }
        rp.record = rec;
    }
    return IKV_OK;
}

}  // namespace

ikv_status take_room_lengths(ikv_pool *pool, Seq &seq, ikv_seq_id id, PageStore::RoomReport *taken) {
    if (taken != nullptr) *taken = PageStore::RoomReport{};
    void *rec = nullptr;
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        rec = seq.reservation;
    }
    if (rec == nullptr) return IKV_OK;
    const uint32_t L = pool->shape.n_layers;
    std::vector<uint32_t> lengths;
    try {
        lengths.resize(L);
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory", current_call());
    }
    PageStore::RoomReport report;
    const ikv_status st = pool->store->room_take(rec, lengths.data(), &report);
    if (st != IKV_OK) return st;
    if (taken != nullptr) *taken = report;
    std::lock_guard<std::mutex> lock(pool->state_mu);
    if (seq.reservation != rec) return IKV_OK;  // the room ended meanwhile (another thread)
    // The device's lengths (the host never advances a sequence with room
    // itself); never backwards: a take that read the device earlier may land
    // after a later one (another thread).
    const uint32_t old_length = seq.length;
    uint32_t len = UINT32_MAX;
    for (uint32_t l = 0; l < L; ++l) {
        seq.layers[l].length = std::max(seq.layers[l].length, lengths[l]);
        len = std::min(len, seq.layers[l].length);
    }
    seq.length = len;
    pool->tokens_total += seq.length - old_length;
    if (report.overrun_layer >= 0 && !pool->room_report.found)
        pool->room_report = RoomIncident{true, false, id, uint32_t(report.overrun_layer)};
    if (report.stale_read && !pool->room_report.found) pool->room_report = RoomIncident{true, true, id, 0};
    return IKV_OK;
}

ikv_status room_append_prepare(ikv_pool *pool, const std::shared_ptr<Seq> *seqs, const ikv_seq_id *ids, uint32_t n_seqs,
                               const AppendSource &src_in, uint32_t l0, uint32_t l1, RoomAppendReady *out) {
    const char *fn = src_in.fn;
    const uint32_t P = pool->shape.page_size, n = src_in.seq_tokens;
    for (uint32_t i = 0; i < n_seqs; ++i)
        if (seqs[i]->reservation == nullptr)
            return fail(IKV_E_INVALID,
                        "%s: sequence %u has no reserved room but others of the call have; append to sequences with "
                        "room (ikv_pool_reserve) and without it in separate calls",
                        fn, (unsigned)ids[i]);
    if (n > P)
        return fail(IKV_E_INVALID,
                    "%s: n_tokens %u exceeds page_size %u; an append to a sequence with reserved room carries at most "
                    "one page of tokens",
                    fn, n, P);
    if (n_seqs > kMaxRoomSeqsPerAppend)
        return fail(IKV_E_INVALID, "%s: %u sequences with reserved room in one append; at most %u", fn, n_seqs,
                    kMaxRoomSeqsPerAppend);
    if (!src_in.on_device)
        return fail(IKV_E_INVALID,
                    "%s: sequences with reserved room take device input (src_on_device = 1); the device writes "
                    "them at its own lengths",
                    fn);
    for (uint32_t i = 0; i < n_seqs; ++i)
        for (uint32_t l = l0; l < l1; ++l)
            if (uint64_t(seqs[i]->layers[l].length) + n > seqs[i]->reserved_end)
                return fail(IKV_E_RANGE,
                            "%s: layer %u of sequence %u holds %u tokens; %u more pass its room, which ends at %u "
                            "(ikv_pool_reserve)",
                            fn, l, (unsigned)ids[i], seqs[i]->layers[l].length, n, seqs[i]->reserved_end);
    RoomAppendReady &r = *out;
    r.src = src_in;
    r.src.room = true;
    r.l0 = l0;
    r.l1 = l1;
    ikv_status st = pool->store->check_source(r.src);
    if (st == IKV_OK) st = pool->store->stream_capturing(r.src.stream, fn, &r.capturing);
    if (st != IKV_OK) return st;
    if (!r.src.async) {  // checked before anything is written, as every synchronous append
        NonFinite bad;
        st = pool->store->find_nonfinite(r.src, l0, l1, &bad);
        if (st != IKV_OK) return st;
        if (bad.found)
            return fail(IKV_E_INVALID,
                        "%s: %s[sequence %u, layer %u, token %u, head %u, channel %u] is %s; the pool stores finite "
                        "values only",
                        fn, bad.which == 0 ? "k" : "v", (unsigned)ids[bad.token / n], bad.layer, bad.token % n,
                        bad.head, bad.channel, bad.value_name());
    }
    // The kernel for one format when every page of every room has it.
    int only_format = -2;
    bool pages16 = true;
    try {
        r.records.resize(n_seqs);
        r.seqs.assign(seqs, seqs + n_seqs);
        r.ids.assign(ids, ids + n_seqs);
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        for (uint32_t i = 0; i < n_seqs; ++i) {
            const Seq &seq = *seqs[i];
            r.records[i] = seq.reservation;
            for (size_t p = complete_pages(pool, seq); p < seq.pages.size(); ++p) {
                if (seq.pages[p] == nullptr) continue;  // evicted behind the device's length
                const int f = int(seq.pages[p]->format);
                only_format = only_format == -2 || only_format == f ? f : -1;
                pages16 = pages16 && (f == IKV_FMT_F16 || f == IKV_FMT_BF16);
            }
        }
    }
    r.only_format = only_format < 0 ? -1 : only_format;
    r.pages16 = pages16;
    r.pending = true;
    return IKV_OK;
}

ikv_status room_append_run(ikv_pool *pool, RoomAppendReady &r) {
    r.pending = false;
    const char *fn = r.src.fn;
    const uint32_t n_seqs = uint32_t(r.seqs.size()), n = r.src.seq_tokens;
    ikv_status st = pool->store->write_room_append(r.src, r.records.data(), n_seqs, r.l0, r.l1, r.only_format);
    // The device advances the lengths (or reports an overrun); the host takes
    // them in ikv_pool_sync, or now for a synchronous append, which waited.
    if (st != IKV_OK || r.capturing || r.src.async) return st;
    // A synchronous append the device refused (the host's lengths were behind
    // the replays') is reported by the call itself, whatever else is pending.
    int64_t bad = -1, bad_layer = -1;
    for (uint32_t i = 0; i < n_seqs && st == IKV_OK; ++i) {
        PageStore::RoomReport taken;
        st = take_room_lengths(pool, *r.seqs[i], r.ids[i], &taken);
        if (st == IKV_OK && taken.overrun_layer >= 0 && bad < 0) bad = i, bad_layer = taken.overrun_layer;
    }
    if (st != IKV_OK || bad < 0) return st;
    std::lock_guard<std::mutex> lock(pool->state_mu);
    const RoomIncident inc = pool->room_report;  // the call's own overrun is not left for ikv_pool_sync
    if (inc.found && !inc.stale_read && inc.seq == r.ids[bad] && inc.layer == uint32_t(bad_layer))
        pool->room_report = RoomIncident{};
    return fail(IKV_E_RANGE,
                "%s: layer %u of sequence %u has no room for %u more tokens (its room ends at %u; graph replays "
                "filled it); nothing was written",
                fn, uint32_t(bad_layer), (unsigned)r.ids[bad], n, r.seqs[bad]->reserved_end);
}

ikv_status pool_fused_append_begin(ikv_pool *pool, const RoomAppendReady &r, void *fused) {
    return pool->store->fused_append_begin(r.src, fused);
}

ikv_status pool_fused_append_end(ikv_pool *pool, RoomAppendReady &r) {
    r.pending = false;
    return pool->store->fused_append_end(r.src);
}

ikv_status room_append(ikv_pool *pool, const std::shared_ptr<Seq> *seqs, const ikv_seq_id *ids, uint32_t n_seqs,
                       const AppendSource &src, uint32_t l0, uint32_t l1) {
    RoomAppendReady ready;
    const ikv_status st = room_append_prepare(pool, seqs, ids, n_seqs, src, l0, l1, &ready);
    return st == IKV_OK ? room_append_run(pool, ready) : st;
}

ikv_status refuse_with_room(const Seq &seq, ikv_seq_id id, const char *fn) {
    if (seq.reservation == nullptr) return IKV_OK;
    return fail(IKV_E_STATE,
                "%s: sequence %u has room reserved on the device (ikv_pool_reserve); end it first with "
                "ikv_pool_reserve(pool, &seq, 1, 0)",
                fn, (unsigned)id);
}

ikv_status seqs_reserve(ikv_pool *pool, const ikv_seq_id *ids, uint32_t n_seqs, uint32_t n_tokens) {
    std::vector<std::shared_ptr<Seq>> seqs;
    ikv_status st = find_seqs_once(pool, ids, n_seqs, kFn, &seqs);
    if (st != IKV_OK) return st;
    // The device's lengths first: the room is measured from them.
    for (uint32_t i = 0; i < n_seqs; ++i) {
        st = take_room_lengths(pool, *seqs[i], ids[i]);
        if (st != IKV_OK) return st;
    }
    const bool device_lengths = pool->store->keeps_room_lengths();
    std::vector<RoomPart> parts;
    try {
        parts.resize(n_seqs);
        for (uint32_t i = 0; i < n_seqs; ++i) {
            RoomPart &rp = parts[i];
            rp.seq = seqs[i];
            rp.id = ids[i];
            const uint64_t end = n_tokens == 0 ? 0 : uint64_t(longest_layer(*rp.seq)) + n_tokens;
            if (end > UINT32_MAX) {
                unwind(pool, parts);
                return fail(IKV_E_RANGE, "%s: sequence %u would reach %llu tokens, beyond 2^32-1", kFn,
                            (unsigned)rp.id, (unsigned long long)end);
            }
            rp.end = uint32_t(end);
            st = size_part(pool, rp);
            if (st != IKV_OK) {
                unwind(pool, parts);
                return st;
            }
            plan_part(pool, rp);
            if (rp.end != 0 && device_lengths) rp.new_stage.reserve(pool->shape.n_layers);
        }
    } catch (const std::bad_alloc &) {
        unwind(pool, parts);
        return fail(IKV_E_NOMEM, "%s: out of host memory", kFn);
    }
    // Device appends stage every layer's rows in its own buffer: all exist while the room does.
    if (device_lengths)
        for (RoomPart &rp : parts)
            for (uint32_t l = 0; rp.end != 0 && l < pool->shape.n_layers; ++l)
                if (rp.seq->layers[l].stage == nullptr) {
                    st = pool->store->stage_alloc(&rp.seq->layers[l].stage);
                    if (st != IKV_OK) {
                        unwind(pool, parts);
                        return st;
                    }
                    rp.new_stage.push_back(l);
                }
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        st = allocate_locked(pool, parts);
        // The block tables' room for their new pages, before any record is
        // prepared or part committed: commit_locked's push_back must not
        // allocate (a bad_alloc there left pages charged and half a room taken).
        if (st == IKV_OK) try {
                for (RoomPart &rp : parts) rp.seq->pages.reserve(rp.seq->pages.size() + rp.fresh.size());
            } catch (const std::bad_alloc &) {
                for (RoomPart &rp : parts) {
                    for (auto &e : rp.fresh) free_page_bytes_locked(pool, e.second);
                    for (auto &e : rp.copies) free_page_bytes_locked(pool, e.second);
                }
                st = fail(IKV_E_NOMEM, "%s: out of host memory", kFn);
            }
    }
    if (st != IKV_OK) {
        unwind(pool, parts);
        return st;
    }
    // Fill the new pages (empty) and copy the shared ones, outside the lock.
    std::vector<PageStore::PageInit> inits;
    std::vector<PageStore::PageCopy> copies;
    try {
        for (const RoomPart &rp : parts) {
            for (const auto &e : rp.fresh) inits.push_back(PageStore::PageInit{e.second->format, e.second->bytes});
            for (const auto &e : rp.copies)
                copies.push_back(
                    PageStore::PageCopy{e.second->format, e.second->bytes, rp.seq->pages[e.first]->bytes});
        }
    } catch (const std::bad_alloc &) {
        st = fail(IKV_E_NOMEM, "%s: out of host memory", kFn);
    }
    const Exec ex;
    if (st == IKV_OK) st = pool->store->init_pages(inits.data(), inits.size(), ex);
    if (st == IKV_OK) st = pool->store->copy_pages(copies.data(), copies.size(), ex);
    if (st == IKV_OK && device_lengths) st = prepare_records(pool, parts);  // the last step that allocates
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        if (st != IKV_OK) {
            for (RoomPart &rp : parts) {
                for (auto &e : rp.fresh) free_page_bytes_locked(pool, e.second);
                for (auto &e : rp.copies) free_page_bytes_locked(pool, e.second);
            }
            unwind(pool, parts);
            return st;
        }
        for (RoomPart &rp : parts) {
            pool->staging_bytes += rp.new_stage.size() * stage_bytes(pool->shape);
            rp.new_stage.clear();
            commit_locked(pool, rp);
        }
    }
    // The records: written (a room), or retired (a room that ends); only then
    // do the pages past each room go, since a record may point at them. A
    // device error writing a record is returned; that sequence and the ones
    // after it keep their old rooms (with the new pages allocated).
    ikv_status first_error = IKV_OK;
    for (RoomPart &rp : parts) {
        Seq &seq = *rp.seq;
        if (device_lengths && rp.end != 0) {
            st = first_error == IKV_OK ? write_record(pool, rp) : first_error;  // after a failure: old rooms
            if (st != IKV_OK) {
                if (rp.new_record) pool->store->room_free(rp.record);  // never written: back to the store
                first_error = st;
                continue;
            }
        } else if (device_lengths) {
            if (first_error != IKV_OK) continue;  // after a failure: old rooms
            void *old = nullptr;
            {
                std::lock_guard<std::mutex> lock(pool->state_mu);
                std::swap(old, seq.reservation);
            }
            if (old != nullptr) pool->store->room_free(old);  // waits for the device
        }
        std::lock_guard<std::mutex> lock(pool->state_mu);
        if (device_lengths && rp.end != 0) seq.reservation = rp.record;
        seq.reserved_end = rp.end;
        drop_past_room_locked(pool, rp);
        if (rp.end == 0)  // staging again only where a layer's tail page is partial
            for (LayerState &ls : seq.layers)
                if (ls.stage != nullptr && ls.length % pool->shape.page_size == 0) {
                    pool->store->stage_free(ls.stage);
                    ls.stage = nullptr;
                    pool->staging_bytes -= stage_bytes(pool->shape);
                }
    }
    return first_error;
}

ikv_status take_room_reports(ikv_pool *pool, bool report) {
    std::vector<std::pair<ikv_seq_id, std::shared_ptr<Seq>>> with_room;
    try {
        std::shared_lock<std::shared_mutex> table(pool->table_mu);
        std::lock_guard<std::mutex> lock(pool->state_mu);  // reservation changes under it
        for (const auto &e : pool->seqs)
            if (e.second->reservation != nullptr) with_room.emplace_back(e.first, e.second);
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "ikv_pool_sync: out of host memory");
    }
    for (auto &e : with_room) {
        const ikv_status st = take_room_lengths(pool, *e.second, e.first);
        if (st != IKV_OK) return st;
    }
    ikv_seq_id ended_seq = 0;  // rooms that ended: what they met before, or replays of their graphs since
    PageStore::RoomReport ended;
    const ikv_status st = pool->store->room_take_ended(&ended_seq, &ended);
    if (st != IKV_OK) return st;
    if (ended.stale_read || ended.overrun_layer >= 0) {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        if (!pool->room_report.found)
            pool->room_report = ended.stale_read ? RoomIncident{true, true, ended_seq, 0}
                                                 : RoomIncident{true, false, ended_seq, uint32_t(ended.overrun_layer)};
    }
    if (!report) {  // another report came first: every incident found is cleared all the same
        std::lock_guard<std::mutex> lock(pool->state_mu);
        pool->room_report = RoomIncident{};
        return IKV_OK;
    }
    RoomIncident r;
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        r = pool->room_report;
        pool->room_report = RoomIncident{};
    }
    if (!r.found) return IKV_OK;
    if (r.stale_read)
        return fail(IKV_E_STATE,
                    "ikv_pool_sync: a graph captured before ikv_pool_reserve changed the room of sequence %u was "
                    "replayed (its appends wrote nothing; its decode read nothing, or only the old room); capture "
                    "the step again",
                    (unsigned)r.seq);
    return fail(IKV_E_RANGE,
                "ikv_pool_sync: an append to layer %u of sequence %u would have passed its reserved room and wrote "
                "nothing; reserve more room (ikv_pool_reserve) before replaying further",
                r.layer, (unsigned)r.seq);
}

}  // namespace ikv
