/*
 * Header (ikv_decode, CUDA graphs): a call whose page lists must be uploaded
 * becomes a copy node reading the decoder's pinned staging at replay; "either
 * way the lists are those of the captured call", and one capture holds at most
 * 8 calls of a decoder whose lists differ from the call before (a ninth is
 * refused with IKV_E_STATE). Checked: three decodes of different sequences
 * captured in one graph on one decoder replay each with its own lists (their
 * outputs equal eager decodes of the same sequences byte for byte); nine
 * alternating ones are refused at the ninth. (The captured calls once shared
 * one staging buffer: every copy node read the last call's lists.)
 */
#define _POSIX_C_SOURCE 200809L
#include "contract_util.h"

enum { N = 3 };

int main(void) {
    require_gpu();
    ikv_pool *pool = small_cuda_pool(1, 16, 64ull << 20, 0);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ikv_seq_id seq[N];
    float *out[N], *ref[N];
    for (int i = 0; i < N; ++i) {
        IK(ikv_seq_create(pool, &seq[i]));
        float *k = dev_floats(64 * 32, 100 + 2 * i), *v = dev_floats(64 * 32, 101 + 2 * i);
        IK(dev_append(pool, seq[i], 0, 48 + 8 * i, k, v, NULL, 0));  /* lengths 48, 56, 64: different lists */
        CK(cudaMalloc((void **)&out[i], 32 * 4));
        CK(cudaMalloc((void **)&ref[i], 32 * 4));
        CK(cudaMemset(out[i], 0, 32 * 4));
    }
    float *q = dev_floats(32, 99);
    ikv_decoder *dec = NULL;
    ikv_decoder_config dc = ikv_decoder_default_config();
    IK(ikv_decoder_create(&dc, &dec));
    for (int i = 0; i < N; ++i) IK(decode1(dec, pool, &seq[i], q, ref[i], s));  /* eager references, buffers sized */
    CK(cudaStreamSynchronize(s));

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ikv_status st = IKV_OK;
    for (int i = 0; i < N && st == IKV_OK; ++i) st = decode1(dec, pool, &seq[i], q, out[i], s);
    CK(cudaStreamEndCapture(s, &graph));
    if (st != IKV_OK) {
        BREAK("a captured decode of a third sequence was refused: %s: %s", ikv_status_name(st), ikv_last_error());
        return probe_exit();
    }
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 2; ++r) CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < N; ++i) {
        float a[32], b[32];
        CK(cudaMemcpy(a, out[i], sizeof a, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b, ref[i], sizeof b, cudaMemcpyDeviceToHost));
        if (memcmp(a, b, sizeof a) != 0)
            BREAK("replayed decode %d of a graph of %d decodes with different lists differs from its eager "
                  "decode (out[0] %g vs %g)", i, N, a[0], b[0]);
        else
            OKMSG("replayed decode %d equals its eager decode", i);
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));

    /* Nine calls whose lists each differ from the call before: the ninth is refused, the eight before it are not. */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int refused_at = -1;
    ikv_status refused = IKV_OK;
    for (int i = 0; i < 9 && refused_at < 0; ++i) {
        const ikv_status si = decode1(dec, pool, &seq[i % N], q, out[i % N], s);
        if (si != IKV_OK) refused_at = i, refused = si;
    }
    graph = NULL;
    if (cudaStreamEndCapture(s, &graph) != cudaSuccess) cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    if (refused_at == 8 && refused == IKV_E_STATE && strstr(ikv_last_error(), "at most 8"))
        OKMSG("the ninth captured call with lists of its own is refused with IKV_E_STATE");
    else
        BREAK("nine captured calls with lists of their own: refused at %d with %s (%s), expected the ninth with "
              "IKV_E_STATE", refused_at, ikv_status_name(refused), ikv_last_error());
    IK(decode1(dec, pool, &seq[0], q, out[0], s));  /* eager calls work as before */
    CK(cudaStreamSynchronize(s));
    ikv_decoder_destroy(dec);
    ikv_pool_destroy(pool);
    return probe_exit();
}
