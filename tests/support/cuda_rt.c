#include "cuda_rt.h"

#include <dlfcn.h>
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
        if (ikvt_rt.malloc_ && ikvt_rt.free_ && ikvt_rt.memcpy_ && ikvt_rt.sync_) return 1;
    }
    return 0;
}

void *ikvt_dev_upload(const void *host, size_t bytes) {
    void *d = NULL;
    assert_int_equal(ikvt_rt.malloc_(&d, bytes), 0);
    if (host) assert_int_equal(ikvt_rt.memcpy_(d, host, bytes, IKVT_H2D), 0);
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
