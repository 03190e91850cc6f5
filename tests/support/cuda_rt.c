#include "cuda_rt.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

ikvt_cudart ikvt_rt;

int ikvt_load_cudart(void) {
    static const char *names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                  "/usr/local/cuda/lib64/libcudart.so", NULL};
    for (int i = 0; names[i]; ++i) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        *(void **)&ikvt_rt.malloc_ = dlsym(h, "cudaMalloc");
        *(void **)&ikvt_rt.free_ = dlsym(h, "cudaFree");
        *(void **)&ikvt_rt.memcpy_ = dlsym(h, "cudaMemcpy");
        *(void **)&ikvt_rt.sync_ = dlsym(h, "cudaDeviceSynchronize");
        *(void **)&ikvt_rt.memset_ = dlsym(h, "cudaMemset");
        *(void **)&ikvt_rt.memset_async_ = dlsym(h, "cudaMemsetAsync");
        *(void **)&ikvt_rt.memcpy_async_ = dlsym(h, "cudaMemcpyAsync");
        *(void **)&ikvt_rt.stream_create_ = dlsym(h, "cudaStreamCreate");
        *(void **)&ikvt_rt.stream_destroy_ = dlsym(h, "cudaStreamDestroy");
        *(void **)&ikvt_rt.stream_sync_ = dlsym(h, "cudaStreamSynchronize");
        *(void **)&ikvt_rt.begin_capture_ = dlsym(h, "cudaStreamBeginCapture");
        *(void **)&ikvt_rt.end_capture_ = dlsym(h, "cudaStreamEndCapture");
        *(void **)&ikvt_rt.graph_instantiate_ = dlsym(h, "cudaGraphInstantiateWithFlags");
        *(void **)&ikvt_rt.graph_launch_ = dlsym(h, "cudaGraphLaunch");
        *(void **)&ikvt_rt.graph_exec_destroy_ = dlsym(h, "cudaGraphExecDestroy");
        *(void **)&ikvt_rt.graph_destroy_ = dlsym(h, "cudaGraphDestroy");
        *(void **)&ikvt_rt.get_device_count_ = dlsym(h, "cudaGetDeviceCount");
        *(void **)&ikvt_rt.set_device_ = dlsym(h, "cudaSetDevice");
        if (ikvt_rt.malloc_ && ikvt_rt.free_ && ikvt_rt.memcpy_ && ikvt_rt.sync_ && ikvt_rt.memset_ && ikvt_rt.memset_async_ && ikvt_rt.memcpy_async_ &&
            ikvt_rt.stream_create_ && ikvt_rt.stream_destroy_ && ikvt_rt.stream_sync_ && ikvt_rt.begin_capture_ &&
            ikvt_rt.end_capture_ && ikvt_rt.graph_instantiate_ && ikvt_rt.graph_launch_ &&
            ikvt_rt.graph_exec_destroy_ && ikvt_rt.graph_destroy_ && ikvt_rt.get_device_count_ && ikvt_rt.set_device_)
            return 1;
    }
    return 0;
}

void *ikvt_dev_upload(const void *host, size_t bytes) {
    void *d = NULL;
    assert_int_equal(ikvt_rt.malloc_(&d, bytes), 0);
    if (host) assert_int_equal(ikvt_rt.memcpy_(d, host, bytes, IKVT_H2D), 0);
    return d;
}

void *ikvt_dev_normal_f16(ikvt_rng *rng, size_t n) {
    float *x = malloc(4 * n);
    uint16_t *h = malloc(2 * n);
    ikvt_fill_normal(rng, x, n, 1.0f);
    ikvt_to_f16(x, h, n);
    void *d = ikvt_dev_upload(h, 2 * n);
    free(x), free(h);
    return d;
}

void ikvt_require_cuda_device(void) {
    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (ikv_runtime_info_get(&info) != IKV_OK || !info.cuda_built || info.cuda_device_count == 0)
        ikvt_skip_program("no CUDA device");
    if (!ikvt_load_cudart()) ikvt_skip_program("no CUDA device (libcudart could not be loaded for device buffers)");
}
