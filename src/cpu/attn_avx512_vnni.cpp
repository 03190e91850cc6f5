// AVX-512 + VNNI path: attn_avx512.cpp compiled again, this file alone with
// -mavx512vnni besides the AVX-512 flags (cmake/IntentkvIsa.cmake), so that
// its O (avx512_ops.hpp) has the integer ops and INT8 values run through
// 16-bit integer dot products (attn_impl.hpp values_int8). Everything else is
// the AVX-512 path's code. Chosen at run time on CPUs with AVX512-VNNI
// (dispatch.cpp; IKV_CPU_VNNI=off keeps the plain AVX-512 kernels).
#define IKV_AVX512_KERNELS cpu_kernels_avx512_vnni
#include "attn_avx512.cpp"
