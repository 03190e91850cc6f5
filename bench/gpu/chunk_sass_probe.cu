// Not a program: compiled to a cubin by scripts/chunk_sass_count.sh so that
// the SASS of one 16-row chunk's compute can be counted per format and per
// compute path (the SIMT compute_chunk and tc::compute_chunk of
// kernels/decode_attention.cu / decode_mma.cuh), without a GPU. Each probe
// kernel runs exactly one chunk; its count includes a little set-up
// (query fragments, a final sum) around the chunk.
#include "decode_attention.cu"  // the kernels' file itself: its compute functions are internal

namespace ikv {
namespace cuda {
namespace {

template <int D, int R, int F>
__global__ void probe_simt(float *out, ChunkMeta mt, float cap2, float inv_cap2) {
    extern __shared__ __align__(16) uint8_t sm[];
    const int lane = threadIdx.x & 31;
    WarpState<R> w;
    for (int r = 0; r < R; ++r) {
        w.qpos[r] = 1 << 30, w.m[r] = out[r], w.l[r] = 0.0f;
        for (int j = 0; j < 8; ++j) w.acc[r][j] = 0.0f;
    }
    compute_chunk<D, R, F>(sm, mt, reinterpret_cast<const float *>(sm + 40960), w, lane, cap2, inv_cap2);
    float s = 0.0f;
    for (int r = 0; r < R; ++r) {
        s += w.m[r] + w.l[r];
        for (int j = 0; j < 8; ++j) s += w.acc[r][j];
    }
    out[threadIdx.x] = s;
}

template <int D, int R, bool BF, int F>
__global__ void probe_tc(float *out, int r0, int r1, uint32_t pos, float qs, float cap2, float inv_cap2) {
    extern __shared__ __align__(16) uint8_t sm[];
    const int lane = threadIdx.x & 31;
    tc::State<D, R> w;
    tc::init_state<D, R, BF>(w, reinterpret_cast<const float *>(sm + 40960), lane, [](int) { return 1 << 30; });
    tc::compute_chunk<D, R, BF, F>(sm, r0, r1, pos, w, lane, qs, cap2, inv_cap2);
    float s = w.m[0] + w.l[0];
    for (int j = 0; j < D / 8; ++j) s += w.acc[j][0] + w.acc[j][1];
    out[threadIdx.x] = s;
}

// The one-token GQA shape of the benchmark: D = 128, 4 query rows (SIMT) / 8 (tensor cores).
#define IKV_PROBE(F)                                                                             \
    template __global__ void probe_simt<128, 4, F>(float *, ChunkMeta, float, float);           \
    template __global__ void probe_tc<128, 8, false, F>(float *, int, int, uint32_t, float, float, float); \
    template __global__ void probe_tc<128, 8, true, F>(float *, int, int, uint32_t, float, float, float);
IKV_PROBE(IKV_FMT_F16)
IKV_PROBE(IKV_FMT_BF16)
IKV_PROBE(IKV_FMT_FP8_E4M3)
IKV_PROBE(IKV_FMT_INT8)
IKV_PROBE(IKV_FMT_INT4)
#undef IKV_PROBE

}  // namespace
}  // namespace cuda
}  // namespace ikv
