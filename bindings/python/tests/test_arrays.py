"""Array arguments of the Python binding on the CPU (no GPU, no torch, no cupy needed; numpy-only
tests skip without numpy): device arrays refused by CPU pools, dtype/shape/stride checks made
before any C call, strided K/V, zero-copy numpy, DLPack capsules read with ctypes, streams."""
import array
import ctypes
import os
import random
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import intentkv as ikv  # noqa: E402
from intentkv import _arrays  # noqa: E402

try:
    import numpy
except ImportError:  # the numpy-only tests skip
    numpy = None

N_LAYERS, N_KV_HEADS, N_Q_HEADS, HEAD_DIM = 2, 2, 4, 64
ROW = N_KV_HEADS * HEAD_DIM


def random_f32(rng, n):
    return array.array("f", (rng.uniform(-1.0, 1.0) for _ in range(n)))


def new_pool(**fields):
    cfg = dict(n_layers=N_LAYERS, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, page_size=16, capacity_bytes=16 << 20)
    cfg.update(fields)
    return ikv.Pool(**cfg)


class FakeCudaArray:
    """Says it is CUDA device memory (__cuda_array_interface__ v3) but points at a real host buffer:
    a binding that forgot the device check would hand C a readable pointer, so the call would
    succeed and the test fail (rather than crash)."""

    def __init__(self, host, typestr="<f4", shape=None, stream=None):
        self.host = host
        address, n = host.buffer_info()
        self.__cuda_array_interface__ = {"shape": tuple(shape or (n,)), "typestr": typestr,
                                         "data": (address, False), "strides": None, "version": 3,
                                         "stream": stream}


_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_DLTENSOR = b"dltensor"


class FakeDLPack:
    """A DLPack producer written with ctypes over an array.array: counts exports and deleter calls."""

    def __init__(self, host, shape=None, device_type=1, device_id=0, code=2, bits=32, strides=None):
        self.host = host
        address, n = host.buffer_info()
        shape = tuple(shape or (n,))
        self.device = (device_type, device_id)
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        self.managed = _arrays.DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = address
        t.device = _arrays.DLDevice(device_type, device_id)
        t.ndim = len(shape)
        t.dtype = _arrays.DLDataType(code, bits, 1)
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        if self._strides is not None:
            t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = 0
        self.exports = self.deletes = 0
        self.streams = []
        self._deleter = _arrays._DL_DELETER(self._delete)
        self.managed.deleter = ctypes.cast(self._deleter, ctypes.c_void_p).value

    def _delete(self, address):
        assert address == ctypes.addressof(self.managed)
        self.deletes += 1

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.exports += 1
        self.streams.append(stream)
        return _PyCapsule_New(ctypes.addressof(self.managed), _DLTENSOR, None)


def f16_words(values):
    """IEEE half bit patterns of values, as array('H') (no numpy)."""
    return array.array("H", struct.unpack("<%dH" % len(values), struct.pack("<%de" % len(values), *values)))


def from_f16_words(words):
    return struct.unpack("<%de" % len(words), words.tobytes())


class Assertions(unittest.TestCase):
    def assertInvalid(self, substrings, fn, *args, **kwargs):
        """fn raises InvalidArgumentError (an IntentKVError and a ValueError) naming every substring."""
        with self.assertRaises(ValueError) as ctx:
            fn(*args, **kwargs)
        exc = ctx.exception
        self.assertIsInstance(exc, ikv.IntentKVError)
        self.assertIsInstance(exc, ikv.InvalidArgumentError)
        self.assertEqual(exc.status_name, "IKV_E_INVALID")
        for s in substrings:
            self.assertIn(s, exc.message)
        return exc


class DeviceCheckTest(Assertions):
    def test_cpu_pool_refuses_cuda_array_interface(self):
        rng = random.Random(1)
        with new_pool() as pool, ikv.Decoder(n_threads=1) as decoder:
            seq = pool.seq_create()
            host_k, host_v = random_f32(rng, 3 * ROW), random_f32(rng, 3 * ROW)
            self.assertInvalid(["k is CUDA device memory", "__cuda_array_interface__", "CPU pool"],
                               pool.append, seq, FakeCudaArray(host_k), host_v, layer=0)
            self.assertInvalid(["v is CUDA device memory", "CPU pool"],
                               pool.append, seq, host_k, FakeCudaArray(host_v), layer=0)
            self.assertInvalid(["k is CUDA device memory"], pool.append_batch, [seq], FakeCudaArray(host_k),
                               FakeCudaArray(host_v), layer=0)
            self.assertEqual(pool.layer_length(seq, 0), 0)
            pool.append(seq, host_k, host_v, layer=0)  # the same memory as host arrays is fine
            pool.append(seq, host_k, host_v, layer=1)
            q = random_f32(rng, N_Q_HEADS * HEAD_DIM)
            out = array.array("f", bytes(4 * len(q)))
            lse = array.array("f", bytes(4 * N_Q_HEADS))
            self.assertInvalid(["q is CUDA device memory", "CPU pool"], decoder.decode, pool, seq, FakeCudaArray(q),
                               N_Q_HEADS)
            self.assertInvalid(["out is CUDA device memory", "CPU pool"], decoder.decode, pool, seq, q, N_Q_HEADS,
                               out=FakeCudaArray(out))
            self.assertInvalid(["lse is CUDA device memory", "CPU pool"], decoder.decode, pool, seq, q, N_Q_HEADS,
                               lse=FakeCudaArray(lse))
            self.assertEqual(decoder.stats()["steps"], 0)  # nothing reached ikv_decode
            self.assertEqual(list(out), [0.0] * len(out))

    def test_cpu_pool_refuses_cuda_dlpack_before_exporting(self):
        rng = random.Random(2)
        with new_pool() as pool, ikv.Decoder(n_threads=1) as decoder:
            seq = pool.seq_create()
            k = random_f32(rng, 2 * ROW)
            fake_k = FakeDLPack(k, device_type=2, device_id=0)  # kDLCUDA
            self.assertInvalid(["k is CUDA device memory on cuda:0 (DLPack CUDA)", "CPU pool"],
                               pool.append, seq, fake_k, k, layer=0)
            self.assertEqual(fake_k.exports, 0)
            self.assertInvalid(["lives on DLPack device ROCm"], pool.append, seq,
                               FakeDLPack(k, device_type=10), k, layer=0)
            pool.append(seq, k, k, layer=0)
            pool.append(seq, k, k, layer=1)
            q = random_f32(rng, N_Q_HEADS * HEAD_DIM)
            self.assertInvalid(["q is CUDA device memory"], decoder.decode, pool, seq,
                               FakeDLPack(q, device_type=2), N_Q_HEADS)


class DLPackTest(Assertions):
    def test_host_dlpack_is_read_in_place_and_given_back(self):
        rng = random.Random(3)
        with new_pool() as pool, ikv.Decoder(n_threads=1) as decoder:
            a, b = pool.seq_create(), pool.seq_create()
            k, v = random_f32(rng, N_LAYERS * 5 * ROW), random_f32(rng, N_LAYERS * 5 * ROW)
            fk = FakeDLPack(k, shape=(N_LAYERS, 5, N_KV_HEADS, HEAD_DIM))
            fv = FakeDLPack(v, shape=(N_LAYERS, 5, N_KV_HEADS, HEAD_DIM), device_type=3)  # kDLCUDAHost: pinned host
            self.assertEqual(pool.append(a, fk, fv), 5)
            pool.append(b, k, v)
            for layer in range(N_LAYERS):
                self.assertEqual(pool.read(a, layer, 0, 5), pool.read(b, layer, 0, 5))
            self.assertEqual((fk.exports, fk.deletes, fv.exports, fv.deletes), (1, 1, 1, 1))
            self.assertEqual(fk.streams, [None])  # host arrays: no stream handed to the producer
            q = random_f32(rng, N_Q_HEADS * HEAD_DIM)
            expected = decoder.decode(pool, a, q, N_Q_HEADS)
            out = array.array("f", [float("nan")] * len(q))
            fout = FakeDLPack(out, shape=(1, N_Q_HEADS, HEAD_DIM))
            self.assertIs(decoder.decode(pool, a, FakeDLPack(q), N_Q_HEADS, out=fout), fout)
            self.assertEqual(list(out), list(expected))  # written in place, through the capsule's pointer
            self.assertEqual(fout.deletes, 1)

    def test_dlpack_strides_and_dtypes(self):
        rng = random.Random(4)
        with new_pool() as pool:
            a, b = pool.seq_create(), pool.seq_create()
            # [head][token][dim] memory read as [token][head][dim] through DLPack strides (elements)
            n = 3
            k_hm = random_f32(rng, N_KV_HEADS * n * HEAD_DIM)
            strides = (HEAD_DIM, n * HEAD_DIM, 1)
            pool.append(a, FakeDLPack(k_hm, shape=(n, N_KV_HEADS, HEAD_DIM), strides=strides),
                        FakeDLPack(k_hm, shape=(n, N_KV_HEADS, HEAD_DIM), strides=strides), layer=0)
            token_major = array.array("f", [k_hm[(h * n + t) * HEAD_DIM + d] for t in range(n)
                                            for h in range(N_KV_HEADS) for d in range(HEAD_DIM)])
            pool.append(b, token_major, token_major, layer=0)
            self.assertEqual(pool.read(a, 0, 0, n), pool.read(b, 0, 0, n))
            fake = FakeDLPack(token_major, code=0, bits=32)  # int32
            self.assertInvalid(["k holds int32 elements", "expected F32"], pool.append, a, fake, fake, layer=0)
            self.assertEqual(fake.deletes, fake.exports)  # given back on the error path too


class DTypeShapeTest(Assertions):
    def test_dtype_errors(self):
        rng = random.Random(5)
        with new_pool() as pool, ikv.Decoder(n_threads=1) as decoder:
            seq = pool.seq_create()
            kv = random_f32(rng, N_LAYERS * 4 * ROW)
            pool.append(seq, kv, kv)
            q = random_f32(rng, N_Q_HEADS * HEAD_DIM)
            words = array.array("H", [0] * (4 * ROW))
            self.assertInvalid(["k holds 16-bit elements", "expected F32", "kv_dtype"], pool.append, seq, words, words,
                               layer=0)
            self.assertInvalid(["q holds 16-bit elements of no float type", "q_dtype"], decoder.decode, pool, seq,
                               array.array("H", [0] * len(q)), N_Q_HEADS)
            self.assertInvalid(["q holds format 'i'"], decoder.decode, pool, seq, array.array("i", [0] * len(q)),
                               N_Q_HEADS)
            self.assertInvalid(["out holds float64 elements"], decoder.decode, pool, seq, q, N_Q_HEADS,
                               out=array.array("d", [0.0] * len(q)))
            self.assertInvalid(["lse holds 16-bit elements", "expected F32"], decoder.decode, pool, seq, q, N_Q_HEADS,
                               lse=array.array("H", [0] * N_Q_HEADS))
            self.assertInvalid(["out_dtype F16 needs out="], decoder.decode, pool, seq, q, N_Q_HEADS,
                               out_dtype=ikv.DType.F16)
            self.assertInvalid(["out is read-only"], decoder.decode, pool, seq, q, N_Q_HEADS,
                               out=bytes(4 * len(q)))
            self.assertEqual(decoder.stats()["steps"], 0)

    def test_f16_queries_and_outputs_as_raw_words(self):
        rng = random.Random(6)
        with new_pool() as pool, ikv.Decoder(n_threads=1) as decoder:
            seq = pool.seq_create()
            kv = random_f32(rng, N_LAYERS * 30 * ROW)
            pool.append(seq, kv, random_f32(rng, len(kv)))
            q16 = f16_words([rng.uniform(-1, 1) for _ in range(2 * N_Q_HEADS * HEAD_DIM)])
            q32 = array.array("f", from_f16_words(q16))  # the same values in float32
            ref, ref_lse = decoder.decode(pool, seq, q32, N_Q_HEADS, n_query_tokens=2, return_lse=True)
            out16 = array.array("H", [0] * len(q16))
            lse = array.array("f", [0.0] * 2 * N_Q_HEADS)
            got = decoder.decode(pool, seq, q16, N_Q_HEADS, n_query_tokens=2, q_dtype=ikv.DType.F16, out=out16,
                                 out_dtype=ikv.DType.F16, lse=lse)
            self.assertIs(got[0], out16)
            self.assertIs(got[1], lse)
            vals = from_f16_words(out16)
            for a, b in zip(vals, ref):  # float16 rounding of the output
                self.assertLessEqual(abs(a - b), 2.0 ** -10 * max(abs(b), 2.0 ** -14) + 1e-6)
            for a, b in zip(lse, ref_lse):
                self.assertAlmostEqual(a, b, places=5)
            self.assertInvalid(["q holds float32 elements", "expected F16", "q_dtype"], decoder.decode, pool, seq,
                               q32, N_Q_HEADS, q_dtype=ikv.DType.F16)

    def test_shape_errors(self):
        rng = random.Random(7)
        with new_pool() as pool, ikv.Decoder(n_threads=1) as decoder:
            seq = pool.seq_create()
            kv = random_f32(rng, N_LAYERS * 8 * ROW)
            pool.append(seq, kv, kv)
            q = random_f32(rng, N_Q_HEADS * HEAD_DIM)
            self.assertInvalid(["q holds 255 elements; this call needs 256"], decoder.decode, pool, seq, q[:-1],
                               N_Q_HEADS)
            self.assertInvalid(["out holds 128 elements; this call needs 256"], decoder.decode, pool, seq, q,
                               N_Q_HEADS, out=array.array("f", bytes(4 * 128)))
            self.assertInvalid(["lse holds 3 elements; this call needs 4"], decoder.decode, pool, seq, q, N_Q_HEADS,
                               lse=array.array("f", [0.0] * 3))
            # 256 floats shaped (8, 32): the right count, but rows of half a head
            shaped = memoryview(q).cast("B").cast("f", shape=[8, 32])
            self.assertInvalid(["q has shape (8, 32)", "whole heads of head_dim 64"], decoder.decode, pool, seq,
                               shaped, N_Q_HEADS)
            k = memoryview(random_f32(rng, 4 * ROW)).cast("B").cast("f", shape=[16, 32])
            self.assertInvalid(["k has shape (16, 32)"], pool.append, seq, k, k, layer=0)
            self.assertInvalid(["k holds 100 elements, not a positive multiple of 128"], pool.append, seq,
                               kv[:100], kv[:100], layer=0)
            self.assertInvalid(["v holds 128 elements; this call needs 256"], pool.append, seq, kv[:256], kv[:128],
                               layer=0)
            self.assertInvalid(["seqs is empty"], pool.append_batch, [], kv[:256], kv[:256], layer=0)
            self.assertEqual(pool.layer_length(seq, 0), 8)
            self.assertEqual(decoder.stats()["steps"], 0)


class StreamTest(Assertions):
    def test_stream_handles(self):
        class TorchLike:
            cuda_stream = 0x1234

        class CupyLike:
            ptr = 0x5678

        class Protocol:
            def __cuda_stream__(self):
                return (0, 0x9abc)

        class NumbaLike:
            handle = ctypes.c_void_p(0xdef0)

        cases = [(None, None), (0, None), (7, 7), (ctypes.c_void_p(11), 11), (TorchLike(), 0x1234),
                 (CupyLike(), 0x5678), (Protocol(), 0x9abc), (NumbaLike(), 0xdef0)]
        for stream, handle in cases:
            self.assertEqual(_arrays.stream_handle(stream), handle, repr(stream))
        for bad in (-1, True, "stream", 1.5):
            with self.assertRaises(_arrays.ArrayError):
                _arrays.stream_handle(bad)
        ref = _arrays.array_ref(FakeCudaArray(array.array("f", [0.0] * 4), stream=0x42), "q")
        self.assertEqual((ref.kind, ref.stream), (_arrays.DEVICE, 0x42))

    def test_cpu_pool_takes_stream_and_async_flag(self):
        # ikv_pool_append: a CPU pool accepts IKV_APPEND_ASYNC and appends synchronously; streams are unused.
        rng = random.Random(8)
        with new_pool() as pool, ikv.Decoder(n_threads=1) as decoder:
            a, b = pool.seq_create(), pool.seq_create()
            kv = random_f32(rng, N_LAYERS * 3 * ROW)
            pool.append(a, kv, kv, async_=True, stream=0)
            pool.append(b, kv, kv)
            pool.sync()
            self.assertEqual(pool.read(a, 1, 0, 3), pool.read(b, 1, 0, 3))
            bad = array.array("f", [float("nan")] * ROW)
            with self.assertRaises(ikv.IntentKVError) as ctx:  # checked at once on a CPU pool
                pool.append(a, bad, bad, layer=0, async_=True)
            self.assertIn("ikv_pool_append", ctx.exception.message)
            q = random_f32(rng, N_Q_HEADS * HEAD_DIM)
            self.assertEqual(list(decoder.decode(pool, a, q, N_Q_HEADS, stream=None)),
                             list(decoder.decode(pool, b, q, N_Q_HEADS)))
            self.assertInvalid(["stream is a str"], decoder.decode, pool, a, q, N_Q_HEADS, stream="s")


@unittest.skipIf(numpy is None, "numpy is not installed")
class NumpyTest(Assertions):
    def test_out_and_lse_are_written_in_place(self):
        rng = numpy.random.default_rng(9)
        with new_pool() as pool, ikv.Decoder(n_threads=1) as decoder:
            seq = pool.seq_create()
            kv = rng.uniform(-1, 1, (N_LAYERS, 50, N_KV_HEADS, HEAD_DIM)).astype(numpy.float32)
            pool.append(seq, kv, kv[::-1].copy())
            q = rng.uniform(-1, 1, (1, 2, N_Q_HEADS, HEAD_DIM)).astype(numpy.float32)
            ref, ref_lse = decoder.decode(pool, seq, q, N_Q_HEADS, n_query_tokens=2, return_lse=True)
            out = numpy.full(q.shape, numpy.nan, numpy.float32)
            lse = numpy.full((1, 2, N_Q_HEADS), numpy.nan, numpy.float32)
            got_out, got_lse = decoder.decode(pool, seq, q, N_Q_HEADS, n_query_tokens=2, out=out, lse=lse)
            self.assertIs(got_out, out)
            self.assertIs(got_lse, lse)
            self.assertTrue(numpy.array_equal(out.ravel(), numpy.frombuffer(ref, numpy.float32)))
            self.assertTrue(numpy.array_equal(lse.ravel(), numpy.frombuffer(ref_lse, numpy.float32)))
            # a view into a larger array: written in place too, its neighbours untouched
            big = numpy.zeros((3, 2, N_Q_HEADS, HEAD_DIM), numpy.float32)
            decoder.decode(pool, seq, q, N_Q_HEADS, n_query_tokens=2, out=big[1:2])
            self.assertTrue(numpy.array_equal(big[1:2], out))
            self.assertFalse(big[0].any() or big[2].any())
            # float16 out
            out16 = numpy.zeros(q.shape, numpy.float16)
            decoder.decode(pool, seq, q, N_Q_HEADS, n_query_tokens=2, out=out16)
            self.assertLess(numpy.abs(out16.astype(numpy.float32) - out).max(), 2e-3)
            readonly = out.copy()
            readonly.setflags(write=False)
            self.assertInvalid(["out is read-only"], decoder.decode, pool, seq, q, N_Q_HEADS, n_query_tokens=2,
                               out=readonly)
            self.assertInvalid(["out must be C-contiguous"], decoder.decode, pool, seq, q, N_Q_HEADS,
                               n_query_tokens=2, out=numpy.zeros((1, 2, N_Q_HEADS, 2 * HEAD_DIM), numpy.float32)[..., ::2])

    def test_inputs_are_not_copied(self):
        arr = numpy.arange(4 * ROW, dtype=numpy.float32)
        arr.setflags(write=False)  # read-only inputs too: the pointer C gets is the array's own
        ref = _arrays.array_ref(arr, "k", need=_arrays.HOST)
        self.assertEqual(ref.ptr, arr.__array_interface__["data"][0])
        view = arr.reshape(4, ROW)[1:3]
        self.assertEqual(_arrays.array_ref(view, "k").ptr, view.__array_interface__["data"][0])
        f64 = numpy.zeros(8)  # float64 host inputs are the one case converted (to float32)
        self.assertEqual(_arrays.array_ref(f64, "q", f64_to_f32=True).elem, _arrays.F32)
        self.assertEqual(_arrays.array_ref(f64, "out").elem, _arrays.F64)

    def test_strided_kv_views_equal_contiguous_appends(self):
        rng = numpy.random.default_rng(10)
        with new_pool(default_format=ikv.Format.INT8) as strided, new_pool(default_format=ikv.Format.INT8) as dense:
            seqs = [strided.seq_create() for _ in range(3)]
            ref = [dense.seq_create() for _ in range(3)]
            # a fused projection [seq][token][q heads | k heads | v heads] per layer; k and v are views of it
            width = (N_Q_HEADS + 2 * N_KV_HEADS) * HEAD_DIM
            for layer in range(N_LAYERS):
                qkv = rng.uniform(-1, 1, (3, 5, width)).astype(numpy.float32)
                k = qkv[..., N_Q_HEADS * HEAD_DIM:(N_Q_HEADS + N_KV_HEADS) * HEAD_DIM]
                v = qkv[..., (N_Q_HEADS + N_KV_HEADS) * HEAD_DIM:]
                self.assertFalse(k.flags.c_contiguous)
                self.assertEqual(strided.append_batch(seqs, k, v, layer=layer), 5)
                for i, seq in enumerate(ref):
                    dense.append(seq, numpy.ascontiguousarray(k[i]), numpy.ascontiguousarray(v[i]), layer=layer)
            # head-major memory [layer][head][token][dim] read as [layer][token][head][dim]
            hm_k = rng.uniform(-1, 1, (N_LAYERS, N_KV_HEADS, 7, HEAD_DIM)).astype(numpy.float32)
            hm_v = rng.uniform(-1, 1, (N_LAYERS, N_KV_HEADS, 7, HEAD_DIM)).astype(numpy.float32)
            strided.append(seqs[0], hm_k.transpose(0, 2, 1, 3), hm_v.transpose(0, 2, 1, 3))
            dense.append(ref[0], numpy.ascontiguousarray(hm_k.transpose(0, 2, 1, 3)),
                         numpy.ascontiguousarray(hm_v.transpose(0, 2, 1, 3)))
            for a, b in zip(seqs, ref):
                n = dense.seq_length(b)
                self.assertEqual(strided.seq_length(a), n)
                for layer in range(N_LAYERS):
                    self.assertEqual(strided.read(a, layer, 0, n), dense.read(b, layer, 0, n))
            every_other = numpy.zeros((3, N_KV_HEADS, 2 * HEAD_DIM), numpy.float32)[..., ::2]
            self.assertInvalid(["head_dim elements are 2 apart", "contiguous"], strided.append, seqs[1],
                               every_other, every_other, layer=0)
            self.assertInvalid(["k and v must share strides"], strided.append, seqs[1], hm_k.transpose(0, 2, 1, 3),
                               numpy.ascontiguousarray(hm_v.transpose(0, 2, 1, 3)))
            self.assertInvalid(["k's token stride is 0 elements", ">= head_dim"], strided.append, seqs[1],
                               numpy.broadcast_to(hm_k[0, :, :1], (4, N_KV_HEADS, 1, HEAD_DIM))[:, :, 0],
                               numpy.broadcast_to(hm_v[0, :, :1], (4, N_KV_HEADS, 1, HEAD_DIM))[:, :, 0], layer=0)
            self.assertInvalid(["k holds float16 elements", "expected F32"], strided.append, seqs[1],
                               hm_k.astype(numpy.float16), hm_v.astype(numpy.float16))

    def test_float64_host_inputs_still_convert(self):
        rng = numpy.random.default_rng(11)
        with new_pool() as pool, ikv.Decoder(n_threads=1) as decoder:
            a, b = pool.seq_create(), pool.seq_create()
            kv = rng.uniform(-1, 1, (N_LAYERS, 6, N_KV_HEADS, HEAD_DIM))
            pool.append(a, kv, kv)
            pool.append(b, kv.astype(numpy.float32), kv.astype(numpy.float32))
            self.assertEqual(pool.read(a, 0, 0, 6), pool.read(b, 0, 0, 6))
            q = rng.uniform(-1, 1, (N_Q_HEADS, HEAD_DIM))
            self.assertEqual(list(decoder.decode(pool, a, q, N_Q_HEADS)),
                             list(decoder.decode(pool, a, q.astype(numpy.float32), N_Q_HEADS)))

    def test_query_memory_takes_numpy_f16(self):
        with new_pool(n_layers=1) as pool, ikv.QueryMemory(pool, n_q_heads=N_Q_HEADS) as memory:
            seq = pool.seq_create()
            q = numpy.ones((2, N_Q_HEADS, HEAD_DIM), numpy.float16)
            memory.remember(seq, 0, q)
            memory.remember(seq, 0, q.astype(numpy.float32))
            memory.end_turn(seq)
            self.assertInvalid(["q is CUDA device memory", "host memory"], memory.remember, seq, 0,
                               FakeCudaArray(array.array("f", [0.0] * N_Q_HEADS * HEAD_DIM)))


if __name__ == "__main__":
    unittest.main()
