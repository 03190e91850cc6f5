// Where page bytes live. The pool's core (sequences, block tables,
// refcounts, staging, accounting) never touches page memory directly: it asks
// a PageStore to allocate, fill, read and copy pages. The host store
// (host_page_store.cpp) keeps pages in mimalloc slabs; a CUDA store keeps them
// in device memory and is created by make_cuda_store() (src/cuda/, or the
// stand-in in src/cuda/absent/ that fails with IKV_E_NO_DEVICE).
//
// Staging (the fp32 copy of a partial tail page, one buffer per sequence and
// layer: K [n_kv_heads][page_size][head_dim] then V the same) lives in the
// store's memory too: host memory for the host store, device memory for a
// CUDA store, so an append from device pointers never goes through the host.
// The core owns staging buffers through stage_alloc/stage_free and hands them
// to write_layer / write_append.
//
// Thread-safety a store must provide: alloc/release/reserved_bytes are called
// under the pool's accounting mutex (never concurrently with each other);
// init/write_layer/write_append/find_nonfinite/read_rows/read_summary/copy
// and the stage_* calls may run concurrently on different pages and buffers
// (stage_alloc/stage_free sometimes under the accounting mutex: a store's own
// lock for them must be a leaf).
#pragma once

#include <cstdint>
#include <memory>

#include "common/page_format.hpp"
#include "intentkv.h"
#include "pool/append_rows.hpp"

namespace ikv {

// How a store call runs its device work: synchronously (on the store's own
// stream, returning when it is done) or, for an asynchronous append
// (IKV_APPEND_ASYNC), enqueued on the engine's stream without waiting. Host
// stores always run synchronously.
struct Exec {
    void *stream = nullptr;  // the engine's cudaStream_t (async only)
    bool async = false;
};

// Sequences with room (ikv_pool_reserve) one append may list on a store that
// keeps their lengths (the kernel takes their records as launch parameters).
constexpr uint32_t kMaxRoomSeqsPerAppend = 1024;

class PageStore {
public:
    virtual ~PageStore() = default;

    // A page of format f (page_bytes(shape, f) bytes, 64-byte aligned). On
    // failure returns IKV_E_NOMEM / IKV_E_DEVICE with the message set.
    virtual ikv_status alloc(ikv_format f, uint8_t **page) = 0;
    // Give a page back (it may be reused by a later alloc of the same format).
    virtual void release(ikv_format f, uint8_t *page) = 0;
    // Make every sub-page empty (as write_subpage with 0 valid rows) and
    // every summary record zero.
    virtual ikv_status init(ikv_format f, uint8_t *page) = 0;
    // init() of n pages, run as ex says. The device store enqueues them all
    // and waits once (a bulk append opens a page per P tokens; one wait each
    // cost ~20 us), or not at all for an asynchronous append.
    struct PageInit {
        ikv_format format;
        uint8_t *page;
    };
    virtual ikv_status init_pages(const PageInit *pages, size_t n, const Exec &ex) {
        (void)ex;
        for (size_t i = 0; i < n; ++i) {
            const ikv_status st = init(pages[i].format, pages[i].page);
            if (st != IKV_OK) return st;
        }
        return IKV_OK;
    }
    // copy() of n pages (an append's copy-on-write of shared tail pages),
    // run as ex says.
    struct PageCopy {
        ikv_format format;
        uint8_t *dst;
        const uint8_t *src;
    };
    virtual ikv_status copy_pages(const PageCopy *pages, size_t n, const Exec &ex) {
        (void)ex;
        for (size_t i = 0; i < n; ++i) {
            const ikv_status st = copy(pages[i].format, pages[i].dst, pages[i].src);
            if (st != IKV_OK) return st;
        }
        return IKV_OK;
    }
    // Quantize the first n_valid rows of every kv-head of one layer from
    // fp32 staging of this store (k, v: [H][P][D], inside a stage_alloc
    // buffer) into the page, then recompute the layer's key summaries from
    // the stored (dequantized) keys.
    virtual ikv_status write_layer(ikv_format f, uint8_t *page, uint32_t layer, const float *k, const float *v,
                                   uint32_t n_valid) = 0;
    // As write_layer, with a hint: the previous write of this layer of this
    // page stored exactly `unchanged` rows, and rows [0, unchanged) of the
    // staging still hold the values it stored them from (an append to a
    // partial page). A store may skip re-encoding them where the format has
    // no shared scales (F16, BF16); the bytes written must equal write_layer's.
    virtual ikv_status write_layer_tail(ikv_format f, uint8_t *page, uint32_t layer, const float *k, const float *v,
                                        uint32_t n_valid, uint32_t unchanged) {
        (void)unchanged;
        return write_layer(f, page, layer, k, v, n_valid);
    }
    // Dequantize rows [t0, t0+n) of (layer, head) into host memory; row i of
    // K goes to k_out + i*out_stride (same for V). Either output may be null.
    virtual ikv_status read_rows(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t head, uint32_t t0,
                                 uint32_t n, float *k_out, float *v_out, uint64_t out_stride) const = 0;
    // The summary record of (layer, head) as stored (summary_record_bytes:
    // bf16 k_min[D], k_max[D], k_mean[D]) into host memory.
    virtual ikv_status read_summary(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t head,
                                    uint16_t *out) const = 0;

    // ---- staging buffers: 2*H*P*D floats each, in this store's memory ----
    // On failure IKV_E_NOMEM / IKV_E_DEVICE with the message set.
    virtual ikv_status stage_alloc(float **stage) = 0;
    virtual void stage_free(float *stage) = 0;
    // dst = src, whole buffers (a fork's child copies the parent's staging).
    virtual ikv_status stage_copy(float *dst, const float *src) = 0;
    // Rows [0, n_valid) of every kv-head of `stage` = the stored (dequantized)
    // rows of `layer` of page (re-staging after truncate or a format change).
    virtual ikv_status stage_from_page(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t n_valid,
                                       float *stage) = 0;

    // ---- appends ----
    // Whether the store can take this input at all, before anything changes
    // (a CUDA store refuses a stream that is capturing a graph: an append
    // changes host state that a replay would not). Message set on failure.
    virtual ikv_status check_source(const AppendSource &src) {
        (void)src;
        return IKV_OK;
    }
    // The first non-finite element of layers [l0, l1) of the input (out->found
    // false if none). Reads the input only. A store that cannot read
    // src.on_device input returns IKV_E_UNSUPPORTED with the message set.
    virtual ikv_status find_nonfinite(const AppendSource &src, uint32_t l0, uint32_t l1, NonFinite *out) = 0;
    // Carry out the writes in order (see AppendWrite): the input rows into
    // staging, then quantize-on-write of each page layer from staging. The
    // input was checked finite, except for an asynchronous append
    // (src.async: enqueued on src.stream, returns without waiting; staging
    // then keeps finite values itself and records the first non-finite
    // element for take_async_error). Otherwise returns when the pages are
    // written (device input: ordered after the engine's work on src.stream).
    virtual ikv_status write_append(const AppendSource &src, const AppendWrite *writes, size_t n_writes) = 0;
    // Before an append commits anything: the device memory write_append will
    // need (n_whole pages written whole, after each layer's first; n_writes
    // page writes in all; layer: the one appended unless src.all_layers), so
    // that running out of it refuses the append with nothing changed.
    virtual ikv_status prepare_append(const AppendSource &src, uint32_t layer, size_t n_whole, size_t n_writes) {
        (void)src;
        (void)layer;
        (void)n_whole;
        (void)n_writes;
        return IKV_OK;
    }
    // Wait for every asynchronous append's device work; then the first
    // non-finite input element any of them met since the last call (and the
    // sequence it was for), which is forgotten. Stores without asynchronous
    // appends find nothing.
    virtual ikv_status take_async_error(NonFinite *out, ikv_seq_id *seq) {
        *out = NonFinite{};
        *seq = 0;
        return IKV_OK;
    }

    // Byte copy of a whole page of format f.
    virtual ikv_status copy(ikv_format f, uint8_t *dst, const uint8_t *src) = 0;
    // Wait until the asynchronous appends' device work is done (the calls the
    // header says wait for them first, also where they touch no page
    // themselves: a truncate or fork may release or share pages that work
    // still writes). Stores without asynchronous appends return at once.
    virtual ikv_status wait_appends(const char *fn) {
        (void)fn;
        return IKV_OK;
    }

    // ---- room reserved ahead (ikv_pool_reserve; pool_reserve.cpp) ----
    // Whether this store keeps the lengths of sequences with room in its own
    // memory, where its appends advance them and decodes read them (a CUDA
    // store: so both can be captured in a graph). The host store does not:
    // room there is only pages allocated ahead.
    virtual bool keeps_room_lengths() const { return false; }
    // One sequence's room: its per-layer lengths now, the pages of positions
    // [page_first * P, end) with their formats, and its layers' staging.
    struct Room {
        ikv_seq_id seq;
        const uint32_t *lengths;  // [n_layers]
        uint32_t page_first, n_pages, end;
        uint8_t *const *pages;      // [n_pages]
        const ikv_format *formats;  // [n_pages]
        float *const *stages;       // [n_layers]
    };
    // Make *record (null: a new one) ready to hold a room of n_pages pages:
    // what writing it needs is allocated now, so that room_set after the
    // pool committed the room fails only with a device error. On failure
    // nothing changed. Message set on failure.
    virtual ikv_status room_prepare(uint32_t n_pages, void **record) {
        (void)n_pages;
        (void)record;
        return IKV_E_UNSUPPORTED;
    }
    // Write a prepared record (the caller took the device's lengths first,
    // room_take); it stays at its address (graphs captured earlier keep it),
    // under a new generation. Waits for the device. Message set on failure.
    virtual ikv_status room_set(const Room &room, void *record) {
        (void)room;
        (void)record;
        return IKV_E_UNSUPPORTED;
    }
    // Wait for the device; the record's lengths (lengths[n_layers]) and what
    // its appends and decodes met since the last call: *overrun_layer = the
    // first layer an append would have passed the room at (-1: none),
    // *stale_read = a decode found more tokens than its lists covered. Both
    // reports are cleared.
    struct RoomReport {
        int64_t overrun_layer = -1;
        bool stale_read = false;
    };
    virtual ikv_status room_take(void *record, uint32_t *lengths, RoomReport *report) {
        (void)record;
        (void)lengths;
        (void)report;
        return IKV_E_UNSUPPORTED;
    }
    // The room ends: graphs captured with it append and read nothing from now
    // on (and report it); the store may reuse the record for a later room.
    virtual void room_free(void *record) { (void)record; }
    // What records whose rooms ended met since the last call (replays of
    // graphs captured with them), cleared; *seq: the first one's sequence.
    virtual ikv_status room_take_ended(ikv_seq_id *seq, RoomReport *report) {
        *seq = 0;
        *report = RoomReport{};
        return IKV_OK;
    }
    // The record's generation (it changes with every room_set and room_free).
    virtual uint32_t room_generation(const void *record) const {
        (void)record;
        return 0;
    }
    // Whether stream is capturing a CUDA graph (a host store: never).
    virtual ikv_status stream_capturing(void *stream, const char *fn, bool *capturing) {
        (void)stream;
        (void)fn;
        *capturing = false;
        return IKV_OK;
    }
    // The record in device memory (a cuda::RoomRecord: decode reads its lengths).
    virtual void *room_on_device(const void *record) const {
        (void)record;
        return nullptr;
    }
    // An append of src.seq_tokens (<= page_size) tokens per sequence to
    // layers [l0, l1) of n_seqs sequences with room (records[i]: the batch's
    // sequence i), written at the lengths the device holds when it runs and
    // advancing them; enqueued on src.stream without waiting (capturable).
    // only_format: the format of every page the room holds, or -1.
    // A decode that does a ready room append in its own kernels (cuda_decode.cpp,
    // ikv_decode_args.append), around its launches on src.stream: begin orders
    // it as write_room_append orders an append and fills *fused (a
    // cuda::FusedAppend: the input rows and the pool's error record); end
    // records it as the pool's latest asynchronous append. CUDA stores only.
    virtual ikv_status fused_append_begin(const AppendSource &src, void *fused) {
        (void)src;
        (void)fused;
        return IKV_E_UNSUPPORTED;
    }
    virtual ikv_status fused_append_end(const AppendSource &src) {
        (void)src;
        return IKV_E_UNSUPPORTED;
    }
    virtual ikv_status write_room_append(const AppendSource &src, void *const *records, uint32_t n_seqs, uint32_t l0,
                                         uint32_t l1, int only_format) {
        (void)src;
        (void)records;
        (void)n_seqs;
        (void)l0;
        (void)l1;
        (void)only_format;
        return IKV_E_UNSUPPORTED;
    }

    // ---- the host tier (CUDA stores with host capacity; pool_tier.cpp) ----
    // Whether this store has one. The others refuse the calls below.
    virtual bool has_host_tier() const { return false; }
    // Whether moves may be enqueued on stream (a CUDA store refuses a stream
    // that is capturing a graph). Message set on failure.
    virtual ikv_status check_move_stream(void *stream, const char *fn) {
        (void)stream;
        (void)fn;
        return IKV_OK;
    }
    // A page of format f in pinned host memory the device reads directly
    // (under the pool's accounting mutex, as alloc). release() takes either
    // tier's pages.
    virtual ikv_status alloc_host(ikv_format f, uint8_t **page) {
        (void)f;
        *page = nullptr;
        return IKV_E_UNSUPPORTED;
    }
    // Copy each page to its new place on the engine's stream, behind the work
    // on it, without waiting; the store's synchronous calls wait for the
    // copies, and each source page returns to its allocator once its copy is
    // done (the caller has already dropped it from the pool's accounting).
    struct PageMove {
        ikv_format format;
        uint8_t *dst;
        uint8_t *src;
    };
    virtual ikv_status move_pages(const PageMove *moves, size_t n, void *stream) {
        (void)moves;
        (void)n;
        (void)stream;
        return IKV_E_UNSUPPORTED;
    }
    // One tier step's moves, both directions at once: the offloads (device
    // to host) run on a copy stream of the store's own, after everything
    // enqueued on `stream` so far; the fetches (host to device; or any moves,
    // as move_pages passes them) on `stream`, after earlier offloads' copies.
    // The first n_paired fetches land in the memory the first n_paired
    // offloads empty (fetches[i].dst == offloads[i].src), each after its
    // offload's copy, ordered on the device, so the bus carries the two
    // directions together; their sources become the fetched pages' places
    // and are not released. The other offload sources and every fetch
    // source return to their allocators once copied. Later reads of the
    // offloaded pages' host copies (decode over host pages, fetches, the
    // store's synchronous calls) wait for the copy stream (order_after_moves).
    virtual ikv_status exchange_pages(const PageMove *offloads, size_t n_off, const PageMove *fetches, size_t n_fetch,
                                      size_t n_paired, void *stream) {
        (void)offloads, (void)n_off, (void)fetches, (void)n_fetch, (void)n_paired, (void)stream;
        return IKV_E_UNSUPPORTED;
    }
    // Order work the caller enqueues next on `stream` after the copies of
    // exchange_pages' offloads (decode calls it when its lists hold host-tier
    // pages). A store without a copy stream has nothing to order.
    virtual ikv_status order_after_moves(void *stream, const char *fn) {
        (void)stream, (void)fn;
        return IKV_OK;
    }
    // Memory held for pages (slabs), live or free.
    virtual uint64_t reserved_bytes() const = 0;
    // Slab memory of the host tier (CUDA pools with one; else 0).
    virtual uint64_t host_reserved_bytes() const { return 0; }
};

// Host store: pages from mimalloc slabs. Fails only with IKV_E_NOMEM.
ikv_status make_host_store(const ikv_pool_config &config, std::unique_ptr<PageStore> *out);

// Device store for IKV_BACKEND_CUDA. In a build without CUDA it returns
// IKV_E_NO_DEVICE with a sentence saying so.
ikv_status make_cuda_store(const ikv_pool_config &config, std::unique_ptr<PageStore> *out);

}  // namespace ikv
