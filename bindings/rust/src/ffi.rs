//! Raw declarations mirroring include/intentkv.h, written by hand (no bindgen: no external crates).
//!
//! C enums are plain `c_int` aliases with constants, so a value the library adds later can never be
//! an invalid Rust enum. Struct field order and types follow the header exactly; the tests compare
//! every `*_default()` struct_size with `size_of` of the struct here.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_float, c_int, c_uint, c_void};

pub type ikv_status = c_int;
pub const IKV_OK: ikv_status = 0;
pub const IKV_E_INVALID: ikv_status = -1;
pub const IKV_E_NULL: ikv_status = -2;
pub const IKV_E_RANGE: ikv_status = -3;
pub const IKV_E_NOMEM: ikv_status = -4;
pub const IKV_E_BUDGET: ikv_status = -5;
pub const IKV_E_OVERLAP: ikv_status = -6;
pub const IKV_E_UNSUPPORTED: ikv_status = -7;
pub const IKV_E_NO_DEVICE: ikv_status = -8;
pub const IKV_E_DEVICE: ikv_status = -9;
pub const IKV_E_SHARED: ikv_status = -10;
pub const IKV_E_EVICTED: ikv_status = -11;
pub const IKV_E_NOT_FOUND: ikv_status = -12;
pub const IKV_E_STATE: ikv_status = -13;
pub const IKV_E_INTERNAL: ikv_status = -14;

pub type ikv_format = c_int;
pub const IKV_FMT_F16: ikv_format = 0;
pub const IKV_FMT_BF16: ikv_format = 1;
pub const IKV_FMT_FP8_E4M3: ikv_format = 2;
pub const IKV_FMT_INT8: ikv_format = 3;
pub const IKV_FMT_INT4: ikv_format = 4;
pub const IKV_FMT_COUNT: usize = 5;
pub const IKV_FMT_AUTO: ikv_format = 255;

pub type ikv_dtype = c_int;
pub type ikv_topk_mode = c_int;
pub const IKV_TOPK_FIXED: ikv_topk_mode = 0;
pub const IKV_TOPK_MASS: ikv_topk_mode = 1;
pub type ikv_topk_score = c_int;
pub const IKV_TOPK_SCORE_QUEST: ikv_topk_score = 0;
pub const IKV_TOPK_SCORE_HYBRID: ikv_topk_score = 1;
pub const IKV_TOPK_SCORE_KEYS: ikv_topk_score = 2;
pub const IKV_DTYPE_F32: ikv_dtype = 0;
pub const IKV_DTYPE_F16: ikv_dtype = 1;
pub const IKV_DTYPE_BF16: ikv_dtype = 2;

pub type ikv_backend = c_int;
pub const IKV_BACKEND_CPU: ikv_backend = 0;
pub const IKV_BACKEND_CUDA: ikv_backend = 1;

pub type ikv_block_kind = c_int;
pub const IKV_KIND_SYSTEM_PROMPT: ikv_block_kind = 0;
pub const IKV_KIND_MEMORY_SUMMARY: ikv_block_kind = 1;
pub const IKV_KIND_RETRIEVED_DOC: ikv_block_kind = 2;
pub const IKV_KIND_TOOL_OUTPUT: ikv_block_kind = 3;
pub const IKV_KIND_SCRATCHPAD: ikv_block_kind = 4;
pub const IKV_KIND_CONVERSATION: ikv_block_kind = 5;
pub const IKV_KIND_REASONING: ikv_block_kind = 6;
pub const IKV_KIND_OTHER: ikv_block_kind = 7;

pub type ikv_policy = c_int;
pub const IKV_POLICY_ALWAYS: ikv_policy = 0;
pub const IKV_POLICY_ATTEND: ikv_policy = 1;
pub const IKV_POLICY_SKIP: ikv_policy = 2;
pub const IKV_POLICY_RECENT: ikv_policy = 3;
pub const IKV_POLICY_GLOBAL: ikv_policy = 4;

pub type ikv_over_budget = c_int;
pub const IKV_OVER_BUDGET_FAIL: ikv_over_budget = 0;
pub const IKV_OVER_BUDGET_KEEP: ikv_over_budget = 1;

pub type ikv_reason = c_int;
pub type ikv_seq_id = u32;

pub const IKV_NAME_MAX: usize = 63;
pub const IKV_ALL_LAYERS: u32 = u32::MAX;
pub const IKV_MAX_QUERY_TOKENS: u32 = 2048;
pub const IKV_PAGE_MANDATORY: u8 = 0x1;
pub const IKV_PAGE_PARTIAL: u8 = 0x2;

#[repr(C)]
pub struct ikv_layout {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ikv_router {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ikv_plan {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ikv_pool {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ikv_decoder {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ikv_query_memory {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ikv_page_feedback {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_query_memory_config {
    pub struct_size: u32,
    pub n_q_heads: u32,
    pub decay: c_float,
    // Later fields (the struct of ikv_query_memory_default_config_v2; a caller passing the first, 12-byte
    // struct_size gets turns = 0):
    /// Ended turns kept apart, 1..64, the oldest dropped first; 0 = one decayed mean (the first version's
    /// memory); default 4.
    pub turns: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_page_feedback_config {
    pub struct_size: u32,
    pub rate: c_float,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_runtime_info {
    pub struct_size: u32,
    pub version: c_uint,
    pub cuda_built: c_int,
    pub cuda_device_count: c_int,
    pub cuda_device_name: [c_char; 64],
    pub cpu_isa: [c_char; 16],
    pub cpu_isa_available: [c_char; 64],
    pub cuda_archs: [c_char; 32],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ikv_token_range {
    pub begin: u32,
    pub end: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_block_desc {
    pub struct_size: u32,
    pub name: *const c_char,
    pub kind: ikv_block_kind,
    pub start: u32,
    pub end: u32,
    pub policy: ikv_policy,
    pub score: c_float,
    pub precision_hint: ikv_format,
    pub turn: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_block_info {
    pub id: u32,
    pub name: [c_char; IKV_NAME_MAX + 1],
    pub kind: ikv_block_kind,
    pub start: u32,
    pub end: u32,
    pub policy: ikv_policy,
    pub score: c_float,
    pub precision_hint: ikv_format,
    pub turn: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_synth_config {
    pub struct_size: u32,
    pub seq_len: u32,
    pub n_documents: u32,
    pub n_tool_outputs: u32,
    pub n_turns: u32,
    pub seed: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_precision_policy {
    pub always_format: ikv_format,
    pub global_format: ikv_format,
    pub recent_format: ikv_format,
    pub attend_high: ikv_format,
    pub attend_mid: ikv_format,
    pub attend_low: ikv_format,
    pub attend_high_score: c_float,
    pub attend_mid_score: c_float,
    pub demote1_pressure: c_float,
    pub demote2_pressure: c_float,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_router_config {
    pub struct_size: u32,
    pub page_size: u32,
    pub token_budget: u32,
    pub recent_window: u32,
    pub memory_pressure: c_float,
    pub attend_threshold: c_float,
    pub prefetch_depth: u32,
    pub unlabeled_score: c_float,
    pub over_budget: ikv_over_budget,
    pub precision: ikv_precision_policy,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ikv_plan_page {
    pub page: u32,
    pub token_begin: u32,
    pub token_end: u32,
    pub format: u8,
    pub flags: u8,
    pub reserved: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ikv_block_decision {
    pub block_id: u32,
    pub start: u32,
    pub end: u32,
    pub tokens_selected: u32,
    pub selected: u8,
    pub format: u8,
    pub reason: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ikv_plan_summary {
    pub seq_len: u32,
    pub page_size: u32,
    pub tokens_selected: u32,
    pub tokens_skipped: u32,
    pub pages_selected: u32,
    pub pages_total: u32,
    pub tokens_by_format: [u32; IKV_FMT_COUNT],
    pub mandatory_tokens: u32,
    pub token_budget: u32,
    pub over_budget: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_model_shape {
    pub struct_size: u32,
    pub n_layers: u32,
    pub n_q_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ikv_plan_cost {
    pub bytes_by_format: [u64; IKV_FMT_COUNT],
    pub bytes_total: u64,
    pub bytes_dense_f16: u64,
    pub flops: u64,
    pub flops_dense: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_pool_config {
    pub struct_size: u32,
    pub backend: ikv_backend,
    pub device: c_int,
    pub n_layers: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub page_size: u32,
    pub capacity_bytes: u64,
    pub default_format: ikv_format,
    pub kv_dtype: ikv_dtype,
    // Later fields (the struct of ikv_pool_default_config_v2):
    /// CUDA pools: bytes of pinned host memory for a host tier of pages (`ikv_seq_offload`);
    /// 0 (default) = no host tier. CPU pools: must be 0.
    pub host_capacity_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ikv_pool_stats {
    pub struct_size: u32,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub pages_used: u64,
    pub pages_by_format: [u64; IKV_FMT_COUNT],
    pub bytes_by_format: [u64; IKV_FMT_COUNT],
    pub reserved_bytes: u64,
    pub staging_bytes: u64,
    pub n_sequences: u32,
    pub tokens_total: u64,
    // Later fields: the host tier.
    /// Bytes of pages in the host tier (<= host_capacity_bytes).
    pub host_used_bytes: u64,
    /// Pages in the host tier.
    pub host_pages: u64,
    /// Page bytes moved device -> host since the pool was created.
    pub bytes_offloaded: u64,
    /// Page bytes moved host -> device since the pool was created.
    pub bytes_fetched: u64,
    /// Pages in host memory that decode calls listed, one per page and call (read over the bus: the stalls
    /// the tier policy avoids; with query-aware top-k, host-tier candidates, which it may read).
    pub host_page_reads: u64,
    /// Pinned host slab memory the host tier holds, >= host_used_bytes (kept while the pool lives).
    pub host_reserved_bytes: u64,
}

/// `ikv_pool_tier_step` fetches nothing: the step's pages stay where they are and decodes read host-tier
/// ones over the bus (`ikv_tier_policy.flags`).
pub const IKV_TIER_NO_PREFETCH: u32 = 0x1;

/// The automatic tier policy of a CUDA pool with a host tier (`ikv_pool_set_tier_policy`). A field left 0
/// takes its default, so a zeroed struct with struct_size set is the default policy.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ikv_tier_policy {
    pub struct_size: u32,
    /// A page no `ikv_pool_tier_step` named for at least this many steps is idle; default 8.
    pub idle_steps: u32,
    /// Share of capacity_bytes above which a step offloads, in (0, 1]; default 0.9.
    pub device_high: c_float,
    /// Share idle pages are offloaded down to, in (0, device_high]; default min(0.75, device_high).
    pub device_low: c_float,
    /// `IKV_TIER_*`
    pub flags: u32,
}

/// What one `ikv_pool_tier_step` did. Set struct_size first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ikv_tier_step_report {
    pub struct_size: u32,
    /// Pages moved host -> device by this call.
    pub pages_fetched: u32,
    /// Pages moved device -> host by this call.
    pub pages_offloaded: u32,
    /// Pages this step's plans read that are still in host memory after the call.
    pub pages_on_host: u32,
    /// The pool's step count after this call (the first call makes it 1).
    pub step: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_append {
    pub struct_size: u32,
    pub layer: u32,
    pub n_tokens: u32,
    pub k: *const c_void,
    pub v: *const c_void,
    pub token_stride: i64,
    pub head_stride: i64,
    pub layer_stride: i64,
    pub src_on_device: c_int,
    pub stream: *mut c_void,
    pub formats: *const ikv_plan,
    pub seq_stride: i64,
    pub flags: u32,
}

pub const IKV_APPEND_ASYNC: u32 = 0x1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ikv_decoder_stats {
    pub struct_size: u32,
    pub reserved: u32,
    pub steps: u64,
    pub lists_built: u64,
    pub lists_reused: u64,
    pub last_bytes_read: u64,
    pub appends_fused: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_decoder_config {
    pub struct_size: u32,
    pub n_threads: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ikv_decode_args {
    pub struct_size: u32,
    pub layer: u32,
    pub n_seqs: u32,
    pub seqs: *const ikv_seq_id,
    pub plans: *const *const ikv_plan,
    pub n_query_tokens: u32,
    pub n_q_heads: u32,
    pub q: *const c_void,
    pub q_dtype: ikv_dtype,
    pub out: *mut c_void,
    pub out_dtype: ikv_dtype,
    pub lse: *mut c_float,
    pub scale: c_float,
    pub softcap: c_float,
    pub topk_token_budget: u32,
    pub stream: *mut c_void,
    pub topk_mode: ikv_topk_mode,
    pub topk_mass: c_float,
    pub topk_min_tokens: u32,
    pub topk_score: ikv_topk_score,
    pub query_memory: *const ikv_query_memory,
    pub feedback: *mut ikv_page_feedback,
    pub topk_feedback_weight: c_float,
}

extern "C" {
    pub fn ikv_version() -> c_uint;
    pub fn ikv_version_string() -> *const c_char;
    pub fn ikv_status_name(status: ikv_status) -> *const c_char;
    pub fn ikv_last_error() -> *const c_char;
    pub fn ikv_runtime_info_get(info: *mut ikv_runtime_info) -> ikv_status;
    pub fn ikv_format_name(format: ikv_format) -> *const c_char;
    pub fn ikv_block_kind_name(kind: ikv_block_kind) -> *const c_char;
    pub fn ikv_policy_name(policy: ikv_policy) -> *const c_char;
    pub fn ikv_reason_name(reason: ikv_reason) -> *const c_char;

    pub fn ikv_block_desc_default() -> ikv_block_desc;
    pub fn ikv_layout_create(out: *mut *mut ikv_layout) -> ikv_status;
    pub fn ikv_layout_destroy(layout: *mut ikv_layout);
    pub fn ikv_layout_clone(layout: *const ikv_layout, out: *mut *mut ikv_layout) -> ikv_status;
    pub fn ikv_layout_add(layout: *mut ikv_layout, block: *const ikv_block_desc, id_out: *mut u32) -> ikv_status;
    pub fn ikv_layout_update(layout: *mut ikv_layout, id: u32, block: *const ikv_block_desc) -> ikv_status;
    pub fn ikv_layout_set_score(layout: *mut ikv_layout, id: u32, score: c_float) -> ikv_status;
    pub fn ikv_layout_remove(layout: *mut ikv_layout, id: u32) -> ikv_status;
    pub fn ikv_layout_count(layout: *const ikv_layout) -> usize;
    pub fn ikv_layout_at(layout: *const ikv_layout, index: usize, out: *mut ikv_block_info) -> ikv_status;
    pub fn ikv_layout_get(layout: *const ikv_layout, id: u32, out: *mut ikv_block_info) -> ikv_status;
    pub fn ikv_layout_find_token(layout: *const ikv_layout, token: u32, id_out: *mut u32) -> ikv_status;
    pub fn ikv_layout_validate(layout: *const ikv_layout, seq_len: u32) -> ikv_status;

    pub fn ikv_synth_default_config() -> ikv_synth_config;
    pub fn ikv_synth_layout(config: *const ikv_synth_config, out: *mut *mut ikv_layout) -> ikv_status;

    pub fn ikv_router_default_config() -> ikv_router_config;
    pub fn ikv_router_create(config: *const ikv_router_config, out: *mut *mut ikv_router) -> ikv_status;
    pub fn ikv_router_destroy(router: *mut ikv_router);
    pub fn ikv_router_get_config(router: *const ikv_router, out: *mut ikv_router_config) -> ikv_status;
    pub fn ikv_router_set_pressure(router: *mut ikv_router, memory_pressure: c_float) -> ikv_status;
    pub fn ikv_router_route(router: *const ikv_router, layout: *const ikv_layout, seq_len: u32,
                            plan_out: *mut *mut ikv_plan) -> ikv_status;
    pub fn ikv_plan_from_ranges(ranges: *const ikv_token_range, n_ranges: usize, seq_len: u32, page_size: u32,
                                format: ikv_format, plan_out: *mut *mut ikv_plan) -> ikv_status;
    pub fn ikv_plan_destroy(plan: *mut ikv_plan);
    pub fn ikv_plan_get_summary(plan: *const ikv_plan, out: *mut ikv_plan_summary) -> ikv_status;
    pub fn ikv_plan_pages(plan: *const ikv_plan, pages: *mut *const ikv_plan_page, count: *mut usize) -> ikv_status;
    pub fn ikv_plan_skipped_pages(plan: *const ikv_plan, pages: *mut *const u32, count: *mut usize) -> ikv_status;
    pub fn ikv_plan_prefetch(plan: *const ikv_plan, pages: *mut *const u32, count: *mut usize) -> ikv_status;
    pub fn ikv_plan_decisions(plan: *const ikv_plan, decisions: *mut *const ikv_block_decision,
                              count: *mut usize) -> ikv_status;
    pub fn ikv_plan_page_format(plan: *const ikv_plan, page: u32, out: *mut ikv_format) -> ikv_status;
    pub fn ikv_model_shape_default() -> ikv_model_shape;
    pub fn ikv_plan_get_cost(plan: *const ikv_plan, shape: *const ikv_model_shape, out: *mut ikv_plan_cost)
                             -> ikv_status;

    // The header's ikv_pool_default_config() is a macro naming this version's symbol (the unversioned
    // symbol returns the first, 48-byte layout for programs built with the first header).
    #[link_name = "ikv_pool_default_config_v2"]
    pub fn ikv_pool_default_config() -> ikv_pool_config;
    pub fn ikv_pool_create(config: *const ikv_pool_config, out: *mut *mut ikv_pool) -> ikv_status;
    pub fn ikv_pool_destroy(pool: *mut ikv_pool);
    pub fn ikv_pool_get_config(pool: *const ikv_pool, out: *mut ikv_pool_config) -> ikv_status;
    pub fn ikv_pool_page_bytes(pool: *const ikv_pool, format: ikv_format) -> u64;
    pub fn ikv_pool_get_stats(pool: *const ikv_pool, out: *mut ikv_pool_stats) -> ikv_status;
    pub fn ikv_seq_create(pool: *mut ikv_pool, id_out: *mut ikv_seq_id) -> ikv_status;
    pub fn ikv_seq_destroy(pool: *mut ikv_pool, seq: ikv_seq_id) -> ikv_status;
    pub fn ikv_seq_length(pool: *const ikv_pool, seq: ikv_seq_id, length_out: *mut u32) -> ikv_status;
    // The header's ikv_append_default() is a macro naming this version's symbol.
    #[link_name = "ikv_append_default_v2"]
    pub fn ikv_append_default(pool: *const ikv_pool, n_tokens: u32) -> ikv_append;
    pub fn ikv_pool_append(pool: *mut ikv_pool, seq: ikv_seq_id, args: *const ikv_append) -> ikv_status;
    pub fn ikv_pool_append_batch(pool: *mut ikv_pool, seqs: *const ikv_seq_id, n_seqs: u32,
                                 args: *const ikv_append) -> ikv_status;
    pub fn ikv_pool_sync(pool: *mut ikv_pool) -> ikv_status;
    pub fn ikv_pool_reserve(pool: *mut ikv_pool, seqs: *const ikv_seq_id, n_seqs: u32, n_tokens: u32) -> ikv_status;
    pub fn ikv_seq_fork(pool: *mut ikv_pool, parent: ikv_seq_id, child_out: *mut ikv_seq_id) -> ikv_status;
    pub fn ikv_seq_truncate(pool: *mut ikv_pool, seq: ikv_seq_id, n_tokens: u32) -> ikv_status;
    pub fn ikv_seq_evict(pool: *mut ikv_pool, seq: ikv_seq_id, begin: u32, end: u32) -> ikv_status;
    pub fn ikv_seq_is_evicted(pool: *const ikv_pool, seq: ikv_seq_id, token: u32, evicted_out: *mut c_int)
                              -> ikv_status;
    pub fn ikv_seq_page_format(pool: *const ikv_pool, seq: ikv_seq_id, page: u32, out: *mut ikv_format)
                               -> ikv_status;
    pub fn ikv_seq_set_page_format(pool: *mut ikv_pool, seq: ikv_seq_id, page: u32, format: ikv_format)
                                   -> ikv_status;
    pub fn ikv_seq_apply_plan_formats(pool: *mut ikv_pool, seq: ikv_seq_id, plan: *const ikv_plan) -> ikv_status;
    pub fn ikv_seq_offload(pool: *mut ikv_pool, seq: ikv_seq_id, begin: u32, end: u32, stream: *mut c_void,
                           moved_out: *mut u32) -> ikv_status;
    pub fn ikv_seq_fetch(pool: *mut ikv_pool, seq: ikv_seq_id, begin: u32, end: u32, stream: *mut c_void,
                         moved_out: *mut u32) -> ikv_status;
    pub fn ikv_seq_page_tier(pool: *const ikv_pool, seq: ikv_seq_id, page: u32, on_host_out: *mut c_int)
                             -> ikv_status;
    pub fn ikv_pool_set_tier_policy(pool: *mut ikv_pool, policy: *const ikv_tier_policy) -> ikv_status;
    pub fn ikv_pool_tier_step(pool: *mut ikv_pool, seqs: *const ikv_seq_id, plans: *const *const ikv_plan,
                              n_seqs: u32, stream: *mut c_void, report: *mut ikv_tier_step_report) -> ikv_status;
    pub fn ikv_seq_read(pool: *const ikv_pool, seq: ikv_seq_id, layer: u32, begin: u32, end: u32,
                        k_out: *mut c_float, v_out: *mut c_float) -> ikv_status;

    pub fn ikv_decoder_default_config() -> ikv_decoder_config;
    pub fn ikv_decoder_create(config: *const ikv_decoder_config, out: *mut *mut ikv_decoder) -> ikv_status;
    pub fn ikv_decoder_destroy(decoder: *mut ikv_decoder);
    // The header's ikv_decode_args_default() is a macro naming this version's symbol.
    #[link_name = "ikv_decode_args_default_v2"]
    pub fn ikv_decode_args_default() -> ikv_decode_args;
    pub fn ikv_decode(decoder: *mut ikv_decoder, pool: *mut ikv_pool, args: *const ikv_decode_args) -> ikv_status;
    pub fn ikv_decoder_last_bytes_read(decoder: *const ikv_decoder, bytes_out: *mut u64) -> ikv_status;
    // The header's ikv_query_memory_default_config() is a macro naming this version's symbol (the unversioned
    // symbol returns the first, 12-byte layout for programs built with the first header).
    #[link_name = "ikv_query_memory_default_config_v2"]
    pub fn ikv_query_memory_default_config() -> ikv_query_memory_config;
    pub fn ikv_query_memory_create(pool: *const ikv_pool, config: *const ikv_query_memory_config,
                                   out: *mut *mut ikv_query_memory) -> ikv_status;
    pub fn ikv_query_memory_destroy(memory: *mut ikv_query_memory);
    pub fn ikv_query_memory_remember(memory: *mut ikv_query_memory, seq: ikv_seq_id, layer: u32, q: *const c_void,
                                     q_dtype: ikv_dtype, n_tokens: u32) -> ikv_status;
    pub fn ikv_query_memory_end_turn(memory: *mut ikv_query_memory, seq: ikv_seq_id) -> ikv_status;
    pub fn ikv_query_memory_forget(memory: *mut ikv_query_memory, seq: ikv_seq_id) -> ikv_status;
    pub fn ikv_query_memory_reset(memory: *mut ikv_query_memory) -> ikv_status;
    pub fn ikv_page_feedback_default_config() -> ikv_page_feedback_config;
    pub fn ikv_page_feedback_create(pool: *const ikv_pool, config: *const ikv_page_feedback_config,
                                    out: *mut *mut ikv_page_feedback) -> ikv_status;
    pub fn ikv_page_feedback_destroy(feedback: *mut ikv_page_feedback);
    pub fn ikv_page_feedback_get(feedback: *const ikv_page_feedback, seq: ikv_seq_id, layer: u32, kv_head: u32,
                                 mass: *mut c_float, capacity: u32, n_pages_out: *mut u32) -> ikv_status;
    pub fn ikv_page_feedback_forget(feedback: *mut ikv_page_feedback, seq: ikv_seq_id) -> ikv_status;
    pub fn ikv_page_feedback_reset(feedback: *mut ikv_page_feedback) -> ikv_status;
    pub fn ikv_decoder_last_selection(decoder: *const ikv_decoder, seq_index: u32, kv_head: u32,
                                      ranges: *mut ikv_token_range, capacity: usize, n_out: *mut usize)
                                      -> ikv_status;
    pub fn ikv_decoder_get_stats(decoder: *const ikv_decoder, out: *mut ikv_decoder_stats) -> ikv_status;
}
