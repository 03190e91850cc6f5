"""Raw ctypes mirror of include/intentkv.h: structs, enums and prototypes.

Field order and types follow the header exactly; C enums are `int`. Keep this
file in step with the header: tests compare every *_default() struct_size with
ctypes.sizeof of the class below, so a drift shows up as a failing test.
"""
import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_float, c_int, c_int64, c_size_t, c_uint,
                    c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)

IKV_NAME_MAX = 63
IKV_FMT_COUNT = 5
IKV_ALL_LAYERS = 0xFFFFFFFF
IKV_MAX_QUERY_TOKENS = 2048
IKV_PAGE_MANDATORY = 0x1
IKV_PAGE_PARTIAL = 0x2
IKV_TIER_NO_PREFETCH = 0x1

# ikv_status
OK, E_INVALID, E_NULL, E_RANGE, E_NOMEM, E_BUDGET, E_OVERLAP = 0, -1, -2, -3, -4, -5, -6
E_UNSUPPORTED, E_NO_DEVICE, E_DEVICE, E_SHARED, E_EVICTED, E_NOT_FOUND = -7, -8, -9, -10, -11, -12
E_STATE, E_INTERNAL = -13, -14

# ikv_format
FMT_F16, FMT_BF16, FMT_FP8_E4M3, FMT_INT8, FMT_INT4, FMT_AUTO = 0, 1, 2, 3, 4, 255
# ikv_dtype
DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
# ikv_backend
BACKEND_CPU, BACKEND_CUDA = 0, 1
# ikv_block_kind
(KIND_SYSTEM_PROMPT, KIND_MEMORY_SUMMARY, KIND_RETRIEVED_DOC, KIND_TOOL_OUTPUT, KIND_SCRATCHPAD,
 KIND_CONVERSATION, KIND_REASONING, KIND_OTHER) = range(8)
# ikv_policy
POLICY_ALWAYS, POLICY_ATTEND, POLICY_SKIP, POLICY_RECENT, POLICY_GLOBAL = range(5)
# ikv_over_budget
OVER_BUDGET_FAIL, OVER_BUDGET_KEEP = 0, 1


class RuntimeInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("version", c_uint), ("cuda_built", c_int),
                ("cuda_device_count", c_int), ("cuda_device_name", c_char * 64), ("cpu_isa", c_char * 16),
                ("cpu_isa_available", c_char * 64), ("cuda_archs", c_char * 32)]


class TokenRange(Structure):
    _fields_ = [("begin", c_uint32), ("end", c_uint32)]


class BlockDesc(Structure):
    _fields_ = [("struct_size", c_uint32), ("name", c_char_p), ("kind", c_int), ("start", c_uint32),
                ("end", c_uint32), ("policy", c_int), ("score", c_float), ("precision_hint", c_int),
                ("turn", c_uint32)]


class BlockInfo(Structure):
    _fields_ = [("id", c_uint32), ("name", c_char * (IKV_NAME_MAX + 1)), ("kind", c_int), ("start", c_uint32),
                ("end", c_uint32), ("policy", c_int), ("score", c_float), ("precision_hint", c_int),
                ("turn", c_uint32)]


class SynthConfig(Structure):
    _fields_ = [("struct_size", c_uint32), ("seq_len", c_uint32), ("n_documents", c_uint32),
                ("n_tool_outputs", c_uint32), ("n_turns", c_uint32), ("seed", c_uint64)]


class PrecisionPolicy(Structure):
    _fields_ = [("always_format", c_int), ("global_format", c_int), ("recent_format", c_int),
                ("attend_high", c_int), ("attend_mid", c_int), ("attend_low", c_int),
                ("attend_high_score", c_float), ("attend_mid_score", c_float),
                ("demote1_pressure", c_float), ("demote2_pressure", c_float)]


class RouterConfig(Structure):
    _fields_ = [("struct_size", c_uint32), ("page_size", c_uint32), ("token_budget", c_uint32),
                ("recent_window", c_uint32), ("memory_pressure", c_float), ("attend_threshold", c_float),
                ("prefetch_depth", c_uint32), ("unlabeled_score", c_float), ("over_budget", c_int),
                ("precision", PrecisionPolicy)]


class PlanPage(Structure):
    _fields_ = [("page", c_uint32), ("token_begin", c_uint32), ("token_end", c_uint32), ("format", c_uint8),
                ("flags", c_uint8), ("reserved", c_uint16)]


class BlockDecision(Structure):
    _fields_ = [("block_id", c_uint32), ("start", c_uint32), ("end", c_uint32), ("tokens_selected", c_uint32),
                ("selected", c_uint8), ("format", c_uint8), ("reason", c_uint16)]


class PlanSummary(Structure):
    _fields_ = [("seq_len", c_uint32), ("page_size", c_uint32), ("tokens_selected", c_uint32),
                ("tokens_skipped", c_uint32), ("pages_selected", c_uint32), ("pages_total", c_uint32),
                ("tokens_by_format", c_uint32 * IKV_FMT_COUNT), ("mandatory_tokens", c_uint32),
                ("token_budget", c_uint32), ("over_budget", c_int)]


class ModelShape(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_layers", c_uint32), ("n_q_heads", c_uint32),
                ("n_kv_heads", c_uint32), ("head_dim", c_uint32)]


class PlanCost(Structure):
    _fields_ = [("bytes_by_format", c_uint64 * IKV_FMT_COUNT), ("bytes_total", c_uint64),
                ("bytes_dense_f16", c_uint64), ("flops", c_uint64), ("flops_dense", c_uint64)]


class PoolConfig(Structure):
    _fields_ = [("struct_size", c_uint32), ("backend", c_int), ("device", c_int), ("n_layers", c_uint32),
                ("n_kv_heads", c_uint32), ("head_dim", c_uint32), ("page_size", c_uint32),
                ("capacity_bytes", c_uint64), ("default_format", c_int), ("kv_dtype", c_int),
                ("host_capacity_bytes", c_uint64)]  # later field: the struct of ikv_pool_default_config_v2


class PoolStats(Structure):
    _fields_ = [("struct_size", c_uint32), ("capacity_bytes", c_uint64), ("used_bytes", c_uint64),
                ("pages_used", c_uint64), ("pages_by_format", c_uint64 * IKV_FMT_COUNT),
                ("bytes_by_format", c_uint64 * IKV_FMT_COUNT), ("reserved_bytes", c_uint64),
                ("staging_bytes", c_uint64), ("n_sequences", c_uint32), ("tokens_total", c_uint64),
                ("host_used_bytes", c_uint64), ("host_pages", c_uint64), ("bytes_offloaded", c_uint64),
                ("bytes_fetched", c_uint64), ("host_page_reads", c_uint64), ("host_reserved_bytes", c_uint64)]


class TierPolicy(Structure):
    _fields_ = [("struct_size", c_uint32), ("idle_steps", c_uint32), ("device_high", c_float),
                ("device_low", c_float), ("flags", c_uint32)]


class TierStepReport(Structure):
    _fields_ = [("struct_size", c_uint32), ("pages_fetched", c_uint32), ("pages_offloaded", c_uint32),
                ("pages_on_host", c_uint32), ("step", c_uint64)]


class Append(Structure):
    _fields_ = [("struct_size", c_uint32), ("layer", c_uint32), ("n_tokens", c_uint32), ("k", c_void_p),
                ("v", c_void_p), ("token_stride", c_int64), ("head_stride", c_int64), ("layer_stride", c_int64),
                ("src_on_device", c_int), ("stream", c_void_p), ("formats", c_void_p), ("seq_stride", c_int64),
                ("flags", c_uint32)]


class DecoderConfig(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_threads", c_uint32)]


class DecoderStats(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved", c_uint32), ("steps", c_uint64), ("lists_built", c_uint64),
                ("lists_reused", c_uint64), ("last_bytes_read", c_uint64), ("appends_fused", c_uint64)]


class DecodeArgs(Structure):
    _fields_ = [("struct_size", c_uint32), ("layer", c_uint32), ("n_seqs", c_uint32),
                ("seqs", POINTER(c_uint32)), ("plans", POINTER(c_void_p)), ("n_query_tokens", c_uint32),
                ("n_q_heads", c_uint32), ("q", c_void_p), ("q_dtype", c_int), ("out", c_void_p),
                ("out_dtype", c_int), ("lse", POINTER(c_float)), ("scale", c_float), ("softcap", c_float),
                ("topk_token_budget", c_uint32), ("stream", c_void_p), ("topk_mode", c_int),
                ("topk_mass", c_float), ("topk_min_tokens", c_uint32), ("topk_score", c_int),
                ("query_memory", c_void_p), ("feedback", c_void_p), ("topk_feedback_weight", c_float),
                ("append", c_void_p)]


class PageFeedbackConfig(Structure):
    _fields_ = [("struct_size", c_uint32), ("rate", c_float)]


class QueryMemoryConfig(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_q_heads", c_uint32), ("decay", c_float),
                ("turns", c_uint32)]  # later field: the struct of ikv_query_memory_default_config_v2


# (name, restype, argtypes). Handles are c_void_p; status is c_int.
_S = c_int
_V = c_void_p
_PV = POINTER(c_void_p)
_PROTOTYPES = [
    ("ikv_version", c_uint, []),
    ("ikv_version_string", c_char_p, []),
    ("ikv_status_name", c_char_p, [c_int]),
    ("ikv_last_error", c_char_p, []),
    ("ikv_runtime_info_get", _S, [POINTER(RuntimeInfo)]),
    ("ikv_format_name", c_char_p, [c_int]),
    ("ikv_block_kind_name", c_char_p, [c_int]),
    ("ikv_policy_name", c_char_p, [c_int]),
    ("ikv_reason_name", c_char_p, [c_int]),
    ("ikv_block_desc_default", BlockDesc, []),
    ("ikv_layout_create", _S, [_PV]),
    ("ikv_layout_destroy", None, [_V]),
    ("ikv_layout_clone", _S, [_V, _PV]),
    ("ikv_layout_add", _S, [_V, POINTER(BlockDesc), POINTER(c_uint32)]),
    ("ikv_layout_update", _S, [_V, c_uint32, POINTER(BlockDesc)]),
    ("ikv_layout_set_score", _S, [_V, c_uint32, c_float]),
    ("ikv_layout_remove", _S, [_V, c_uint32]),
    ("ikv_layout_count", c_size_t, [_V]),
    ("ikv_layout_at", _S, [_V, c_size_t, POINTER(BlockInfo)]),
    ("ikv_layout_get", _S, [_V, c_uint32, POINTER(BlockInfo)]),
    ("ikv_layout_find_token", _S, [_V, c_uint32, POINTER(c_uint32)]),
    ("ikv_layout_validate", _S, [_V, c_uint32]),
    ("ikv_synth_default_config", SynthConfig, []),
    ("ikv_synth_layout", _S, [POINTER(SynthConfig), _PV]),
    ("ikv_router_default_config", RouterConfig, []),
    ("ikv_router_create", _S, [POINTER(RouterConfig), _PV]),
    ("ikv_router_destroy", None, [_V]),
    ("ikv_router_get_config", _S, [_V, POINTER(RouterConfig)]),
    ("ikv_router_set_pressure", _S, [_V, c_float]),
    ("ikv_router_route", _S, [_V, _V, c_uint32, _PV]),
    ("ikv_plan_from_ranges", _S, [POINTER(TokenRange), c_size_t, c_uint32, c_uint32, c_int, _PV]),
    ("ikv_plan_destroy", None, [_V]),
    ("ikv_plan_get_summary", _S, [_V, POINTER(PlanSummary)]),
    ("ikv_plan_pages", _S, [_V, POINTER(POINTER(PlanPage)), POINTER(c_size_t)]),
    ("ikv_plan_skipped_pages", _S, [_V, POINTER(POINTER(c_uint32)), POINTER(c_size_t)]),
    ("ikv_plan_prefetch", _S, [_V, POINTER(POINTER(c_uint32)), POINTER(c_size_t)]),
    ("ikv_plan_decisions", _S, [_V, POINTER(POINTER(BlockDecision)), POINTER(c_size_t)]),
    ("ikv_plan_page_format", _S, [_V, c_uint32, POINTER(c_int)]),
    ("ikv_model_shape_default", ModelShape, []),
    ("ikv_plan_get_cost", _S, [_V, POINTER(ModelShape), POINTER(PlanCost)]),
    # The header's ikv_pool_default_config() is a macro naming this version's symbol; the unversioned
    # symbol returns the first, 48-byte layout (no host_capacity_bytes) and is not declared here.
    ("ikv_pool_default_config_v2", PoolConfig, []),
    ("ikv_pool_create", _S, [POINTER(PoolConfig), _PV]),
    ("ikv_pool_destroy", None, [_V]),
    ("ikv_pool_get_config", _S, [_V, POINTER(PoolConfig)]),
    ("ikv_pool_page_bytes", c_uint64, [_V, c_int]),
    ("ikv_pool_get_stats", _S, [_V, POINTER(PoolStats)]),
    ("ikv_seq_create", _S, [_V, POINTER(c_uint32)]),
    ("ikv_seq_destroy", _S, [_V, c_uint32]),
    ("ikv_seq_length", _S, [_V, c_uint32, POINTER(c_uint32)]),
    # ikv_append_default() is a macro naming this version's symbol (the unversioned one returns the
    # first, 80-byte layout: no seq_stride, no flags).
    ("ikv_append_default_v2", Append, [_V, c_uint32]),
    ("ikv_pool_append", _S, [_V, c_uint32, POINTER(Append)]),
    ("ikv_pool_append_batch", _S, [_V, POINTER(c_uint32), c_uint32, POINTER(Append)]),
    ("ikv_pool_sync", _S, [_V]),
    ("ikv_pool_reserve", _S, [_V, POINTER(c_uint32), c_uint32, c_uint32]),
    ("ikv_seq_fork", _S, [_V, c_uint32, POINTER(c_uint32)]),
    ("ikv_seq_truncate", _S, [_V, c_uint32, c_uint32]),
    ("ikv_seq_evict", _S, [_V, c_uint32, c_uint32, c_uint32]),
    ("ikv_seq_is_evicted", _S, [_V, c_uint32, c_uint32, POINTER(c_int)]),
    ("ikv_seq_page_format", _S, [_V, c_uint32, c_uint32, POINTER(c_int)]),
    ("ikv_seq_set_page_format", _S, [_V, c_uint32, c_uint32, c_int]),
    ("ikv_seq_apply_plan_formats", _S, [_V, c_uint32, _V]),
    ("ikv_seq_offload", _S, [_V, c_uint32, c_uint32, c_uint32, c_void_p, POINTER(c_uint32)]),
    ("ikv_seq_fetch", _S, [_V, c_uint32, c_uint32, c_uint32, c_void_p, POINTER(c_uint32)]),
    ("ikv_seq_page_tier", _S, [_V, c_uint32, c_uint32, POINTER(c_int)]),
    ("ikv_pool_set_tier_policy", _S, [_V, POINTER(TierPolicy)]),
    ("ikv_pool_tier_step", _S, [_V, POINTER(c_uint32), POINTER(c_void_p), c_uint32, c_void_p,
                                POINTER(TierStepReport)]),
    ("ikv_seq_read", _S, [_V, c_uint32, c_uint32, c_uint32, c_uint32, c_void_p, c_void_p]),
    ("ikv_decoder_default_config", DecoderConfig, []),
    ("ikv_decoder_create", _S, [POINTER(DecoderConfig), _PV]),
    ("ikv_decoder_destroy", None, [_V]),
    ("ikv_decode_args_default_v3", DecodeArgs, []),  # this struct version's default (the header's macro)
    ("ikv_decode", _S, [_V, _V, POINTER(DecodeArgs)]),
    ("ikv_decoder_last_bytes_read", _S, [_V, POINTER(c_uint64)]),
    # The header's ikv_query_memory_default_config() is a macro naming this version's symbol; the unversioned
    # symbol returns the first, 12-byte layout (no turns) and is not declared here.
    ("ikv_query_memory_default_config_v2", QueryMemoryConfig, []),
    ("ikv_query_memory_create", _S, [_V, POINTER(QueryMemoryConfig), _PV]),
    ("ikv_query_memory_destroy", None, [_V]),
    ("ikv_query_memory_remember", _S, [_V, c_uint32, c_uint32, _V, c_int, c_uint32]),
    ("ikv_query_memory_end_turn", _S, [_V, c_uint32]),
    ("ikv_query_memory_forget", _S, [_V, c_uint32]),
    ("ikv_query_memory_reset", _S, [_V]),
    ("ikv_page_feedback_default_config", PageFeedbackConfig, []),
    ("ikv_page_feedback_create", _S, [_V, POINTER(PageFeedbackConfig), _PV]),
    ("ikv_page_feedback_destroy", None, [_V]),
    ("ikv_page_feedback_get", _S, [_V, c_uint32, c_uint32, c_uint32, POINTER(c_float), c_uint32, POINTER(c_uint32)]),
    ("ikv_page_feedback_block_scores", _S, [_V, c_uint32, _V]),
    ("ikv_page_feedback_forget", _S, [_V, c_uint32]),
    ("ikv_page_feedback_reset", _S, [_V]),
    ("ikv_seq_layer_length", _S, [_V, c_uint32, c_uint32, POINTER(c_uint32)]),
    ("ikv_decoder_last_selection", _S, [_V, c_uint32, c_uint32, POINTER(TokenRange), ctypes.c_size_t,
                                        POINTER(ctypes.c_size_t)]),
    ("ikv_decoder_get_stats", _S, [_V, POINTER(DecoderStats)]),
]

_lib = None


def _candidate_paths(path):
    if path:
        yield path
    env = os.environ.get("INTENTKV_LIB")
    if env:
        yield env
    found = ctypes.util.find_library("intentkv")
    if found:
        yield found


def load(path=None):
    """Load libintentkv (explicit path, else $INTENTKV_LIB, else the system search). Idempotent."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    errors = []
    for candidate in _candidate_paths(path):
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as exc:
            errors.append("%s: %s" % (candidate, exc))
            continue
        for name, restype, argtypes in _PROTOTYPES:
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = lib
        return lib
    raise OSError("libintentkv not found; set INTENTKV_LIB or call intentkv.load(path). Tried: "
                  + ("; ".join(errors) if errors else "nothing (no path, no $INTENTKV_LIB, find_library failed)"))


def lib():
    return _lib if _lib is not None else load()
