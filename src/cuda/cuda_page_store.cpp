// Device page storage for IKV_BACKEND_CUDA pools: pages of one format are
// carved from cudaMalloc'd slabs (never managed memory) on the pool's device by
// the same SlabAllocator as the host store. The pool core's fp32 staging of
// partial tail pages lives in device memory too (fixed-size buffers from
// cudaMalloc'd chunks, reused through a free list), so an append never moves
// K/V through the host:
//   find_nonfinite  device input: one kernel finds the first NaN/inf (the
//                   only device->host traffic: its 8-byte verdict); host
//                   input is scanned on the host;
//   write_append    host input is uploaded once; then per round (a set of
//                   page writes with distinct staging buffers: see
//                   plan_rounds) one kernel converts the input rows into the
//                   staging buffers and quantizes the page layers from them
//                   (kernels/stage_rows.cuh, kernels/quantize_pages.cu); up
//                   to 64 jobs travel in the launch parameters, more through
//                   the job ring (job_ring.hpp).
// Quantize-on-write writes bytes identical to write_subpage() plus the key
// summaries. Reads copy the needed bytes back and dequantize with the
// reference reader, so ikv_seq_read and ikv_seq_page_summary return exactly
// what the CPU store would; re-staging (truncate, format changes) goes the
// same way and uploads the rows.
//
// The store works on its own non-blocking stream and waits for it before each
// call returns (the PageStore calls are synchronous by contract), except for
// asynchronous appends (IKV_APPEND_ASYNC: the engine's stream, no wait); device input
// is ordered after the engine's stream with an event. Decode never goes
// through here.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "common/quant.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/device_rooms.hpp"
#include "cuda/host_tier.hpp"
#include "cuda/job_ring.hpp"
#include "ikv_kernels.h"
#include "pool/page_store.hpp"
#include "pool/slab_allocator.hpp"

namespace ikv {
namespace {

constexpr uint64_t kSlabAlign = 256;
// Device slabs are large: cudaMalloc costs tens of microseconds and cudaFree
// synchronizes the device, and a 32-layer, 8-head, head_dim 128 F16 page is
// 2.4 MB (8 MB slabs held 3 pages: a 2048-token bulk append made ~40 slabs).
// The allocator still caps a slab at a 16th of the pool's capacity (at least
// one page), and never frees device slabs to make room (cudaFree would wait).
constexpr uint64_t kSlabTargetBytes = 64ull << 20;

// Slab memory from cudaMalloc on the pool's device. A pool with a host tier
// keeps its empty slabs: pages leaving for the host and coming back would
// otherwise cudaFree (which synchronizes the device) and cudaMalloc slabs
// at every turn of a session (bench/RESULTS.md section 9).
class DeviceMemory final : public SlabMemory {
public:
    DeviceMemory(int device, bool keep_empty) : device_(device), keep_empty_(keep_empty) {}
    bool keeps_empty_slabs() const override { return keep_empty_; }
    bool frees_without_waiting() const override { return false; }  // cudaFree synchronizes the device
    ikv_status allocate(uint64_t bytes, uint8_t **out) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), current_call(), "cudaSetDevice");
        void *base = nullptr;
        const cudaError_t err = cudaMalloc(&base, bytes);
        if (err != cudaSuccess) {
            cudaGetLastError();
            return fail(IKV_E_NOMEM, "%s: cudaMalloc of a %llu-byte page slab on device %d failed: %s",
                        current_call(), (unsigned long long)bytes, device_, cudaGetErrorString(err));
        }
        *out = static_cast<uint8_t *>(base);
        return IKV_OK;
    }
    void deallocate(uint8_t *base) override {
        DeviceGuard g(device_);
        cudaFree(base);
    }

private:
    int device_;
    bool keep_empty_;
};

class CudaPageStore final : public PageStore {
public:
    CudaPageStore(const ikv_pool_config &c, cudaStream_t stream)
        : shape_{c.n_layers, c.n_kv_heads, c.head_dim, c.page_size},
          device_(c.device),
          stream_(stream),
          memory_(c.device, c.host_capacity_bytes > 0),
          slabs_(shape_, c.capacity_bytes, kSlabAlign, kSlabTargetBytes, memory_),
          host_memory_(c.device),
          stage_bytes_(cuda::stage_buffer_bytes(shape_)),  // rows and the summaries' folds (ikv_kernels.h)
          rooms_(c.n_layers) {
        if (c.host_capacity_bytes > 0)  // throws std::bad_alloc only (make_cuda_store catches it)
            host_slabs_.reset(
                new SlabAllocator(shape_, c.host_capacity_bytes, kSlabAlign, kSlabTargetBytes, host_memory_));
    }

    ~CudaPageStore() override {
        DeviceGuard g(device_);
        wait_async();  // the appends and the copy stream's offloads
        cudaStreamSynchronize(stream_);
        moved_.drain(true, [this](ikv_format f, uint8_t *p) { release(f, p); });
        ring_.reset();
        for (void *chunk : stage_chunks_) cudaFree(chunk);
        if (input_) cudaFree(input_);
        if (scratch_) cudaFree(scratch_);
        if (verdict_dev_) cudaFree(verdict_dev_);
        if (verdict_host_) cudaFreeHost(verdict_host_);
        if (error_dev_) cudaFree(error_dev_);
        if (event_) cudaEventDestroy(event_);
        if (async_done_) cudaEventDestroy(async_done_);
        if (fence_) cudaEventDestroy(fence_);
        if (copy_stream_) cudaStreamDestroy(copy_stream_);
        cudaStreamDestroy(stream_);
    }

    // Sources of finished moves go back first; if slab memory runs out while
    // moves are in flight, wait for them and try again.
    ikv_status alloc(ikv_format f, uint8_t **page) override { return alloc_from(slabs_, f, page); }
    void release(ikv_format f, uint8_t *page) override {
        if (host_slabs_ && host_slabs_->owns(page))
            host_slabs_->release(f, page);
        else
            slabs_.release(f, page);
    }

    // ---- the host tier (host_tier.hpp, pool_tier.cpp) ----

    bool has_host_tier() const override { return host_slabs_ != nullptr; }
    // A graph capture would only record the copies while the pool takes the
    // new places at once (and frees the old ones): refused, as appends are.
    ikv_status check_move_stream(void *stream, const char *fn) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        const cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
        if (err != cudaSuccess) return cuda_fail(err, fn, "cudaStreamIsCapturing of the stream");
        if (capture != cudaStreamCaptureStatusNone)
            return fail(IKV_E_INVALID,
                        "%s: the stream is capturing a CUDA graph; moving pages between the tiers changes the pool's "
                        "host state, which a replay would not, so move them before or after the capture",
                        fn);
        return IKV_OK;
    }
    ikv_status alloc_host(ikv_format f, uint8_t **page) override {
        if (!host_slabs_) return fail(IKV_E_UNSUPPORTED, "%s: the pool has no host tier", current_call());
        return alloc_from(*host_slabs_, f, page);
    }
    // Behind the engine's work on its stream (and earlier asynchronous
    // appends), as an asynchronous append's work is: the store's synchronous
    // calls wait for it. On failure nothing is left in flight. (exchange_pages'
    // second list: copies on `stream`, whichever their direction.)
    ikv_status move_pages(const PageMove *moves, size_t n, void *stream) override {
        return exchange_pages(nullptr, 0, moves, n, 0, stream);
    }

    ikv_status exchange_pages(const PageMove *offloads, size_t n_off, const PageMove *fetches, size_t n_fetch,
                              size_t n_paired, void *stream) override {
        if (n_off + n_fetch == 0) return IKV_OK;
        std::vector<DeferredReleases::Page> off_sources, fetch_sources;
        try {
            off_sources.reserve(n_off - n_paired);
            fetch_sources.reserve(n_fetch);
            moved_.reserve(2);  // the two source lists below are queued without allocating
        } catch (const std::bad_alloc &) {
            return fail(IKV_E_NOMEM, "%s: out of host memory", current_call());
        }
        ikv_status cst = check_move_stream(stream, current_call());
        if (cst != IKV_OK) return cst;
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), current_call(), "cudaSetDevice");
        Exec ex;
        ex.stream = stream;
        ex.async = true;
        cudaStream_t st = nullptr;
        cudaError_t err = begin(ex, &st);
        // The copy stream starts after the engine's work so far (the appends
        // that completed the pages, the decodes that read them).
        if (err == cudaSuccess && n_off > 0) err = ensure_copy_stream();
        if (err == cudaSuccess && n_off > 0) err = stream_waits_for(copy_stream_, st);
        // Fetches into free memory first; their sources may be earlier offloads' copies.
        if (err == cudaSuccess && n_fetch > 0) err = wait_fence(st);
        if (err == cudaSuccess) err = copy_pages_async(fetches + n_paired, n_fetch - n_paired, st);
        // Offloads in batches; each batch's paired fetches wait for it on the device.
        for (size_t b = 0; b < n_off && err == cudaSuccess; b += kExchangeBatch) {
            const size_t e = std::min(n_off, b + kExchangeBatch);
            err = copy_pages_async(offloads + b, e - b, copy_stream_);
            if (err != cudaSuccess || b >= n_paired) continue;
            err = stream_waits_for(st, copy_stream_);
            if (err == cudaSuccess) err = copy_pages_async(fetches + b, std::min(e, n_paired) - b, st);
        }
        // Sources back to their allocators once copied (paired offload sources are fetched pages' places now).
        for (size_t i = n_paired; i < n_off; ++i) off_sources.emplace_back(offloads[i].format, offloads[i].src);
        for (size_t j = 0; j < n_fetch; ++j) fetch_sources.emplace_back(fetches[j].format, fetches[j].src);
        // From here every copy is enqueued, and a paired fetch may already have
        // overwritten its offload's source: the move can only complete.
        const bool enqueued = err == cudaSuccess;
        if (err == cudaSuccess && n_off > 0) {
            std::lock_guard<std::mutex> fl(async_mu_);
            err = cudaEventRecord(fence_, copy_stream_);
            if (err == cudaSuccess) fence_pending_ = true;
        }
        if (err == cudaSuccess) err = finish(ex);
        bool off_queued = off_sources.empty(), fetch_queued = fetch_sources.empty();
        if (err == cudaSuccess && !off_queued) off_queued = (err = moved_.add(copy_stream_, off_sources)) == cudaSuccess;
        if (err == cudaSuccess && !fetch_queued) fetch_queued = (err = moved_.add(st, fetch_sources)) == cudaSuccess;
        if (err == cudaSuccess) return IKV_OK;
        // Wait for whatever was enqueued. With every copy enqueued and done,
        // the move completes (its sources not queued yet go back at the next
        // drain); otherwise the device failed and the pages moving may be lost.
        const cudaError_t s1 = cudaStreamSynchronize(st);
        const cudaError_t s2 = copy_stream_ ? cudaStreamSynchronize(copy_stream_) : cudaSuccess;
        cudaGetLastError();
        if (enqueued && s1 == cudaSuccess && s2 == cudaSuccess) {
            if (!off_queued) moved_.add_done(std::move(off_sources));
            if (!fetch_queued) moved_.add_done(std::move(fetch_sources));
            return IKV_OK;
        }
        return cuda_fail(err, current_call(), "enqueueing the copies of pages between the tiers");
    }

    ikv_status order_after_moves(void *stream, const char *fn) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        const cudaError_t err = wait_fence(static_cast<cudaStream_t>(stream));
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, fn, "waiting for the offloads' copies");
    }

    ikv_status init(ikv_format f, uint8_t *page) override {
        const PageInit one{f, page};
        return init_pages(&one, 1, Exec{});
    }

    // Every layer of every page written empty (as write_subpage with no rows:
    // zero bytes, empty scales, zero summaries; sub-pages and summaries tile a
    // page) by one launch over (page, layer) jobs. It was a memset and a
    // kernel per page: 256 launches and 0.42 ms for the 128 fresh pages of a
    // 2048-token append (bench/RESULTS.md section 3b).
    ikv_status init_pages(const PageInit *pages, size_t n, const Exec &ex) override {
        if (n == 0) return IKV_OK;
        const uint64_t n_jobs = uint64_t(n) * shape_.n_layers;
        if (n_jobs > 0x7FFFFFFFull / shape_.n_kv_heads)
            return fail(IKV_E_INVALID, "%s: too many pages at once", current_call());
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), current_call(), "cudaSetDevice");
        cudaStream_t st = nullptr;
        cudaError_t err = begin(ex, &st);
        if (err != cudaSuccess) return cuda_fail(err, current_call(), "waiting for asynchronous appends");
        Jobs jobs;
        err = ensure_append_buffers();
        if (err == cudaSuccess) err = jobs.acquire(*this, size_t(n_jobs));
        if (err != cudaSuccess) return cuda_fail(err, current_call(), "allocating the page-initialization jobs");
        for (size_t i = 0; i < n; ++i)
            for (uint32_t l = 0; l < shape_.n_layers; ++l)
                jobs.host[i * shape_.n_layers + l] =
                    cuda::AppendJob{pages[i].page, nullptr, l, 0, 0, 0, uint32_t(pages[i].format), 0};
        err = jobs.upload(st);
        if (err == cudaSuccess) err = cuda::launch_quantize_jobs(shape_, jobs.at(0), jobs.where, uint32_t(n_jobs), st);
        if (err == cudaSuccess) err = jobs.release(st);
        if (err == cudaSuccess) err = finish(ex);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, current_call(), "initializing device pages");
    }

    ikv_status copy_pages(const PageCopy *pages, size_t n, const Exec &ex) override {
        if (n == 0) return IKV_OK;
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), current_call(), "cudaSetDevice");
        cudaStream_t st = nullptr;
        cudaError_t err = begin(ex, &st);
        for (size_t i = 0; i < n && err == cudaSuccess; ++i)
            err = cudaMemcpyAsync(pages[i].dst, pages[i].src, page_bytes(shape_, pages[i].format),
                                  cudaMemcpyDefault, st);  // either tier (a host-tier page is mapped memory)
        if (err == cudaSuccess) err = finish(ex);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, current_call(), "cudaMemcpyAsync of a device page");
    }

    // k, v: device staging (a stage_alloc buffer, k its start: its summary folds are refreshed too).
    ikv_status write_layer(ikv_format f, uint8_t *page, uint32_t layer, const float *k, const float *v,
                           uint32_t n_valid) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), current_call(), "cudaSetDevice");
        cudaError_t err = wait_async();
        if (err == cudaSuccess)
            err = cuda::launch_quantize_layer(shape_, f, page, layer, k, v, n_valid, const_cast<float *>(k), stream_);
        if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, current_call(), "quantize-on-write on the device");
    }

    ikv_status read_rows(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t head, uint32_t t0, uint32_t n,
                         float *k_out, float *v_out, uint64_t out_stride) const override {
        const SubpageLayout sl = subpage_layout(f, shape_.page_size, shape_.head_dim);
        std::vector<uint8_t> sub(sl.bytes);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), current_call(), "cudaSetDevice");
        cudaError_t err = wait_async();
        if (err == cudaSuccess)
            err = cudaMemcpy(sub.data(), page + subpage_offset(shape_, f, layer, head), sl.bytes, cudaMemcpyDefault);
        if (err != cudaSuccess) return cuda_fail(err, current_call(), "cudaMemcpy of a device sub-page");
        for (uint32_t i = 0; i < n; ++i) {
            if (k_out) read_subpage_row(f, shape_.page_size, shape_.head_dim, sub.data(), 0, t0 + i, k_out + i * out_stride);
            if (v_out) read_subpage_row(f, shape_.page_size, shape_.head_dim, sub.data(), 1, t0 + i, v_out + i * out_stride);
        }
        return IKV_OK;
    }

    ikv_status read_summary(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t head,
                            uint16_t *out) const override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), "ikv_seq_page_summary", "cudaSetDevice");
        cudaError_t err = wait_async();
        if (err == cudaSuccess)
            err = cudaMemcpy(out, page + summary_offset(shape_, f, layer, head), summary_record_bytes(shape_),
                             cudaMemcpyDefault);  // either tier
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, "ikv_seq_page_summary", "cudaMemcpy of a key summary");
    }

    // On the store's stream (a plain cudaMemcpy device-to-device would not be
    // ordered with the non-blocking stream's later quantize kernels).
    ikv_status copy(ikv_format f, uint8_t *dst, const uint8_t *src) override {
        const PageCopy one{f, dst, src};
        return copy_pages(&one, 1, Exec{});
    }

    // ---- staging in device memory ----

    ikv_status stage_alloc(float **stage) override {
        std::lock_guard<std::mutex> lock(stage_mu_);
        if (stage_free_.empty()) {
            const uint64_t stride = align_up(stage_bytes_, kSlabAlign);
            const uint64_t per_chunk = std::max<uint64_t>(1, kStageChunkBytes / stride);
            DeviceGuard g(device_);
            if (g.error() != cudaSuccess) return cuda_fail(g.error(), current_call(), "cudaSetDevice");
            void *chunk = nullptr;
            const cudaError_t err = cudaMalloc(&chunk, per_chunk * stride);
            if (err != cudaSuccess) {
                cudaGetLastError();
                return fail(IKV_E_NOMEM, "%s: cudaMalloc of %llu bytes of staging on device %d failed: %s",
                            current_call(), (unsigned long long)(per_chunk * stride), device_, cudaGetErrorString(err));
            }
            try {
                stage_chunks_.push_back(chunk);
                stage_free_.reserve(stage_chunks_.size() * per_chunk);
            } catch (const std::bad_alloc &) {
                if (!stage_chunks_.empty() && stage_chunks_.back() == chunk) stage_chunks_.pop_back();
                cudaFree(chunk);
                return fail(IKV_E_NOMEM, "%s: out of host memory", current_call());
            }
            for (uint64_t i = per_chunk; i-- > 0;)
                stage_free_.push_back(reinterpret_cast<float *>(static_cast<uint8_t *>(chunk) + i * stride));
        }
        *stage = stage_free_.back();
        stage_free_.pop_back();
        return IKV_OK;
    }

    // Never fails: the free list has room for every buffer of every chunk.
    void stage_free(float *stage) override {
        std::lock_guard<std::mutex> lock(stage_mu_);
        stage_free_.push_back(stage);
    }

    ikv_status stage_copy(float *dst, const float *src) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), current_call(), "cudaSetDevice");
        cudaError_t err = wait_async();
        if (err == cudaSuccess) err = cudaMemcpyAsync(dst, src, stage_bytes_, cudaMemcpyDeviceToDevice, stream_);
        if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, current_call(), "cudaMemcpyAsync of device staging");
    }

    // Through the host: the reference reader dequantizes exactly what
    // ikv_seq_read returns, and the rows go back up once.
    ikv_status stage_from_page(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t n_valid,
                               float *stage) override {
        std::vector<float> rows;
        try {
            rows.assign(stage_bytes_ / sizeof(float), 0.0f);
        } catch (const std::bad_alloc &) {
            return fail(IKV_E_NOMEM, "%s: out of host memory", current_call());
        }
        const uint64_t head_floats = uint64_t(shape_.page_size) * shape_.head_dim;
        float *k = rows.data(), *v = rows.data() + head_floats * shape_.n_kv_heads;
        for (uint32_t h = 0; h < shape_.n_kv_heads; ++h) {
            const ikv_status st =
                read_rows(f, page, layer, h, 0, n_valid, k + h * head_floats, v + h * head_floats, shape_.head_dim);
            if (st != IKV_OK) return st;
        }
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), current_call(), "cudaSetDevice");
        cudaError_t err = cudaMemcpyAsync(stage, rows.data(), stage_bytes_, cudaMemcpyHostToDevice, stream_);
        if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, current_call(), "cudaMemcpyAsync of re-staged rows");
    }

    // ---- appends ----

    ikv_status stream_capturing(void *stream, const char *fn, bool *capturing) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        const cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
        if (err != cudaSuccess) return cuda_fail(err, fn, "cudaStreamIsCapturing of the call's stream");
        *capturing = capture != cudaStreamCaptureStatusNone;
        return IKV_OK;
    }

    ikv_status check_source(const AppendSource &src) override {
        if (!src.on_device) return IKV_OK;
        bool capturing = false;
        const ikv_status st = stream_capturing(src.stream, src.fn, &capturing);
        if (st != IKV_OK || !capturing) return st;
        if (!src.room)
            return fail(IKV_E_INVALID,
                        "%s: %s->stream is capturing a CUDA graph; an append changes the pool's host state, which "
                        "a replay would not, so append before or after the capture (or reserve room for the "
                        "sequences first: ikv_pool_reserve)",
                        src.fn, current_args());
        if (!src.async)
            return fail(IKV_E_INVALID,
                        "%s: %s->stream is capturing a CUDA graph; a captured append must not wait for the "
                        "device: set IKV_APPEND_ASYNC in %s->flags",
                        src.fn, current_args(), current_args());
        return IKV_OK;
    }

    // ---- room reserved ahead (device_rooms.hpp) ----
    bool keeps_room_lengths() const override { return true; }
    ikv_status room_prepare(uint32_t n_pages, void **record) override {
        constexpr const char *fn = "ikv_pool_reserve";
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        const cudaError_t err = ensure_append_buffers();  // a captured append cannot allocate them
        if (err != cudaSuccess) return cuda_fail(err, fn, "allocating the append buffers");
        return rooms_.prepare(n_pages, record, fn);
    }
    ikv_status room_set(const Room &room, void *record) override {
        constexpr const char *fn = "ikv_pool_reserve";
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        return rooms_.set(room, record, fn);
    }
    uint32_t room_generation(const void *record) const override { return DeviceRooms::generation(record); }
    ikv_status room_take_ended(ikv_seq_id *seq, RoomReport *report) override {
        const char *fn = current_call();
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        *seq = 0;
        return rooms_.take_retired(seq, report, fn);
    }
    ikv_status room_take(void *record, uint32_t *lengths, RoomReport *report) override {
        const char *fn = current_call();
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        return rooms_.take(record, lengths, report, fn);
    }
    void room_free(void *record) override {
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        rooms_.retire(record);
    }
    void *room_on_device(const void *record) const override { return DeviceRooms::on_device(record); }

    // Under mu_, the device set: an append to sequences with room on
    // src.stream (asynchronous, as every one there) is ordered eagerly after
    // the pool's earlier asynchronous appends (begin); a capture orders itself
    // (its stream's work is the graph's).
    ikv_status order_room_append(const AppendSource &src, bool *capturing, Exec *ex) {
        ikv_status st = stream_capturing(src.stream, src.fn, capturing);
        if (st != IKV_OK) return st;
        ex->stream = src.stream;
        ex->async = true;
        cudaStream_t stream = nullptr;
        const cudaError_t err = *capturing ? cudaSuccess : begin(*ex, &stream);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, src.fn, "ordering the append after the pool's earlier ones");
    }

    ikv_status write_room_append(const AppendSource &src, void *const *records, uint32_t n_seqs, uint32_t l0,
                                 uint32_t l1, int only_format) override {
        const char *fn = src.fn;
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        cudaStream_t stream = static_cast<cudaStream_t>(src.stream);
        std::vector<cuda::RoomRecord *> &recs = room_recs_;  // under mu_: no allocation per step once grown
        std::vector<uint32_t> &gens = room_gens_;
        try {
            recs.resize(n_seqs);
            gens.resize(n_seqs);
        } catch (const std::bad_alloc &) {
            return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
        }
        for (uint32_t i = 0; i < n_seqs; ++i) {
            recs[i] = static_cast<cuda::RoomRecord *>(DeviceRooms::on_device(records[i]));
            gens[i] = DeviceRooms::generation(records[i]);
        }
        bool capturing = false;
        Exec ex;
        const ikv_status st = order_room_append(src, &capturing, &ex);
        if (st != IKV_OK) return st;
        const cuda::RoomAppend ra{n_seqs, l0, l1 - l0, src.seq_tokens, recs.data(), gens.data()};
        cudaError_t err = cuda::launch_room_append(shape_, rows_of(src), ra, only_format, error_dev_, stream);
        if (err == cudaSuccess && !capturing) err = finish(ex);
        if (err == cudaSuccess && !capturing && !src.async) err = cudaStreamSynchronize(stream);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, fn, "the append at the device's lengths");
    }

    ikv_status fused_append_begin(const AppendSource &src, void *fused) override {
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), src.fn, "cudaSetDevice");
        bool capturing = false;
        Exec ex;
        const ikv_status st = order_room_append(src, &capturing, &ex);
        if (st != IKV_OK) return st;
        cuda::FusedAppend &f = *static_cast<cuda::FusedAppend *>(fused);
        f.in = rows_of(src);
        f.error = error_dev_;
        return IKV_OK;
    }
    ikv_status fused_append_end(const AppendSource &src) override {
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), src.fn, "cudaSetDevice");
        bool capturing = false;
        ikv_status st = stream_capturing(src.stream, src.fn, &capturing);
        if (st != IKV_OK || capturing) return st;
        Exec ex;
        ex.stream = src.stream;
        ex.async = true;
        // The store's lock was let go while the decode launched: an append
        // another thread enqueued meanwhile on another stream is the latest
        // one now, and the event finish() records must come after it too.
        cudaStream_t stream = nullptr;
        cudaError_t err = begin(ex, &stream);
        if (err == cudaSuccess) err = finish(ex);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, src.fn, "recording the append");
    }

    ikv_status find_nonfinite(const AppendSource &src, uint32_t l0, uint32_t l1, NonFinite *out) override {
        const char *fn = src.fn;
        if (!src.on_device) {
            find_nonfinite_host(src, shape_, l0, l1, out);
            return IKV_OK;
        }
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        cudaError_t err = ensure_append_buffers();
        if (err != cudaSuccess) return cuda_fail(err, fn, "allocating the append buffers");
        err = wait_async();
        if (err == cudaSuccess) err = order_after(src.stream);
        if (err == cudaSuccess) err = cudaMemsetAsync(verdict_dev_, 0xFF, sizeof(unsigned long long), stream_);
        if (err == cudaSuccess)
            err = cuda::launch_find_nonfinite(shape_, rows_of(src), l0, l1 - l0, src.n_tokens, verdict_dev_, stream_);
        if (err == cudaSuccess)
            err = cudaMemcpyAsync(verdict_host_, verdict_dev_, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                  stream_);
        if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
        if (err != cudaSuccess) return cuda_fail(err, fn, "the finiteness check of device K/V");
        *out = NonFinite{};
        const unsigned long long key = *verdict_host_;
        if (key == ~0ull) return IKV_OK;
        const uint32_t H = shape_.n_kv_heads, D = shape_.head_dim, n = src.n_tokens;
        const uint64_t e = key >> 1, row = e / D, rows_per_array = uint64_t(l1 - l0) * n * H;
        const uint64_t r = row % rows_per_array;
        out->found = true;
        out->is_nan = (key & 1) == 0;
        out->sign_unknown = !out->is_nan;
        out->which = int(row / rows_per_array);
        out->channel = uint32_t(e % D);
        out->head = uint32_t(r % H);
        out->token = uint32_t(r / H % n);
        out->layer = l0 + uint32_t(r / H / n);
        return IKV_OK;
    }

    ikv_status write_append(const AppendSource &src, const AppendWrite *writes, size_t n_writes) override {
        const char *fn = src.fn;
        if (n_writes == 0) return IKV_OK;
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        Exec ex;
        ex.stream = src.stream;
        ex.async = src.async;
        cudaStream_t st = nullptr;
        cudaError_t err = begin(ex, &st);
        if (err != cudaSuccess) return cuda_fail(err, fn, "waiting for asynchronous appends");
        Jobs jobs;
        err = ensure_append_buffers();
        if (err == cudaSuccess) err = jobs.acquire(*this, n_writes);
        if (err != cudaSuccess) return cuda_fail(err, fn, "allocating the append buffers");
        cuda::AppendRows in = rows_of(src);
        if (src.async) {
            // begin() put the engine's stream after earlier asynchronous work
        } else if (src.on_device) {
            err = order_after(src.stream);
        } else {  // host input: upload the extent the strides address, once
            const uint64_t bytes = input_bytes(src, writes[0].layer), half = align_up(bytes, kSlabAlign);
            err = ensure_input(2 * half);
            if (err == cudaSuccess) err = cudaMemcpyAsync(input_, src.k, bytes, cudaMemcpyHostToDevice, st);
            if (err == cudaSuccess) err = cudaMemcpyAsync(input_ + half, src.v, bytes, cudaMemcpyHostToDevice, st);
            in.k = input_;
            in.v = input_ + half;
        }
        if (err != cudaSuccess) return cuda_fail(err, fn, "bringing K/V to the device");

        const uint32_t rounds = plan_rounds(writes, n_writes, jobs.host, &err);
        if (err != cudaSuccess) return cuda_fail(err, fn, "allocating the append's scratch staging");
        if (rounds == 0) return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
        err = jobs.upload(st);
        for (uint32_t r = 0; r < rounds && err == cudaSuccess; ++r) {
            const uint32_t first = round_start_[r], count = round_start_[r + 1] - first;
            if (count == 0) continue;
            err = cuda::launch_append_jobs(shape_, in, jobs.at(first), jobs.where, count,
                                           only_format(jobs.host + first, count), error_dev_, st);
        }
        if (err == cudaSuccess) err = jobs.release(st);
        if (err == cudaSuccess) err = finish(ex);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, fn, "staging and quantize-on-write on the device");
    }

    ikv_status prepare_append(const AppendSource &src, uint32_t layer, size_t n_whole, size_t n_writes) override {
        const char *fn = src.fn;
        std::lock_guard<std::mutex> lock(mu_);
        // The common case, an engine's one-token append with everything sized: no device call at all.
        const bool sized = event_ && verdict_dev_ && verdict_host_ && error_dev_ && ring_ && n_whole == 0 &&
                           src.on_device && n_writes <= cuda::kInlineJobs;
        if (sized) return IKV_OK;
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        cudaError_t err = ensure_append_buffers();
        if (err == cudaSuccess && n_whole > 0)  // what plan_rounds asks for
            err = ensure_scratch(scratch_per_round(n_whole), align_up(stage_bytes_, kSlabAlign));
        if (err == cudaSuccess && !src.on_device)  // host input: what write_append uploads
            err = ensure_input(2 * align_up(input_bytes(src, layer), kSlabAlign));
        if (err == cudaSuccess && n_writes > cuda::kInlineJobs) err = ring_->reserve(n_writes);  // Jobs::acquire's
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, fn, "allocating the append's device buffers");
    }

    ikv_status take_async_error(NonFinite *out, ikv_seq_id *seq) override {
        constexpr const char *fn = "ikv_pool_sync";
        *out = NonFinite{};
        *seq = 0;
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        cudaError_t err = wait_async();
        // Replays of captured appends (sequences with room) ran on streams the store never saw.
        if (err == cudaSuccess && rooms_.any_live()) err = cudaDeviceSynchronize();
        if (err != cudaSuccess) return cuda_fail(err, fn, "waiting for asynchronous appends");
        if (error_dev_ == nullptr) return IKV_OK;  // no append yet
        cuda::AppendError e{};
        err = cudaMemcpyAsync(&e, error_dev_, sizeof e, cudaMemcpyDeviceToHost, stream_);
        if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
        if (err == cudaSuccess && e.claimed) err = cudaMemsetAsync(error_dev_, 0, sizeof e, stream_);
        if (err == cudaSuccess && e.claimed) err = cudaStreamSynchronize(stream_);
        if (err != cudaSuccess) return cuda_fail(err, fn, "reading the asynchronous appends' error record");
        if (!e.claimed) return IKV_OK;
        out->found = true;
        out->is_nan = e.is_nan != 0;
        out->sign_unknown = !out->is_nan;
        out->which = int(e.which);
        out->layer = e.layer;
        out->token = e.token;
        out->head = e.head;
        out->channel = e.channel;
        *seq = ikv_seq_id(e.seq);
        return IKV_OK;
    }

    uint64_t reserved_bytes() const override { return slabs_.reserved_bytes(); }
    uint64_t host_reserved_bytes() const override { return host_slabs_ ? host_slabs_->reserved_bytes() : 0; }

private:
    static constexpr uint64_t kStageChunkBytes = 8ull << 20;
    static constexpr uint64_t kMaxScratchBytes = 64ull << 20;  // scratch stages of a bulk append

    cuda::AppendRows rows_of(const AppendSource &src) const {
        return cuda::AppendRows{src.k,           src.v,        src.dtype,         src.all_layers ? 1u : 0u,
                                src.seq_tokens,  src.token_stride, src.head_stride, src.layer_stride,
                                src.seq_stride};
    }

    // Under mu_. The job list of one call: up to kInlineJobs in inline_jobs_,
    // handed to the kernels in their launch parameters; more in a ring slot
    // (pinned host memory, uploaded once, released after the last launch).
    struct Jobs {
        cuda::AppendJob *host = nullptr;
        cuda::JobsIn where = cuda::JobsIn::kHost;
        JobRing::Slot *slot = nullptr;
        size_t n = 0;

        cudaError_t acquire(CudaPageStore &store, size_t n_jobs) {
            n = n_jobs;
            if (n_jobs <= cuda::kInlineJobs) {
                host = store.inline_jobs_;
                return cudaSuccess;
            }
            where = cuda::JobsIn::kDevice;
            const cudaError_t err = store.ring_->acquire(n_jobs, &slot);
            if (err == cudaSuccess) host = slot->host;
            return err;
        }
        cudaError_t upload(cudaStream_t st) const { return slot ? JobRing::upload(*slot, n, st) : cudaSuccess; }
        const cuda::AppendJob *at(size_t i) const { return (slot ? slot->dev : host) + i; }
        cudaError_t release(cudaStream_t st) { return slot ? JobRing::release(slot, st) : cudaSuccess; }
    };

    // The format all n jobs write, or -1 if they differ.
    static int only_format(const cuda::AppendJob *jobs, uint32_t n) {
        for (uint32_t i = 1; i < n; ++i)
            if (jobs[i].format != jobs[0].format) return -1;
        return n > 0 ? int(jobs[0].format) : -1;
    }

    // Under mu_. Orders the writes into rounds (jobs, round_start_); each
    // round is one launch of the staging + quantize kernel, so the jobs of a
    // round need distinct staging buffers. The writes of one
    // (sequence, layer) come together and all name its staging buffer: the
    // first may continue a partial page (its earlier rows are staged there)
    // and the last may leave one (its rows must stay there). Pages in between
    // are whole and start at row 0, so they go through scratch stages
    // instead: round 0 holds every (sequence, layer)'s first write plus as
    // many whole pages as there are scratch stages (at most
    // kMaxScratchBytes), further rounds the remaining whole pages, and the
    // last round the partial last writes. A bulk append of 2048 tokens over
    // 32 layers is then ~10 rounds instead of 128 (one per page of a layer);
    // a batch append of one token to B sequences is one round. Returns the
    // number of rounds (0: out of host memory; *err: a CUDA error growing
    // the scratch).
    uint32_t plan_rounds(const AppendWrite *writes, size_t n_writes, cuda::AppendJob *jobs, cudaError_t *err) {
        *err = cudaSuccess;
        const uint32_t P = shape_.page_size;
        size_t n_whole = 0;
        for (size_t i = 0; i < n_writes; ++i) {
            const bool first = i == 0 || writes[i].stage != writes[i - 1].stage;
            n_whole += !first && writes[i].row0 + writes[i].rows == P;
        }
        const uint64_t stride = align_up(stage_bytes_, kSlabAlign);
        const size_t per_round = scratch_per_round(n_whole);
        if (n_whole > 0) {
            *err = ensure_scratch(per_round, stride);
            if (*err != cudaSuccess) return 1;
        }
        const uint32_t whole_rounds = uint32_t((n_whole + per_round - 1) / per_round);
        const uint32_t rounds = std::max<uint32_t>(1, whole_rounds) + 1;  // + the partial last writes
        try {
            round_start_.assign(rounds + 1, 0);
        } catch (const std::bad_alloc &) {
            return 0;
        }
        // Round of each write: first writes -> 0, whole page w (in order) -> w / per_round, partial last -> last.
        auto round_of = [&](size_t i, size_t whole_index, bool first) -> uint32_t {
            if (first) return 0;
            if (writes[i].row0 + writes[i].rows == P) return uint32_t(whole_index / per_round);
            return rounds - 1;
        };
        for (int pass = 0; pass < 2; ++pass) {  // 0: count per round, 1: place
            std::vector<uint32_t> &next = round_next_;
            if (pass == 1) {
                for (uint32_t r = 0; r < rounds; ++r) round_start_[r + 1] += round_start_[r];
                try {
                    next.assign(round_start_.begin(), round_start_.end() - 1);
                } catch (const std::bad_alloc &) {
                    return 0;
                }
            }
            size_t whole = 0;
            for (size_t i = 0; i < n_writes; ++i) {
                const AppendWrite &w = writes[i];
                const bool first = i == 0 || w.stage != writes[i - 1].stage;
                const bool is_whole = !first && w.row0 + w.rows == P;
                const uint32_t r = round_of(i, whole, first);
                if (pass == 0) {
                    ++round_start_[r + 1];
                } else {
                    float *stage = is_whole ? reinterpret_cast<float *>(scratch_ + (whole % per_round) * stride) : w.stage;
                    jobs[next[r]++] = cuda::AppendJob{w.page,  stage,  w.layer,          w.token0,
                                                      w.row0,  w.rows, uint32_t(w.format), uint32_t(w.seq)};
                }
                whole += is_whole;
            }
        }
        return rounds;
    }

    // IKV_CUDA_APPEND_SCRATCH_STAGES=n (read once) caps the scratch stages of a
    // round below the 64 MiB bound, so tests run bulk appends over many rounds.
    // Staging copies the scratch holds per round of whole-page writes.
    size_t scratch_per_round(size_t n_whole) const {
        const uint64_t stride = align_up(stage_bytes_, kSlabAlign);
        return size_t(std::max<uint64_t>(1, std::min<uint64_t>({n_whole, kMaxScratchBytes / stride, scratch_stage_limit()})));
    }
    // Bytes of one of K, V that a host-input append uploads (the extent its strides address).
    uint64_t input_bytes(const AppendSource &src, uint32_t layer) const {
        const uint32_t l0 = src.all_layers ? 0 : layer, l1 = src.all_layers ? shape_.n_layers : l0 + 1;
        return source_extent(src, shape_, l0, l1) * dtype_bytes(src.dtype);
    }

    static uint64_t scratch_stage_limit() {
        static const uint64_t limit = [] {
            const char *e = std::getenv("IKV_CUDA_APPEND_SCRATCH_STAGES");
            const long long n = e ? std::atoll(e) : 0;
            return n > 0 ? uint64_t(n) : ~uint64_t(0);
        }();
        return limit;
    }

    // Under mu_: n scratch stages of `stride` bytes (grown, never shrunk; the
    // last append synchronized its stream, so the old ones are idle).
    cudaError_t ensure_scratch(size_t n, uint64_t stride) {
        if (scratch_stages_ >= n) return cudaSuccess;
        const cudaError_t waited = wait_async();  // asynchronous appends may still use the old scratch
        if (waited != cudaSuccess) return waited;
        if (scratch_) cudaFree(scratch_);
        scratch_ = nullptr;
        scratch_stages_ = 0;
        const cudaError_t err = cudaMalloc(reinterpret_cast<void **>(&scratch_), n * stride);
        if (err == cudaSuccess) scratch_stages_ = n;
        return err;
    }

    // The store's stream waits for the engine's work on `stream` so far.
    cudaError_t order_after(void *stream) {
        cudaError_t err = cudaEventRecord(event_, static_cast<cudaStream_t>(stream));
        if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, event_, 0);
        return err;
    }

    // Under mu_. The event, the 8-byte verdict (device + pinned host), the
    // asynchronous appends' error record and the job ring.
    cudaError_t ensure_append_buffers() {
        cudaError_t err = cudaSuccess;
        if (event_ == nullptr) err = cudaEventCreateWithFlags(&event_, cudaEventDisableTiming);
        if (err == cudaSuccess && verdict_dev_ == nullptr)
            err = cudaMalloc(reinterpret_cast<void **>(&verdict_dev_), sizeof(unsigned long long));
        if (err == cudaSuccess && verdict_host_ == nullptr)
            err = cudaMallocHost(reinterpret_cast<void **>(&verdict_host_), sizeof(unsigned long long));
        if (err == cudaSuccess && error_dev_ == nullptr) {
            err = cudaMalloc(reinterpret_cast<void **>(&error_dev_), sizeof(cuda::AppendError));
            if (err == cudaSuccess) err = cudaMemset(error_dev_, 0, sizeof(cuda::AppendError));
            if (err != cudaSuccess && error_dev_ != nullptr) {
                cudaFree(error_dev_);
                error_dev_ = nullptr;
            }
        }
        if (err == cudaSuccess && !ring_) {
            ring_.reset(new (std::nothrow) JobRing);
            if (!ring_) err = cudaErrorMemoryAllocation;
        }
        return err;
    }

    // Under mu_. The stream a call's device work goes on: the store's own
    // (synchronous calls first wait for earlier asynchronous appends), or the
    // engine's for an asynchronous append, put after earlier asynchronous
    // appends (which may have used another stream: they share the store's
    // buffers). finish() ends the call: a synchronous one waits for its
    // stream; an asynchronous one records where it ended and returns.
    cudaError_t begin(const Exec &ex, cudaStream_t *st) {
        if (!ex.async) {
            *st = stream_;
            return wait_async();
        }
        *st = static_cast<cudaStream_t>(ex.stream);
        std::lock_guard<std::mutex> lock(async_mu_);
        // The same stream as the last asynchronous append orders them already.
        return async_pending_ && *st != async_stream_ ? cudaStreamWaitEvent(*st, async_done_, 0) : cudaSuccess;
    }
    cudaError_t finish(const Exec &ex) {
        if (!ex.async) return cudaStreamSynchronize(stream_);
        std::lock_guard<std::mutex> lock(async_mu_);
        cudaError_t err = async_done_ ? cudaSuccess : cudaEventCreateWithFlags(&async_done_, cudaEventDisableTiming);
        if (err == cudaSuccess) err = cudaEventRecord(async_done_, static_cast<cudaStream_t>(ex.stream));
        if (err == cudaSuccess) async_pending_ = true;
        async_stream_ = static_cast<cudaStream_t>(ex.stream);
        return err;
    }

    // Before any synchronous device work: wait until the asynchronous appends
    // so far are done (they may have used another stream; ikv_seq_read copies
    // on the legacy stream). Host-side: the next calls find nothing pending.
    // n page copies enqueued on st, in one call where the runtime batches
    // them (CUDA 12.8+: a tier step's hundreds of pages cost one call's host
    // time instead of one each); under mu_ (the address lists are members).
    cudaError_t copy_pages_async(const PageMove *m, size_t n, cudaStream_t st) {
        if (n == 0) return cudaSuccess;
#if CUDART_VERSION >= 12080
        if (st == nullptr || st == cudaStreamLegacy) return copy_pages_one_by_one(m, n, st);  // batches refuse it
        try {
            batch_dst_.resize(n);
            batch_src_.resize(n);
            batch_bytes_.resize(n);
        } catch (const std::bad_alloc &) {
            return cudaErrorMemoryAllocation;
        }
        for (size_t i = 0; i < n; ++i) {
            batch_dst_[i] = m[i].dst;
            batch_src_[i] = m[i].src;
            batch_bytes_[i] = page_bytes(shape_, m[i].format);
        }
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // the sources as the stream's order leaves them
        size_t first = 0;
        return cudaMemcpyBatchAsync(batch_dst_.data(), batch_src_.data(), batch_bytes_.data(), n, &attr, &first, 1, st);
#else
        return copy_pages_one_by_one(m, n, st);
#endif
    }
    cudaError_t copy_pages_one_by_one(const PageMove *m, size_t n, cudaStream_t st) const {
        cudaError_t err = cudaSuccess;
        for (size_t i = 0; i < n && err == cudaSuccess; ++i)
            err = cudaMemcpyAsync(m[i].dst, m[i].src, page_bytes(shape_, m[i].format), cudaMemcpyDefault, st);
        return err;
    }

    ikv_status wait_appends(const char *fn) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
        const cudaError_t err = wait_async();
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, fn, "waiting for the asynchronous appends");
    }

    cudaError_t wait_async() const {
        std::lock_guard<std::mutex> lock(async_mu_);
        if (fence_pending_) {  // the offloads of exchange_pages (they write host pages the call may read)
            const cudaError_t err = cudaEventSynchronize(fence_);
            if (err != cudaSuccess) return err;
            fence_pending_ = false;
        }
        if (!async_pending_) return cudaSuccess;
        const cudaError_t err = cudaEventSynchronize(async_done_);
        if (err == cudaSuccess) async_pending_ = false;
        return err;
    }

    // Work enqueued next on st waits (on the device) for the offloads'
    // copies of exchange_pages; once they are done, nothing is waited for.
    // On a capturing stream the wait is an external-event node.
    cudaError_t wait_fence(cudaStream_t st) const {
        std::lock_guard<std::mutex> lock(async_mu_);
        if (!fence_pending_) return cudaSuccess;
        // While capturing, an event query would invalidate the capture (global
        // and thread-local modes): the wait becomes an external-event node.
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        cudaError_t err = cudaStreamIsCapturing(st, &capture);
        if (err != cudaSuccess) return err;
        if (capture != cudaStreamCaptureStatusNone) return cudaStreamWaitEvent(st, fence_, cudaEventWaitExternal);
        err = cudaEventQuery(fence_);
        if (err == cudaSuccess) {
            fence_pending_ = false;
            return cudaSuccess;
        }
        return err == cudaErrorNotReady ? cudaStreamWaitEvent(st, fence_, 0) : err;
    }

    // `waiter` runs what is enqueued on it next after what `on` holds now.
    static cudaError_t stream_waits_for(cudaStream_t waiter, cudaStream_t on) {
        cudaEvent_t ev = nullptr;
        cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (err == cudaSuccess) err = cudaEventRecord(ev, on);
        if (err == cudaSuccess) err = cudaStreamWaitEvent(waiter, ev, 0);
        if (ev) cudaEventDestroy(ev);  // released once the recorded work is done
        return err;
    }

    // The copy stream of exchange_pages' offloads and its fence event, made at first use.
    cudaError_t ensure_copy_stream() {
        cudaError_t err = cudaSuccess;
        if (!copy_stream_) err = cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking);
        if (err == cudaSuccess && !fence_) err = cudaEventCreateWithFlags(&fence_, cudaEventDisableTiming);
        return err;
    }

    // Under mu_: device room for host input of `bytes` bytes.
    cudaError_t ensure_input(uint64_t bytes) {
        if (input_bytes_ >= bytes) return cudaSuccess;
        if (input_) cudaFree(input_);
        input_ = nullptr;
        input_bytes_ = 0;
        const cudaError_t err = cudaMalloc(reinterpret_cast<void **>(&input_), bytes);
        if (err == cudaSuccess) input_bytes_ = bytes;
        return err;
    }

    PageShape shape_;
    int device_;
    cudaStream_t stream_;
    DeviceMemory memory_;  // declared before slabs_: outlives it
    SlabAllocator slabs_;
    PinnedMemory host_memory_;                 // declared before host_slabs_: outlives it
    std::unique_ptr<SlabAllocator> host_slabs_;  // the host tier, when host_capacity_bytes > 0
    DeferredReleases moved_;                   // sources of moves whose copies may still run
    uint64_t stage_bytes_;

    // alloc()/alloc_host() from one tier's slabs (under the pool's accounting mutex).
    ikv_status alloc_from(SlabAllocator &slabs, ikv_format f, uint8_t **page) {
        auto give_back = [this](ikv_format g, uint8_t *p) { release(g, p); };
        moved_.drain(false, give_back);
        // Pages whose copies are still running hold memory that comes back
        // soon: wait for it rather than add a slab (moves would otherwise
        // reserve past capacity_bytes, and a host-tier pool keeps its slabs).
        if (!slabs.has_free(f) && !moved_.empty()) moved_.drain(true, give_back);
        return slabs.alloc(f, page);
    }

    std::mutex stage_mu_;  // leaf lock: stage_alloc/stage_free only
    std::vector<void *> stage_chunks_;
    std::vector<float *> stage_free_;

    std::mutex mu_;  // one append's device work at a time through the buffers below
    cudaEvent_t event_ = nullptr;
    unsigned long long *verdict_dev_ = nullptr, *verdict_host_ = nullptr;
    cuda::AppendError *error_dev_ = nullptr;  // asynchronous appends' first non-finite input
    std::unique_ptr<JobRing> ring_;
    cuda::AppendJob inline_jobs_[cuda::kInlineJobs];

    // Asynchronous appends (leaf lock: taken inside mu_, or alone by const readers).
    mutable std::mutex async_mu_;
    cudaEvent_t async_done_ = nullptr;  // recorded where the last one ended
    cudaStream_t async_stream_ = nullptr;  // ... on this stream
    mutable bool async_pending_ = false;
    // exchange_pages: offloads run on copy_stream_; fence_ marks the last
    // call's copies (under async_mu_, pending until seen done).
    cudaStream_t copy_stream_ = nullptr;
    cudaEvent_t fence_ = nullptr;
    mutable bool fence_pending_ = false;
    static constexpr size_t kExchangeBatch = 32;  // offloads per device-side ordering point (16 MB of 512 KB pages)
    std::vector<void *> batch_dst_;  // copy_pages_async's address lists (under mu_)
    std::vector<const void *> batch_src_;
    std::vector<size_t> batch_bytes_;
    uint8_t *input_ = nullptr;
    uint64_t input_bytes_ = 0;
    std::vector<uint32_t> round_start_, round_next_;
    uint8_t *scratch_ = nullptr;  // scratch stages for the whole pages of a bulk append
    size_t scratch_stages_ = 0;
    DeviceRooms rooms_;  // under mu_
    std::vector<cuda::RoomRecord *> room_recs_;  // write_room_append's launch arguments (under mu_)
    std::vector<uint32_t> room_gens_;
};

}  // namespace

ikv_status make_cuda_store(const ikv_pool_config &config, std::unique_ptr<PageStore> *out) {
    const char *fn = "ikv_pool_create";
    int n = 0;
    const cudaError_t cerr = cudaGetDeviceCount(&n);
    if (cerr != cudaSuccess || n == 0) {
        cudaGetLastError();
        return fail(IKV_E_NO_DEVICE,
                    "%s: config->backend is IKV_BACKEND_CUDA but no CUDA device is usable here (%s); use "
                    "IKV_BACKEND_CPU",
                    fn, cerr != cudaSuccess ? cudaGetErrorString(cerr) : "0 devices");
    }
    if (config.device < 0 || config.device >= n)
        return fail(IKV_E_NO_DEVICE, "%s: config->device %d is not a CUDA device ordinal in [0, %d)", fn,
                    config.device, n);
    if (!cuda::head_dim_supported(config.head_dim))
        return fail(IKV_E_UNSUPPORTED,
                    "%s: config->head_dim %u: the CUDA backend is built for head_dim 32, 64, 128 and 256; use "
                    "IKV_BACKEND_CPU",
                    fn, config.head_dim);
    DeviceGuard g(config.device);
    if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
    cudaStream_t stream = nullptr;
    const cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return cuda_fail(err, fn, "cudaStreamCreateWithFlags");
    CudaPageStore *s = nullptr;
    try {
        s = new CudaPageStore(config, stream);
    } catch (const std::bad_alloc &) {
        cudaStreamDestroy(stream);
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
    out->reset(s);
    return IKV_OK;
}

}  // namespace ikv
