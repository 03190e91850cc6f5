// Host allocation failures on demand, for tests/test_pool_alloc_faults.c:
// this file replaces operator new and the mimalloc entry points the library
// imports (a definition in the executable wins over the shared libraries'),
// and once armed with n the n-th allocation from then on and every later one
// fail (operator new throws std::bad_alloc, mi_* return NULL) until
// disarmed. Linked into that test alone (tests/CMakeLists.txt).
#include <dlfcn.h>

#include <cstdlib>
#include <new>

namespace {
long g_left = -1;   // allocations to let through before failing; -1: disarmed
long g_failed = 0;  // failures since armed

bool fail_now() {
    if (g_left < 0) return false;
    if (g_left == 0) return ++g_failed, true;
    --g_left;
    return false;
}
template <class Fn>
Fn real(const char *name) {
    return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}
}  // namespace

extern "C" void ikvt_faults_arm(long n) { g_left = n, g_failed = 0; }
extern "C" long ikvt_faults_disarm(void) {
    g_left = -1;
    return g_failed;
}

void *operator new(std::size_t n) {
    void *p = fail_now() ? nullptr : std::malloc(n ? n : 1);
    if (p == nullptr) throw std::bad_alloc();
    return p;
}
void *operator new[](std::size_t n) { return operator new(n); }
void *operator new(std::size_t n, const std::nothrow_t &) noexcept { return fail_now() ? nullptr : std::malloc(n ? n : 1); }
void *operator new[](std::size_t n, const std::nothrow_t &t) noexcept { return operator new(n, t); }
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t) noexcept { std::free(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { std::free(p); }

extern "C" void *mi_malloc(std::size_t n) {
    static auto f = real<void *(*)(std::size_t)>("mi_malloc");
    return fail_now() ? nullptr : f(n);
}
extern "C" void *mi_malloc_aligned(std::size_t n, std::size_t a) {
    static auto f = real<void *(*)(std::size_t, std::size_t)>("mi_malloc_aligned");
    return fail_now() ? nullptr : f(n, a);
}
extern "C" void *mi_mallocn(std::size_t count, std::size_t n) {
    static auto f = real<void *(*)(std::size_t, std::size_t)>("mi_mallocn");
    return fail_now() ? nullptr : f(count, n);
}
