/* One scenario, run on a CPU pool (test_pool_batch, in CI) and on a CUDA pool
 * (test_gpu_pool): ikv_pool_append_batch stores exactly what one
 * ikv_pool_append per sequence stores, and a rejected batch changes no
 * sequence. */
#ifndef IKV_TEST_BATCH_APPEND_H
#define IKV_TEST_BATCH_APPEND_H

#include "intentkv.h"

/* async (CUDA pools): the device-input batches are IKV_APPEND_ASYNC. */
void ikvt_batch_append_scenario(ikv_backend backend, int async);

#endif
