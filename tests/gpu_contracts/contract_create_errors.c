/*
 * Header (ikv_pool_create): "Errors: IKV_E_NULL, IKV_E_INVALID (names the
 * field), IKV_E_NO_DEVICE (CUDA not built, no GPU, or config->device not a
 * device ordinal), IKV_E_UNSUPPORTED (a CUDA pool of head_dim 80 or 96),
 * IKV_E_DEVICE, IKV_E_NOMEM": each case on a machine with a GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include "contract_util.h"


static ikv_status try_create(ikv_backend b, int device, uint32_t head_dim, uint64_t host_cap) {
    ikv_pool_config c = ikv_pool_default_config();
    c.backend = b;
    c.device = device;
    c.n_layers = 1;
    c.n_kv_heads = 1;
    c.head_dim = head_dim;
    c.capacity_bytes = 1 << 20;
    c.host_capacity_bytes = host_cap;
    ikv_pool *p = NULL;
    ikv_status st = ikv_pool_create(&c, &p);
    if (p) ikv_pool_destroy(p);
    return st;
}

int main(void) {
    require_gpu();
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    ikv_status st;
    st = try_create(IKV_BACKEND_CUDA, 0, 80, 0);
    if (st == IKV_E_UNSUPPORTED) OKMSG("head_dim 80 on CUDA -> IKV_E_UNSUPPORTED");
    else BREAK("head_dim 80 on CUDA -> %s", ikv_status_name(st));
    st = try_create(IKV_BACKEND_CUDA, 0, 96, 0);
    if (st == IKV_E_UNSUPPORTED) OKMSG("head_dim 96 on CUDA -> IKV_E_UNSUPPORTED");
    else BREAK("head_dim 96 on CUDA -> %s", ikv_status_name(st));
    st = try_create(IKV_BACKEND_CPU, 0, 128, 1 << 20);
    if (st == IKV_E_INVALID) OKMSG("host_capacity_bytes on a CPU pool -> IKV_E_INVALID");
    else BREAK("host_capacity_bytes on a CPU pool -> %s", ikv_status_name(st));
    st = try_create(IKV_BACKEND_CUDA, 0, 128, 1 << 20);
    if (st == IKV_OK) OKMSG("a CUDA pool with a host tier is created");
    else BREAK("a CUDA pool with a host tier -> %s: %s", ikv_status_name(st), ikv_last_error());
    st = try_create(IKV_BACKEND_CUDA, -1, 128, 0);
    if (st == IKV_E_NO_DEVICE && strstr(ikv_last_error(), "config->device")) OKMSG("device -1 -> IKV_E_NO_DEVICE");
    else BREAK("config->device = -1 with %d GPU(s) -> %s (\"%s\"), expected IKV_E_NO_DEVICE naming config->device",
               n, ikv_status_name(st), ikv_last_error());
    st = try_create(IKV_BACKEND_CUDA, n, 128, 0);
    if (st == IKV_E_NO_DEVICE && strstr(ikv_last_error(), "config->device"))
        OKMSG("device %d (== count) -> IKV_E_NO_DEVICE", n);
    else BREAK("config->device = %d (the device count) -> %s (\"%s\")", n, ikv_status_name(st), ikv_last_error());
    return probe_exit();
}
