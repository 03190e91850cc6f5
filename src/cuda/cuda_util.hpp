// Small helpers of the CUDA host side: run on a pool's device and restore the
// caller's current device afterwards, and turn a cudaError_t into an
// IKV_E_DEVICE status with a sentence naming the call.
#pragma once

#include <cuda_runtime_api.h>

#include "common/error.hpp"

namespace ikv {

// Makes `device` current for the scope; the caller's device comes back after.
class DeviceGuard {
public:
    explicit DeviceGuard(int device) {
        if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
        err_ = prev_ == device ? cudaSuccess : cudaSetDevice(device);
    }
    ~DeviceGuard() {
        if (prev_ >= 0 && err_ == cudaSuccess) cudaSetDevice(prev_);
    }
    cudaError_t error() const { return err_; }
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;

private:
    int prev_ = -1;
    cudaError_t err_ = cudaSuccess;
};

// This thread in relaxed stream-capture mode for the scope: a host-side wait
// for work recorded outside any graph (or a pinned allocation) is then legal
// while another thread captures in global mode, and does not invalidate that
// capture (CUDA prohibits such calls to every thread during one by default).
class RelaxedCaptureMode {
public:
    RelaxedCaptureMode() { ok_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess; }
    ~RelaxedCaptureMode() {
        if (ok_) cudaThreadExchangeStreamCaptureMode(&mode_);
    }
    RelaxedCaptureMode(const RelaxedCaptureMode &) = delete;
    RelaxedCaptureMode &operator=(const RelaxedCaptureMode &) = delete;

private:
    cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
    bool ok_ = false;
};

// fail(IKV_E_DEVICE, "<fn>: <what> failed: <cuda error name>: <text>"), or
// IKV_E_NOMEM for device memory that ran out (the header: "host/device
// allocation failed").
inline ikv_status cuda_fail(cudaError_t err, const char *fn, const char *what) {
    cudaGetLastError();  // clear a sticky launch error so later calls see their own
    const ikv_status st = err == cudaErrorMemoryAllocation ? IKV_E_NOMEM : IKV_E_DEVICE;
    return fail(st, "%s: %s failed: %s: %s", fn, what, cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace ikv
