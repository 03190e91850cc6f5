package intentkv

/*
#include <stdlib.h>
#include <intentkv.h>
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"
)

// PoolConfig is ikv_pool_config. Go's zero values of the fields added after
// the first five (DefaultFormat F16, KVDType F32, Backend CPU, Device 0)
// are the binding's defaults; DefaultPoolConfig gives the library's other
// defaults.
type PoolConfig struct {
	Layers, KVHeads, HeadDim, PageSize uint32
	CapacityBytes                      uint64
	DefaultFormat                      Format  // format of new pages when no plan says otherwise
	KVDType                            DType   // element type of appended K/V: F32 ([]float32) or F16/BF16 ([]uint16 bits)
	Backend                            Backend // CPU, or CUDA (host input only; see the package comment)
	Device                             int     // CUDA device ordinal
	// HostCapacityBytes (CUDA pools) is the pinned host memory of a host
	// tier of pages (Offload, Fetch); 0 = no host tier. CPU pools: must be 0.
	HostCapacityBytes uint64
}

// DefaultPoolConfig is ikv_pool_default_config's values except KVDType,
// which is F32 here (the library's default is F16).
func DefaultPoolConfig() PoolConfig {
	c := C.ikv_pool_default_config_v2()
	cfg := poolConfigFromC(&c)
	cfg.KVDType = DTypeF32
	return cfg
}

func poolConfigFromC(c *C.ikv_pool_config) PoolConfig {
	return PoolConfig{
		Layers: uint32(c.n_layers), KVHeads: uint32(c.n_kv_heads), HeadDim: uint32(c.head_dim), PageSize: uint32(c.page_size),
		CapacityBytes: uint64(c.capacity_bytes), DefaultFormat: Format(c.default_format), KVDType: DType(c.kv_dtype),
		Backend: Backend(c.backend), Device: int(c.device), HostCapacityBytes: uint64(c.host_capacity_bytes),
	}
}

// AllLayers as a layer appends the same tokens to every layer at once (IKV_ALL_LAYERS).
const AllLayers = math.MaxUint32

// AppendAsync is the IKV_APPEND_ASYNC flag (AppendArgs.Flags). It matters
// only for device input, which this binding does not pass: a CPU pool
// appends synchronously with it as without it, and a CUDA pool refuses it
// with host input.
const AppendAsync = C.IKV_APPEND_ASYNC

// AppendArgs is one ikv_pool_append or ikv_pool_append_batch call.
//
// Element (t, h, d) of layer l of the i-th sequence is at
// K[l*LayerStride + i*SeqStride + t*TokenStride + h*HeadStride + d]
// (LayerStride only with AllLayers, SeqStride only for a batch). A zero
// stride is the dense one: TokenStride KVHeads*HeadDim, HeadStride HeadDim,
// SeqStride Tokens*KVHeads*HeadDim, LayerStride nSeqs*SeqStride, so that
// dense K is [layer][seq][token][kv_head][head_dim]. The binding checks
// that K and V hold every element the strides reach before calling.
type AppendArgs struct {
	Layer    uint32    // a layer, or AllLayers
	K, V     []float32 // for a pool whose KVDType is F32
	K16, V16 []uint16  // for a pool whose KVDType is F16 or BF16: raw bits in that dtype
	// Tokens per sequence; 0: from len(K) (all strides must then be 0).
	Tokens                                          uint32
	TokenStride, HeadStride, LayerStride, SeqStride int64
	Formats                                         *Plan  // optional: new pages take the plan's page format
	Flags                                           uint32 // AppendAsync or 0
}

// Pool is an ikv_pool: paged KV storage. Calls on different sequences may
// run concurrently; calls that change one sequence need the caller's
// ordering against every other call on it.
type Pool struct {
	raw *C.ikv_pool
	cfg PoolConfig // as created (read back from the library)
}

// NewPool creates a pool (ikv_pool_create).
func NewPool(cfg PoolConfig) (*Pool, error) {
	c := C.ikv_pool_default_config_v2()
	c.n_layers, c.n_kv_heads, c.head_dim, c.page_size = C.uint32_t(cfg.Layers), C.uint32_t(cfg.KVHeads), C.uint32_t(cfg.HeadDim), C.uint32_t(cfg.PageSize)
	c.capacity_bytes = C.uint64_t(cfg.CapacityBytes)
	c.default_format = C.ikv_format(cfg.DefaultFormat)
	c.kv_dtype = C.ikv_dtype(cfg.KVDType)
	c.backend = C.ikv_backend(cfg.Backend)
	c.device = C.int(cfg.Device)
	c.host_capacity_bytes = C.uint64_t(cfg.HostCapacityBytes)
	p := &Pool{}
	if err := call(func() C.ikv_status { return C.ikv_pool_create(&c, &p.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(p, (*Pool).Close)
	got, err := p.Config()
	if err != nil {
		p.Close()
		return nil, err
	}
	p.cfg = got
	return p, nil
}

// Config is a copy of the pool's config (ikv_pool_get_config).
func (p *Pool) Config() (PoolConfig, error) {
	defer runtime.KeepAlive(p)
	var c C.ikv_pool_config
	c.struct_size = C.uint32_t(C.sizeof_ikv_pool_config)
	if err := call(func() C.ikv_status { return C.ikv_pool_get_config(p.raw, &c) }); err != nil {
		return PoolConfig{}, err
	}
	return poolConfigFromC(&c), nil
}

// PoolStats is ikv_pool_stats.
type PoolStats struct {
	CapacityBytes, UsedBytes, PagesUsed uint64
	PagesByFormat, BytesByFormat        [FormatCount]uint64
	ReservedBytes                       uint64 // slab memory held, >= UsedBytes
	StagingBytes                        uint64 // fp32 copies of partial tail pages
	Sequences                           uint32
	TokensTotal                         uint64 // sum of sequence lengths
	// The host tier (CUDA pools with HostCapacityBytes > 0; UsedBytes then
	// counts the device tier only, PagesUsed and the *ByFormat arrays both).
	HostUsedBytes  uint64 // bytes of pages in the host tier
	HostPages      uint64 // pages in the host tier
	BytesOffloaded uint64 // page bytes moved device -> host since the pool was created
	BytesFetched   uint64 // page bytes moved host -> device since the pool was created
	// HostPageReads counts the pages in host memory that decode calls
	// listed, one per page and call (read over the bus: the stalls the tier
	// policy avoids; with query-aware top-k, host-tier candidates).
	HostPageReads uint64
	// HostReservedBytes is the pinned host slab memory the host tier holds
	// (>= HostUsedBytes; kept while the pool lives).
	HostReservedBytes uint64
}

// Stats is ikv_pool_get_stats.
func (p *Pool) Stats() (PoolStats, error) {
	defer runtime.KeepAlive(p)
	var s C.ikv_pool_stats
	s.struct_size = C.uint32_t(C.sizeof_ikv_pool_stats)
	if err := call(func() C.ikv_status { return C.ikv_pool_get_stats(p.raw, &s) }); err != nil {
		return PoolStats{}, err
	}
	out := PoolStats{
		CapacityBytes: uint64(s.capacity_bytes), UsedBytes: uint64(s.used_bytes), PagesUsed: uint64(s.pages_used),
		ReservedBytes: uint64(s.reserved_bytes), StagingBytes: uint64(s.staging_bytes),
		Sequences: uint32(s.n_sequences), TokensTotal: uint64(s.tokens_total),
		HostUsedBytes: uint64(s.host_used_bytes), HostPages: uint64(s.host_pages),
		BytesOffloaded: uint64(s.bytes_offloaded), BytesFetched: uint64(s.bytes_fetched),
		HostPageReads: uint64(s.host_page_reads), HostReservedBytes: uint64(s.host_reserved_bytes),
	}
	for i := range out.PagesByFormat {
		out.PagesByFormat[i] = uint64(s.pages_by_format[i])
		out.BytesByFormat[i] = uint64(s.bytes_by_format[i])
	}
	return out, nil
}

// PageBytes is the bytes one page occupies in format (all layers and
// kv-heads, scales included); 0 for a bad format or a closed pool.
func (p *Pool) PageBytes(format Format) uint64 {
	defer runtime.KeepAlive(p)
	return uint64(C.ikv_pool_page_bytes(p.raw, C.ikv_format(format)))
}

// SeqCreate creates an empty sequence.
func (p *Pool) SeqCreate() (uint32, error) {
	defer runtime.KeepAlive(p)
	var id C.ikv_seq_id
	err := call(func() C.ikv_status { return C.ikv_seq_create(p.raw, &id) })
	return uint32(id), err
}

// SeqDestroy destroys a sequence; its pages are released (shared pages when their last user goes).
func (p *Pool) SeqDestroy(seq uint32) error {
	defer runtime.KeepAlive(p)
	return call(func() C.ikv_status { return C.ikv_seq_destroy(p.raw, C.ikv_seq_id(seq)) })
}

// SeqLength is the number of tokens stored in every layer.
func (p *Pool) SeqLength(seq uint32) (uint32, error) {
	defer runtime.KeepAlive(p)
	var n C.uint32_t
	err := call(func() C.ikv_status { return C.ikv_seq_length(p.raw, C.ikv_seq_id(seq), &n) })
	return uint32(n), err
}

// LayerLength is the number of tokens stored in one layer.
func (p *Pool) LayerLength(seq, layer uint32) (uint32, error) {
	defer runtime.KeepAlive(p)
	var n C.uint32_t
	err := call(func() C.ikv_status { return C.ikv_seq_layer_length(p.raw, C.ikv_seq_id(seq), C.uint32_t(layer), &n) })
	return uint32(n), err
}

// Append appends tokens to one layer, or to every layer with AllLayers: k
// and v are [token][kv_head][head_dim], or [layer][token][kv_head][head_dim]
// with AllLayers, float32 (the pool's KVDType must be F32).
func (p *Pool) Append(seq, layer uint32, k, v []float32) error {
	return p.append("Pool.Append", []uint32{seq}, AppendArgs{Layer: layer, K: k, V: v})
}

// Append16 is Append for a pool whose KVDType is F16 or BF16: k and v hold
// the raw 16-bit patterns of that dtype.
func (p *Pool) Append16(seq, layer uint32, k, v []uint16) error {
	return p.append("Pool.Append16", []uint32{seq}, AppendArgs{Layer: layer, K16: k, V16: v})
}

// AppendWith is ikv_pool_append with every argument of AppendArgs.
func (p *Pool) AppendWith(seq uint32, a AppendArgs) error {
	return p.append("Pool.AppendWith", []uint32{seq}, a)
}

// AppendBatch is ikv_pool_append_batch: a.Tokens tokens (or what len(K)
// holds) to each of seqs, atomically over the batch.
func (p *Pool) AppendBatch(seqs []uint32, a AppendArgs) error {
	if len(seqs) == 0 {
		return bindErr(ErrInvalid, "Pool.AppendBatch: no sequences")
	}
	return p.append("Pool.AppendBatch", seqs, a)
}

// mulAdd returns acc + a*b, or -1 if a value is negative or it overflows int64.
func mulAdd(acc, a, b int64) int64 {
	if acc < 0 || a < 0 || b < 0 {
		return -1
	}
	if a != 0 && b > (math.MaxInt64-acc)/a {
		return -1
	}
	return acc + a*b
}

func (p *Pool) append(method string, seqs []uint32, a AppendArgs) error {
	defer runtime.KeepAlive(p)
	defer runtime.KeepAlive(a.Formats)
	cfg := p.cfg
	var n int // elements of K (and V)
	var elem uintptr
	var kp, vp unsafe.Pointer
	switch cfg.KVDType {
	case DTypeF32:
		if a.K16 != nil || a.V16 != nil {
			return bindErr(ErrInvalid, "%s: the pool's kv_dtype is F32: pass K and V as []float32", method)
		}
		if len(a.K) != len(a.V) && a.Tokens == 0 {
			return bindErr(ErrInvalid, "%s: K has %d elements, V %d", method, len(a.K), len(a.V))
		}
		n, elem = len(a.K), 4
		if len(a.V) < n {
			n = len(a.V)
		}
	case DTypeF16, DTypeBF16:
		if a.K != nil || a.V != nil {
			return bindErr(ErrInvalid, "%s: the pool's kv_dtype is %v: pass K16 and V16 (raw bits)", method, cfg.KVDType)
		}
		if len(a.K16) != len(a.V16) && a.Tokens == 0 {
			return bindErr(ErrInvalid, "%s: K16 has %d elements, V16 %d", method, len(a.K16), len(a.V16))
		}
		n, elem = len(a.K16), 2
		if len(a.V16) < n {
			n = len(a.V16)
		}
	default:
		return bindErr(ErrInvalid, "%s: the pool's kv_dtype %v is unknown to this binding", method, cfg.KVDType)
	}
	if a.TokenStride < 0 || a.HeadStride < 0 || a.LayerStride < 0 || a.SeqStride < 0 {
		return bindErr(ErrInvalid, "%s: strides must not be negative", method)
	}
	layers, nseq := int64(1), int64(len(seqs))
	if a.Layer == AllLayers {
		layers = int64(cfg.Layers)
	}
	heads, dim := int64(cfg.KVHeads), int64(cfg.HeadDim)
	row := heads * dim
	tokens := int64(a.Tokens)
	if tokens == 0 {
		if a.TokenStride != 0 || a.HeadStride != 0 || a.LayerStride != 0 || a.SeqStride != 0 {
			return bindErr(ErrInvalid, "%s: set Tokens when setting strides", method)
		}
		per := layers * nseq * row
		if per == 0 || n == 0 || int64(n)%per != 0 {
			return bindErr(ErrInvalid, "%s: K and V need the same positive multiple of %d elements (layers %d * sequences %d * kv_heads*head_dim %d), not %d",
				method, per, layers, nseq, row, n)
		}
		tokens = int64(n) / per
		if tokens > math.MaxUint32 {
			return bindErr(ErrInvalid, "%s: %d tokens per sequence is too many", method, tokens)
		}
	}
	ts, hs, ss, ls := a.TokenStride, a.HeadStride, a.SeqStride, a.LayerStride
	if ts == 0 {
		ts = row
	}
	if hs == 0 {
		hs = dim
	}
	if ss == 0 {
		ss = tokens * row
	}
	if ls == 0 {
		ls = nseq * ss
	}
	// The last element the library reads, plus one.
	need := mulAdd(dim, layers-1, ls)
	need = mulAdd(need, nseq-1, ss)
	need = mulAdd(need, tokens-1, ts)
	need = mulAdd(need, heads-1, hs)
	if need < 0 || need > int64(n) {
		return bindErr(ErrInvalid, "%s: the strides reach element %d, K and V hold %d", method, need, n)
	}
	switch elem {
	case 4:
		kp, vp = unsafe.Pointer(cFloats(a.K)), unsafe.Pointer(cFloats(a.V))
	default:
		kp, vp = cHalves(a.K16), cHalves(a.V16)
	}
	defer C.free(kp)
	defer C.free(vp)
	ca := C.ikv_append_default_v2(p.raw, C.uint32_t(tokens))
	ca.layer = C.uint32_t(a.Layer)
	ca.k, ca.v = kp, vp
	ca.token_stride, ca.head_stride, ca.layer_stride, ca.seq_stride = C.int64_t(ts), C.int64_t(hs), C.int64_t(ls), C.int64_t(ss)
	ca.flags = C.uint32_t(a.Flags)
	if a.Formats != nil {
		if a.Formats.raw == nil {
			return bindErr(ErrState, "%s: Formats is a closed plan", method)
		}
		ca.formats = a.Formats.raw
	}
	if len(seqs) == 1 && method != "Pool.AppendBatch" {
		return call(func() C.ikv_status { return C.ikv_pool_append(p.raw, C.ikv_seq_id(seqs[0]), &ca) })
	}
	cs := (*C.ikv_seq_id)(cAlloc(len(seqs), 4))
	defer C.free(unsafe.Pointer(cs))
	for i, s := range seqs {
		unsafe.Slice(cs, len(seqs))[i] = C.ikv_seq_id(s)
	}
	return call(func() C.ikv_status { return C.ikv_pool_append_batch(p.raw, cs, C.uint32_t(len(seqs)), &ca) })
}

// Sync waits for the pool's asynchronous appends and reports the first
// non-finite input they met (ikv_pool_sync); a CPU pool has nothing pending.
func (p *Pool) Sync() error {
	defer runtime.KeepAlive(p)
	return call(func() C.ikv_status { return C.ikv_pool_sync(p.raw) })
}

// Reserve allocates room now for the next nTokens tokens of every layer of
// each of seqs (ikv_pool_reserve); 0 ends it. On a CUDA pool the device then
// keeps their lengths, so their appends and decodes can be captured in one
// CUDA graph and replayed; Sync brings the host's lengths up to the replays'.
func (p *Pool) Reserve(seqs []uint32, nTokens uint32) error {
	defer runtime.KeepAlive(p)
	if len(seqs) == 0 {
		return bindErr(ErrInvalid, "Pool.Reserve: seqs is empty; it needs at least one sequence")
	}
	cs := (*C.ikv_seq_id)(cAlloc(len(seqs), 4))
	defer C.free(unsafe.Pointer(cs))
	for i, s := range seqs {
		unsafe.Slice(cs, len(seqs))[i] = C.ikv_seq_id(s)
	}
	return call(func() C.ikv_status { return C.ikv_pool_reserve(p.raw, cs, C.uint32_t(len(seqs)), C.uint32_t(nTokens)) })
}

// Fork creates a sequence sharing all of parent's pages by reference (copy-on-write).
func (p *Pool) Fork(parent uint32) (uint32, error) {
	defer runtime.KeepAlive(p)
	var id C.ikv_seq_id
	err := call(func() C.ikv_status { return C.ikv_seq_fork(p.raw, C.ikv_seq_id(parent), &id) })
	return uint32(id), err
}

// Truncate rolls back the last n tokens of every layer.
func (p *Pool) Truncate(seq, n uint32) error {
	defer runtime.KeepAlive(p)
	return call(func() C.ikv_status { return C.ikv_seq_truncate(p.raw, C.ikv_seq_id(seq), C.uint32_t(n)) })
}

// Evict releases whole pages of tokens [begin, end) (page aligned, before the tail page).
func (p *Pool) Evict(seq, begin, end uint32) error {
	defer runtime.KeepAlive(p)
	return call(func() C.ikv_status {
		return C.ikv_seq_evict(p.raw, C.ikv_seq_id(seq), C.uint32_t(begin), C.uint32_t(end))
	})
}

// IsEvicted reports whether token's page was evicted.
func (p *Pool) IsEvicted(seq, token uint32) (bool, error) {
	defer runtime.KeepAlive(p)
	var e C.int
	err := call(func() C.ikv_status { return C.ikv_seq_is_evicted(p.raw, C.ikv_seq_id(seq), C.uint32_t(token), &e) })
	return e != 0, err
}

// PageFormat is the storage format of page page of a sequence.
func (p *Pool) PageFormat(seq, page uint32) (Format, error) {
	defer runtime.KeepAlive(p)
	var f C.ikv_format
	err := call(func() C.ikv_status { return C.ikv_seq_page_format(p.raw, C.ikv_seq_id(seq), C.uint32_t(page), &f) })
	return Format(f), err
}

// SetPageFormat re-stores one page in another format (ErrShared for a page shared with a fork).
func (p *Pool) SetPageFormat(seq, page uint32, format Format) error {
	defer runtime.KeepAlive(p)
	return call(func() C.ikv_status {
		return C.ikv_seq_set_page_format(p.raw, C.ikv_seq_id(seq), C.uint32_t(page), C.ikv_format(format))
	})
}

// ApplyPlanFormats re-stores every live, unshared, full page of a sequence
// in the format the plan assigns it; atomic.
func (p *Pool) ApplyPlanFormats(seq uint32, plan *Plan) error {
	defer runtime.KeepAlive(p)
	defer runtime.KeepAlive(plan)
	var raw *C.ikv_plan
	if plan != nil {
		if plan.raw == nil {
			return bindErr(ErrState, "Pool.ApplyPlanFormats: plan is a closed plan")
		}
		raw = plan.raw
	}
	return call(func() C.ikv_status { return C.ikv_seq_apply_plan_formats(p.raw, C.ikv_seq_id(seq), raw) })
}

// Tier is where a page of a pool is: device memory, or the pinned host tier
// of a CUDA pool created with HostCapacityBytes > 0 (ikv_seq_page_tier).
// CPU pools keep every page in TierDevice (their memory).
type Tier int

const (
	TierDevice Tier = 0
	TierHost   Tier = 1
)

func (t Tier) String() string {
	switch t {
	case TierDevice:
		return "device"
	case TierHost:
		return "host"
	}
	return fmt.Sprintf("Tier(%d)", int(t))
}

// Offload moves the pages of seq overlapping tokens [begin, end) from device
// memory to the pool's host tier (ikv_seq_offload) and returns how many
// moved. Only whole pages this sequence alone holds move; shared, partial
// tail, evicted and already offloaded pages stay. The copies are enqueued
// on the default CUDA stream (this binding passes no streams); the pool's
// synchronous calls wait for them. Atomic: ErrNoMem when the host tier lacks
// room for all of them. A CPU pool, or one without a host tier, is refused
// with ErrUnsupported.
func (p *Pool) Offload(seq, begin, end uint32) (uint32, error) {
	defer runtime.KeepAlive(p)
	var n C.uint32_t
	err := call(func() C.ikv_status {
		return C.ikv_seq_offload(p.raw, C.ikv_seq_id(seq), C.uint32_t(begin), C.uint32_t(end), nil, &n)
	})
	return uint32(n), err
}

// Fetch brings the host-tier pages of seq overlapping [begin, end) back to
// device memory (ikv_seq_fetch), as Offload in the other direction (ErrNoMem
// when CapacityBytes lacks room for all of them); it returns how many moved.
func (p *Pool) Fetch(seq, begin, end uint32) (uint32, error) {
	defer runtime.KeepAlive(p)
	var n C.uint32_t
	err := call(func() C.ikv_status {
		return C.ikv_seq_fetch(p.raw, C.ikv_seq_id(seq), C.uint32_t(begin), C.uint32_t(end), nil, &n)
	})
	return uint32(n), err
}

// PageTier is the tier page page of seq is in (ikv_seq_page_tier).
func (p *Pool) PageTier(seq, page uint32) (Tier, error) {
	defer runtime.KeepAlive(p)
	var onHost C.int
	err := call(func() C.ikv_status { return C.ikv_seq_page_tier(p.raw, C.ikv_seq_id(seq), C.uint32_t(page), &onHost) })
	if err != nil {
		return TierDevice, err
	}
	if onHost != 0 {
		return TierHost, nil
	}
	return TierDevice, nil
}

// TierNoPrefetch is the IKV_TIER_NO_PREFETCH flag (TierPolicy.Flags):
// TierStep fetches nothing; the step's pages stay where they are and
// decodes read host-tier ones over the bus.
const TierNoPrefetch = C.IKV_TIER_NO_PREFETCH

// TierPolicy is ikv_tier_policy, the automatic tier policy of a CUDA pool
// with a host tier. A zero field takes the library's default, so
// TierPolicy{} is the default policy.
type TierPolicy struct {
	IdleSteps  uint32  // a page no TierStep named for this many steps is idle (offloaded under pressure); default 8
	DeviceHigh float32 // a step offloads above this share of CapacityBytes; in (0, 1]; default 0.9
	DeviceLow  float32 // idle pages are offloaded down to this share; in (0, DeviceHigh]; default min(0.75, DeviceHigh)
	Flags      uint32  // TierNoPrefetch or 0
}

// SetTierPolicy turns the automatic tier policy on (policy != nil) or off
// (nil) (ikv_pool_set_tier_policy). It changes no page; the next TierStep
// acts. A field out of range is refused with ErrInvalid naming it (checked
// first); a CPU pool, or one without a host tier, with ErrUnsupported.
func (p *Pool) SetTierPolicy(policy *TierPolicy) error {
	defer runtime.KeepAlive(p)
	if policy == nil {
		return call(func() C.ikv_status { return C.ikv_pool_set_tier_policy(p.raw, nil) })
	}
	var c C.ikv_tier_policy
	c.struct_size = C.uint32_t(C.sizeof_ikv_tier_policy)
	c.idle_steps = C.uint32_t(policy.IdleSteps)
	c.device_high, c.device_low = C.float(policy.DeviceHigh), C.float(policy.DeviceLow)
	c.flags = C.uint32_t(policy.Flags)
	return call(func() C.ikv_status { return C.ikv_pool_set_tier_policy(p.raw, &c) })
}

// TierStepReport is ikv_tier_step_report: what one TierStep did.
type TierStepReport struct {
	PagesFetched   uint32 // pages moved host -> device by this call
	PagesOffloaded uint32 // pages moved device -> host by this call
	PagesOnHost    uint32 // pages the step reads that stay in host memory (its decodes read them over the bus)
	Step           uint64 // the pool's step count after this call (the first call makes it 1)
}

// TierStep is one step of the automatic tier policy (ikv_pool_tier_step):
// call it once per engine step, before the step's decodes, with the
// sequences the step decodes (none: a step that only relieves pressure) and
// one plan per sequence (nil entries: the whole sequence), or no plans. It
// marks the pages the step reads as used, offloads idle pages under
// pressure and fetches the step's pages from the host tier, on the default
// CUDA stream (this binding passes no streams). Errors: ErrUnsupported (a
// CPU pool or no host tier), ErrState (no policy set: SetTierPolicy),
// ErrNotFound, ErrInvalid, ErrDevice, ErrNoMem.
func (p *Pool) TierStep(seqs []uint32, plans []*Plan) (TierStepReport, error) {
	defer runtime.KeepAlive(p)
	defer runtime.KeepAlive(plans)
	const m = "Pool.TierStep"
	if len(plans) > 0 && len(plans) != len(seqs) {
		return TierStepReport{}, bindErr(ErrInvalid, "%s: %d plans for %d sequences", m, len(plans), len(seqs))
	}
	if uint64(len(seqs)) > math.MaxUint32 {
		return TierStepReport{}, bindErr(ErrInvalid, "%s: %d sequences is too many", m, len(seqs))
	}
	var cs *C.ikv_seq_id
	if len(seqs) > 0 {
		cs = (*C.ikv_seq_id)(cAlloc(len(seqs), 4))
		defer C.free(unsafe.Pointer(cs))
		for i, s := range seqs {
			unsafe.Slice(cs, len(seqs))[i] = C.ikv_seq_id(s)
		}
	}
	var cp **C.ikv_plan
	if len(plans) > 0 {
		cp = (**C.ikv_plan)(cAlloc(len(plans), unsafe.Sizeof(uintptr(0))))
		defer C.free(unsafe.Pointer(cp))
		for i, pl := range plans {
			var raw *C.ikv_plan
			if pl != nil {
				if pl.raw == nil {
					return TierStepReport{}, bindErr(ErrState, "%s: plans[%d] is a closed plan", m, i)
				}
				raw = pl.raw
			}
			unsafe.Slice(cp, len(plans))[i] = raw
		}
	}
	var r C.ikv_tier_step_report
	r.struct_size = C.uint32_t(C.sizeof_ikv_tier_step_report)
	err := call(func() C.ikv_status {
		return C.ikv_pool_tier_step(p.raw, cs, cp, C.uint32_t(len(seqs)), nil, &r)
	})
	if err != nil {
		return TierStepReport{}, err
	}
	return TierStepReport{PagesFetched: uint32(r.pages_fetched), PagesOffloaded: uint32(r.pages_offloaded),
		PagesOnHost: uint32(r.pages_on_host), Step: uint64(r.step)}, nil
}

// Read returns the stored (dequantized) K and V of tokens [begin, end) of a
// layer, [token][kv_head][head_dim].
func (p *Pool) Read(seq, layer, begin, end uint32) (k, v []float32, err error) {
	defer runtime.KeepAlive(p)
	n := 0
	if end > begin {
		n = int(end-begin) * int(p.cfg.KVHeads*p.cfg.HeadDim)
	}
	ck := (*C.float)(cAlloc(n, 4))
	cv := (*C.float)(cAlloc(n, 4))
	defer C.free(unsafe.Pointer(ck))
	defer C.free(unsafe.Pointer(cv))
	err = call(func() C.ikv_status {
		return C.ikv_seq_read(p.raw, C.ikv_seq_id(seq), C.uint32_t(layer), C.uint32_t(begin), C.uint32_t(end), ck, cv)
	})
	if err != nil {
		return nil, nil, err
	}
	return goFloats(ck, n), goFloats(cv, n), nil
}

// PageSummary is the key summary of one page, layer and kv-head
// (ikv_seq_page_summary): per channel, bounds and mean of the stored keys.
type PageSummary struct {
	KMin, KMax, KMean []float32 // head_dim each
	Tokens            uint32    // tokens summarized
}

// PageSummary is ikv_seq_page_summary.
func (p *Pool) PageSummary(seq, layer, kvHead, page uint32) (PageSummary, error) {
	defer runtime.KeepAlive(p)
	d := int(p.cfg.HeadDim)
	buf := (*C.float)(cAlloc(3*d, 4))
	defer C.free(unsafe.Pointer(buf))
	all := unsafe.Slice(buf, 3*d)
	var n C.uint32_t
	err := call(func() C.ikv_status {
		return C.ikv_seq_page_summary(p.raw, C.ikv_seq_id(seq), C.uint32_t(layer), C.uint32_t(kvHead), C.uint32_t(page),
			&all[0], &all[d], &all[2*d], &n)
	})
	if err != nil {
		return PageSummary{}, err
	}
	return PageSummary{goFloats(&all[0], d), goFloats(&all[d], d), goFloats(&all[2*d], d), uint32(n)}, nil
}

// ptr is the handle for the library: NULL for a nil or closed pool.
func (p *Pool) ptr() *C.ikv_pool {
	if p == nil {
		return nil
	}
	return p.raw
}

// Close frees the pool and every sequence in it. Query memories and
// feedback objects of the pool must be closed first. Idempotent.
func (p *Pool) Close() {
	if p.raw != nil {
		C.ikv_pool_destroy(p.raw)
		p.raw = nil
	}
}
