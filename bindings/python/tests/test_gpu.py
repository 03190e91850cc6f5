"""GPU tests of the Python binding: a CUDA pool driven with PyTorch CUDA tensors, checked against a
CPU pool of the same shape fed the same values as numpy arrays.

Skipped when torch, numpy, a CUDA device or a CUDA-enabled libintentkv is missing; set
INTENTKV_REQUIRE_GPU=1 to make those skips failures instead. On a GPU machine:

    INTENTKV_LIB=/path/to/cuda-build/libintentkv.so INTENTKV_REQUIRE_GPU=1 \\
        python3 -m unittest bindings/python/tests/test_gpu.py -v
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import intentkv as ikv  # noqa: E402

try:
    import numpy
except ImportError:
    numpy = None
try:
    import torch
except ImportError:
    torch = None
try:
    import cupy
except ImportError:  # only test_cupy_arrays_on_their_stream needs it
    cupy = None

N_LAYERS, N_KV_HEADS, N_Q_HEADS = 2, 2, 8
REQUIRE = os.environ.get("INTENTKV_REQUIRE_GPU") == "1"


def _why_not():
    if torch is None:
        return "torch is not installed"
    if numpy is None:
        return "numpy is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        info = ikv.runtime_info()
    except OSError as exc:
        return "libintentkv not found: %s" % exc
    if not info["cuda_built"]:
        return "libintentkv was built without CUDA (runtime_info()['cuda_built'] is 0)"
    if info["cuda_device_count"] < 1:
        return "libintentkv sees no GPU"
    return None


WHY_NOT = _why_not()


def rel_err(got, ref):
    got, ref = numpy.asarray(got, numpy.float64).ravel(), numpy.asarray(ref, numpy.float64).ravel()
    return float(numpy.linalg.norm(got - ref) / numpy.linalg.norm(ref))


def host(t):
    """A torch tensor's values as a float32 numpy array (for the CPU pool)."""
    return t.detach().float().cpu().numpy()


class DLPackOnly:
    """Hides a tensor's __cuda_array_interface__: the binding must read it through DLPack."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return self.tensor.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


@unittest.skipIf(WHY_NOT is not None and not REQUIRE, WHY_NOT)
class CudaPoolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if WHY_NOT is not None:  # only with INTENTKV_REQUIRE_GPU=1: a failure, not a skip
            raise RuntimeError("INTENTKV_REQUIRE_GPU=1 but " + WHY_NOT)
        cls.device = torch.cuda.current_device()

    def pools(self, fmt, head_dim, kv_dtype=ikv.DType.F32):
        cfg = dict(n_layers=N_LAYERS, n_kv_heads=N_KV_HEADS, head_dim=head_dim, page_size=16,
                   capacity_bytes=64 << 20, default_format=fmt, kv_dtype=kv_dtype)
        return ikv.Pool(backend=ikv.Backend.CUDA, device=self.device, **cfg), ikv.Pool(**cfg)

    def assertReadsMatch(self, gpu_pool, cpu_pool, pairs, bound):
        for g, c in pairs:
            n = cpu_pool.seq_length(c)
            self.assertEqual(gpu_pool.seq_length(g), n)
            for layer in range(N_LAYERS):
                for got, ref in zip(gpu_pool.read(g, layer, 0, n), cpu_pool.read(c, layer, 0, n)):
                    self.assertLess(rel_err(got, ref), bound, "seq %d layer %d" % (g, layer))

    def decode_both(self, gpu, cpu, gpu_pool, cpu_pool, gseqs, cseqs, q, plans=None, layer=1, stream=None,
                    out_dtype=None):
        """One step on each pool: (CUDA out, CUDA lse, CPU out, CPU lse) as numpy arrays."""
        n_tokens = q.shape[1]
        out = torch.full(q.shape, float("nan"), device="cuda", dtype=out_dtype or torch.float32)
        lse = torch.full(q.shape[:3], float("nan"), device="cuda")
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())  # q, out, lse were written on the current stream
        got = gpu.decode(gpu_pool, gseqs, q, N_Q_HEADS, layer=layer, plans=plans, n_query_tokens=n_tokens,
                         out=out, lse=lse, stream=stream)
        self.assertIs(got[0], out)
        self.assertIs(got[1], lse)
        (stream or torch.cuda.current_stream()).synchronize()
        if q.dtype == torch.bfloat16:  # the CPU pool gets the same bfloat16 values, as CPU tensors (DLPack)
            q_cpu, out_cpu = q.cpu(), torch.zeros(q.shape, dtype=torch.bfloat16)
        else:
            q_cpu, out_cpu = host(q), numpy.zeros(q.shape, numpy.float32)
        lse_cpu = numpy.zeros(q.shape[:3], numpy.float32)
        cpu.decode(cpu_pool, cseqs, q_cpu, N_Q_HEADS, layer=layer, plans=plans, n_query_tokens=n_tokens,
                   out=out_cpu, lse=lse_cpu)
        got_out, got_lse = host(out), host(lse)
        self.assertTrue(numpy.isfinite(got_out).all(), "the CUDA decode left part of out unwritten")
        self.assertTrue(numpy.isfinite(got_lse).all(), "the CUDA decode left part of lse unwritten")
        return got_out, got_lse, host(out_cpu) if torch.is_tensor(out_cpu) else out_cpu, lse_cpu

    def check_step(self, results, bound):
        got_out, got_lse, ref_out, ref_lse = results
        self.assertGreater(numpy.linalg.norm(ref_out), 0.0)
        self.assertLess(rel_err(got_out, ref_out), bound)
        self.assertLess(float(numpy.abs(got_lse - ref_lse).max()), bound * max(1.0, float(numpy.abs(ref_lse).max())))

    def test_f16_pages_match_cpu_pool(self):
        torch.manual_seed(0)
        head_dim = 128
        gpu_pool, cpu_pool = self.pools(ikv.Format.F16, head_dim)
        with gpu_pool, cpu_pool, ikv.Decoder() as gpu, ikv.Decoder(n_threads=2) as cpu:
            gseqs = [gpu_pool.seq_create() for _ in range(2)]
            cseqs = [cpu_pool.seq_create() for _ in range(2)]
            for g, c, n in zip(gseqs, cseqs, (150, 37)):  # [layer][token][kv_head][head_dim], every layer at once
                k = torch.randn(N_LAYERS, n, N_KV_HEADS, head_dim, device="cuda")
                v = torch.randn(N_LAYERS, n, N_KV_HEADS, head_dim, device="cuda")
                self.assertEqual(gpu_pool.append(g, k, v), n)
                cpu_pool.append(c, host(k), host(v))
            # Strided chunks, one layer at a time: sequence 0 gets 5 tokens from a fused projection
            # [token][q heads | k heads | v heads] (2-D views, token stride = the projection's width),
            # sequence 1 gets 3 tokens from head-major memory [kv_head][token][head_dim].
            width = (N_Q_HEADS + 2 * N_KV_HEADS) * head_dim
            for layer in range(N_LAYERS):
                qkv = torch.randn(5, width, device="cuda")
                k = qkv[:, N_Q_HEADS * head_dim:(N_Q_HEADS + N_KV_HEADS) * head_dim]
                v = qkv[:, (N_Q_HEADS + N_KV_HEADS) * head_dim:]
                self.assertEqual(gpu_pool.append(gseqs[0], k, v, layer=layer), 5)
                cpu_pool.append(cseqs[0], host(k), host(v), layer=layer)
                k = torch.randn(N_KV_HEADS, 3, head_dim, device="cuda").transpose(0, 1)
                v = torch.randn(N_KV_HEADS, 3, head_dim, device="cuda").transpose(0, 1)
                self.assertEqual(gpu_pool.append(gseqs[1], k, v, layer=layer), 3)
                cpu_pool.append(cseqs[1], host(k), host(v), layer=layer)
            # One more token per sequence through append_batch, per layer, from strided views of a fused
            # projection [seq][token][q heads | k heads | v heads].
            for layer in range(N_LAYERS):
                qkv = torch.randn(2, 1, width, device="cuda")
                k = qkv[..., N_Q_HEADS * head_dim:(N_Q_HEADS + N_KV_HEADS) * head_dim]
                v = qkv[..., (N_Q_HEADS + N_KV_HEADS) * head_dim:]
                self.assertFalse(k.is_contiguous())
                self.assertEqual(gpu_pool.append_batch(gseqs, k, v, layer=layer), 1)
                cpu_pool.append_batch(cseqs, host(k), host(v), layer=layer)
            torch.cuda.synchronize()
            self.assertReadsMatch(gpu_pool, cpu_pool, zip(gseqs, cseqs), 1e-6)  # the same F16 rounding
            stream = torch.cuda.Stream()
            self.assertEqual([gpu_pool.seq_length(g) for g in gseqs], [156, 41])
            with ikv.Plan.from_ranges([(0, 40), (100, 156)], 156, page_size=16) as plan:
                for n_tokens, plans in ((1, None), (1, [plan, None]), (4, None)):
                    q = torch.randn(2, n_tokens, N_Q_HEADS, head_dim, device="cuda")
                    self.check_step(self.decode_both(gpu, cpu, gpu_pool, cpu_pool, gseqs, cseqs, q, plans=plans,
                                                     stream=stream), 1e-3)
            # float16 queries and outputs; the CPU pool gets the same values in float32
            q = torch.randn(2, 1, N_Q_HEADS, head_dim, device="cuda").half()
            self.check_step(self.decode_both(gpu, cpu, gpu_pool, cpu_pool, gseqs, cseqs, q, layer=0,
                                             out_dtype=torch.float16), 2e-3)
            # the same queries through DLPack alone (no __cuda_array_interface__), float32 out
            out = torch.full(q.shape, float("nan"), device="cuda")
            gpu.decode(gpu_pool, gseqs, DLPackOnly(q), N_Q_HEADS, layer=0, out=DLPackOnly(out))
            torch.cuda.synchronize()
            ref = numpy.zeros(q.shape, numpy.float32)
            cpu.decode(cpu_pool, cseqs, host(q).astype(numpy.float16), N_Q_HEADS, layer=0, out=ref)
            self.assertLess(rel_err(host(out), ref), 1e-3)
            # bfloat16 queries and outputs ('<V2' typestr read as bfloat16): output rounding bounds it
            q = torch.randn(2, 1, N_Q_HEADS, head_dim, device="cuda").bfloat16()
            self.check_step(self.decode_both(gpu, cpu, gpu_pool, cpu_pool, gseqs, cseqs, q, layer=1,
                                             out_dtype=torch.bfloat16), 1e-2)

    def test_int8_pages_match_cpu_pool(self):
        torch.manual_seed(1)
        head_dim = 64
        gpu_pool, cpu_pool = self.pools(ikv.Format.INT8, head_dim, kv_dtype=ikv.DType.F16)
        with gpu_pool, cpu_pool, ikv.Decoder() as gpu, ikv.Decoder(n_threads=2) as cpu:
            gseqs = [gpu_pool.seq_create() for _ in range(3)]
            cseqs = [cpu_pool.seq_create() for _ in range(3)]
            for chunk in (70, 1, 25):  # float16 K/V, [layer][seq][token][kv_head][head_dim]
                k = torch.randn(N_LAYERS, 3, chunk, N_KV_HEADS, head_dim, device="cuda").half()
                v = torch.randn(N_LAYERS, 3, chunk, N_KV_HEADS, head_dim, device="cuda").half()
                self.assertEqual(gpu_pool.append_batch(gseqs, k, v), chunk)
                cpu_pool.append_batch(cseqs, k.cpu().numpy(), v.cpu().numpy())
            torch.cuda.synchronize()
            self.assertReadsMatch(gpu_pool, cpu_pool, zip(gseqs, cseqs), 2e-2)
            for n_tokens in (1, 3):
                q = torch.randn(3, n_tokens, N_Q_HEADS, head_dim, device="cuda")
                self.check_step(self.decode_both(gpu, cpu, gpu_pool, cpu_pool, gseqs, cseqs, q, layer=0), 2e-2)

    def test_async_append_then_decode_on_the_same_stream(self):
        torch.manual_seed(2)
        head_dim = 128
        gpu_pool, cpu_pool = self.pools(ikv.Format.F16, head_dim)
        with gpu_pool, cpu_pool, ikv.Decoder() as gpu, ikv.Decoder(n_threads=2) as cpu:
            g, c = gpu_pool.seq_create(), cpu_pool.seq_create()
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):  # everything below is produced and consumed on `stream`
                k = torch.randn(N_LAYERS, 60, N_KV_HEADS, head_dim, device="cuda")
                v = torch.randn(N_LAYERS, 60, N_KV_HEADS, head_dim, device="cuda")
                gpu_pool.append(g, k, v, stream=stream, async_=True)
                steps = []
                for _ in range(3):  # a decode loop: append the step's token to each layer, then decode it
                    k1 = torch.randn(1, N_KV_HEADS, head_dim, device="cuda")
                    v1 = torch.randn(1, N_KV_HEADS, head_dim, device="cuda")
                    for layer in range(N_LAYERS):
                        gpu_pool.append(g, k1, v1, layer=layer, stream=stream, async_=True)
                    q = torch.randn(1, 1, N_Q_HEADS, head_dim, device="cuda")
                    out = torch.full_like(q, float("nan"))
                    lse = torch.full((1, 1, N_Q_HEADS), float("nan"), device="cuda")
                    gpu.decode(gpu_pool, g, q, N_Q_HEADS, layer=1, out=out, lse=lse, stream=stream.cuda_stream)
                    steps.append((k1, v1, q, out, lse))
            self.assertEqual(gpu_pool.seq_length(g), 63)
            stream.synchronize()
            gpu_pool.sync()  # every input was finite
            cpu_pool.append(c, host(k), host(v))
            for k1, v1, q, out, lse in steps:
                for layer in range(N_LAYERS):
                    cpu_pool.append(c, host(k1), host(v1), layer=layer)
                ref, ref_lse = cpu.decode(cpu_pool, c, host(q), N_Q_HEADS, layer=1, return_lse=True)
                self.assertTrue(numpy.isfinite(host(out)).all())
                self.assertLess(rel_err(host(out), ref), 1e-3)
                ref_lse = numpy.asarray(ref_lse)
                self.assertLess(float(numpy.abs(host(lse).ravel() - ref_lse).max()),
                                1e-3 * max(1.0, float(numpy.abs(ref_lse).max())))
            self.assertReadsMatch(gpu_pool, cpu_pool, [(g, c)], 1e-6)
            # An asynchronous append does not check finiteness at the call: a NaN is stored as 0 and
            # reported by the next sync(), which then clears the report.
            bad = torch.randn(N_LAYERS, 1, N_KV_HEADS, head_dim, device="cuda")
            bad[1, 0, 1, 5] = float("nan")
            torch.cuda.synchronize()
            gpu_pool.append(g, bad, bad, stream=stream, async_=True)
            with self.assertRaises(ikv.IntentKVError) as ctx:
                gpu_pool.sync()
            self.assertEqual(ctx.exception.status_name, "IKV_E_INVALID")
            gpu_pool.sync()
            k_read, _ = gpu_pool.read(g, 1, 63, 64)
            self.assertEqual(k_read[1 * head_dim + 5], 0.0)

    def test_decode_with_device_append_equals_append_then_decode(self):
        """decode(append=(k, v)) with device tensors on sequences with reserved room: the decode's own
        kernels write each layer's token (stats()["appends_fused"]); the outputs and the stored pages
        equal a CPU pool that appends, then decodes, across a page boundary."""
        torch.manual_seed(5)
        head_dim = 64
        gpu_pool, cpu_pool = self.pools(ikv.Format.F16, head_dim)
        with gpu_pool, cpu_pool, ikv.Decoder() as gpu, ikv.Decoder(n_threads=2) as cpu:
            gs = [gpu_pool.seq_create() for _ in range(2)]
            cs = [cpu_pool.seq_create() for _ in range(2)]
            prompt = torch.randn(2, N_LAYERS, 11, N_KV_HEADS, head_dim, device="cuda")
            for i in range(2):
                gpu_pool.append(gs[i], prompt[i], prompt[i])
                cpu_pool.append(cs[i], host(prompt[i]), host(prompt[i]))
            steps = 9  # lengths 11 -> 20: the page of 16 fills and the next one starts
            gpu_pool.reserve(gs, steps)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            for _ in range(steps):
                for layer in range(N_LAYERS):
                    with torch.cuda.stream(stream):
                        kv = torch.randn(2, 1, N_KV_HEADS, head_dim, device="cuda")
                        q = torch.randn(2, 1, N_Q_HEADS, head_dim, device="cuda")
                        out = torch.full_like(q, float("nan"))
                    gpu.decode(gpu_pool, gs, q, N_Q_HEADS, layer=layer, out=out, append=(kv, kv),
                               append_async=True, stream=stream)
                    stream.synchronize()
                    cpu_pool.append_batch(cs, host(kv), host(kv), layer=layer)
                    ref = cpu.decode(cpu_pool, cs, host(q), N_Q_HEADS, layer=layer)
                    self.assertTrue(numpy.isfinite(host(out)).all())
                    self.assertLess(rel_err(host(out), ref), 1e-3)
            gpu_pool.sync()
            self.assertEqual(gpu.stats()["appends_fused"], steps * N_LAYERS)
            self.assertReadsMatch(gpu_pool, cpu_pool, list(zip(gs, cs)), 1e-6)

    @unittest.skipIf(cupy is None, "cupy is not installed")
    def test_cupy_arrays_on_their_stream(self):
        head_dim = 64
        gpu_pool, cpu_pool = self.pools(ikv.Format.F16, head_dim)
        with gpu_pool, cpu_pool, ikv.Decoder() as gpu, ikv.Decoder(n_threads=1) as cpu:
            g, c = gpu_pool.seq_create(), cpu_pool.seq_create()
            rng = numpy.random.default_rng(4)
            k = rng.standard_normal((N_LAYERS, 33, N_KV_HEADS, head_dim), dtype=numpy.float32)
            v = rng.standard_normal((N_LAYERS, 33, N_KV_HEADS, head_dim), dtype=numpy.float32)
            q = rng.standard_normal((1, 1, N_Q_HEADS, head_dim), dtype=numpy.float32)
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:  # CuPy names its current stream in __cuda_array_interface__ (v3); no stream= below
                kd, vd, qd = cupy.asarray(k), cupy.asarray(v), cupy.asarray(q)
                out = cupy.full(q.shape, numpy.nan, numpy.float32)
                self.assertEqual(ikv._arrays.array_ref(qd, "q").stream, stream.ptr)
                gpu_pool.append(g, kd, vd, async_=True)
                gpu.decode(gpu_pool, g, qd, N_Q_HEADS, layer=1, out=out)
            stream.synchronize()
            gpu_pool.sync()
            cpu_pool.append(c, k, v)
            ref = cpu.decode(cpu_pool, c, q, N_Q_HEADS, layer=1)
            self.assertLess(rel_err(cupy.asnumpy(out), ref), 1e-3)

    def test_host_and_device_arrays_on_the_wrong_pool_raise(self):
        torch.manual_seed(3)
        head_dim = 64
        gpu_pool, cpu_pool = self.pools(ikv.Format.F16, head_dim)
        with gpu_pool, cpu_pool, ikv.Decoder() as gpu, ikv.Decoder(n_threads=1) as cpu:
            g, c = gpu_pool.seq_create(), cpu_pool.seq_create()
            kv = numpy.random.default_rng(3).uniform(-1, 1, (N_LAYERS, 20, N_KV_HEADS, head_dim)).astype(numpy.float32)
            gpu_pool.append(g, kv, kv)  # host K/V into a CUDA pool: the library copies them
            cpu_pool.append(c, kv, kv)
            self.assertReadsMatch(gpu_pool, cpu_pool, [(g, c)], 1e-6)
            q = torch.randn(1, 1, N_Q_HEADS, head_dim, device="cuda")
            out = torch.zeros_like(q)

            def raises(substrings, fn, *args, **kwargs):
                with self.assertRaises(ikv.InvalidArgumentError) as ctx:
                    fn(*args, **kwargs)
                self.assertIsInstance(ctx.exception, ValueError)
                for s in substrings:
                    self.assertIn(s, ctx.exception.message)

            raises(["q is host memory", "CUDA pool"], gpu.decode, gpu_pool, g, q.cpu(), N_Q_HEADS, out=out)
            raises(["q is host memory", "CUDA pool"], gpu.decode, gpu_pool, g, host(q), N_Q_HEADS, out=out)
            raises(["out is host memory", "CUDA pool"], gpu.decode, gpu_pool, g, q, N_Q_HEADS, out=out.cpu())
            raises(["lse is host memory"], gpu.decode, gpu_pool, g, q, N_Q_HEADS, out=out,
                   lse=torch.zeros(N_Q_HEADS))
            raises(["out is required on a CUDA pool"], gpu.decode, gpu_pool, g, q, N_Q_HEADS)
            raises(["return_lse on a CUDA pool needs lse="], gpu.decode, gpu_pool, g, q, N_Q_HEADS, out=out,
                   return_lse=True)
            raises(["q holds float64 elements"], gpu.decode, gpu_pool, g, q.double(), N_Q_HEADS, out=out)
            raises(["q must be C-contiguous"], gpu.decode, gpu_pool, g,
                   torch.randn(1, 1, N_Q_HEADS, 2 * head_dim, device="cuda")[..., ::2], N_Q_HEADS, out=out)
            kd = torch.from_numpy(kv).cuda()
            raises(["async_=True", "device memory", "k is host memory"], gpu_pool.append, g, kv, kv, async_=True)
            raises(["k is CUDA device memory", "v is host memory"], gpu_pool.append, g, kd, kv)
            raises(["k is CUDA device memory", "CPU pool"], cpu_pool.append, c, kd, kd)
            raises(["q is CUDA device memory", "CPU pool"], cpu.decode, cpu_pool, c, q, N_Q_HEADS)
            raises(["out is CUDA device memory", "CPU pool"], cpu.decode, cpu_pool, c, host(q), N_Q_HEADS, out=out)
            self.assertEqual((gpu_pool.seq_length(g), cpu_pool.seq_length(c)), (20, 20))
            self.assertEqual(gpu.stats()["steps"], 0)
            self.assertFalse(out.any().item())


if __name__ == "__main__":
    unittest.main()
