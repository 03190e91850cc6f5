// Pool lifetime, sequence lifetime, fork, statistics, and the page
// accounting helpers every other pool file uses.
#include <algorithm>
#include <new>

#include "pool/pool_internal.hpp"

namespace ikv {

std::shared_ptr<Seq> find_seq(const ikv_pool *pool, ikv_seq_id id) {
    std::shared_lock<std::shared_mutex> lock(pool->table_mu);
    auto it = pool->seqs.find(id);
    return it == pool->seqs.end() ? nullptr : it->second;
}

ikv_status check_room_locked(const ikv_pool *pool, bool host_tier, uint64_t extra, uint64_t freed, const char *fn) {
    const uint64_t used = host_tier ? pool->host_used_bytes : pool->used_bytes;
    const uint64_t cap = host_tier ? pool->config.host_capacity_bytes : pool->config.capacity_bytes;
    if (extra > freed && used - freed + extra > cap)
        return fail(IKV_E_NOMEM, "%s: needs %llu more bytes of %s but %llu of %s %llu are in use", fn,
                    (unsigned long long)(extra - freed), host_tier ? "the host tier" : "page storage",
                    (unsigned long long)used, host_tier ? "host_capacity_bytes" : "capacity_bytes",
                    (unsigned long long)cap);
    return IKV_OK;
}

ikv_status alloc_page_locked(ikv_pool *pool, ikv_format f, PageRec *rec) {
    const ikv_status st = pool->store->alloc(f, &rec->bytes);
    if (st != IKV_OK) return st;
    rec->format = f;
    rec->refs = 1;
    rec->on_host = false;  // new pages are device (or CPU) pages; only pool_tier.cpp moves them
    rec->last_used = pool->tier_clock;  // a new page is in use, not idle
    pool->used_bytes += pool->page_bytes[f];
    pool->pages_used += 1;
    pool->pages_by_format[f] += 1;
    pool->bytes_by_format[f] += pool->page_bytes[f];
    return IKV_OK;
}

void free_page_bytes_locked(ikv_pool *pool, PageRec *rec) {
    const ikv_format f = rec->format;
    const uint64_t b = pool->page_bytes[f];
    pool->store->release(f, rec->bytes);  // the store knows which tier's memory it is
    rec->bytes = nullptr;
    if (rec->on_host) {
        pool->host_used_bytes -= b;
        pool->host_pages -= 1;
        rec->on_host = false;
    } else {
        pool->used_bytes -= b;
    }
    pool->pages_used -= 1;
    pool->pages_by_format[f] -= 1;
    pool->bytes_by_format[f] -= b;
}

void free_new_staging(ikv_pool *pool, Seq *seq, std::vector<uint32_t> &layers) {
    for (uint32_t l : layers) {
        pool->store->stage_free(seq->layers[l].stage);
        seq->layers[l].stage = nullptr;
    }
    layers.clear();
}

void unref_page_locked(ikv_pool *pool, PageRec *rec) {
    if (rec == nullptr) return;
    if (--rec->refs > 0) return;
    free_page_bytes_locked(pool, rec);
    delete rec;
}

ikv_status pool_create(const ikv_pool_config &config, ikv_pool **out) {
    ikv_pool *pool = new (std::nothrow) ikv_pool;
    if (pool == nullptr) return fail(IKV_E_NOMEM, "ikv_pool_create: out of host memory");
    pool->config = config;
    pool->shape = PageShape{config.n_layers, config.n_kv_heads, config.head_dim, config.page_size};
    for (int f = 0; f < IKV_FMT_COUNT; ++f) pool->page_bytes[f] = page_bytes(pool->shape, ikv_format(f));
    const ikv_status st = config.backend == IKV_BACKEND_CUDA ? make_cuda_store(config, &pool->store)
                                                             : make_host_store(config, &pool->store);
    if (st != IKV_OK) {
        delete pool;
        return st;
    }
    *out = pool;
    return IKV_OK;
}

void pool_destroy(ikv_pool *pool) {
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        for (auto &kv : pool->seqs) {
            for (PageRec *rec : kv.second->pages) unref_page_locked(pool, rec);
            free_stages(pool, *kv.second);  // before the store goes
        }
    }
    pool->seqs.clear();
    delete pool;  // the store frees its slabs
}

void pool_stats(const ikv_pool *pool, ikv_pool_stats *out) {
    std::shared_lock<std::shared_mutex> table(pool->table_mu);
    std::lock_guard<std::mutex> lock(pool->state_mu);
    out->capacity_bytes = pool->config.capacity_bytes;
    out->used_bytes = pool->used_bytes;
    out->pages_used = pool->pages_used;
    for (int f = 0; f < IKV_FMT_COUNT; ++f) {
        out->pages_by_format[f] = pool->pages_by_format[f];
        out->bytes_by_format[f] = pool->bytes_by_format[f];
    }
    out->reserved_bytes = pool->store->reserved_bytes();
    out->staging_bytes = pool->staging_bytes;
    out->n_sequences = uint32_t(pool->seqs.size());
    out->tokens_total = pool->tokens_total;
    out->host_used_bytes = pool->host_used_bytes;
    out->host_pages = pool->host_pages;
    out->bytes_offloaded = pool->bytes_offloaded;
    out->bytes_fetched = pool->bytes_fetched;
    out->host_page_reads = pool->host_page_reads.load(std::memory_order_relaxed);
    out->host_reserved_bytes = pool->store->host_reserved_bytes();
}

ikv_status seq_create(ikv_pool *pool, ikv_seq_id *id_out) {
    try {
        auto seq = std::make_shared<Seq>();
        seq->layers.resize(pool->shape.n_layers);
        std::unique_lock<std::shared_mutex> lock(pool->table_mu);
        while (pool->seqs.count(pool->next_id) != 0) ++pool->next_id;  // after 2^32 ids: skip live ones
        const ikv_seq_id id = pool->next_id;
        pool->seqs.emplace(id, std::move(seq));
        ++pool->next_id;
        *id_out = id;
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "ikv_seq_create: out of host memory");
    }
    return IKV_OK;
}

ikv_status seq_destroy(ikv_pool *pool, ikv_seq_id id) {
    std::shared_ptr<Seq> seq;
    {
        std::unique_lock<std::shared_mutex> lock(pool->table_mu);
        auto it = pool->seqs.find(id);
        if (it == pool->seqs.end()) return seq_not_found("ikv_seq_destroy", id);
        seq = std::move(it->second);
        pool->seqs.erase(it);
    }
    void *room = nullptr;
    {
        std::lock_guard<std::mutex> lock(pool->state_mu);
        std::swap(room, seq->reservation);
    }
    if (room != nullptr) pool->store->room_free(room);  // waits for the device; graphs with it read nothing now
    std::lock_guard<std::mutex> lock(pool->state_mu);
    for (PageRec *rec : seq->pages) unref_page_locked(pool, rec);
    pool->staging_bytes -= free_stages(pool, *seq) * stage_bytes(pool->shape);
    pool->tokens_total -= seq->length;
    return IKV_OK;
}

ikv_status seq_length(const ikv_pool *pool, ikv_seq_id id, uint32_t *length_out) {
    auto seq = find_seq(pool, id);
    if (!seq) return seq_not_found("ikv_seq_length", id);
    *length_out = seq->length;
    return IKV_OK;
}

ikv_status seq_layer_length(const ikv_pool *pool, ikv_seq_id id, uint32_t layer, uint32_t *length_out) {
    constexpr const char *fn = "ikv_seq_layer_length";
    auto seq = find_seq(pool, id);
    if (!seq) return seq_not_found(fn, id);
    if (layer >= seq->layers.size())
        return fail(IKV_E_RANGE, "%s: layer %u is out of range; the pool has %u layers", fn, layer,
                    unsigned(seq->layers.size()));
    *length_out = seq->layers[layer].length;
    return IKV_OK;
}

ikv_status seq_fork(ikv_pool *pool, ikv_seq_id parent_id, ikv_seq_id *child_out) {
    constexpr const char *fn = "ikv_seq_fork";
    auto parent = find_seq(pool, parent_id);
    if (!parent) return seq_not_found(fn, parent_id);
    ikv_status room = refuse_with_room(*parent, parent_id, fn);
    if (room != IKV_OK) return room;
    room = pool->store->wait_appends(fn);  // the shared pages are complete (the header's rule)
    if (room != IKV_OK) return room;
    std::shared_ptr<Seq> child;
    try {
        child = std::make_shared<Seq>();
        // Block table (refs taken below): the pages that hold tokens, not a
        // room reserved ahead on a CPU pool (the child reserves its own).
        uint32_t longest = 0;
        for (const LayerState &ls : parent->layers) longest = std::max(longest, ls.length);
        const size_t held = (uint64_t(longest) + pool->shape.page_size - 1) / pool->shape.page_size;
        child->pages.assign(parent->pages.begin(), parent->pages.begin() + std::min(held, parent->pages.size()));
        child->layers.resize(parent->layers.size());
    } catch (const std::bad_alloc &) {
        return fail(IKV_E_NOMEM, "%s: out of host memory copying sequence %u", fn, (unsigned)parent_id);
    }
    child->length = parent->length;
    // Lengths and staging copies (the store's memory: host or device).
    uint32_t n_stages = 0;
    for (size_t l = 0; l < parent->layers.size(); ++l) {
        child->layers[l].length = parent->layers[l].length;
        if (parent->layers[l].stage == nullptr) continue;
        ikv_status st = pool->store->stage_alloc(&child->layers[l].stage);
        if (st == IKV_OK) st = pool->store->stage_copy(child->layers[l].stage, parent->layers[l].stage);
        if (st != IKV_OK) {
            free_stages(pool, *child);
            return st;
        }
        ++n_stages;
    }
    try {
        std::unique_lock<std::shared_mutex> table(pool->table_mu);
        while (pool->seqs.count(pool->next_id) != 0) ++pool->next_id;
        const ikv_seq_id id = pool->next_id;
        pool->seqs.emplace(id, child);
        ++pool->next_id;
        std::lock_guard<std::mutex> lock(pool->state_mu);
        for (PageRec *rec : child->pages)
            if (rec != nullptr) ++rec->refs;
        pool->staging_bytes += n_stages * stage_bytes(pool->shape);
        pool->tokens_total += child->length;
        *child_out = id;
    } catch (const std::bad_alloc &) {
        free_stages(pool, *child);
        return fail(IKV_E_NOMEM, "%s: out of host memory copying sequence %u", fn, (unsigned)parent_id);
    }
    return IKV_OK;
}

}  // namespace ikv
