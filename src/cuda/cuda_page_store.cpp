// Device page storage for IKV_BACKEND_CUDA pools: pages of one format are
// carved from cudaMalloc'd slabs (never managed memory) on the pool's device by
// the same SlabAllocator as the host store. Writes quantize on the
// device: the pool core's fp32 staging of one layer is uploaded and the
// quantize-on-write kernel (kernels/quantize_pages.cu) writes bytes identical
// to write_subpage() plus the key summaries. Reads copy the needed bytes back
// and dequantize with the reference reader, so ikv_seq_read and
// ikv_seq_page_summary return exactly what the CPU store would.
//
// The store works on its own non-blocking stream and waits for it before each
// call returns (the PageStore calls are synchronous by contract); decode never
// goes through here.
#include <algorithm>
#include <mutex>
#include <new>
#include <vector>

#include "common/quant.hpp"
#include "cuda/cuda_util.hpp"
#include "ikv_kernels.h"
#include "pool/page_store.hpp"
#include "pool/slab_allocator.hpp"

namespace ikv {
namespace {

constexpr uint64_t kSlabAlign = 256;
constexpr uint64_t kSlabTargetBytes = 8ull << 20;

// Slab memory from cudaMalloc on the pool's device.
class DeviceMemory final : public SlabMemory {
public:
    explicit DeviceMemory(int device) : device_(device) {}
    ikv_status allocate(uint64_t bytes, uint8_t **out) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), "ikv_pool", "cudaSetDevice");
        void *base = nullptr;
        const cudaError_t err = cudaMalloc(&base, bytes);
        if (err != cudaSuccess) {
            cudaGetLastError();
            return fail(IKV_E_NOMEM, "ikv_pool: cudaMalloc of a %llu-byte page slab on device %d failed: %s",
                        (unsigned long long)bytes, device_, cudaGetErrorString(err));
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
};

class CudaPageStore final : public PageStore {
public:
    CudaPageStore(const ikv_pool_config &c, cudaStream_t stream)
        : shape_{c.n_layers, c.n_kv_heads, c.head_dim, c.page_size},
          device_(c.device),
          stream_(stream),
          memory_(c.device),
          slabs_(shape_, c.capacity_bytes, kSlabAlign, kSlabTargetBytes, memory_) {}

    ~CudaPageStore() override {
        DeviceGuard g(device_);
        if (scratch_) cudaFree(scratch_);
        cudaStreamDestroy(stream_);
    }

    ikv_status alloc(ikv_format f, uint8_t **page) override { return slabs_.alloc(f, page); }
    void release(ikv_format f, uint8_t *page) override { slabs_.release(f, page); }

    ikv_status init(ikv_format f, uint8_t *page) override {
        std::lock_guard<std::mutex> lock(mu_);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), "ikv_pool", "cudaSetDevice");
        cudaError_t err = cudaMemsetAsync(page, 0, page_bytes(shape_, f), stream_);
        // Empty sub-pages as write_subpage writes them (unit scales), zero summaries.
        for (uint32_t l = 0; l < shape_.n_layers && err == cudaSuccess; ++l)
            err = cuda::launch_quantize_layer(shape_, f, page, l, nullptr, nullptr, 0, stream_);
        if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, "ikv_pool", "initializing a device page");
    }

    ikv_status write_layer(ikv_format f, uint8_t *page, uint32_t layer, const float *k, const float *v,
                           uint32_t n_valid) override {
        std::lock_guard<std::mutex> lock(mu_);  // one staging upload at a time through the scratch buffer
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), "ikv_pool_append", "cudaSetDevice");
        const uint64_t floats = uint64_t(shape_.n_kv_heads) * shape_.page_size * shape_.head_dim;
        cudaError_t err = ensure_scratch(2 * floats * sizeof(float));
        if (err != cudaSuccess) return cuda_fail(err, "ikv_pool_append", "cudaMalloc of the staging upload buffer");
        float *dk = scratch_, *dv = scratch_ + floats;
        const uint64_t bytes = uint64_t(n_valid) * shape_.head_dim * sizeof(float);
        // Staging is [H][P][D]; only the first n_valid rows of each head matter.
        for (uint32_t h = 0; h < shape_.n_kv_heads && err == cudaSuccess && bytes > 0; ++h) {
            const uint64_t off = uint64_t(h) * shape_.page_size * shape_.head_dim;
            err = cudaMemcpyAsync(dk + off, k + off, bytes, cudaMemcpyHostToDevice, stream_);
            if (err == cudaSuccess) err = cudaMemcpyAsync(dv + off, v + off, bytes, cudaMemcpyHostToDevice, stream_);
        }
        if (err == cudaSuccess) err = cuda::launch_quantize_layer(shape_, f, page, layer, dk, dv, n_valid, stream_);
        if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, "ikv_pool_append", "quantize-on-write on the device");
    }

    ikv_status read_rows(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t head, uint32_t t0, uint32_t n,
                         float *k_out, float *v_out, uint64_t out_stride) const override {
        const SubpageLayout sl = subpage_layout(f, shape_.page_size, shape_.head_dim);
        std::vector<uint8_t> sub(sl.bytes);
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), "ikv_seq_read", "cudaSetDevice");
        const cudaError_t err =
            cudaMemcpy(sub.data(), page + subpage_offset(shape_, f, layer, head), sl.bytes, cudaMemcpyDeviceToHost);
        if (err != cudaSuccess) return cuda_fail(err, "ikv_seq_read", "cudaMemcpy of a device sub-page");
        for (uint32_t i = 0; i < n; ++i) {
            if (k_out) read_subpage_row(f, shape_.page_size, shape_.head_dim, sub.data(), 0, t0 + i, k_out + i * out_stride);
            if (v_out) read_subpage_row(f, shape_.page_size, shape_.head_dim, sub.data(), 1, t0 + i, v_out + i * out_stride);
        }
        return IKV_OK;
    }

    ikv_status read_summary(ikv_format f, const uint8_t *page, uint32_t layer, uint32_t head,
                            float *out) const override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), "ikv_seq_page_summary", "cudaSetDevice");
        const cudaError_t err = cudaMemcpy(out, page + summary_offset(shape_, f, layer, head),
                                           summary_record_bytes(shape_), cudaMemcpyDeviceToHost);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, "ikv_seq_page_summary", "cudaMemcpy of a key summary");
    }

    ikv_status copy(ikv_format f, uint8_t *dst, const uint8_t *src) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), "ikv_pool", "cudaSetDevice");
        const cudaError_t err = cudaMemcpy(dst, src, page_bytes(shape_, f), cudaMemcpyDeviceToDevice);
        return err == cudaSuccess ? IKV_OK : cuda_fail(err, "ikv_pool", "cudaMemcpy of a device page");
    }

    // Appends with src_on_device: bring the engine's device K/V to the host
    // staging path, ordered after the engine's work on its stream.
    ikv_status download(void *host_dst, const void *device_src, uint64_t bytes, void *stream) override {
        DeviceGuard g(device_);
        if (g.error() != cudaSuccess) return cuda_fail(g.error(), "ikv_pool_append", "cudaSetDevice");
        cudaStream_t s = static_cast<cudaStream_t>(stream);
        cudaError_t err = cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, s);
        if (err == cudaSuccess) err = cudaStreamSynchronize(s);
        return err == cudaSuccess ? IKV_OK
                                  : cuda_fail(err, "ikv_pool_append", "cudaMemcpyAsync of device K/V to the host");
    }

    uint64_t reserved_bytes() const override { return slabs_.reserved_bytes(); }

private:
    cudaError_t ensure_scratch(uint64_t bytes) {
        if (scratch_bytes_ >= bytes) return cudaSuccess;
        if (scratch_) cudaFree(scratch_);
        scratch_ = nullptr;
        scratch_bytes_ = 0;
        const cudaError_t err = cudaMalloc(reinterpret_cast<void **>(&scratch_), bytes);
        if (err == cudaSuccess) scratch_bytes_ = bytes;
        return err;
    }

    PageShape shape_;
    int device_;
    cudaStream_t stream_;
    DeviceMemory memory_;  // declared before slabs_: outlives it
    SlabAllocator slabs_;
    std::mutex mu_;
    float *scratch_ = nullptr;
    uint64_t scratch_bytes_ = 0;
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
        return fail(IKV_E_UNSUPPORTED, "%s: config->head_dim %u: the CUDA backend is built for head_dim 64, 128 and 256",
                    fn, config.head_dim);
    DeviceGuard g(config.device);
    if (g.error() != cudaSuccess) return cuda_fail(g.error(), fn, "cudaSetDevice");
    cudaStream_t stream = nullptr;
    const cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return cuda_fail(err, fn, "cudaStreamCreateWithFlags");
    CudaPageStore *s = new (std::nothrow) CudaPageStore(config, stream);
    if (s == nullptr) {
        cudaStreamDestroy(stream);
        return fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    }
    out->reset(s);
    return IKV_OK;
}

}  // namespace ikv
