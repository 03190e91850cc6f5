/* ikv_pool_append_batch on CPU pools: the scenario of support/batch_append.c
 * (the same runs on a CUDA pool in test_gpu_pool). */
#include "batch_append.h"
#include "support.h"

static void test_batch_equals_single_appends(void **state) {
    (void)state;
    ikvt_batch_append_scenario(IKV_BACKEND_CPU, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equals_single_appends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
