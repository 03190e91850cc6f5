//! Safe Rust bindings for intentkv, over the C API of `include/intentkv.h` (raw items in [`ffi`]).
//!
//! Every fallible call returns `Result<T, Error>`; an [`Error`] carries the status and the sentence
//! of `ikv_last_error()`. Handles free themselves on `Drop`. Config structs are the C structs
//! themselves: start from `*::default_config()` and change fields by name.
//!
//! ```no_run
//! let layout = intentkv::Layout::synth(&intentkv::Layout::synth_default_config()).unwrap();
//! let router = intentkv::Router::new(&intentkv::Router::default_config()).unwrap();
//! let plan = router.route(&layout, 32768).unwrap();
//! println!("{:?}", plan.summary().unwrap());
//! ```

pub mod ffi;

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_char, c_int};
use std::ptr;
use std::sync::Arc;

pub use ffi::{ikv_block_decision as Decision, ikv_decoder_config as DecoderConfig, ikv_decoder_stats as DecoderStats,
              ikv_model_shape as ModelShape, ikv_plan_cost as PlanCost, ikv_plan_page as PlanPage,
              ikv_plan_summary as PlanSummary, ikv_pool_config as PoolConfig, ikv_pool_stats as PoolStats,
              ikv_query_memory_config as QueryMemoryConfig, ikv_router_config as RouterConfig, ikv_synth_config as SynthConfig, ikv_tier_policy as TierPolicy,
              ikv_tier_step_report as TierStepReport, ikv_token_range as TokenRange, ikv_seq_id as SeqId,
              IKV_ALL_LAYERS, IKV_TIER_NO_PREFETCH};

/// A failed intentkv call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The `ikv_status` code (negative).
    pub status: i32,
    /// The sentence from `ikv_last_error()` (or from the binding's own argument check).
    pub message: String,
}

impl Error {
    /// The status name, e.g. "IKV_E_RANGE".
    pub fn status_name(&self) -> &'static str {
        status_name(self.status)
    }

    fn invalid(message: String) -> Error {
        Error { status: ffi::IKV_E_INVALID, message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status_name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn static_str(p: *const c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    // SAFETY: the library returns NUL-terminated strings in static storage for these calls.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("?")
}

fn char_array(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Name of a status code, e.g. "IKV_E_RANGE".
pub fn status_name(status: i32) -> &'static str {
    static_str(unsafe { ffi::ikv_status_name(status) })
}

/// Name of a format, e.g. "int8".
pub fn format_name(format: i32) -> &'static str {
    static_str(unsafe { ffi::ikv_format_name(format) })
}

fn check(status: ffi::ikv_status) -> Result<()> {
    if status == ffi::IKV_OK {
        return Ok(());
    }
    // SAFETY: ikv_last_error returns a thread-local NUL-terminated string valid until the next call.
    let message = unsafe { CStr::from_ptr(ffi::ikv_last_error()) }.to_string_lossy().into_owned();
    Err(Error { status, message })
}

/// `ikv_version()` of the linked library.
pub fn version() -> u32 {
    unsafe { ffi::ikv_version() }
}

/// `ikv_version_string()` of the linked library.
pub fn version_string() -> &'static str {
    static_str(unsafe { ffi::ikv_version_string() })
}

/// What `ikv_runtime_info_get` reports, with strings decoded.
#[derive(Clone, Debug)]
pub struct RuntimeInfo {
    pub version: u32,
    pub cuda_built: bool,
    pub cuda_device_count: i32,
    pub cuda_device_name: String,
    pub cpu_isa: String,
    pub cpu_isa_available: String,
    pub cuda_archs: String,
}

pub fn runtime_info() -> Result<RuntimeInfo> {
    // SAFETY: ikv_runtime_info is plain old data; all-zero is a valid value.
    let mut info: ffi::ikv_runtime_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<ffi::ikv_runtime_info>() as u32;
    check(unsafe { ffi::ikv_runtime_info_get(&mut info) })?;
    Ok(RuntimeInfo {
        version: info.version,
        cuda_built: info.cuda_built != 0,
        cuda_device_count: info.cuda_device_count,
        cuda_device_name: char_array(&info.cuda_device_name),
        cpu_isa: char_array(&info.cpu_isa),
        cpu_isa_available: char_array(&info.cpu_isa_available),
        cuda_archs: char_array(&info.cuda_archs),
    })
}

fn out_handle<T>(create: impl FnOnce(*mut *mut T) -> ffi::ikv_status) -> Result<*mut T> {
    let mut handle: *mut T = ptr::null_mut();
    check(create(&mut handle))?;
    Ok(handle)
}

// ------------------------------------------------------------------ layouts

/// A block as the caller describes it (`Block::new` has `ikv_block_desc_default()`'s defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub name: String,
    pub kind: ffi::ikv_block_kind,
    pub start: u32,
    pub end: u32,
    pub policy: ffi::ikv_policy,
    pub score: f32,
    pub precision_hint: ffi::ikv_format,
    pub turn: u32,
}

impl Block {
    /// Kind OTHER, policy ATTEND, score 0.5, hint AUTO, turn 0.
    pub fn new(name: &str, start: u32, end: u32) -> Block {
        Block { name: name.to_string(), kind: ffi::IKV_KIND_OTHER, start, end, policy: ffi::IKV_POLICY_ATTEND,
                score: 0.5, precision_hint: ffi::IKV_FMT_AUTO, turn: 0 }
    }

    /// Calls `f` with the C description; the name's CString lives for the call.
    fn with_desc<R>(&self, f: impl FnOnce(&ffi::ikv_block_desc) -> Result<R>) -> Result<R> {
        let name = CString::new(self.name.as_str())
            .map_err(|_| Error::invalid(format!("block name {:?} contains a NUL byte", self.name)))?;
        let mut desc = unsafe { ffi::ikv_block_desc_default() };
        desc.name = name.as_ptr();
        desc.kind = self.kind;
        desc.start = self.start;
        desc.end = self.end;
        desc.policy = self.policy;
        desc.score = self.score;
        desc.precision_hint = self.precision_hint;
        desc.turn = self.turn;
        f(&desc)
    }
}

/// A block as stored: its id plus its description.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockInfo {
    pub id: u32,
    pub block: Block,
}

impl From<&ffi::ikv_block_info> for BlockInfo {
    fn from(info: &ffi::ikv_block_info) -> BlockInfo {
        BlockInfo {
            id: info.id,
            block: Block { name: char_array(&info.name), kind: info.kind, start: info.start, end: info.end,
                           policy: info.policy, score: info.score, precision_hint: info.precision_hint,
                           turn: info.turn },
        }
    }
}

/// The semantic blocks of a context.
#[derive(Debug)]
pub struct Layout {
    raw: *mut ffi::ikv_layout,
}

// SAFETY: const calls may run concurrently and mutating calls take &mut self (header contract).
unsafe impl Send for Layout {}
unsafe impl Sync for Layout {}

impl Layout {
    pub fn new() -> Result<Layout> {
        out_handle(|out| unsafe { ffi::ikv_layout_create(out) }).map(|raw| Layout { raw })
    }

    pub fn synth_default_config() -> SynthConfig {
        unsafe { ffi::ikv_synth_default_config() }
    }

    /// A deterministic synthetic agentic layout tiling [0, config.seq_len).
    pub fn synth(config: &SynthConfig) -> Result<Layout> {
        out_handle(|out| unsafe { ffi::ikv_synth_layout(config, out) }).map(|raw| Layout { raw })
    }

    pub fn try_clone(&self) -> Result<Layout> {
        out_handle(|out| unsafe { ffi::ikv_layout_clone(self.raw, out) }).map(|raw| Layout { raw })
    }

    /// Add a block; returns its id.
    pub fn add(&mut self, block: &Block) -> Result<u32> {
        let mut id = 0u32;
        block.with_desc(|desc| check(unsafe { ffi::ikv_layout_add(self.raw, desc, &mut id) }))?;
        Ok(id)
    }

    pub fn update(&mut self, id: u32, block: &Block) -> Result<()> {
        block.with_desc(|desc| check(unsafe { ffi::ikv_layout_update(self.raw, id, desc) }))
    }

    pub fn set_score(&mut self, id: u32, score: f32) -> Result<()> {
        check(unsafe { ffi::ikv_layout_set_score(self.raw, id, score) })
    }

    pub fn remove(&mut self, id: u32) -> Result<()> {
        check(unsafe { ffi::ikv_layout_remove(self.raw, id) })
    }

    pub fn len(&self) -> usize {
        unsafe { ffi::ikv_layout_count(self.raw) }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The index-th block in ascending start order.
    pub fn at(&self, index: usize) -> Result<BlockInfo> {
        let mut info = std::mem::MaybeUninit::<ffi::ikv_block_info>::zeroed();
        check(unsafe { ffi::ikv_layout_at(self.raw, index, info.as_mut_ptr()) })?;
        Ok(BlockInfo::from(unsafe { &info.assume_init() }))
    }

    pub fn get(&self, id: u32) -> Result<BlockInfo> {
        let mut info = std::mem::MaybeUninit::<ffi::ikv_block_info>::zeroed();
        check(unsafe { ffi::ikv_layout_get(self.raw, id, info.as_mut_ptr()) })?;
        Ok(BlockInfo::from(unsafe { &info.assume_init() }))
    }

    /// All blocks in ascending start order.
    pub fn blocks(&self) -> Result<Vec<BlockInfo>> {
        (0..self.len()).map(|i| self.at(i)).collect()
    }

    /// Id of the block covering `token`.
    pub fn find_token(&self, token: u32) -> Result<u32> {
        let mut id = 0u32;
        check(unsafe { ffi::ikv_layout_find_token(self.raw, token, &mut id) })?;
        Ok(id)
    }

    pub fn validate(&self, seq_len: u32) -> Result<()> {
        check(unsafe { ffi::ikv_layout_validate(self.raw, seq_len) })
    }

    pub fn as_ptr(&self) -> *const ffi::ikv_layout {
        self.raw
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        unsafe { ffi::ikv_layout_destroy(self.raw) }
    }
}

// ------------------------------------------------------------------ routers and plans

/// Turns a layout into plans.
#[derive(Debug)]
pub struct Router {
    raw: *mut ffi::ikv_router,
}

// SAFETY: route is documented to run from several threads at once; set_pressure takes &mut self.
unsafe impl Send for Router {}
unsafe impl Sync for Router {}

impl Router {
    pub fn default_config() -> RouterConfig {
        unsafe { ffi::ikv_router_default_config() }
    }

    pub fn new(config: &RouterConfig) -> Result<Router> {
        out_handle(|out| unsafe { ffi::ikv_router_create(config, out) }).map(|raw| Router { raw })
    }

    pub fn config(&self) -> Result<RouterConfig> {
        let mut out = Router::default_config();
        out.struct_size = std::mem::size_of::<RouterConfig>() as u32;
        check(unsafe { ffi::ikv_router_get_config(self.raw, &mut out) })?;
        Ok(out)
    }

    pub fn set_pressure(&mut self, memory_pressure: f32) -> Result<()> {
        check(unsafe { ffi::ikv_router_set_pressure(self.raw, memory_pressure) })
    }

    pub fn route(&self, layout: &Layout, seq_len: u32) -> Result<Plan> {
        out_handle(|out| unsafe { ffi::ikv_router_route(self.raw, layout.raw, seq_len, out) }).map(|raw| Plan { raw })
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        unsafe { ffi::ikv_router_destroy(self.raw) }
    }
}

/// An immutable routing result (holds copies; independent of the layout it came from).
#[derive(Debug)]
pub struct Plan {
    raw: *mut ffi::ikv_plan,
}

// SAFETY: plans are immutable after creation; any number of threads may read one.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

fn plan_slice<'a, T>(call: impl FnOnce(*mut *const T, *mut usize) -> ffi::ikv_status) -> Result<&'a [T]> {
    let mut data: *const T = ptr::null();
    let mut count = 0usize;
    check(call(&mut data, &mut count))?;
    if count == 0 || data.is_null() {
        return Ok(&[]);
    }
    // SAFETY: the arrays live inside the plan, which the caller borrows for 'a.
    Ok(unsafe { std::slice::from_raw_parts(data, count) })
}

impl Plan {
    /// A plan reading exactly `ranges` of a seq_len-token sequence.
    pub fn from_ranges(ranges: &[TokenRange], seq_len: u32, page_size: u32, format: ffi::ikv_format) -> Result<Plan> {
        out_handle(|out| unsafe {
            ffi::ikv_plan_from_ranges(ranges.as_ptr(), ranges.len(), seq_len, page_size, format, out)
        })
        .map(|raw| Plan { raw })
    }

    pub fn summary(&self) -> Result<PlanSummary> {
        let mut out = PlanSummary::default();
        check(unsafe { ffi::ikv_plan_get_summary(self.raw, &mut out) })?;
        Ok(out)
    }

    pub fn pages(&self) -> Result<&[PlanPage]> {
        plan_slice(|d, c| unsafe { ffi::ikv_plan_pages(self.raw, d, c) })
    }

    pub fn skipped_pages(&self) -> Result<&[u32]> {
        plan_slice(|d, c| unsafe { ffi::ikv_plan_skipped_pages(self.raw, d, c) })
    }

    pub fn prefetch(&self) -> Result<&[u32]> {
        plan_slice(|d, c| unsafe { ffi::ikv_plan_prefetch(self.raw, d, c) })
    }

    pub fn decisions(&self) -> Result<&[Decision]> {
        plan_slice(|d, c| unsafe { ffi::ikv_plan_decisions(self.raw, d, c) })
    }

    pub fn page_format(&self, page: u32) -> Result<ffi::ikv_format> {
        let mut out: ffi::ikv_format = 0;
        check(unsafe { ffi::ikv_plan_page_format(self.raw, page, &mut out) })?;
        Ok(out)
    }

    pub fn default_shape() -> ModelShape {
        unsafe { ffi::ikv_model_shape_default() }
    }

    pub fn cost(&self, shape: &ModelShape) -> Result<PlanCost> {
        let mut out = PlanCost::default();
        check(unsafe { ffi::ikv_plan_get_cost(self.raw, shape, &mut out) })?;
        Ok(out)
    }

    pub fn as_ptr(&self) -> *const ffi::ikv_plan {
        self.raw
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        unsafe { ffi::ikv_plan_destroy(self.raw) }
    }
}

// ------------------------------------------------------------------ pools

/// Where a page of a pool is ([`Pool::page_tier`]): device memory, or the pinned host tier of a CUDA
/// pool created with `host_capacity_bytes > 0`. CPU pools keep every page in `Device` (their memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    Device,
    Host,
}

/// The C pool, destroyed when its last owner goes: the [`Pool`] and every [`QueryMemory`] and
/// [`PageFeedback`] made for it (the header: the pool must outlive them).
#[derive(Debug)]
struct PoolHandle(*mut ffi::ikv_pool);

// SAFETY: only destroyed, once, by the last Arc; calls go through Pool, QueryMemory and PageFeedback.
unsafe impl Send for PoolHandle {}
unsafe impl Sync for PoolHandle {}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        unsafe { ffi::ikv_pool_destroy(self.0) }
    }
}

/// Paged KV storage. The safe `append` takes `f32` slices, so `Pool::default_config()` sets kv_dtype F32.
#[derive(Debug)]
pub struct Pool {
    raw: *mut ffi::ikv_pool,
    handle: Arc<PoolHandle>,
    config: PoolConfig,
}

// SAFETY: calls on different sequences may run concurrently; mutating calls take &mut self here.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Pool {
    /// `ikv_pool_default_config()` with kv_dtype = F32.
    pub fn default_config() -> PoolConfig {
        let mut config = unsafe { ffi::ikv_pool_default_config() };
        config.kv_dtype = ffi::IKV_DTYPE_F32;
        config
    }

    pub fn new(config: &PoolConfig) -> Result<Pool> {
        let raw = out_handle(|out| unsafe { ffi::ikv_pool_create(config, out) })?;
        let mut pool = Pool { raw, handle: Arc::new(PoolHandle(raw)), config: *config };
        pool.config.struct_size = std::mem::size_of::<PoolConfig>() as u32;
        check(unsafe { ffi::ikv_pool_get_config(raw, &mut pool.config) })?;
        Ok(pool)
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    pub fn stats(&self) -> Result<PoolStats> {
        let mut out = PoolStats { struct_size: std::mem::size_of::<PoolStats>() as u32, ..Default::default() };
        check(unsafe { ffi::ikv_pool_get_stats(self.raw, &mut out) })?;
        Ok(out)
    }

    pub fn page_bytes(&self, format: ffi::ikv_format) -> u64 {
        unsafe { ffi::ikv_pool_page_bytes(self.raw, format) }
    }

    pub fn seq_create(&mut self) -> Result<SeqId> {
        let mut id = 0;
        check(unsafe { ffi::ikv_seq_create(self.raw, &mut id) })?;
        Ok(id)
    }

    pub fn seq_destroy(&mut self, seq: SeqId) -> Result<()> {
        check(unsafe { ffi::ikv_seq_destroy(self.raw, seq) })
    }

    pub fn seq_length(&self, seq: SeqId) -> Result<u32> {
        let mut n = 0;
        check(unsafe { ffi::ikv_seq_length(self.raw, seq, &mut n) })?;
        Ok(n)
    }

    /// The `ikv_append` for f32 K/V laid out `[layer][seq][token][kv_head][head_dim]` (`layer` None: every
    /// layer) over `n_seqs` sequences, and the tokens per sequence; `what` names the call in errors.
    fn kv_args(&self, k: &[f32], v: &[f32], n_seqs: usize, layer: Option<u32>, plan: Option<&Plan>, what: &str)
               -> Result<(ffi::ikv_append, u32)> {
        if self.config.kv_dtype != ffi::IKV_DTYPE_F32 {
            return Err(Error::invalid(format!("{what} takes f32 slices; this pool's kv_dtype is not F32")));
        }
        let layers = if layer.is_none() { self.config.n_layers } else { 1 } as usize;
        let row = (self.config.n_kv_heads * self.config.head_dim) as usize;
        let per_token = layers * n_seqs * row;
        if n_seqs == 0 || k.is_empty() || k.len() % per_token != 0 || v.len() != k.len() {
            return Err(Error::invalid(format!(
                "k has {} and v {} elements; both must be the same positive multiple of {}",
                k.len(), v.len(), per_token)));
        }
        let n_tokens = (k.len() / per_token) as u32;
        let mut args = unsafe { ffi::ikv_append_default(self.raw, n_tokens) };
        args.layer = layer.unwrap_or(IKV_ALL_LAYERS);
        args.k = k.as_ptr().cast();
        args.v = v.as_ptr().cast();
        args.seq_stride = (n_tokens as usize * row) as i64;
        args.layer_stride = (n_seqs * n_tokens as usize * row) as i64;
        args.formats = plan.map_or(ptr::null(), |p| p.raw);
        Ok((args, n_tokens))
    }

    /// Append contiguous f32 K and V: `[layer][token][kv_head][head_dim]` when `layer` is None (every
    /// layer), else `[token][kv_head][head_dim]`. New pages take `plan`'s formats when given.
    /// Returns the number of tokens appended.
    pub fn append(&mut self, seq: SeqId, k: &[f32], v: &[f32], layer: Option<u32>, plan: Option<&Plan>)
                  -> Result<u32> {
        let (args, n_tokens) = self.kv_args(k, v, 1, layer, plan, "Pool::append")?;
        check(unsafe { ffi::ikv_pool_append(self.raw, seq, &args) })?;
        Ok(n_tokens)
    }

    /// Append the same number of f32 tokens to each of `seqs` in one atomic call: K and V are
    /// `[layer][seq][token][kv_head][head_dim]` when `layer` is None, else `[seq][token][kv_head][head_dim]`.
    /// Returns the number of tokens appended to each sequence.
    pub fn append_batch(&mut self, seqs: &[SeqId], k: &[f32], v: &[f32], layer: Option<u32>,
                        plan: Option<&Plan>) -> Result<u32> {
        let n_seqs = u32::try_from(seqs.len()).map_err(|_| Error::invalid("more than 2^32-1 sequences".into()))?;
        let (args, n_tokens) = self.kv_args(k, v, seqs.len(), layer, plan, "Pool::append_batch")?;
        check(unsafe { ffi::ikv_pool_append_batch(self.raw, seqs.as_ptr(), n_seqs, &args) })?;
        Ok(n_tokens)
    }

    /// Wait for the pool's asynchronous appends; an error names a non-finite value one of them stored as 0
    /// (or an append past a reserved room). Takes the lengths graph replays reached (`reserve`).
    pub fn sync(&mut self) -> Result<()> {
        check(unsafe { ffi::ikv_pool_sync(self.raw) })
    }

    /// Room for the next `n_tokens` tokens of every layer of each of `seqs`, allocated now
    /// (ikv_pool_reserve); 0 ends it. On a CUDA pool the device then keeps their lengths, so their
    /// appends and decodes can be captured in one CUDA graph and replayed.
    pub fn reserve(&mut self, seqs: &[SeqId], n_tokens: u32) -> Result<()> {
        let n_seqs = u32::try_from(seqs.len()).map_err(|_| Error::invalid("more than 2^32-1 sequences".into()))?;
        check(unsafe { ffi::ikv_pool_reserve(self.raw, seqs.as_ptr(), n_seqs, n_tokens) })
    }

    pub fn fork(&mut self, parent: SeqId) -> Result<SeqId> {
        let mut child = 0;
        check(unsafe { ffi::ikv_seq_fork(self.raw, parent, &mut child) })?;
        Ok(child)
    }

    pub fn truncate(&mut self, seq: SeqId, n_tokens: u32) -> Result<()> {
        check(unsafe { ffi::ikv_seq_truncate(self.raw, seq, n_tokens) })
    }

    pub fn evict(&mut self, seq: SeqId, begin: u32, end: u32) -> Result<()> {
        check(unsafe { ffi::ikv_seq_evict(self.raw, seq, begin, end) })
    }

    pub fn is_evicted(&self, seq: SeqId, token: u32) -> Result<bool> {
        let mut out: c_int = 0;
        check(unsafe { ffi::ikv_seq_is_evicted(self.raw, seq, token, &mut out) })?;
        Ok(out != 0)
    }

    pub fn page_format(&self, seq: SeqId, page: u32) -> Result<ffi::ikv_format> {
        let mut out = 0;
        check(unsafe { ffi::ikv_seq_page_format(self.raw, seq, page, &mut out) })?;
        Ok(out)
    }

    pub fn set_page_format(&mut self, seq: SeqId, page: u32, format: ffi::ikv_format) -> Result<()> {
        check(unsafe { ffi::ikv_seq_set_page_format(self.raw, seq, page, format) })
    }

    pub fn apply_plan_formats(&mut self, seq: SeqId, plan: &Plan) -> Result<()> {
        check(unsafe { ffi::ikv_seq_apply_plan_formats(self.raw, seq, plan.raw) })
    }

    /// Tokens [begin, end) of a layer, dequantized to f32: (k, v) laid out `[token][kv_head][head_dim]`.
    pub fn seq_read(&self, seq: SeqId, layer: u32, begin: u32, end: u32) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = end.saturating_sub(begin) as usize * (self.config.n_kv_heads * self.config.head_dim) as usize;
        let (mut k, mut v) = (vec![0f32; n], vec![0f32; n]);
        check(unsafe { ffi::ikv_seq_read(self.raw, seq, layer, begin, end, k.as_mut_ptr(), v.as_mut_ptr()) })?;
        Ok((k, v))
    }

    /// Move the pages of `seq` overlapping tokens `[begin, end)` from device memory to the pool's host
    /// tier (`ikv_seq_offload`; a CUDA pool created with `host_capacity_bytes > 0`). Only whole pages this
    /// sequence alone holds move; shared, partial tail, evicted and already offloaded pages stay. The
    /// copies are enqueued on the default CUDA stream (other streams: `ffi::ikv_seq_offload`).
    /// Atomic: `IKV_E_NOMEM` when the host tier lacks room for all of them; a CPU pool is refused with
    /// `IKV_E_UNSUPPORTED`. Returns the number of pages moved.
    pub fn offload(&mut self, seq: SeqId, begin: u32, end: u32) -> Result<u32> {
        let mut moved = 0;
        check(unsafe { ffi::ikv_seq_offload(self.raw, seq, begin, end, ptr::null_mut(), &mut moved) })?;
        Ok(moved)
    }

    /// Bring the host-tier pages of `seq` overlapping `[begin, end)` back to device memory
    /// (`ikv_seq_fetch`), as [`Pool::offload`] in the other direction (`IKV_E_NOMEM` when
    /// `capacity_bytes` lacks room for all of them). Returns the number of pages moved.
    pub fn fetch(&mut self, seq: SeqId, begin: u32, end: u32) -> Result<u32> {
        let mut moved = 0;
        check(unsafe { ffi::ikv_seq_fetch(self.raw, seq, begin, end, ptr::null_mut(), &mut moved) })?;
        Ok(moved)
    }

    /// The tier page `page` of `seq` is in (`ikv_seq_page_tier`).
    pub fn page_tier(&self, seq: SeqId, page: u32) -> Result<Tier> {
        let mut on_host: c_int = 0;
        check(unsafe { ffi::ikv_seq_page_tier(self.raw, seq, page, &mut on_host) })?;
        Ok(if on_host != 0 { Tier::Host } else { Tier::Device })
    }

    /// The default tier policy (`ikv_tier_policy` zeroed with struct_size set: every field takes its
    /// default); set fields by name and pass it to [`Pool::set_tier_policy`].
    pub fn default_tier_policy() -> TierPolicy {
        TierPolicy { struct_size: std::mem::size_of::<TierPolicy>() as u32, ..Default::default() }
    }

    /// Turn the automatic tier policy on (`Some`) or off (`None`) (`ikv_pool_set_tier_policy`; a CUDA pool
    /// created with `host_capacity_bytes > 0`). Changes no page; the next [`Pool::tier_step`] acts.
    /// Errors: `IKV_E_INVALID` (struct_size, or a field out of range: named; checked first),
    /// `IKV_E_UNSUPPORTED` (a CPU pool, or a CUDA pool without a host tier).
    pub fn set_tier_policy(&mut self, policy: Option<&TierPolicy>) -> Result<()> {
        check(unsafe { ffi::ikv_pool_set_tier_policy(self.raw, policy.map_or(ptr::null(), |p| p as *const _)) })
    }

    /// One step of the automatic tier policy (`ikv_pool_tier_step`): call it once per engine step, before
    /// the step's decodes, with the sequences the step decodes (empty: a step that only relieves
    /// pressure) and one plan (or None = the whole sequence) per sequence; an empty `plans` means no
    /// plans. Marks the pages the step reads as used, offloads idle pages under pressure and fetches the
    /// step's pages from the host tier, on the default CUDA stream (other streams:
    /// `ffi::ikv_pool_tier_step`). Errors: `IKV_E_UNSUPPORTED` (a CPU pool or no host tier),
    /// `IKV_E_STATE` (no policy set), `IKV_E_NOT_FOUND`, `IKV_E_INVALID`, `IKV_E_DEVICE`, `IKV_E_NOMEM`.
    pub fn tier_step(&mut self, seqs: &[SeqId], plans: &[Option<&Plan>]) -> Result<TierStepReport> {
        let n_seqs = u32::try_from(seqs.len()).map_err(|_| Error::invalid("more than 2^32-1 sequences".into()))?;
        if !plans.is_empty() && plans.len() != seqs.len() {
            return Err(Error::invalid(format!("{} plans for {} sequences", plans.len(), seqs.len())));
        }
        let raw_plans: Vec<*const ffi::ikv_plan> = plans.iter().map(|p| p.map_or(ptr::null(), |p| p.raw)).collect();
        let mut report =
            TierStepReport { struct_size: std::mem::size_of::<TierStepReport>() as u32, ..Default::default() };
        check(unsafe {
            ffi::ikv_pool_tier_step(self.raw, if seqs.is_empty() { ptr::null() } else { seqs.as_ptr() },
                                    if raw_plans.is_empty() { ptr::null() } else { raw_plans.as_ptr() }, n_seqs,
                                    ptr::null_mut(), &mut report)
        })?;
        Ok(report)
    }

    pub fn as_ptr(&self) -> *const ffi::ikv_pool {
        self.raw
    }
}

// ------------------------------------------------------------------ decode

/// One decode step's request (f32 queries and outputs on CPU pools).
#[derive(Clone, Copy, Debug)]
pub struct DecodeRequest<'a> {
    pub layer: u32,
    pub seqs: &'a [SeqId],
    /// One plan (or None = dense) per sequence; an empty slice means all dense.
    pub plans: &'a [Option<&'a Plan>],
    pub n_query_tokens: u32,
    pub n_q_heads: u32,
    /// `[seq][query_token][q_head][head_dim]`
    pub q: &'a [f32],
    /// 0 = 1/sqrt(head_dim)
    pub scale: f32,
    pub softcap: f32,
    pub topk_token_budget: u32,
    /// Adaptive budget (`IKV_TOPK_MASS`): `Some(share)` covers that estimated attention-mass share,
    /// with `topk_token_budget` as the upper limit (0 = none) and `topk_min_tokens` the lower.
    pub topk_mass: Option<f32>,
    pub topk_min_tokens: u32,
    /// What pages are ranked by: `ffi::IKV_TOPK_SCORE_QUEST` (default), `ffi::IKV_TOPK_SCORE_HYBRID` or `ffi::IKV_TOPK_SCORE_KEYS`.
    pub topk_score: ffi::ikv_topk_score,
    /// What earlier turns asked (a memory of the same pool), scored beside the queries.
    pub query_memory: Option<&'a QueryMemory>,
    /// Receives the attention share of every page read (the decode writes into it).
    pub feedback: Option<&'a PageFeedback>,
    /// With `feedback`: the averages as a prior of the ranking, in [0, 1] (0 = off).
    pub topk_feedback_weight: f32,
}

impl<'a> DecodeRequest<'a> {
    pub fn new(seqs: &'a [SeqId], q: &'a [f32], n_q_heads: u32) -> DecodeRequest<'a> {
        DecodeRequest { layer: 0, seqs, plans: &[], n_query_tokens: 1, n_q_heads, q, scale: 0.0, softcap: 0.0,
                        topk_token_budget: 0, topk_mass: None, topk_min_tokens: 0,
                        topk_score: ffi::IKV_TOPK_SCORE_QUEST, query_memory: None, feedback: None,
                        topk_feedback_weight: 0.0 }
    }
}

/// Runs decode steps; owns worker threads and scratch. One caller thread at a time (`&mut self`).
#[derive(Debug)]
pub struct Decoder {
    raw: *mut ffi::ikv_decoder,
}

// SAFETY: a decoder may move between threads; decode takes &mut self so it is never shared.
unsafe impl Send for Decoder {}

impl Decoder {
    /// n_threads: CPU workers including the caller; 0 = hardware threads.
    pub fn new(n_threads: u32) -> Result<Decoder> {
        let mut config = unsafe { ffi::ikv_decoder_default_config() };
        config.n_threads = n_threads;
        out_handle(|out| unsafe { ffi::ikv_decoder_create(&config, out) }).map(|raw| Decoder { raw })
    }

    /// Decode into `out` (`[seq][query_token][q_head][head_dim]`), optionally `lse` (same without head_dim).
    pub fn decode_into(&mut self, pool: &Pool, req: &DecodeRequest, out: &mut [f32], lse: Option<&mut [f32]>)
                       -> Result<()> {
        let rows = req.seqs.len() * req.n_query_tokens as usize * req.n_q_heads as usize;
        let width = rows * pool.config.head_dim as usize;
        if req.q.len() != width || out.len() != width {
            return Err(Error::invalid(format!("q has {} and out {} elements; this request needs {}",
                                              req.q.len(), out.len(), width)));
        }
        if !req.plans.is_empty() && req.plans.len() != req.seqs.len() {
            return Err(Error::invalid(format!("{} plans for {} sequences", req.plans.len(), req.seqs.len())));
        }
        let lse_ptr = match lse {
            Some(l) if l.len() != rows => {
                return Err(Error::invalid(format!("lse has {} elements; this request needs {}", l.len(), rows)))
            }
            Some(l) => l.as_mut_ptr(),
            None => ptr::null_mut(),
        };
        let plans: Vec<*const ffi::ikv_plan> = req.plans.iter().map(|p| p.map_or(ptr::null(), |p| p.raw)).collect();
        let mut args = unsafe { ffi::ikv_decode_args_default() };
        args.layer = req.layer;
        args.n_seqs = req.seqs.len() as u32;
        args.seqs = req.seqs.as_ptr();
        args.plans = if plans.is_empty() { ptr::null() } else { plans.as_ptr() };
        args.n_query_tokens = req.n_query_tokens;
        args.n_q_heads = req.n_q_heads;
        args.q = req.q.as_ptr().cast();
        args.q_dtype = ffi::IKV_DTYPE_F32;
        args.out = out.as_mut_ptr().cast();
        args.out_dtype = ffi::IKV_DTYPE_F32;
        args.lse = lse_ptr;
        args.scale = req.scale;
        args.softcap = req.softcap;
        args.topk_token_budget = req.topk_token_budget;
        args.topk_score = req.topk_score;
        args.query_memory = req.query_memory.map_or(ptr::null(), |m| m.raw as *const _);
        args.feedback = req.feedback.map_or(ptr::null_mut(), |f| f.raw);
        args.topk_feedback_weight = req.topk_feedback_weight;
        if let Some(share) = req.topk_mass {
            args.topk_mode = ffi::IKV_TOPK_MASS;
            args.topk_mass = share;
            args.topk_min_tokens = req.topk_min_tokens;
        }
        // The pool is only read by decode (several decoders may decode one pool concurrently).
        check(unsafe { ffi::ikv_decode(self.raw, pool.raw, &args) })
    }

    /// Decode and return the output as a new Vec.
    pub fn decode(&mut self, pool: &Pool, req: &DecodeRequest) -> Result<Vec<f32>> {
        let mut out = vec![0f32; req.q.len()];
        self.decode_into(pool, req, &mut out, None)?;
        Ok(out)
    }

    pub fn last_bytes_read(&self) -> Result<u64> {
        let mut out = 0;
        check(unsafe { ffi::ikv_decoder_last_bytes_read(self.raw, &mut out) })?;
        Ok(out)
    }

    /// The token ranges the last successful decode read for `seq_index` (into its `seqs`) and
    /// `kv_head`: maximal runs, ascending (plan, eviction and query-aware selection applied).
    pub fn last_selection(&self, seq_index: u32, kv_head: u32) -> Result<Vec<ffi::ikv_token_range>> {
        let mut n = 0usize;
        check(unsafe { ffi::ikv_decoder_last_selection(self.raw, seq_index, kv_head, std::ptr::null_mut(), 0, &mut n) })?;
        let mut runs = vec![ffi::ikv_token_range { begin: 0, end: 0 }; n];
        check(unsafe {
            ffi::ikv_decoder_last_selection(self.raw, seq_index, kv_head, runs.as_mut_ptr(), runs.len(), &mut n)
        })?;
        runs.truncate(n);
        Ok(runs)
    }

    /// Counters since creation: steps, page lists built and reused (kept from the previous call:
    /// same pool, sequences, lengths and plans), the last step's bytes read.
    pub fn stats(&self) -> Result<DecoderStats> {
        let mut out = DecoderStats { struct_size: std::mem::size_of::<DecoderStats>() as u32, ..Default::default() };
        check(unsafe { ffi::ikv_decoder_get_stats(self.raw, &mut out) })?;
        Ok(out)
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        unsafe { ffi::ikv_decoder_destroy(self.raw) }
    }
}

// ------------------------------------------------------------------ what earlier steps teach

/// What earlier turns of each sequence asked (`ikv_query_memory`). It keeps its pool's C object
/// alive (shared ownership): the [`Pool`] may be dropped first, and appends to the pool go on while
/// the memory lives.
#[derive(Debug)]
pub struct QueryMemory {
    raw: *mut ffi::ikv_query_memory,
    row: usize,
    _pool: Arc<PoolHandle>,  // dropped after the memory is destroyed (fields drop after Drop::drop)
}

impl QueryMemory {
    /// `ikv_query_memory_default_config()`: n_q_heads 0 (must be set), decay 0.5, turns 4.
    pub fn default_config() -> QueryMemoryConfig {
        unsafe { ffi::ikv_query_memory_default_config() }
    }

    /// A memory with the default config's other fields (turns 4); see [`QueryMemory::with_config`].
    pub fn new(pool: &Pool, n_q_heads: u32, decay: f32) -> Result<QueryMemory> {
        QueryMemory::with_config(pool, &QueryMemoryConfig { n_q_heads, decay, ..QueryMemory::default_config() })
    }

    /// A memory for the sequences of `pool` (`ikv_query_memory_create`). `config.turns` (1..64) ended turns
    /// are kept apart and a decode recalls, per query head, the one most similar (cosine) to its current
    /// query; 0 keeps one mean of the turns weighted decay^age (the first version's memory). Errors:
    /// `IKV_E_INVALID` naming `n_q_heads` (not a positive multiple of the pool's n_kv_heads), `decay`
    /// (outside (0, 1)) or `turns` (above 64).
    pub fn with_config(pool: &Pool, config: &QueryMemoryConfig) -> Result<QueryMemory> {
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::ikv_query_memory_create(pool.raw, config, &mut raw) })?;
        Ok(QueryMemory { raw, row: config.n_q_heads as usize * pool.config.head_dim as usize,
                         _pool: Arc::clone(&pool.handle) })
    }

    /// Adds query tokens `[n_tokens][n_q_heads][head_dim]` of `seq` at `layer` to the current turn.
    pub fn remember(&mut self, seq: SeqId, layer: u32, q: &[f32]) -> Result<()> {
        if q.is_empty() || q.len() % self.row != 0 {
            return Err(Error { status: ffi::IKV_E_INVALID,
                               message: format!("q has {} floats, not a positive multiple of n_q_heads*head_dim = {}",
                                                q.len(), self.row) });
        }
        let n = (q.len() / self.row) as u32;
        check(unsafe { ffi::ikv_query_memory_remember(self.raw, seq, layer, q.as_ptr().cast(), ffi::IKV_DTYPE_F32, n) })
    }

    pub fn end_turn(&mut self, seq: SeqId) -> Result<()> { check(unsafe { ffi::ikv_query_memory_end_turn(self.raw, seq) }) }
    pub fn forget(&mut self, seq: SeqId) -> Result<()> { check(unsafe { ffi::ikv_query_memory_forget(self.raw, seq) }) }
    pub fn reset(&mut self) -> Result<()> { check(unsafe { ffi::ikv_query_memory_reset(self.raw) }) }
}

impl Drop for QueryMemory {
    fn drop(&mut self) {
        unsafe { ffi::ikv_query_memory_destroy(self.raw) }
    }
}

/// The attention mass each read page received, averaged per page (`ikv_page_feedback`).
/// Decodes that are given it write into it: use it from one thread at a time.
/// Like [`QueryMemory`] it keeps its pool's C object alive.
#[derive(Debug)]
pub struct PageFeedback {
    raw: *mut ffi::ikv_page_feedback,
    _pool: Arc<PoolHandle>,  // dropped after the feedback is destroyed
}

impl PageFeedback {
    pub fn new(pool: &Pool, rate: f32) -> Result<PageFeedback> {
        let mut config = unsafe { ffi::ikv_page_feedback_default_config() };
        config.rate = rate;
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::ikv_page_feedback_create(pool.raw, &config, &mut raw) })?;
        Ok(PageFeedback { raw, _pool: Arc::clone(&pool.handle) })
    }

    /// The averages of `seq` at `layer` and `kv_head`, one per page fed back so far.
    pub fn get(&self, seq: SeqId, layer: u32, kv_head: u32) -> Result<Vec<f32>> {
        let mut n = 0u32;
        check(unsafe { ffi::ikv_page_feedback_get(self.raw, seq, layer, kv_head, ptr::null_mut(), 0, &mut n) })?;
        let mut out = vec![0f32; n as usize];
        check(unsafe { ffi::ikv_page_feedback_get(self.raw, seq, layer, kv_head, out.as_mut_ptr(), n, &mut n) })?;
        Ok(out)
    }

    pub fn forget(&mut self, seq: SeqId) -> Result<()> { check(unsafe { ffi::ikv_page_feedback_forget(self.raw, seq) }) }
    pub fn reset(&mut self) -> Result<()> { check(unsafe { ffi::ikv_page_feedback_reset(self.raw) }) }
}

impl Drop for PageFeedback {
    fn drop(&mut self) {
        unsafe { ffi::ikv_page_feedback_destroy(self.raw) }
    }
}
