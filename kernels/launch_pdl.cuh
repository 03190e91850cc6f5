// Programmatic dependent launch (PDL, sm_90+) for the kernels of one step
// that follow each other on a stream (score -> select -> decode -> merge).
//
// Why: at B = 1 a step is a few tens of microseconds and each kernel boundary
// costs the launch of the next grid after the previous one drained. With PDL
// the next grid is launched while the previous one is still running; its CTAs
// do their index arithmetic and then wait in pdl_wait() until the previous
// grid has completed and its writes are visible. So every kernel launched
// with launch_pdl() must call pdl_wait() before its first global-memory read
// of anything an earlier kernel (ours or the engine's) may write, and may call
// pdl_launch_dependents() once it no longer needs its SM slot to itself
// (the dependents' CTAs only take slots the running grid leaves free).
//
// On devices below sm_90, or with IKV_CUDA_PDL=0 in the environment (read
// once; for side-by-side timing), launch_pdl() is a plain launch; below sm_90
// both device calls compile to nothing. A PDL launch is captured into a CUDA
// graph as a programmatic edge, so captured steps keep the overlap.
//
// launch() is the same call without PDL, for the kernels outside a step's
// chain (page initialization, the multi-token path; an append's staging +
// quantize kernel is launched with PDL and waits first thing). Every kernel
// of the library is launched through these two, so a launch reports its own
// error only.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace ikv {
namespace cuda {

// Wait for the grids this one depends on (complete, writes visible).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Allow the next PDL-launched grid on the stream to be scheduled now.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A property of the current device, computed once per device ordinal (< 64)
// by probe(dev) -> bool; false where the ordinal cannot be read. A probe
// that fails clears only its own error (cudaGetLastError after a failed
// call), never an error some earlier call of the engine's left behind.
template <class Probe>
bool per_device_flag(std::atomic<uint64_t> &known, std::atomic<uint64_t> &yes, Probe probe) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) {
        (void)cudaGetLastError();
        return false;
    }
    const uint64_t bit = 1ull << dev;
    if (!(known.load(std::memory_order_acquire) & bit)) {
        if (probe(dev)) yes.fetch_or(bit, std::memory_order_acq_rel);
        known.fetch_or(bit, std::memory_order_acq_rel);
    }
    return (yes.load(std::memory_order_acquire) & bit) != 0;
}

// Compute capability major of device dev, 0 where it cannot be read.
inline int cc_major(int dev) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return major;
}

// Whether launches use PDL: IKV_CUDA_PDL is not "0" and the current device
// has compute capability >= 9 (remembered per device ordinal).
inline bool pdl_supported() {
    static const bool enabled = [] {
        const char *e = std::getenv("IKV_CUDA_PDL");
        return e == nullptr || std::strcmp(e, "0") != 0;
    }();
    if (!enabled) return false;
    static std::atomic<uint64_t> known{0}, yes{0};
    return per_device_flag(known, yes, [](int dev) { return cc_major(dev) >= 9; });
}

// A launch configuration: programmatic stream serialization when pdl is set;
// cluster_x > 1 groups that many consecutive blocks along x into a
// thread-block cluster (sm_90+; grid.x must be a multiple of it). attr holds
// the attributes cfg points at.
inline cudaLaunchConfig_t launch_config(bool pdl, unsigned cluster_x, dim3 grid, dim3 block, size_t smem,
                                        cudaStream_t stream, cudaLaunchAttribute (&attr)[2]) {
    unsigned n = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster_x;
        attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cfg;
}

// kernel<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx
// (launch_config says what pdl and cluster_x do). Returns the launch's own
// error: `<<<>>>` followed by cudaGetLastError() would also report an error
// some earlier runtime call of the thread left behind (the engine's, say) as
// this launch's failure.
template <typename... KArgs, typename... Args>
cudaError_t launch_ex(bool pdl, unsigned cluster_x, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args &&...args) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = launch_config(pdl, cluster_x, grid, block, smem, stream, attr);
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

// A step's kernel: programmatic dependent launch where the device supports it.
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args &&...args) {
    return launch_ex(pdl_supported(), 1, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// A plain launch (kernels that do not call pdl_wait()).
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args &&...args) {
    return launch_ex(false, 1, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace cuda
}  // namespace ikv
