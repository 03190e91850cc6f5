/* Calls that allocate host memory, run out of it. Each case runs in a child
 * process under an address-space limit (RLIMIT_AS, soft) a little above what
 * the child maps already: the call must fail with IKV_E_NOMEM and a sentence,
 * never abort, and once the limit is lifted the objects it was given still
 * work. (Debian's libmimalloc overrides operator new with one that abort()s
 * when memory runs out; the library must never reach it: docs/FORMATS.md,
 * "Memory".) A decode is not among the cases: its scratch comes from
 * segments mimalloc reserved before any such limit, so no limit made it
 * fail. Skips (77) under AddressSanitizer and ThreadSanitizer, whose shadow
 * memory no such limit allows, and where fork or setrlimit is unavailable. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define IKVT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define IKVT_SANITIZED 1
#endif
#endif
#ifndef IKVT_SANITIZED
#define IKVT_SANITIZED 0
#endif

enum { CASE_OK = 0, CASE_WRONG_STATUS = 2, CASE_NEVER_FAILED = 3, CASE_BROKEN_AFTER = 4 };

/* Bytes the process maps now (/proc/self/statm's first field). */
static unsigned long long mapped_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f == NULL) return 0;
    if (fscanf(f, "%lu", &pages) != 1) pages = 0;
    fclose(f);
    return (unsigned long long)pages * (unsigned long long)sysconf(_SC_PAGESIZE);
}

/* The soft address-space limit: `extra` bytes above what is mapped now, or none. */
static void limit_to(unsigned long long extra) {
    struct rlimit r;
    getrlimit(RLIMIT_AS, &r);
    r.rlim_cur = extra == 0 ? r.rlim_max : (rlim_t)(mapped_bytes() + extra);
    if (setrlimit(RLIMIT_AS, &r) != 0) _exit(77);
}
static void unlimit(void) { limit_to(0); }

/* A case's verdict on a status met under the limit: IKV_E_NOMEM with a
 * sentence that starts with the call's name (also where the memory ran out
 * below the API, in a page store). */
static int expect_nomem(const char *what, ikv_status st) {
    const size_t n = strlen(what);
    const char *e = ikv_last_error();
    if (st == IKV_E_NOMEM && strncmp(e, what, n) == 0 && e[n] == ':' && e[n + 1] == ' ' && e[n + 2] != '\0')
        return CASE_OK;
    fprintf(stderr, "%s: %s (%s), expected IKV_E_NOMEM with a sentence starting \"%s: \"\n", what,
            ikv_status_name(st), e, what);
    return CASE_WRONG_STATUS;
}

/* Use up what the heap has left under the limit (small blocks, never freed:
 * the child exits), after glibc gave back what it could (and with its mmap
 * threshold fixed, so that it does not grow after a free). */
static void exhaust_heap(void) {
    malloc_trim(0);
    for (size_t n = 0; n < ((size_t)1 << 26) && malloc(16) != NULL; ++n) {
    }
}

static int case_route(void) { /* a plan of 2^29 pages */
    ikv_router_config c = ikv_router_default_config();
    c.page_size = 8;
    ikv_router *r = NULL;
    ikv_layout *l = NULL;
    if (ikv_router_create(&c, &r) != IKV_OK || ikv_layout_create(&l) != IKV_OK) return CASE_BROKEN_AFTER;
    limit_to(256ull << 20);
    ikv_plan *p = NULL;
    const int v = expect_nomem("ikv_router_route", ikv_router_route(r, l, UINT32_MAX, &p));
    unlimit();
    if (v != CASE_OK) return v;
    if (p != NULL || ikv_router_route(r, l, 1000, &p) != IKV_OK) return CASE_BROKEN_AFTER;
    ikv_plan_destroy(p);
    ikv_layout_destroy(l);
    ikv_router_destroy(r);
    return CASE_OK;
}

static int case_plan_from_ranges(void) {
    const ikv_token_range one = {0, 1};
    ikv_plan *p = NULL;
    limit_to(256ull << 20);
    const int v = expect_nomem("ikv_plan_from_ranges", ikv_plan_from_ranges(&one, 1, UINT32_MAX, 8, IKV_FMT_F16, &p));
    unlimit();
    if (v != CASE_OK) return v;
    if (p != NULL || ikv_plan_from_ranges(&one, 1, 100, 8, IKV_FMT_F16, &p) != IKV_OK) return CASE_BROKEN_AFTER;
    ikv_plan_destroy(p);
    return CASE_OK;
}

static ikv_pool *small_pool(uint32_t head_dim) {
    ikv_pool_config c = ikv_pool_default_config();
    c.n_layers = 1;
    c.n_kv_heads = 1;
    c.head_dim = head_dim;
    ikv_pool *p = NULL;
    return ikv_pool_create(&c, &p) == IKV_OK ? p : NULL;
}

/* ikv_seq_create, or ikv_seq_fork of one sequence (forks), until memory runs out. */
static int seq_loop(int forks) {
    ikv_pool *p = small_pool(32);
    ikv_seq_id s0 = 0, s = 0;
    if (p == NULL || ikv_seq_create(p, &s0) != IKV_OK) return CASE_BROKEN_AFTER;
    limit_to(8ull << 20);
    ikv_status st = IKV_OK;
    for (uint32_t n = 0; n < 50u * 1000 * 1000 && st == IKV_OK; ++n)
        st = forks ? ikv_seq_fork(p, s0, &s) : ikv_seq_create(p, &s);
    if (st == IKV_OK) return CASE_NEVER_FAILED;
    const int v = expect_nomem(forks ? "ikv_seq_fork" : "ikv_seq_create", st);
    unlimit();
    if (v != CASE_OK) return v;
    if (ikv_seq_create(p, &s) != IKV_OK) return CASE_BROKEN_AFTER;
    ikv_pool_destroy(p);
    return CASE_OK;
}
static int case_seq_create(void) { return seq_loop(0); }
static int case_seq_fork(void) { return seq_loop(1); }

static int case_query_memory(void) {
    ikv_pool *p = small_pool(32);
    ikv_query_memory_config c = ikv_query_memory_default_config();
    c.n_q_heads = 4;
    ikv_query_memory *m = NULL;
    if (p == NULL || ikv_query_memory_create(p, &c, &m) != IKV_OK) return CASE_BROKEN_AFTER;
    float q[4 * 32];
    for (int i = 0; i < 4 * 32; ++i) q[i] = (float)(i % 7) - 3.0f;
    limit_to(8ull << 20);
    ikv_status st = IKV_OK;
    for (uint32_t n = 0; n < 50u * 1000 * 1000 && st == IKV_OK; ++n)
        st = ikv_query_memory_remember(m, n, 0, q, IKV_DTYPE_F32, 1);
    if (st == IKV_OK) return CASE_NEVER_FAILED;
    const int v = expect_nomem("ikv_query_memory_remember", st);
    unlimit();
    if (v != CASE_OK) return v;
    if (ikv_query_memory_remember(m, UINT32_MAX, 0, q, IKV_DTYPE_F32, 1) != IKV_OK) return CASE_BROKEN_AFTER;
    ikv_query_memory_destroy(m);
    ikv_pool_destroy(p);
    return CASE_OK;
}

/* Calls that only release memory must work when none is left: evicting,
 * rolling back to a page boundary and destroying a sequence give pages back
 * to slabs (one page per slab here: capacity for 16 pages, slabs a 16th of
 * it) without allocating. They once aborted on std::bad_alloc. */
static int case_release(void) {
    ikv_pool_config c = ikv_pool_default_config();
    c.n_layers = 1;
    c.n_kv_heads = 1;
    c.head_dim = 32;
    c.page_size = 8;
    c.default_format = IKV_FMT_F16;
    ikv_pool *probe = NULL;
    if (ikv_pool_create(&c, &probe) != IKV_OK) return CASE_BROKEN_AFTER;
    c.capacity_bytes = 16 * ikv_pool_page_bytes(probe, IKV_FMT_F16);
    ikv_pool_destroy(probe);
    mallopt(M_MMAP_THRESHOLD, 128 << 10);
    ikv_pool *p = NULL;
    ikv_seq_id a = 0, b = 0, d = 0;
    float kv[8 * 8 * 32];
    for (int i = 0; i < 8 * 8 * 32; ++i) kv[i] = (float)(i % 13) * 0.25f - 1.5f;
    if (ikv_pool_create(&c, &p) != IKV_OK) return CASE_BROKEN_AFTER;
    /* 16 pages: a 8, b 5, d 3 */
    ikv_append ap = ikv_append_default(p, 8 * 8);
    ap.k = kv, ap.v = kv;
    if (ikv_seq_create(p, &a) != IKV_OK || ikv_seq_create(p, &b) != IKV_OK || ikv_seq_create(p, &d) != IKV_OK ||
        ikv_pool_append(p, a, &ap) != IKV_OK)
        return CASE_BROKEN_AFTER;
    ap.n_tokens = 8 * 5;
    if (ikv_pool_append(p, b, &ap) != IKV_OK) return CASE_BROKEN_AFTER;
    ap.n_tokens = 8 * 3;
    if (ikv_pool_append(p, d, &ap) != IKV_OK) return CASE_BROKEN_AFTER;
    limit_to(64u << 10);
    exhaust_heap();  /* again before each call: what one call frees the next could use */
    const ikv_status evict = ikv_seq_evict(p, a, 0, 56);
    exhaust_heap();
    const ikv_status truncate = ikv_seq_truncate(p, b, 24);
    exhaust_heap();
    const ikv_status destroy = ikv_seq_destroy(p, d);
    unlimit();
    if (evict != IKV_OK || truncate != IKV_OK || destroy != IKV_OK) {
        fprintf(stderr, "release with no memory left: evict %s, truncate %s, destroy %s (%s)\n",
                ikv_status_name(evict), ikv_status_name(truncate), ikv_status_name(destroy), ikv_last_error());
        return CASE_WRONG_STATUS;
    }
    ikv_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    uint32_t len = 0;
    /* left: a's last page (7 evicted), b's 2 pages (3 rolled back), d's none */
    if (ikv_pool_get_stats(p, &st) != IKV_OK || st.pages_used != 1 + 2 || ikv_seq_length(p, b, &len) != IKV_OK ||
        len != 16 || ikv_pool_append(p, b, &ap) != IKV_OK)
        return CASE_BROKEN_AFTER;
    ikv_pool_destroy(p);
    return CASE_OK;
}

/* Runs f in a child; fails the test unless it exits with CASE_OK (77: skipped). */
static void run_case(const char *name, int (*f)(void)) {
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) skip();
    if (pid == 0) { /* a crash is the child's death, not a jump back into CMocka's runner */
        const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS, SIGABRT};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; ++i) signal(sigs[i], SIG_DFL);
        _exit(f());
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) fail_msg("%s: the child was killed by signal %d (%s)", name, WTERMSIG(status), strsignal(WTERMSIG(status)));
    const int code = WEXITSTATUS(status);
    if (code == 77) skip();
    if (code != CASE_OK)
        fail_msg("%s: %s", name,
                 code == CASE_WRONG_STATUS    ? "a wrong status under the limit (above)"
                 : code == CASE_NEVER_FAILED  ? "never ran out of memory under the limit"
                 : code == CASE_BROKEN_AFTER ? "the objects did not work after the limit was lifted"
                                             : "the child failed");
}

static void test_route(void **state) { (void)state, run_case("route", case_route); }
static void test_plan_from_ranges(void **state) { (void)state, run_case("plan_from_ranges", case_plan_from_ranges); }
static void test_seq_create(void **state) { (void)state, run_case("seq_create", case_seq_create); }
static void test_seq_fork(void **state) { (void)state, run_case("seq_fork", case_seq_fork); }
static void test_query_memory(void **state) { (void)state, run_case("query_memory", case_query_memory); }
static void test_release(void **state) { (void)state, run_case("release", case_release); }

int main(void) {
    if (IKVT_SANITIZED) {
        printf("skipped: address-space limits do not fit a sanitizer's shadow memory\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),    cmocka_unit_test(test_plan_from_ranges), cmocka_unit_test(test_seq_create),
        cmocka_unit_test(test_seq_fork), cmocka_unit_test(test_query_memory), cmocka_unit_test(test_release),
    };
    if (getenv("IKVT_TEST_FILTER")) cmocka_set_test_filter(getenv("IKVT_TEST_FILTER"));
    return cmocka_run_group_tests_name("out_of_memory", tests, NULL, NULL);
}
