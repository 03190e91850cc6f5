"""Array arguments as raw pointers for C: host buffers, numpy, __cuda_array_interface__ and DLPack.

Every array argument of the bindings (K/V of appends, q/out/lse of a decode, ...) goes through
array_ref(), which finds where the data lives (host, CUDA device, CUDA managed memory), its element
type, shape and strides (in elements), and a pointer C can use without copying. Nothing here
imports numpy, torch or cupy: objects are read through their protocols.

Order of the protocols tried: __cuda_array_interface__ (CuPy, Numba, PyTorch CUDA tensors),
__array_interface__ (numpy and what mimics it), DLPack (__dlpack__ / __dlpack_device__; the
capsule is read with ctypes), then the buffer protocol (array.array, memoryview, bytearray).
"""
import ctypes
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p
from typing import Any, Callable, List, Optional, Sequence, Tuple

# Where an array's memory lives.
HOST = "host"        # host memory (pageable or pinned)
DEVICE = "device"    # CUDA device memory
MANAGED = "managed"  # CUDA managed memory: readable from both

# Element types as the protocols describe them; the bindings map the first three onto ikv_dtype.
F32, F16, BF16, RAW16, F64 = "float32", "float16", "bfloat16", "16-bit", "float64"


class ArrayRef:
    """One array argument: ptr (int), shape, strides (elements), elem (element type), kind (HOST,
    DEVICE, MANAGED), device_id (None when unknown), readonly, stream (a CAI v3 producer stream or
    None), source (the protocol, for messages). release() gives a DLPack tensor back."""

    def __init__(self, what: str, obj: Any, ptr: int, shape: Sequence[int], strides: Optional[Sequence[int]],
                 itemsize: int, elem: str, kind: str, source: str, device_id: Optional[int] = None,
                 readonly: bool = False, stream: Optional[int] = None) -> None:
        self.what = what
        self.obj = obj          # keeps the source (or its converted copy) alive while C uses ptr
        self.ptr = ptr
        self.shape = tuple(int(n) for n in shape)
        self.strides = tuple(int(s) for s in strides) if strides is not None else contiguous_strides(self.shape)
        self.itemsize = itemsize
        self.elem = elem
        self.kind = kind
        self.source = source
        self.device_id = device_id
        self.readonly = readonly
        self.stream = stream
        self._release: Optional[Callable[[], None]] = None

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def c_contiguous(self) -> bool:
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n == 1:
                continue
            if s != expected:
                return False
            expected *= n
        return True

    def where(self) -> str:
        return _where(self.kind, self.device_id, self.source)

    def release(self) -> None:
        fn, self._release = self._release, None
        if fn is not None:
            fn()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


def _where(kind: str, device_id: Optional[int], source: str) -> str:
    """'host memory (numpy)', 'CUDA device memory on cuda:0 (DLPack CUDA)', ... for messages."""
    if kind == HOST:
        return "host memory (%s)" % source
    dev = "" if device_id is None else " on cuda:%d" % device_id
    return "%s memory%s (%s)" % ("CUDA device" if kind == DEVICE else "CUDA managed", dev, source)


def contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


class ArrayError(Exception):
    """Raised by this module; the bindings turn it into their IntentKVError (IKV_E_INVALID)."""


# ---------------------------------------------------------------- streams

def stream_handle(stream: Any) -> Optional[int]:
    """A cudaStream_t as an int (None = the default stream) from an int, a ctypes.c_void_p, or an
    object with __cuda_stream__ (the CUDA stream protocol: (version, handle)), .cuda_stream
    (torch.cuda.Stream), .ptr (cupy.cuda.Stream) or .handle (numba.cuda stream)."""
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise ArrayError("stream is a bool; pass a cudaStream_t handle (int) or a stream object")
    if isinstance(stream, int):
        if stream < 0:
            raise ArrayError("stream is %d; a cudaStream_t handle is >= 0 (0 = the default stream)" % stream)
        return stream or None
    if isinstance(stream, c_void_p):
        return stream.value or None
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        if isinstance(value, tuple) and len(value) == 2:
            value = value[1]
        return stream_handle(int(value))
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, c_void_p):
            value = value.value or 0
        if isinstance(value, int) and not isinstance(value, bool):
            return stream_handle(value)
    raise ArrayError("stream is a %s; pass a cudaStream_t handle (int), or an object with __cuda_stream__, "
                     ".cuda_stream (torch.cuda.Stream), .ptr (cupy.cuda.Stream) or .handle (numba)"
                     % type(stream).__name__)


# ---------------------------------------------------------------- element types

def _typestr_elem(typestr: str, obj: Any) -> Tuple[str, int]:
    """(element type, itemsize) of an array-interface typestr such as '<f4'."""
    if len(typestr) < 3 or typestr[0] not in "<>|=":
        raise ArrayError("unreadable typestr %r" % (typestr,))
    order, kind, size = typestr[0], typestr[1], int(typestr[2:])
    if order == ">" and size > 1:
        return "big-endian %s%d" % (kind, size), size
    if kind == "f" and size == 4:
        return F32, 4
    if kind == "f" and size == 2:
        return F16, 2
    if kind == "f" and size == 8:
        return F64, 8
    if size == 2 and kind in "Viu":
        # PyTorch and ml_dtypes describe bfloat16 as '<V2'; the dtype object says which it is.
        if "bfloat16" in str(getattr(obj, "dtype", "")):
            return BF16, 2
        return RAW16, 2
    return {"i": "int", "u": "uint", "b": "bool", "c": "complex", "V": "void"}.get(kind, kind) + str(8 * size), size


def _format_elem(fmt: str, itemsize: int) -> str:
    """Element type of a buffer-protocol format string ('f', '<e', 'H', ...)."""
    code = fmt.lstrip("@=<")
    if fmt.startswith((">", "!")) and itemsize > 1:
        return "big-endian %r" % fmt
    if code == "f":
        return F32
    if code == "e":
        return F16
    if code == "d":
        return F64
    if itemsize == 2 and code in ("h", "H"):
        return RAW16
    return "format %r" % fmt


# ---------------------------------------------------------------- DLPack

_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLROCM, _kDLROCMHost, _kDLCUDAManaged = 1, 2, 3, 10, 11, 13
_DL_KIND = {_kDLCPU: HOST, _kDLCUDAHost: HOST, _kDLCUDA: DEVICE, _kDLCUDAManaged: MANAGED}
_DL_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm",
             11: "ROCm host", 12: "ext_dev", 13: "CUDA managed", 14: "oneAPI", 15: "WebGPU", 16: "Hexagon"}


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    """dlpack.h's unversioned DLManagedTensor (what __dlpack__() returns when given no max_version)."""
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


_DL_DELETER = CFUNCTYPE(None, c_void_p)
# Fresh function objects (not ctypes.pythonapi's shared ones, whose argtypes other code may set).
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(c_void_p, ctypes.py_object, c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, c_char_p)(("PyCapsule_SetName", ctypes.pythonapi))
_DLTENSOR = b"dltensor"
_USED_DLTENSOR = b"used_dltensor"  # module constant: the capsule keeps pointing at it


def _dl_elem(dtype: DLDataType) -> Tuple[str, int]:
    code, bits, lanes = dtype.code, dtype.bits, dtype.lanes
    size = (bits * lanes + 7) // 8
    if lanes != 1:
        return "vector of %d lanes" % lanes, size
    if code == 2 and bits == 32:
        return F32, 4
    if code == 2 and bits == 16:
        return F16, 2
    if code == 4 and bits == 16:
        return BF16, 2
    if code == 2 and bits == 64:
        return F64, 8
    return {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}.get(code, "code%d-" % code) + \
        str(bits), size


def _from_dlpack(obj: Any, what: str, dev_type: int, dev_id: int, dl_stream: Optional[int]) -> ArrayRef:
    try:
        if dev_type in (_kDLCUDA, _kDLCUDAManaged):
            try:
                capsule = obj.__dlpack__(stream=dl_stream if dl_stream is not None else 1)
            except TypeError:  # a producer older than the stream keyword
                capsule = obj.__dlpack__()
        else:
            capsule = obj.__dlpack__()
    except Exception as exc:
        raise ArrayError("%s: its __dlpack__() failed: %s: %s" % (what, type(exc).__name__, exc))
    if not _capsule_is_valid(capsule, _DLTENSOR):
        raise ArrayError("%s: __dlpack__() returned no 'dltensor' capsule (a used or versioned one?)" % what)
    address = _capsule_pointer(capsule, _DLTENSOR)
    if _capsule_set_name(capsule, _USED_DLTENSOR) != 0:  # from now on we own it and call its deleter
        raise ArrayError("%s: could not mark the DLPack capsule as consumed" % what)
    managed = DLManagedTensor.from_address(address)

    def give_back(address=address, deleter=managed.deleter, capsule=capsule):
        if deleter:
            _DL_DELETER(deleter)(address)

    t = managed.dl_tensor
    try:
        dev = int(t.device.device_type)
        if dev not in _DL_KIND:
            raise ArrayError("%s: its DLPack tensor lives on device type %s, which intentkv cannot read"
                             % (what, _DL_NAMES.get(dev, str(dev))))
        shape = [t.shape[i] for i in range(t.ndim)]
        strides = [t.strides[i] for i in range(t.ndim)] if t.strides else None  # elements; NULL = row-major
        elem, itemsize = _dl_elem(t.dtype)
        ptr = (t.data or 0) + t.byte_offset
        kind = _DL_KIND[dev]
        ref = ArrayRef(what, obj, ptr, shape, strides, itemsize, elem, kind, "DLPack %s" % _DL_NAMES[dev],
                       device_id=int(t.device.device_id) if kind != HOST else None)
    except Exception:
        give_back()
        raise
    ref._release = give_back
    return ref


# ---------------------------------------------------------------- array interfaces

def _torch_or_cupy_device_index(obj: Any) -> Optional[int]:
    device = getattr(obj, "device", None)
    for attr in ("index", "id"):  # torch.device.index, cupy.cuda.Device.id
        value = getattr(device, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _from_interface(obj: Any, what: str, iface: dict, kind: str, source: str) -> ArrayRef:
    try:
        shape = tuple(int(n) for n in iface["shape"])
        elem, itemsize = _typestr_elem(iface["typestr"], obj)
        data = iface.get("data")
        byte_strides = iface.get("strides")
    except (KeyError, TypeError, ValueError) as exc:
        raise ArrayError("%s: its %s is malformed (%s)" % (what, source, exc))
    if iface.get("mask") is not None:
        raise ArrayError("%s: masked arrays (%s with a mask) are not supported" % (what, source))
    if data is None:
        ptr, readonly = 0, False
    elif isinstance(data, tuple):
        ptr, readonly = int(data[0] or 0), bool(data[1])
    else:
        raise ArrayError("%s: its %s holds a buffer object as data; pass the array itself" % (what, source))
    ptr += int(iface.get("offset", 0) or 0)
    strides = None
    if byte_strides is not None:
        if any(s % itemsize for s in byte_strides):
            raise ArrayError("%s has byte strides %s that are not multiples of its element size %d"
                             % (what, tuple(byte_strides), itemsize))
        strides = [s // itemsize for s in byte_strides]
    stream = None
    if kind != HOST and int(iface.get("version", 0)) >= 3 and iface.get("stream") is not None:
        stream = int(iface["stream"])
    return ArrayRef(what, obj, ptr, shape, strides, itemsize, elem, kind, source,
                    device_id=_torch_or_cupy_device_index(obj) if kind != HOST else None,
                    readonly=readonly, stream=stream)


def _from_buffer(obj: Any, what: str, writable: bool) -> ArrayRef:
    view = memoryview(obj)
    elem = _format_elem(view.format, view.itemsize)
    if not view.c_contiguous:
        raise ArrayError("%s must be C-contiguous (a buffer of strides %s bytes is not)" % (what, view.strides))
    raw = view.cast("B") if view.nbytes else None
    if raw is not None and raw.readonly:
        if writable:
            raise ArrayError("%s is read-only (%s); pass a writable array" % (what, type(obj).__name__))
        keep = (ctypes.c_char * raw.nbytes).from_buffer_copy(raw)  # ctypes cannot point into read-only memory
    else:
        keep = (ctypes.c_char * view.nbytes).from_buffer(raw) if raw is not None else (ctypes.c_char * 1)()
    ref = ArrayRef(what, (obj, keep), ctypes.addressof(keep), view.shape or (1,), None, view.itemsize, elem, HOST,
                   type(obj).__name__)
    return ref


def _is_numpy(obj: Any) -> bool:
    return type(obj).__module__ == "numpy" and hasattr(obj, "astype")


def array_ref(obj: Any, what: str, need: Optional[str] = None, why: str = "", writable: bool = False,
              f64_to_f32: bool = False, dl_stream: Optional[int] = None) -> ArrayRef:
    """Describe obj for C. need: HOST (C reads it on the host) or DEVICE (on the GPU); a mismatch
    raises ArrayError naming `what` and `why`, before any DLPack export. writable: C writes into it.
    f64_to_f32: a float64 numpy input is converted to a float32 copy (the bindings' long-standing
    convenience for host inputs); nothing else is ever copied, except read-only non-numpy buffers."""
    if obj is None:
        raise ArrayError("%s is None; pass an array" % what)
    ref = None
    cai, cai_error = None, None
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        pass
    except Exception as exc:  # e.g. a torch tensor that requires grad
        if not hasattr(obj, "__dlpack__"):
            raise ArrayError("%s: reading its __cuda_array_interface__ failed: %s" % (what, exc))
        cai_error = exc  # DLPack may still work (it says why if it does not)
    if cai is not None:
        ref = _from_interface(obj, what, cai, DEVICE, "__cuda_array_interface__")
    elif cai_error is None and getattr(obj, "__array_interface__", None) is not None:
        _check_side(what, HOST, need, why, _where(HOST, None, type(obj).__name__))
        if f64_to_f32 and _is_numpy(obj) and str(obj.dtype) == "float64":
            import numpy
            obj = numpy.ascontiguousarray(obj, dtype=numpy.float32)
        ref = _from_interface(obj, what, obj.__array_interface__, HOST, type(obj).__name__)
    elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        try:
            dev_type, dev_id = obj.__dlpack_device__()
            dev_type, dev_id = int(dev_type), int(dev_id)
        except Exception as exc:
            raise ArrayError("%s: its __dlpack_device__() failed: %s" % (what, exc))
        if dev_type not in _DL_KIND:
            raise ArrayError("%s lives on DLPack device %s:%d, which intentkv cannot read; pass host memory or a "
                             "CUDA device array" % (what, _DL_NAMES.get(dev_type, str(dev_type)), dev_id))
        source = "DLPack %s" % _DL_NAMES[dev_type]
        _check_side(what, _DL_KIND[dev_type], need, why,
                    _where(_DL_KIND[dev_type], dev_id if _DL_KIND[dev_type] != HOST else None, source))
        ref = _from_dlpack(obj, what, dev_type, dev_id, dl_stream)
    else:
        try:
            ref = _from_buffer(obj, what, writable)
        except TypeError:
            raise ArrayError("%s is a %s, which is no array: pass a buffer (array.array('f'), memoryview), a numpy "
                             "array, an object with __cuda_array_interface__ (CuPy, Numba, PyTorch CUDA tensors) "
                             "or with __dlpack__" % (what, type(obj).__name__))
    try:
        _check_side(what, ref.kind, need, why, ref.where())
        if writable and ref.readonly:
            raise ArrayError("%s is read-only (%s); pass a writable array" % (what, ref.source))
    except Exception:
        ref.release()
        raise
    return ref


def _check_side(what: str, kind: str, need: Optional[str], why: str, where: str) -> None:
    if need == HOST and kind == DEVICE:
        raise ArrayError("%s is %s but %s; pass host memory (numpy, array.array, tensor.cpu())" % (what, where, why))
    if need == DEVICE and kind == HOST:
        raise ArrayError("%s is %s but %s; pass a CUDA device array (a torch CUDA tensor, a CuPy array, ...)"
                         % (what, where, why))


# ---------------------------------------------------------------- shapes and strides

def nocopy_reshape(shape: Sequence[int], strides: Sequence[int], newshape: Sequence[int]) -> Optional[List[int]]:
    """Strides (elements) viewing an array of shape/strides as newshape (same element count,
    row-major order) without copying, or None when no such strides exist (numpy's rule)."""
    old = [(int(n), int(s)) for n, s in zip(shape, strides) if n != 1]
    new = [int(n) for n in newshape]
    out = [0] * len(new)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new) and oi < len(old):
        np_, op = new[ni], old[oi][0]
        while np_ != op:
            if np_ < op:
                if nj >= len(new):
                    return None
                np_ *= new[nj]
                nj += 1
            else:
                if oj >= len(old):
                    return None
                op *= old[oj][0]
                oj += 1
        for ok in range(oi, oj - 1):  # the old axes merged here must be contiguous with each other
            if old[ok][1] != old[ok + 1][0] * old[ok + 1][1]:
                return None
        out[nj - 1] = old[oj - 1][1]
        for nk in range(nj - 1, ni, -1):
            out[nk - 1] = out[nk] * new[nk]
        ni, nj = nj, nj + 1
        oi, oj = oj, oj + 1
    last = out[ni - 1] if ni >= 1 else 1
    for nk in range(ni, len(new)):
        out[nk] = last
    return out
