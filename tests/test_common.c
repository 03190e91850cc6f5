/* Version, status names, error sentence, log callback, runtime info. */
#include <string.h>

#include "support.h"

static void test_version(void **state) {
    (void)state;
    assert_int_equal(ikv_version(), IKV_VERSION_NUMBER);
    assert_string_equal(ikv_version_string(), "0.1.0");
}

static void test_status_names(void **state) {
    (void)state;
    assert_string_equal(ikv_status_name(IKV_OK), "IKV_OK");
    assert_string_equal(ikv_status_name(IKV_E_RANGE), "IKV_E_RANGE");
    assert_string_equal(ikv_status_name(IKV_E_INTERNAL), "IKV_E_INTERNAL");
    assert_string_equal(ikv_status_name((ikv_status)-99), "IKV_UNKNOWN_STATUS");
    assert_string_equal(ikv_status_name((ikv_status)5), "IKV_UNKNOWN_STATUS");
    assert_string_equal(ikv_format_name(IKV_FMT_INT4), "int4");
    assert_string_equal(ikv_format_name(IKV_FMT_AUTO), "auto");
    assert_string_equal(ikv_format_name((ikv_format)17), "?");
    assert_string_equal(ikv_policy_name(IKV_POLICY_RECENT), "RECENT");
    assert_string_equal(ikv_block_kind_name(IKV_KIND_TOOL_OUTPUT), "tool_output");
    assert_string_equal(ikv_reason_name(IKV_REASON_BUDGET_EXHAUSTED), "budget_exhausted");
    assert_string_equal(ikv_reason_name((ikv_reason)IKV_REASON_COUNT), "?");
}

typedef struct captured {
    int calls;
    ikv_log_level level;
    char text[512];
} captured;

static void capture(ikv_log_level level, const char *msg, void *user) {
    captured *c = (captured *)user;
    c->calls++;
    c->level = level;
    strncpy(c->text, msg, sizeof c->text - 1);
}

static void test_errors_and_log(void **state) {
    (void)state;
    captured c;
    memset(&c, 0, sizeof c);
    ikv_set_log_callback(capture, &c, IKV_LOG_DEBUG);
    IKVT_EXPECT_STATUS(ikv_runtime_info_get(NULL), IKV_E_NULL, "ikv_runtime_info_get");
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.level, IKV_LOG_ERROR);
    assert_string_equal(c.text, ikv_last_error());
    ikv_set_log_callback(NULL, NULL, IKV_LOG_DEBUG);
    IKVT_EXPECT_STATUS(ikv_runtime_info_get(NULL), IKV_E_NULL, NULL);
    assert_int_equal(c.calls, 1); /* removed sink is not called */

    ikv_runtime_info small;
    memset(&small, 0, sizeof small);
    small.struct_size = 4;
    IKVT_EXPECT_STATUS(ikv_runtime_info_get(&small), IKV_E_INVALID, "struct_size");
    assert_int_equal(small.version, 0); /* unchanged */
}

static void test_runtime_info(void **state) {
    (void)state;
    ikv_runtime_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    IKVT_OK(ikv_runtime_info_get(&info));
    assert_int_equal(info.version, IKV_VERSION_NUMBER);
    assert_true(strlen(info.cpu_isa) > 0);
    assert_non_null(strstr(info.cpu_isa_available, info.cpu_isa));
    assert_non_null(strstr(info.cpu_isa_available, "scalar"));
    if (!info.cuda_built) assert_int_equal(info.cuda_device_count, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_errors_and_log),
        cmocka_unit_test(test_runtime_info),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
