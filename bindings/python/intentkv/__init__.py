"""Python bindings for intentkv (ctypes over libintentkv; no third-party dependency).

    import intentkv as ikv
    with ikv.Layout.synth(seq_len=8192) as layout, ikv.Router(page_size=16) as router:
        with router.route(layout, 8192) as plan:
            print(plan.summary())

Every failing C call raises IntentKVError(status_name, message), where message is
ikv_last_error(). Argument checks done in Python before any C call (shapes, dtypes, strides,
host vs device memory) raise InvalidArgumentError, an IntentKVError (IKV_E_INVALID) that is also
a ValueError. Handles close on close(), on leaving a `with` block, or when garbage collected.

Arrays (K/V of appends, queries, outputs, lse) are passed to C without copying. Accepted:
host memory through the buffer protocol (array.array, memoryview, bytearray), numpy arrays
(__array_interface__), CUDA arrays through __cuda_array_interface__ (CuPy, Numba, PyTorch CUDA
tensors), and DLPack (__dlpack__ / __dlpack_device__: PyTorch CPU tensors, JAX, ...). CPU pools
take host memory; CUDA pools take device K/V (or host K/V, copied by the library) and device
q/out/lse. Element types are float32, float16 and bfloat16 (ikv_dtype F32, F16, BF16); numpy is
used when installed, never required.
"""
import array
import ctypes
import enum
import weakref
from collections import namedtuple
from ctypes import byref, c_float, c_int, c_size_t, c_uint32, c_uint64, c_void_p, POINTER
from typing import Any, Optional, Sequence, Tuple, Union

from . import _arrays, _ffi
from ._ffi import (IKV_ALL_LAYERS, IKV_MAX_QUERY_TOKENS, IKV_PAGE_MANDATORY, IKV_PAGE_PARTIAL, IKV_TIER_NO_PREFETCH,
                   load)

__all__ = ["load", "IntentKVError", "InvalidArgumentError", "IKV_APPEND_ASYNC", "Format", "DType", "Backend", "Tier", "TopkMode", "TopkScore", "QueryMemory", "PageFeedback", "Kind", "Policy", "Reason", "OverBudget", "Layout",
           "Router", "Plan", "Pool", "TierStepReport", "Decoder", "runtime_info", "version", "version_string",
           "IKV_ALL_LAYERS", "IKV_MAX_QUERY_TOKENS", "IKV_PAGE_MANDATORY", "IKV_PAGE_PARTIAL", "IKV_TIER_NO_PREFETCH"]

IKV_APPEND_ASYNC = 0x1

# Anything array_ref() reads (buffer, numpy array, __cuda_array_interface__, DLPack), and a CUDA
# stream: None (default stream), an int cudaStream_t, or a stream object (torch, cupy, numba).
ArrayLike = Any
StreamLike = Any


class Format(enum.IntEnum):
    F16, BF16, FP8_E4M3, INT8, INT4 = 0, 1, 2, 3, 4
    AUTO = 255


class DType(enum.IntEnum):
    F32, F16, BF16 = 0, 1, 2


class Backend(enum.IntEnum):
    """ikv_backend: where a pool keeps its pages (Pool(backend=Backend.CUDA, device=0, ...))."""
    CPU, CUDA = 0, 1


class Tier(enum.IntEnum):
    """Where a page of a pool is (Pool.page_tier): device memory or a CUDA pool's pinned host tier.
    The value is ikv_seq_page_tier's on_host flag, so bool(tier) is True for HOST."""
    DEVICE, HOST = 0, 1


class TopkMode(enum.IntEnum):
    FIXED = 0
    MASS = 1


class TopkScore(enum.IntEnum):
    QUEST = 0
    HYBRID = 1
    KEYS = 2


class Kind(enum.IntEnum):
    SYSTEM_PROMPT, MEMORY_SUMMARY, RETRIEVED_DOC, TOOL_OUTPUT, SCRATCHPAD, CONVERSATION, REASONING, OTHER = range(8)


class Policy(enum.IntEnum):
    ALWAYS, ATTEND, SKIP, RECENT, GLOBAL = range(5)


class Reason(enum.IntEnum):
    (ALWAYS, GLOBAL, RECENT_WINDOW, SCORE, POLICY_SKIP, BELOW_THRESHOLD, BUDGET_EXHAUSTED, OUTSIDE_WINDOW,
     OVER_BUDGET_KEPT) = range(9)


class OverBudget(enum.IntEnum):
    FAIL, KEEP = 0, 1


class IntentKVError(Exception):
    """A failed ikv_* call: .status (int), .status_name ("IKV_E_RANGE"), .message (ikv_last_error())."""

    def __init__(self, status_name, message, status=None):
        super().__init__("%s: %s" % (status_name, message))
        self.status_name = status_name
        self.message = message
        self.status = status


def _check(status):
    if status != 0:
        lib = _ffi.lib()
        message = (lib.ikv_last_error() or b"").decode("utf-8", "replace")
        raise IntentKVError(lib.ikv_status_name(status).decode(), message, status)


class InvalidArgumentError(IntentKVError, ValueError):
    """An argument check done in Python before any C call (sizes, shapes, dtypes, strides, host vs
    device memory): status IKV_E_INVALID; catch it as IntentKVError or as ValueError."""


def _invalid(message):
    """A Python-side argument check that must stop before C reads past a buffer."""
    return InvalidArgumentError("IKV_E_INVALID", message, _ffi.E_INVALID)


def _decode_field(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, ctypes.Array):
        return list(value)
    if isinstance(value, ctypes.Structure):
        return _struct_dict(value)
    return value


def _struct_dict(struct):
    return {name: _decode_field(getattr(struct, name)) for name, _ in struct._fields_ if name != "struct_size"}


def _apply_fields(struct, fields, what):
    for name, value in fields.items():
        if name == "struct_size" or not hasattr(struct, name):
            raise TypeError("%s has no field %r" % (what, name))
        if name == "precision" and isinstance(value, dict):
            _apply_fields(struct.precision, value, "precision policy")
        else:
            setattr(struct, name, int(value) if isinstance(value, enum.IntEnum) else value)
    return struct


def version():
    return _ffi.lib().ikv_version()


def version_string():
    return _ffi.lib().ikv_version_string().decode()


def runtime_info():
    """ikv_runtime_info_get as a dict (version, cuda_built, cpu_isa, ...)."""
    info = _ffi.RuntimeInfo()
    info.struct_size = ctypes.sizeof(info)
    _check(_ffi.lib().ikv_runtime_info_get(byref(info)))
    return _struct_dict(info)


# ---------------------------------------------------------------- arrays

_ELEM_DTYPE = {_arrays.F32: DType.F32, _arrays.F16: DType.F16, _arrays.BF16: DType.BF16}


class _Refs(list):
    """The arrays of one call; DLPack exports are given back when the call is over."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for ref in self:
            ref.release()

    def add(self, obj, what, **kwargs):
        try:
            ref = _arrays.array_ref(obj, what, **kwargs)
        except _arrays.ArrayError as exc:
            raise _invalid(str(exc)) from None
        self.append(ref)
        return ref


def _stream(stream):
    try:
        return _arrays.stream_handle(stream)
    except (_arrays.ArrayError, TypeError, ValueError) as exc:
        raise _invalid(str(exc)) from None


def _dtype(ref, want, what, want_source):
    """The ikv_dtype of ref's elements; want (when not None) is what the call requires."""
    have = _ELEM_DTYPE.get(ref.elem)
    if have is not None and (want is None or have == want):
        return have
    if ref.elem == _arrays.RAW16 and want in (DType.F16, DType.BF16):
        return DType(want)  # raw 16-bit words (array('H'), uint16 arrays) of the pool's 16-bit type
    if ref.elem == _arrays.RAW16 and want is None:
        raise _invalid("%s holds 16-bit elements of no float type; pass %s=DType.F16 or DType.BF16"
                       % (what, want_source))
    if want is None:
        raise _invalid("%s holds %s elements; expected float32, float16 or bfloat16 (F32, F16, BF16)"
                       % (what, ref.elem))
    raise _invalid("%s holds %s elements; expected %s (%s)" % (what, ref.elem, DType(want).name, want_source))


def _rows(ref, n_rows, width, what):
    """ref is a C-contiguous array of n_rows rows of width elements (q, out: width head_dim; lse: 1)."""
    if ref.count != n_rows * width:
        raise _invalid("%s holds %d elements; this call needs %d" % (what, ref.count, n_rows * width))
    if not ref.c_contiguous():
        raise _invalid("%s must be C-contiguous (ikv_decode takes no strides for it); shape %s has strides %s "
                       "(elements)" % (what, ref.shape, ref.strides))
    if width > 1 and len(ref.shape) >= 2 and ref.shape[-1] % width:
        raise _invalid("%s has shape %s; its last dimension must hold whole heads of head_dim %d"
                       % (what, ref.shape, width))


def _kv_layout(ref, lead, n_kv_heads, head_dim, what, describe):
    """n_tokens and the strides (elements, by dimension name) reading ref as
    [lead...][token][kv_head][head_dim]; lead is [(name, size), ...] (layer, seq)."""
    per_token = n_kv_heads * head_dim
    for _, size in lead:
        per_token *= size
    if ref.count == 0 or ref.count % per_token:
        raise _invalid("%s holds %d elements, not a positive multiple of %d (%s)" % (what, ref.count, per_token,
                                                                                   describe))
    if len(ref.shape) >= 2 and ref.shape[-1] % head_dim:
        raise _invalid("%s has shape %s; its last dimension must hold whole heads of head_dim %d"
                       % (what, ref.shape, head_dim))
    n_tokens = ref.count // per_token
    names = [name for name, _ in lead] + ["token", "kv_head", "head_dim"]
    logical = [size for _, size in lead] + [n_tokens, n_kv_heads, head_dim]
    strides = _arrays.nocopy_reshape(ref.shape, ref.strides, logical)
    if strides is None:
        raise _invalid("%s (shape %s, strides %s elements) cannot be read as [%s] %s through strides; make it "
                       "contiguous (numpy.ascontiguousarray, tensor.contiguous())"
                       % (what, ref.shape, ref.strides, "][".join(names), tuple(logical)))
    canonical = _arrays.contiguous_strides(logical)
    strides = [canonical[i] if n == 1 else strides[i] for i, n in enumerate(logical)]  # a size-1 dim's is unused
    if strides[-1] != 1:
        raise _invalid("%s's head_dim elements are %d apart; they must be contiguous (shape %s, strides %s)"
                       % (what, strides[-1], ref.shape, ref.strides))
    for name, stride in zip(names[:-1], strides[:-1]):
        if stride < head_dim:
            raise _invalid("%s's %s stride is %d elements; ikv_append needs every stride >= head_dim %d "
                           "(shape %s, strides %s)" % (what, name, stride, head_dim, ref.shape, ref.strides))
    return n_tokens, dict(zip(names, strides))


def _device_checks(refs, config):
    """On a CUDA pool: device arrays must be on the pool's device (where the array says)."""
    for ref in refs:
        if ref.kind != _arrays.HOST and ref.device_id is not None and ref.device_id != config["device"]:
            raise _invalid("%s is on cuda:%d but the pool is on device %d" % (ref.what, ref.device_id,
                                                                           config["device"]))


def _producer_stream(refs):
    """The one stream the arrays' __cuda_array_interface__ (v3) says they were produced on, or None."""
    streams = sorted({ref.stream for ref in refs if ref.stream is not None})
    if len(streams) > 1:
        raise _invalid("the arrays were produced on different CUDA streams (%s); pass stream= to name the one "
                       "this call runs on (ordered after the others)" % ", ".join(hex(s) for s in streams))
    return streams[0] if streams else None


_EMPTY = (c_float * 1)()


def _host_pointer(buf):
    """Address of a writable host buffer that this module allocated (never resized while C uses it)."""
    raw = memoryview(buf).cast("B")
    if not raw.nbytes:
        return ctypes.addressof(_EMPTY)
    return ctypes.addressof((ctypes.c_char * raw.nbytes).from_buffer(raw))


# ---------------------------------------------------------------- handles

class _Handle:
    _destroy_name = None

    def __init__(self):
        self._ptr = c_void_p()

    @property
    def handle(self):
        if not self._ptr:
            raise IntentKVError("IKV_E_STATE", "%s is closed" % type(self).__name__, _ffi.E_STATE)
        return self._ptr

    def close(self):
        ptr, self._ptr = self._ptr, c_void_p()
        if ptr and _ffi._lib is not None:
            getattr(_ffi._lib, self._destroy_name)(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass


Block = namedtuple("Block", "id name kind start end policy score precision_hint turn")


def _block(info):
    return Block(info.id, info.name.decode("utf-8", "replace"), Kind(info.kind), info.start, info.end,
                 Policy(info.policy), info.score, info.precision_hint, info.turn)


class Layout(_Handle):
    """The semantic blocks of a context. len(), iteration and [index] go in ascending start order."""
    _destroy_name = "ikv_layout_destroy"

    def __init__(self):
        super().__init__()
        _check(_ffi.lib().ikv_layout_create(byref(self._ptr)))

    @classmethod
    def _wrap(cls, ptr):
        obj = cls.__new__(cls)
        obj._ptr = ptr
        return obj

    @classmethod
    def synth(cls, **fields):
        """ikv_synth_layout from ikv_synth_default_config() with fields (seq_len, n_documents, ...) changed."""
        config = _apply_fields(_ffi.lib().ikv_synth_default_config(), fields, "synth config")
        ptr = c_void_p()
        _check(_ffi.lib().ikv_synth_layout(byref(config), byref(ptr)))
        return cls._wrap(ptr)

    def clone(self):
        ptr = c_void_p()
        _check(_ffi.lib().ikv_layout_clone(self.handle, byref(ptr)))
        return Layout._wrap(ptr)

    @staticmethod
    def _desc(name, start, end, kind, policy, score, precision_hint, turn):
        desc = _ffi.lib().ikv_block_desc_default()
        desc.name = name.encode("utf-8") if isinstance(name, str) else name
        desc.start, desc.end, desc.kind, desc.policy = start, end, int(kind), int(policy)
        desc.score, desc.precision_hint, desc.turn = score, int(precision_hint), turn
        return desc

    def add(self, name, start, end, kind=Kind.OTHER, policy=Policy.ATTEND, score=0.5,
            precision_hint=Format.AUTO, turn=0):
        """Add a block [start, end); returns its id."""
        desc = self._desc(name, start, end, kind, policy, score, precision_hint, turn)
        block_id = c_uint32()
        _check(_ffi.lib().ikv_layout_add(self.handle, byref(desc), byref(block_id)))
        return block_id.value

    def update(self, block_id, **fields):
        """Replace some fields of block block_id (name, start, end, kind, policy, score, precision_hint, turn)."""
        current = self.get(block_id)._asdict()
        del current["id"]
        for name in fields:
            if name not in current:
                raise TypeError("a block has no field %r" % name)
        current.update(fields)
        desc = self._desc(**current)
        _check(_ffi.lib().ikv_layout_update(self.handle, block_id, byref(desc)))

    def set_score(self, block_id, score):
        _check(_ffi.lib().ikv_layout_set_score(self.handle, block_id, score))

    def remove(self, block_id):
        _check(_ffi.lib().ikv_layout_remove(self.handle, block_id))

    def __len__(self):
        return _ffi.lib().ikv_layout_count(self.handle)

    def __getitem__(self, index):
        if index < 0:
            index += len(self)
        if index < 0:
            raise IndexError(index)
        info = _ffi.BlockInfo()
        _check(_ffi.lib().ikv_layout_at(self.handle, index, byref(info)))
        return _block(info)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def get(self, block_id):
        info = _ffi.BlockInfo()
        _check(_ffi.lib().ikv_layout_get(self.handle, block_id, byref(info)))
        return _block(info)

    def find_token(self, token):
        """Id of the block covering token (IKV_E_NOT_FOUND in a gap)."""
        block_id = c_uint32()
        _check(_ffi.lib().ikv_layout_find_token(self.handle, token, byref(block_id)))
        return block_id.value

    def validate(self, seq_len):
        _check(_ffi.lib().ikv_layout_validate(self.handle, seq_len))


PlanPage = namedtuple("PlanPage", "page token_begin token_end format flags")
Decision = namedtuple("Decision", "block_id start end tokens_selected selected format reason")


class Plan(_Handle):
    """An immutable routing result: pages and bounds to read, formats, decisions."""
    _destroy_name = "ikv_plan_destroy"

    @classmethod
    def _wrap(cls, ptr):
        obj = cls.__new__(cls)
        obj._ptr = ptr
        return obj

    @classmethod
    def from_ranges(cls, ranges, seq_len, page_size=16, format=Format.F16):
        """A plan reading exactly the (begin, end) token ranges given."""
        array_t = _ffi.TokenRange * max(len(ranges), 1)
        c_ranges = array_t(*[_ffi.TokenRange(b, e) for b, e in ranges])
        ptr = c_void_p()
        _check(_ffi.lib().ikv_plan_from_ranges(c_ranges, len(ranges), seq_len, page_size, int(format), byref(ptr)))
        return cls._wrap(ptr)

    def summary(self):
        out = _ffi.PlanSummary()
        _check(_ffi.lib().ikv_plan_get_summary(self.handle, byref(out)))
        return _struct_dict(out)

    def pages(self):
        ptr, count = POINTER(_ffi.PlanPage)(), c_size_t()
        _check(_ffi.lib().ikv_plan_pages(self.handle, byref(ptr), byref(count)))
        return [PlanPage(p.page, p.token_begin, p.token_end, p.format, p.flags) for p in ptr[:count.value]]

    def _u32_list(self, fn_name):
        ptr, count = POINTER(c_uint32)(), c_size_t()
        _check(getattr(_ffi.lib(), fn_name)(self.handle, byref(ptr), byref(count)))
        return list(ptr[:count.value])

    def skipped_pages(self):
        return self._u32_list("ikv_plan_skipped_pages")

    def prefetch(self):
        return self._u32_list("ikv_plan_prefetch")

    def decisions(self):
        ptr, count = POINTER(_ffi.BlockDecision)(), c_size_t()
        _check(_ffi.lib().ikv_plan_decisions(self.handle, byref(ptr), byref(count)))
        return [Decision(d.block_id, d.start, d.end, d.tokens_selected, bool(d.selected), d.format,
                         Reason(d.reason)) for d in ptr[:count.value]]

    def page_format(self, page):
        out = c_int()
        _check(_ffi.lib().ikv_plan_page_format(self.handle, page, byref(out)))
        return Format(out.value)

    def cost(self, **shape_fields):
        """Bytes and FLOPs of one step; shape fields default to ikv_model_shape_default()."""
        shape = _apply_fields(_ffi.lib().ikv_model_shape_default(), shape_fields, "model shape")
        out = _ffi.PlanCost()
        _check(_ffi.lib().ikv_plan_get_cost(self.handle, byref(shape), byref(out)))
        return _struct_dict(out)


class Router(_Handle):
    """Router(page_size=16, token_budget=..., precision={"attend_mid": Format.INT4}, ...)."""
    _destroy_name = "ikv_router_destroy"

    def __init__(self, **fields):
        super().__init__()
        config = _apply_fields(_ffi.lib().ikv_router_default_config(), fields, "router config")
        _check(_ffi.lib().ikv_router_create(byref(config), byref(self._ptr)))

    @property
    def config(self):
        out = _ffi.RouterConfig()
        out.struct_size = ctypes.sizeof(out)
        _check(_ffi.lib().ikv_router_get_config(self.handle, byref(out)))
        return _struct_dict(out)

    def set_pressure(self, memory_pressure):
        _check(_ffi.lib().ikv_router_set_pressure(self.handle, memory_pressure))

    def route(self, layout, seq_len):
        ptr = c_void_p()
        _check(_ffi.lib().ikv_router_route(self.handle, layout.handle, seq_len, byref(ptr)))
        return Plan._wrap(ptr)


TierStepReport = namedtuple("TierStepReport", "pages_fetched pages_offloaded pages_on_host step")
TierStepReport.__doc__ = """What one Pool.tier_step() did (ikv_tier_step_report): pages_fetched (host -> device),
pages_offloaded (device -> host), pages_on_host (pages the step reads that stay in host memory: its decodes read
them over the bus) and step (the pool's step count after the call; the first call makes it 1)."""


class Pool(_Handle):
    """Paged KV storage. Pool(n_layers=2, n_kv_heads=2, head_dim=64, ...); kv_dtype defaults to F32 here.
    Pool(backend=Backend.CUDA, device=0, ...) keeps the pages in GPU memory (a library built with CUDA);
    host_capacity_bytes=N (CUDA pools only) adds a tier of N bytes of pinned host memory that
    offload() and fetch() move pages to and from, by hand or through the automatic tier policy
    (set_tier_policy(), then tier_step() once per engine step)."""
    _destroy_name = "ikv_pool_destroy"

    def __init__(self, **fields):
        super().__init__()
        config = _ffi.lib().ikv_pool_default_config_v2()  # the header's ikv_pool_default_config()
        config.kv_dtype = DType.F32  # Python callers hand over float32 buffers
        _apply_fields(config, fields, "pool config")
        _check(_ffi.lib().ikv_pool_create(byref(config), byref(self._ptr)))
        self._config = self.config
        self._dependents = weakref.WeakSet()  # query memories and feedbacks: the pool must outlive them

    def close(self):
        """Destroy the pool, after the QueryMemory and PageFeedback objects made for it (the header:
        the pool must outlive them; they raise IKV_E_STATE once closed)."""
        for d in list(getattr(self, "_dependents", ())):
            d.close()
        super().close()

    @property
    def config(self):
        out = _ffi.PoolConfig()
        out.struct_size = ctypes.sizeof(out)
        _check(_ffi.lib().ikv_pool_get_config(self.handle, byref(out)))
        return _struct_dict(out)

    def stats(self):
        out = _ffi.PoolStats()
        out.struct_size = ctypes.sizeof(out)
        _check(_ffi.lib().ikv_pool_get_stats(self.handle, byref(out)))
        return _struct_dict(out)

    def page_bytes(self, format):
        return _ffi.lib().ikv_pool_page_bytes(self.handle, int(format))

    def seq_create(self):
        seq = c_uint32()
        _check(_ffi.lib().ikv_seq_create(self.handle, byref(seq)))
        return seq.value

    def seq_destroy(self, seq):
        _check(_ffi.lib().ikv_seq_destroy(self.handle, seq))

    def seq_length(self, seq):
        out = c_uint32()
        _check(_ffi.lib().ikv_seq_length(self.handle, seq, byref(out)))
        return out.value

    def _kv_args(self, refs, k, v, seqs, layer, plan, stream, async_):
        """K/V checked against [layer][seq][token][kv_head][head_dim] (no layer dim for one layer, no
        seq dim for one sequence: seqs None) and the ikv_append for them: (args, n_tokens per sequence)."""
        cfg = self._config
        dtype = DType(cfg["kv_dtype"])
        cuda = cfg["backend"] == _ffi.BACKEND_CUDA
        explicit = _stream(stream)
        kw = dict(need=None if cuda else _arrays.HOST, why="the pool is a CPU pool",
                  f64_to_f32=dtype == DType.F32, dl_stream=explicit)
        kr, vr = refs.add(k, "k", **kw), refs.add(v, "v", **kw)
        _dtype(kr, dtype, "k", "the pool's kv_dtype")
        _dtype(vr, dtype, "v", "the pool's kv_dtype")
        on_device = kr.kind != _arrays.HOST
        if cuda:
            if (vr.kind != _arrays.HOST) != on_device:
                raise _invalid("k is %s but v is %s; ikv_append reads both from one side (src_on_device): pass "
                               "both as device arrays or both in host memory" % (kr.where(), vr.where()))
            _device_checks((kr, vr), cfg)
            if async_ and not on_device:
                raise _invalid("async_=True (IKV_APPEND_ASYNC) needs k and v in device memory on a CUDA pool; k "
                               "is %s: append host arrays without async_" % kr.where())
        lead = [] if layer is not None else [("layer", cfg["n_layers"])]
        if seqs is not None:
            lead.append(("seq", len(seqs)))
        describe = "*".join(([] if layer is not None else ["n_layers"]) + ([] if seqs is None else ["len(seqs)"]) +
                            ["n_kv_heads", "head_dim"])
        n_tokens, ks = _kv_layout(kr, lead, cfg["n_kv_heads"], cfg["head_dim"], "k", describe)
        if vr.count != kr.count:
            raise _invalid("v holds %d elements; this call needs %d (as k)" % (vr.count, kr.count))
        _, vs = _kv_layout(vr, lead, cfg["n_kv_heads"], cfg["head_dim"], "v", describe)
        if ks != vs:
            raise _invalid("k and v must share strides (ikv_append reads both with one set); in elements k has "
                           "%s, v has %s" % (ks, vs))
        args = _ffi.lib().ikv_append_default_v2(self.handle, n_tokens)
        args.layer = IKV_ALL_LAYERS if layer is None else layer
        args.k, args.v = kr.ptr, vr.ptr
        args.token_stride, args.head_stride = ks["token"], ks["kv_head"]
        if "layer" in ks:
            args.layer_stride = ks["layer"]
        if "seq" in ks:
            args.seq_stride = ks["seq"]
        args.src_on_device = 1 if cuda and on_device else 0
        args.stream = explicit if explicit is not None else (_producer_stream((kr, vr)) if cuda else None)
        args.flags = IKV_APPEND_ASYNC if async_ else 0
        args.formats = plan.handle if plan is not None else None
        return args, n_tokens

    def append(self, seq: int, k: ArrayLike, v: ArrayLike, layer: Optional[int] = None,
               plan: Optional["Plan"] = None, stream: StreamLike = None, async_: bool = False) -> int:
        """Append K and V laid out [layer][token][kv_head][head_dim] (layer=None: every layer at once)
        or [token][kv_head][head_dim] (one layer), in the pool's kv_dtype. The token count follows from
        the element count. Arrays may be strided where ikv_append's strides can express it (head_dim
        contiguous, every other stride >= head_dim; k and v with the same strides).
        CUDA pools take device arrays (read on the GPU, src_on_device) or host arrays. stream: the
        cudaStream_t that wrote k/v (int, or torch/cupy/numba stream object; default: the stream a
        __cuda_array_interface__ v3 array names, else the default stream). async_=True
        (IKV_APPEND_ASYNC, device arrays): enqueue on stream and return at once; run the decode that
        reads the tokens on the same stream, keep k/v alive until the stream has passed the append,
        and call sync() to learn of non-finite inputs (stored as 0). Returns the tokens appended."""
        with _Refs() as refs:
            args, n_tokens = self._kv_args(refs, k, v, None, layer, plan, stream, async_)
            _check(_ffi.lib().ikv_pool_append(self.handle, seq, byref(args)))
        return n_tokens

    def append_batch(self, seqs: Sequence[int], k: ArrayLike, v: ArrayLike, layer: Optional[int] = None,
                     plan: Optional["Plan"] = None, stream: StreamLike = None, async_: bool = False) -> int:
        """Append the same number of tokens to each of seqs in one atomic call. K and V are laid out
        [layer][seq][token][kv_head][head_dim] (layer=None: every layer) or [seq][token][kv_head][head_dim]
        (one layer); strides, devices, stream and async_ as for append(). Returns the tokens appended to
        each sequence."""
        seqs = list(seqs)
        if not seqs:
            raise _invalid("seqs is empty; append_batch needs at least one sequence")
        with _Refs() as refs:
            args, n_tokens = self._kv_args(refs, k, v, seqs, layer, plan, stream, async_)
            ids = (c_uint32 * len(seqs))(*seqs)
            _check(_ffi.lib().ikv_pool_append_batch(self.handle, ids, len(seqs), byref(args)))
        return n_tokens

    def sync(self) -> None:
        """Wait for asynchronous appends; raises IntentKVError for a non-finite value one of them stored as 0
        (or for an append past a reserved room). Takes the lengths graph replays reached (reserve())."""
        _check(_ffi.lib().ikv_pool_sync(self.handle))

    def reserve(self, seqs: Sequence[int], n_tokens: int) -> None:
        """Room for the next n_tokens tokens of every layer of each of seqs, allocated now
        (ikv_pool_reserve); n_tokens=0 ends it. On a CUDA pool the device then keeps their lengths,
        so their appends and decodes can be captured in one CUDA graph and replayed; sync() brings
        the host's lengths up to the replays'."""
        seqs = list(seqs)
        if not seqs:
            raise _invalid("seqs is empty; reserve needs at least one sequence")
        ids = (c_uint32 * len(seqs))(*seqs)
        _check(_ffi.lib().ikv_pool_reserve(self.handle, ids, len(seqs), n_tokens))

    def layer_length(self, seq, layer):
        """Tokens stored in one layer (layers differ while a step appends layer by layer)."""
        out = c_uint32()
        _check(_ffi.lib().ikv_seq_layer_length(self.handle, seq, layer, byref(out)))
        return out.value

    def fork(self, seq):
        child = c_uint32()
        _check(_ffi.lib().ikv_seq_fork(self.handle, seq, byref(child)))
        return child.value

    def truncate(self, seq, n_tokens):
        _check(_ffi.lib().ikv_seq_truncate(self.handle, seq, n_tokens))

    def evict(self, seq, begin, end):
        _check(_ffi.lib().ikv_seq_evict(self.handle, seq, begin, end))

    def is_evicted(self, seq, token):
        out = c_int()
        _check(_ffi.lib().ikv_seq_is_evicted(self.handle, seq, token, byref(out)))
        return bool(out.value)

    def page_format(self, seq, page):
        out = c_int()
        _check(_ffi.lib().ikv_seq_page_format(self.handle, seq, page, byref(out)))
        return Format(out.value)

    def set_page_format(self, seq, page, format):
        _check(_ffi.lib().ikv_seq_set_page_format(self.handle, seq, page, int(format)))

    def apply_plan_formats(self, seq, plan):
        _check(_ffi.lib().ikv_seq_apply_plan_formats(self.handle, seq, plan.handle))

    def read(self, seq: int, layer: int, begin: int, end: int) -> Tuple[array.array, array.array]:
        """Tokens [begin, end) of a layer, dequantized: (k, v) as array('f') laid out [token][kv_head][head_dim]
        (host memory, for CUDA pools too)."""
        n = max(end - begin, 0) * self._config["n_kv_heads"] * self._config["head_dim"]
        k, v = array.array("f", bytes(4 * n)), array.array("f", bytes(4 * n))
        _check(_ffi.lib().ikv_seq_read(self.handle, seq, layer, begin, end, _host_pointer(k), _host_pointer(v)))
        return k, v

    seq_read = read

    def _move(self, name, seq, begin, end, stream):
        moved = c_uint32()
        _check(getattr(_ffi.lib(), name)(self.handle, seq, begin, end, _stream(stream), byref(moved)))
        return moved.value

    def offload(self, seq: int, begin: int, end: int, stream: StreamLike = None) -> int:
        """Move the pages of seq overlapping tokens [begin, end) from device memory to the pool's host
        tier (ikv_seq_offload; a CUDA pool created with host_capacity_bytes > 0). Only whole pages this
        sequence alone holds move; shared, partial tail, evicted and already-offloaded pages stay. The
        copies are enqueued on stream (int cudaStream_t or a stream object; None = the default stream)
        and the call returns without waiting. Atomic: IKV_E_NOMEM when the host tier lacks room for
        all of them. A CPU pool raises IKV_E_UNSUPPORTED. Returns the number of pages moved."""
        return self._move("ikv_seq_offload", seq, begin, end, stream)

    def fetch(self, seq: int, begin: int, end: int, stream: StreamLike = None) -> int:
        """Bring the host-tier pages of seq overlapping tokens [begin, end) back to device memory
        (ikv_seq_fetch); as offload(), IKV_E_NOMEM when capacity_bytes lacks room for all of them.
        Returns the number of pages moved."""
        return self._move("ikv_seq_fetch", seq, begin, end, stream)

    def page_tier(self, seq: int, page: int) -> Tier:
        """Where page `page` of seq is: Tier.DEVICE or Tier.HOST (CPU pools: always Tier.DEVICE)."""
        out = c_int()
        _check(_ffi.lib().ikv_seq_page_tier(self.handle, seq, page, byref(out)))
        return Tier.HOST if out.value else Tier.DEVICE

    def set_tier_policy(self, idle_steps: Optional[int] = 0, device_high: float = 0.0, device_low: float = 0.0,
                        prefetch: bool = True) -> None:
        """Turn the automatic tier policy on (ikv_pool_set_tier_policy; a CUDA pool created with
        host_capacity_bytes > 0), or off with set_tier_policy(None). 0 takes a field's default:
        idle_steps (steps without use after which a page is idle: offloaded under pressure; 8),
        device_high (the share of capacity_bytes above which a step offloads, in (0, 1]; 0.9),
        device_low (the share idle pages are offloaded down to, in (0, device_high];
        min(0.75, device_high)). prefetch=False sets IKV_TIER_NO_PREFETCH: tier_step() fetches
        nothing and decodes read host-tier pages over the bus. Changes no page; the next tier_step()
        acts. Out-of-range fields raise IntentKVError IKV_E_INVALID naming the field (checked first);
        a CPU pool, or one without a host tier, raises IKV_E_UNSUPPORTED."""
        if idle_steps is None:
            if (device_high, device_low, prefetch) != (0.0, 0.0, True):
                raise _invalid("set_tier_policy(None) turns the policy off; it takes no device_high, device_low "
                               "or prefetch")
            _check(_ffi.lib().ikv_pool_set_tier_policy(self.handle, None))
            return
        if idle_steps < 0:
            raise _invalid("idle_steps is %d; it must be >= 0 (0 = the default, 8)" % idle_steps)
        policy = _ffi.TierPolicy()
        policy.struct_size = ctypes.sizeof(policy)
        policy.idle_steps, policy.device_high, policy.device_low = idle_steps, device_high, device_low
        policy.flags = 0 if prefetch else IKV_TIER_NO_PREFETCH
        _check(_ffi.lib().ikv_pool_set_tier_policy(self.handle, byref(policy)))

    def tier_step(self, seqs: Union[int, Sequence[int]], plans: Optional[Sequence[Optional[Plan]]] = None,
                  stream: StreamLike = None) -> TierStepReport:
        """One step of the automatic tier policy (ikv_pool_tier_step): call it once per engine step,
        before the step's decodes, with the sequences the step decodes (an int, a sequence, or [] for
        a step that only relieves pressure) and the plans it passes them (None, or a plan or None per
        sequence: None = the whole sequence). Marks the pages the step reads as used, offloads idle
        pages under pressure and fetches the step's pages from the host tier; the moves are enqueued
        on stream (int cudaStream_t or a stream object; None = the default stream). Returns a
        TierStepReport. Raises IKV_E_UNSUPPORTED on a CPU pool or one without a host tier, IKV_E_STATE
        when no policy is set (set_tier_policy())."""
        seqs = [seqs] if isinstance(seqs, int) else list(seqs)
        c_plans = None
        if plans is not None:
            plans = list(plans)
            if len(plans) != len(seqs):
                raise _invalid("plans has %d entries for %d sequences" % (len(plans), len(seqs)))
            if plans:
                c_plans = (c_void_p * len(plans))(*[p.handle if p is not None else None for p in plans])
        c_seqs = (c_uint32 * len(seqs))(*seqs) if seqs else None
        report = _ffi.TierStepReport()
        report.struct_size = ctypes.sizeof(report)
        _check(_ffi.lib().ikv_pool_tier_step(self.handle, c_seqs, c_plans, len(seqs), _stream(stream),
                                             byref(report)))
        return TierStepReport(report.pages_fetched, report.pages_offloaded, report.pages_on_host, report.step)


class QueryMemory(_Handle):
    """What earlier turns of each sequence asked (ikv_query_memory): QueryMemory(pool, n_q_heads,
    decay=0.5, turns=4); remember(seq, layer, q) adds float32 query tokens [n_tokens][n_q_heads][head_dim]
    to the current turn, end_turn(seq) ends it; pass it to Decoder.decode(query_memory=...).
    turns (1..64) is how many ended turns are kept apart, the oldest dropped first: a decode recalls,
    per query head, the kept turn whose mean query is the most similar (cosine) to the current one,
    weighted by decay. turns=0 keeps one mean instead (the first version's memory): the turns' means
    averaged with weights decay^age. n_q_heads must be a positive multiple of the pool's n_kv_heads
    and decay in (0, 1); a value out of range raises IntentKVError IKV_E_INVALID naming it."""
    _destroy_name = "ikv_query_memory_destroy"

    def __init__(self, pool, n_q_heads, decay=0.5, turns=4):
        super().__init__()
        if turns < 0:
            raise _invalid("turns is %d; it must be in 0..64 (0 = one decayed mean)" % turns)
        config = _ffi.lib().ikv_query_memory_default_config_v2()  # the header's ikv_query_memory_default_config()
        config.n_q_heads, config.decay, config.turns = n_q_heads, decay, turns
        self._head_dim = pool._config["head_dim"]
        self._row = n_q_heads * self._head_dim
        _check(_ffi.lib().ikv_query_memory_create(pool.handle, byref(config), byref(self._ptr)))
        self._pool = pool  # the pool must outlive the memory: closing it closes this first
        pool._dependents.add(self)

    def remember(self, seq: int, layer: int, q: ArrayLike, q_dtype: Optional[DType] = None) -> None:
        """Add query tokens [n_tokens][n_q_heads][head_dim] (host memory, C-contiguous; float32, float16
        or bfloat16, or q_dtype for raw 16-bit words) to seq's current turn at layer."""
        with _Refs() as refs:
            qr = refs.add(q, "q", need=_arrays.HOST, why="ikv_query_memory_remember reads host memory",
                          f64_to_f32=q_dtype in (None, DType.F32))
            qd = _dtype(qr, q_dtype, "q", "q_dtype")
            if qr.count == 0 or qr.count % self._row:
                raise _invalid("q has %d elements, not a positive multiple of n_q_heads*head_dim = %d" %
                               (qr.count, self._row))
            _rows(qr, qr.count // self._head_dim, self._head_dim, "q")
            _check(_ffi.lib().ikv_query_memory_remember(self.handle, seq, layer, qr.ptr, int(qd),
                                                         qr.count // self._row))

    def end_turn(self, seq):
        _check(_ffi.lib().ikv_query_memory_end_turn(self.handle, seq))

    def forget(self, seq):
        _check(_ffi.lib().ikv_query_memory_forget(self.handle, seq))

    def reset(self):
        _check(_ffi.lib().ikv_query_memory_reset(self.handle))


class PageFeedback(_Handle):
    """Attention feedback (ikv_page_feedback): PageFeedback(pool, rate=0.25); pass it to
    Decoder.decode(feedback=...); get(seq, layer, kv_head) -> per-page averages (list of floats);
    block_scores(seq, layout) re-scores the layout's ATTEND blocks."""
    _destroy_name = "ikv_page_feedback_destroy"

    def __init__(self, pool, rate=0.25):
        super().__init__()
        config = _ffi.lib().ikv_page_feedback_default_config()
        config.rate = rate
        _check(_ffi.lib().ikv_page_feedback_create(pool.handle, byref(config), byref(self._ptr)))
        self._pool = pool  # the pool must outlive the feedback: closing it closes this first
        pool._dependents.add(self)

    def get(self, seq, layer, kv_head):
        lib, n = _ffi.lib(), c_uint32()
        _check(lib.ikv_page_feedback_get(self.handle, seq, layer, kv_head, None, 0, byref(n)))
        out = (c_float * max(n.value, 1))()
        _check(lib.ikv_page_feedback_get(self.handle, seq, layer, kv_head, out, n.value, byref(n)))
        return list(out[:n.value])

    def block_scores(self, seq, layout):
        _check(_ffi.lib().ikv_page_feedback_block_scores(self.handle, seq, layout.handle))

    def forget(self, seq):
        _check(_ffi.lib().ikv_page_feedback_forget(self.handle, seq))

    def reset(self):
        _check(_ffi.lib().ikv_page_feedback_reset(self.handle))


class Decoder(_Handle):
    """One decode step at a time; use one Decoder per thread."""
    _destroy_name = "ikv_decoder_destroy"

    def __init__(self, n_threads=0):
        super().__init__()
        config = _ffi.lib().ikv_decoder_default_config()
        config.n_threads = n_threads
        _check(_ffi.lib().ikv_decoder_create(byref(config), byref(self._ptr)))

    def decode(self, pool: Pool, seqs: Union[int, Sequence[int]], q: ArrayLike, n_q_heads: int, layer: int = 0,
               plans: Optional[Sequence[Optional[Plan]]] = None, n_query_tokens: int = 1, scale: float = 0.0,
               softcap: float = 0.0, topk_token_budget: int = 0, topk_mass: Optional[float] = None,
               topk_min_tokens: int = 0, topk_score: TopkScore = TopkScore.QUEST,
               query_memory: Optional[QueryMemory] = None, feedback: Optional[PageFeedback] = None,
               topk_feedback_weight: float = 0.0, return_lse: bool = False, out: Optional[ArrayLike] = None,
               lse: Optional[ArrayLike] = None, q_dtype: Optional[DType] = None, out_dtype: Optional[DType] = None,
               stream: StreamLike = None, append: Optional[Tuple[ArrayLike, ArrayLike]] = None,
               append_async: bool = False) -> Union[ArrayLike, Tuple[ArrayLike, ArrayLike]]:
        """One decode step: queries [seq][query_token][q_head][head_dim] -> out of the same shape (and
        lse [seq][query_token][q_head], float32, when return_lse or lse is given: returns (out, lse)).
        q and out are C-contiguous float32, float16 or bfloat16 arrays (q_dtype/out_dtype name the type
        of raw 16-bit words, and must match a typed array). Without out, a CPU pool returns a new
        array('f'); given out (and lse), the step writes into them in place and returns them.
        CPU pools: host arrays (buffers, numpy, CPU tensors). CUDA pools: q, out and lse must be device
        arrays (torch CUDA tensors, CuPy, Numba, DLPack); the step is enqueued on stream (int
        cudaStream_t or a stream object; default: the stream a __cuda_array_interface__ v3 array names,
        else the default stream) and returns without synchronizing.
        topk_mass=share selects adaptively (IKV_TOPK_MASS): pages until that estimated share of the
        attention mass, within [topk_min_tokens, topk_token_budget or unlimited] tokens.
        topk_score ranks pages by the Quest bound (QUEST), IKV_TOPK_SCORE_HYBRID (HYBRID) or
        hybrid candidates ranked again by their keys' attention share (KEYS);
        query_memory (a QueryMemory of this pool) adds what earlier turns asked to the ranking;
        feedback (a PageFeedback of this pool) receives each read page's attention share, and with
        topk_feedback_weight > 0 its averages are a prior of the ranking.
        append=(k, v) appends the step's new tokens to this layer of each sequence first
        (ikv_decode_args.append), laid out [seq][token][kv_head][head_dim] as for
        Pool.append_batch(seqs, k, v, layer=layer); the same result as that call followed by the
        decode, checked as a whole before anything is appended. On a CUDA pool whose sequences have
        room (Pool.reserve), with one token each, append_async=True (IKV_APPEND_ASYNC, device arrays)
        and F16/BF16 pages, the decode's own kernels write the token (stats()["appends_fused"])."""
        seqs = [seqs] if isinstance(seqs, int) else list(seqs)
        cfg = pool._config
        cuda = cfg["backend"] == _ffi.BACKEND_CUDA
        head_dim = cfg["head_dim"]
        n_rows = len(seqs) * n_query_tokens * n_q_heads
        if cuda:
            kw = dict(need=_arrays.DEVICE, why="the pool is a CUDA pool (ikv_decode reads q and writes out and lse "
                                               "in device memory)")
        else:
            kw = dict(need=_arrays.HOST, why="the pool is a CPU pool (ikv_decode reads q and writes out and lse in "
                                             "host memory)")
        explicit = _stream(stream)
        kw["dl_stream"] = explicit
        with _Refs() as refs:
            qr = refs.add(q, "q", f64_to_f32=q_dtype in (None, DType.F32), **kw)
            qd = _dtype(qr, q_dtype, "q", "q_dtype")
            _rows(qr, n_rows, head_dim, "q")
            if out is None:
                if cuda:
                    raise _invalid("out is required on a CUDA pool: pass a device array of %d elements to write "
                                   "into (e.g. torch.empty_like(q))" % (n_rows * head_dim))
                if out_dtype not in (None, DType.F32):
                    raise _invalid("out_dtype %s needs out=: pass an array of that type to write into"
                                   % DType(out_dtype).name)
                out = array.array("f", bytes(4 * n_rows * head_dim))
            orf = refs.add(out, "out", writable=True, **kw)
            od = _dtype(orf, out_dtype, "out", "out_dtype")
            _rows(orf, n_rows, head_dim, "out")
            if lse is None and return_lse:
                if cuda:
                    raise _invalid("return_lse on a CUDA pool needs lse=: pass a float32 device array of %d "
                                   "elements to write into" % n_rows)
                lse = array.array("f", bytes(4 * n_rows))
            lr = None
            if lse is not None:
                lr = refs.add(lse, "lse", writable=True, **kw)
                _dtype(lr, DType.F32, "lse", "lse is always float32")
                _rows(lr, n_rows, 1, "lse")
            if cuda:
                _device_checks(refs, cfg)
            args = _ffi.lib().ikv_decode_args_default_v3()
            args.layer, args.n_seqs, args.n_query_tokens, args.n_q_heads = layer, len(seqs), n_query_tokens, n_q_heads
            c_seqs = (c_uint32 * len(seqs))(*seqs)
            args.seqs = c_seqs
            c_plans = None
            if plans is not None:
                if len(plans) != len(seqs):
                    raise _invalid("plans has %d entries for %d sequences" % (len(plans), len(seqs)))
                c_plans = (c_void_p * len(seqs))(*[p.handle if p is not None else None for p in plans])
                args.plans = c_plans
            args.q, args.q_dtype, args.out, args.out_dtype = qr.ptr, int(qd), orf.ptr, int(od)
            args.lse = ctypes.cast(c_void_p(lr.ptr), POINTER(c_float)) if lr is not None else None
            args.scale, args.softcap, args.topk_token_budget = scale, softcap, topk_token_budget
            args.topk_score = int(topk_score)
            for what, obj in (("query_memory", query_memory), ("feedback", feedback)):
                if obj is not None and obj._pool is not pool:
                    raise _invalid("%s was made for another pool" % what)
            args.query_memory = query_memory.handle if query_memory is not None else None
            args.feedback = feedback.handle if feedback is not None else None
            args.topk_feedback_weight = topk_feedback_weight
            if topk_mass is not None:
                args.topk_mode, args.topk_mass, args.topk_min_tokens = TopkMode.MASS, topk_mass, topk_min_tokens
            args.stream = explicit if explicit is not None else (_producer_stream(refs) if cuda else None)
            ap = None
            if append is not None:
                if len(append) != 2:
                    raise _invalid("append must be a pair (k, v) of the step's new tokens")
                ap, _ = pool._kv_args(refs, append[0], append[1], seqs, layer, None, args.stream, append_async)
                ap.stream = args.stream  # the decode's stream (ikv_decode_args.append)
                args.append = ctypes.addressof(ap)
            _check(_ffi.lib().ikv_decode(self.handle, pool.handle, byref(args)))
        return (out, lse) if lse is not None else out

    def last_bytes_read(self):
        out = c_uint64()
        _check(_ffi.lib().ikv_decoder_last_bytes_read(self.handle, byref(out)))
        return out.value

    def last_selection(self, seq_index, kv_head):
        """Token ranges [(begin, end), ...] the last successful decode read for sequence index
        seq_index (into its seqs) and kv_head: maximal runs, ascending."""
        lib = _ffi.lib()
        n = ctypes.c_size_t()
        _check(lib.ikv_decoder_last_selection(self.handle, seq_index, kv_head, None, 0, byref(n)))
        runs = (_ffi.TokenRange * max(n.value, 1))()
        _check(lib.ikv_decoder_last_selection(self.handle, seq_index, kv_head, runs, n.value, byref(n)))
        return [(r.begin, r.end) for r in runs[:n.value]]

    def stats(self):
        """Counters since creation: steps, lists_built, lists_reused (page lists kept from the
        previous call: same pool, sequences, lengths and plans), last_bytes_read, appends_fused
        (decodes whose append= the decode's kernels wrote)."""
        out = _ffi.DecoderStats()
        out.struct_size = ctypes.sizeof(out)
        _check(_ffi.lib().ikv_decoder_get_stats(self.handle, byref(out)))
        d = _struct_dict(out)
        d.pop("reserved", None)
        return d
