/* One scenario, run on a CPU pool (test_decode, in CI) and on a CUDA pool
 * (test_gpu_decode): a decoder reuses the page lists of its previous call
 * exactly when nothing that decides them changed, and every call, reused or
 * not, writes bit for bit what a fresh decoder writes. */
#ifndef IKV_TEST_LIST_REUSE_H
#define IKV_TEST_LIST_REUSE_H

#include "intentkv.h"

void ikvt_list_reuse_scenario(ikv_backend backend);

#endif
