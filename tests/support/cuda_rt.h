/* The few CUDA runtime calls the GPU tests need (device buffers for q, out,
 * lse and device-pointer appends), found at run time with dlopen so the tests
 * build against nothing beyond the public header and run where no CUDA
 * runtime is installed (they skip there). */
#ifndef IKV_TEST_CUDA_RT_H
#define IKV_TEST_CUDA_RT_H

#include <stddef.h>

typedef struct ikvt_cudart {
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int); /* kind: IKVT_H2D or IKVT_D2H */
    int (*sync_)(void);
    int (*memset_)(void *, int, size_t);
    /* On a stream (ordering tests: keep it busy, then write the input behind it). */
    int (*memset_async_)(void *, int, size_t, void *);
    int (*memcpy_async_)(void *, const void *, size_t, int, void *);
    /* Streams and graphs (CUDA-graph capture through the public API). */
    int (*stream_create_)(void **);
    int (*stream_destroy_)(void *);
    int (*stream_sync_)(void *);
    int (*begin_capture_)(void *, int); /* mode: IKVT_CAPTURE_* */
    int (*end_capture_)(void *, void **);
    int (*graph_instantiate_)(void **, void *, unsigned long long);
    int (*graph_launch_)(void *, void *);
    int (*graph_exec_destroy_)(void *);
    int (*graph_destroy_)(void *);
    /* Devices (tensor-parallel tests: pools and buffers on devices other than 0). */
    int (*get_device_count_)(int *);
    int (*set_device_)(int); /* this thread's current device, for the calls above */
} ikvt_cudart;

enum { IKVT_H2D = 1, IKVT_D2H = 2 };
enum { IKVT_CAPTURE_GLOBAL = 0, IKVT_CAPTURE_THREAD_LOCAL = 1, IKVT_CAPTURE_RELAXED = 2 };

/* Filled by ikvt_load_cudart(). */
extern ikvt_cudart ikvt_rt;

/* 1 if libcudart was found and every call resolved, else 0. */
int ikvt_load_cudart(void);

/* Skip the program (exit 77, visibly) unless the library was built with CUDA,
 * sees a device, and libcudart loads. */
void ikvt_require_cuda_device(void);

/* cudaMalloc(bytes) (asserting success) and, when host is not NULL, a copy of host into it. */
void *ikvt_dev_upload(const void *host, size_t bytes);

/* n F16 values drawn from N(0, 1) by rng, in device memory (ikvt_dev_upload). */
struct ikvt_rng;
void *ikvt_dev_normal_f16(struct ikvt_rng *rng, size_t n);

#endif
