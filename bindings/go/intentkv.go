// Package intentkv is the Go binding of intentkv (include/intentkv.h): page
// selection and decode over a paged KV cache, linked through pkg-config.
//
// Handles (Layout, Router, Plan, Pool, Decoder) are closed with Close; a
// finalizer closes a forgotten one, as a leak guard only. Errors are values
// of type *Error carrying the status and the library's sentence, read on the
// OS thread of the failing call. Slices passed to the library are copied
// into C memory for the call (cgo forbids C memory that holds Go pointers),
// so large appends cost one copy of their K/V.
package intentkv

/*
#cgo pkg-config: intentkv
#include <stdlib.h>
#include <intentkv.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Error is a failed call: the ikv_status, its name and ikv_last_error().
type Error struct {
	Status  int
	Name    string
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Name, e.Message) }

// call runs f with its goroutine locked to its OS thread, so that the error
// sentence (thread-local in the library) is the one of this call.
func call(f func() C.ikv_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st == C.IKV_OK {
		return nil
	}
	return &Error{Status: int(st), Name: C.GoString(C.ikv_status_name(st)), Message: C.GoString(C.ikv_last_error())}
}

// Version is the linked library's "MAJOR.MINOR.PATCH".
func Version() string { return C.GoString(C.ikv_version_string()) }

// cFloats copies xs into C memory (freed by the caller with C.free).
func cFloats(xs []float32) *C.float {
	if len(xs) == 0 {
		return nil
	}
	p := (*C.float)(C.malloc(C.size_t(len(xs)) * C.size_t(unsafe.Sizeof(C.float(0)))))
	copy(unsafe.Slice((*float32)(unsafe.Pointer(p)), len(xs)), xs)
	return p
}

// ---------------------------------------------------------------- layouts

// Policy and Kind of a layout block (ikv_policy, ikv_block_kind).
type Policy int
type Kind int

const (
	PolicyAlways Policy = C.IKV_POLICY_ALWAYS
	PolicyAttend Policy = C.IKV_POLICY_ATTEND
	PolicySkip   Policy = C.IKV_POLICY_SKIP
	PolicyRecent Policy = C.IKV_POLICY_RECENT
	PolicyGlobal Policy = C.IKV_POLICY_GLOBAL

	KindSystemPrompt Kind = C.IKV_KIND_SYSTEM_PROMPT
	KindRetrievedDoc Kind = C.IKV_KIND_RETRIEVED_DOC
	KindConversation Kind = C.IKV_KIND_CONVERSATION
	KindOther        Kind = C.IKV_KIND_OTHER
)

// Block describes a layout block: tokens [Start, End).
type Block struct {
	Name       string
	Kind       Kind
	Policy     Policy
	Start, End uint32
	Score      float32
}

// Layout is an ikv_layout: the semantic blocks of a context.
type Layout struct{ raw *C.ikv_layout }

func NewLayout() (*Layout, error) {
	l := &Layout{}
	if err := call(func() C.ikv_status { return C.ikv_layout_create(&l.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(l, (*Layout).Close)
	return l, nil
}

// Add adds a block and returns its id; a refused block changes nothing.
func (l *Layout) Add(b Block) (uint32, error) {
	d := C.ikv_block_desc_default()
	name := C.CString(b.Name)
	defer C.free(unsafe.Pointer(name))
	d.name = name
	d.kind = C.ikv_block_kind(b.Kind)
	d.policy = C.ikv_policy(b.Policy)
	d.start, d.end = C.uint32_t(b.Start), C.uint32_t(b.End)
	d.score = C.float(b.Score)
	var id C.uint32_t
	err := call(func() C.ikv_status { return C.ikv_layout_add(l.raw, &d, &id) })
	return uint32(id), err
}

func (l *Layout) Count() int { return int(C.ikv_layout_count(l.raw)) }

func (l *Layout) Close() {
	if l.raw != nil {
		C.ikv_layout_destroy(l.raw)
		l.raw = nil
	}
}

// ---------------------------------------------------------------- routers and plans

// RouterConfig holds the fields of ikv_router_config most engines set.
type RouterConfig struct {
	PageSize, TokenBudget, RecentWindow uint32
	AttendThreshold                     float32
}

// DefaultRouterConfig is ikv_router_default_config's values.
func DefaultRouterConfig() RouterConfig {
	c := C.ikv_router_default_config()
	return RouterConfig{uint32(c.page_size), uint32(c.token_budget), uint32(c.recent_window), float32(c.attend_threshold)}
}

// Router is an ikv_router.
type Router struct{ raw *C.ikv_router }

func NewRouter(cfg RouterConfig) (*Router, error) {
	c := C.ikv_router_default_config()
	c.page_size, c.token_budget, c.recent_window = C.uint32_t(cfg.PageSize), C.uint32_t(cfg.TokenBudget), C.uint32_t(cfg.RecentWindow)
	c.attend_threshold = C.float(cfg.AttendThreshold)
	r := &Router{}
	if err := call(func() C.ikv_status { return C.ikv_router_create(&c, &r.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(r, (*Router).Close)
	return r, nil
}

// Route routes a layout for a sequence of seqLen tokens into a plan.
func (r *Router) Route(l *Layout, seqLen uint32) (*Plan, error) {
	p := &Plan{}
	if err := call(func() C.ikv_status { return C.ikv_router_route(r.raw, l.raw, C.uint32_t(seqLen), &p.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(p, (*Plan).Close)
	return p, nil
}

func (r *Router) Close() {
	if r.raw != nil {
		C.ikv_router_destroy(r.raw)
		r.raw = nil
	}
}

// TokenRange is a half-open token range [Begin, End).
type TokenRange struct{ Begin, End uint32 }

// PlanPage is one selected page of a plan (ikv_plan_page).
type PlanPage struct {
	Page, TokenBegin, TokenEnd uint32
	Format, Flags              uint8
}

// Plan is an ikv_plan: the pages a step reads.
type Plan struct{ raw *C.ikv_plan }

// PlanFromRanges reads exactly the given token ranges (all pages in F16).
func PlanFromRanges(ranges []TokenRange, seqLen, pageSize uint32) (*Plan, error) {
	cr := make([]C.ikv_token_range, len(ranges)) // Go memory without Go pointers: may be passed
	for i, r := range ranges {
		cr[i] = C.ikv_token_range{begin: C.uint32_t(r.Begin), end: C.uint32_t(r.End)}
	}
	var first *C.ikv_token_range
	if len(cr) > 0 {
		first = &cr[0]
	}
	p := &Plan{}
	err := call(func() C.ikv_status {
		return C.ikv_plan_from_ranges(first, C.size_t(len(cr)), C.uint32_t(seqLen), C.uint32_t(pageSize), C.IKV_FMT_F16, &p.raw)
	})
	if err != nil {
		return nil, err
	}
	runtime.SetFinalizer(p, (*Plan).Close)
	return p, nil
}

// Pages are the plan's selected pages, copied out.
func (p *Plan) Pages() ([]PlanPage, error) {
	var pages *C.ikv_plan_page
	var n C.size_t
	if err := call(func() C.ikv_status { return C.ikv_plan_pages(p.raw, &pages, &n) }); err != nil {
		return nil, err
	}
	out := make([]PlanPage, int(n))
	for i, pg := range unsafe.Slice(pages, int(n)) {
		out[i] = PlanPage{uint32(pg.page), uint32(pg.token_begin), uint32(pg.token_end), uint8(pg.format), uint8(pg.flags)}
	}
	return out, nil
}

// TokensSelected is the plan summary's token count.
func (p *Plan) TokensSelected() (uint32, error) {
	var s C.ikv_plan_summary
	err := call(func() C.ikv_status { return C.ikv_plan_get_summary(p.raw, &s) })
	return uint32(s.tokens_selected), err
}

func (p *Plan) Close() {
	if p.raw != nil {
		C.ikv_plan_destroy(p.raw)
		p.raw = nil
	}
}

// ---------------------------------------------------------------- pools

// PoolConfig holds the fields of ikv_pool_config (CPU pools, float32 K/V here).
type PoolConfig struct {
	Layers, KVHeads, HeadDim, PageSize uint32
	CapacityBytes                      uint64
}

// Pool is an ikv_pool with float32 input (kv_dtype F32), F16 pages by default.
type Pool struct {
	raw *C.ikv_pool
	cfg PoolConfig
}

func NewPool(cfg PoolConfig) (*Pool, error) {
	c := C.ikv_pool_default_config()
	c.n_layers, c.n_kv_heads, c.head_dim, c.page_size = C.uint32_t(cfg.Layers), C.uint32_t(cfg.KVHeads), C.uint32_t(cfg.HeadDim), C.uint32_t(cfg.PageSize)
	c.capacity_bytes = C.uint64_t(cfg.CapacityBytes)
	c.kv_dtype = C.IKV_DTYPE_F32
	p := &Pool{cfg: cfg}
	if err := call(func() C.ikv_status { return C.ikv_pool_create(&c, &p.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(p, (*Pool).Close)
	return p, nil
}

func (p *Pool) SeqCreate() (uint32, error) {
	var id C.ikv_seq_id
	err := call(func() C.ikv_status { return C.ikv_seq_create(p.raw, &id) })
	return uint32(id), err
}

func (p *Pool) SeqLength(seq uint32) (uint32, error) {
	var n C.uint32_t
	err := call(func() C.ikv_status { return C.ikv_seq_length(p.raw, C.ikv_seq_id(seq), &n) })
	return uint32(n), err
}

// Append appends tokens to one layer: k and v are [token][kv_head][head_dim].
func (p *Pool) Append(seq, layer uint32, k, v []float32) error {
	row := int(p.cfg.KVHeads * p.cfg.HeadDim)
	if len(k) == 0 || len(k)%row != 0 || len(v) != len(k) {
		return &Error{Status: int(C.IKV_E_INVALID), Name: "IKV_E_INVALID",
			Message: fmt.Sprintf("Pool.Append: k and v need the same positive multiple of kv_heads*head_dim = %d floats (k %d, v %d)", row, len(k), len(v))}
	}
	ck, cv := cFloats(k), cFloats(v)
	defer C.free(unsafe.Pointer(ck))
	defer C.free(unsafe.Pointer(cv))
	a := C.ikv_append_default(p.raw, C.uint32_t(len(k)/row))
	a.layer = C.uint32_t(layer)
	a.k, a.v = unsafe.Pointer(ck), unsafe.Pointer(cv)
	return call(func() C.ikv_status { return C.ikv_pool_append(p.raw, C.ikv_seq_id(seq), &a) })
}

// Read returns the stored (dequantized) K and V of tokens [begin, end) of a layer.
func (p *Pool) Read(seq, layer, begin, end uint32) (k, v []float32, err error) {
	n := int(end-begin) * int(p.cfg.KVHeads*p.cfg.HeadDim)
	if end < begin {
		n = 0
	}
	ck := (*C.float)(C.malloc(C.size_t(n+1) * 4))
	cv := (*C.float)(C.malloc(C.size_t(n+1) * 4))
	defer C.free(unsafe.Pointer(ck))
	defer C.free(unsafe.Pointer(cv))
	err = call(func() C.ikv_status {
		return C.ikv_seq_read(p.raw, C.ikv_seq_id(seq), C.uint32_t(layer), C.uint32_t(begin), C.uint32_t(end), ck, cv)
	})
	if err != nil {
		return nil, nil, err
	}
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(ck)), n)...),
		append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(cv)), n)...), nil
}

func (p *Pool) Close() {
	if p.raw != nil {
		C.ikv_pool_destroy(p.raw)
		p.raw = nil
	}
}

// ---------------------------------------------------------------- decode

// TopkScore is what query-aware selection ranks pages by (ikv_topk_score).
type TopkScore int

const (
	TopkQuest  TopkScore = C.IKV_TOPK_SCORE_QUEST
	TopkHybrid TopkScore = C.IKV_TOPK_SCORE_HYBRID
)

// DecodeRequest is one decode step over float32 queries and outputs
// ([seq][q_head][head_dim], one query token).
type DecodeRequest struct {
	Layer           uint32
	Seqs            []uint32
	Plans           []*Plan // one per sequence (nil entries: dense), or empty: all dense
	QHeads          uint32
	Q               []float32
	TopkTokenBudget uint32
	TopkScore       TopkScore
}

// Decoder is an ikv_decoder; use one per goroutine at a time.
type Decoder struct{ raw *C.ikv_decoder }

func NewDecoder(threads uint32) (*Decoder, error) {
	c := C.ikv_decoder_default_config()
	c.n_threads = C.uint32_t(threads)
	d := &Decoder{}
	if err := call(func() C.ikv_status { return C.ikv_decoder_create(&c, &d.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(d, (*Decoder).Close)
	return d, nil
}

// Decode runs the step and returns the output, laid out as Q.
func (d *Decoder) Decode(p *Pool, r DecodeRequest) ([]float32, error) {
	if len(r.Seqs) == 0 || r.QHeads == 0 || len(r.Q) != len(r.Seqs)*int(r.QHeads*p.cfg.HeadDim) {
		return nil, &Error{Status: int(C.IKV_E_INVALID), Name: "IKV_E_INVALID",
			Message: fmt.Sprintf("Decoder.Decode: Q has %d floats for %d sequences of %d query heads of head_dim %d",
				len(r.Q), len(r.Seqs), r.QHeads, p.cfg.HeadDim)}
	}
	n := len(r.Q)
	cq := cFloats(r.Q)
	cout := (*C.float)(C.malloc(C.size_t(n) * 4))
	seqs := (*C.ikv_seq_id)(C.malloc(C.size_t(len(r.Seqs)) * 4))
	defer C.free(unsafe.Pointer(cq))
	defer C.free(unsafe.Pointer(cout))
	defer C.free(unsafe.Pointer(seqs))
	for i, s := range r.Seqs {
		unsafe.Slice(seqs, len(r.Seqs))[i] = C.ikv_seq_id(s)
	}
	a := C.ikv_decode_args_default_v2()
	if len(r.Plans) > 0 {
		if len(r.Plans) != len(r.Seqs) {
			return nil, &Error{Status: int(C.IKV_E_INVALID), Name: "IKV_E_INVALID",
				Message: fmt.Sprintf("Decoder.Decode: %d plans for %d sequences", len(r.Plans), len(r.Seqs))}
		}
		plans := (**C.ikv_plan)(C.malloc(C.size_t(len(r.Plans)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
		defer C.free(unsafe.Pointer(plans))
		for i, pl := range r.Plans {
			var raw *C.ikv_plan
			if pl != nil {
				raw = pl.raw
			}
			unsafe.Slice(plans, len(r.Plans))[i] = raw
		}
		a.plans = plans
	}
	a.layer, a.n_seqs, a.n_q_heads = C.uint32_t(r.Layer), C.uint32_t(len(r.Seqs)), C.uint32_t(r.QHeads)
	a.seqs = seqs
	a.q, a.out = unsafe.Pointer(cq), unsafe.Pointer(cout)
	a.topk_token_budget = C.uint32_t(r.TopkTokenBudget)
	a.topk_score = C.ikv_topk_score(r.TopkScore)
	if err := call(func() C.ikv_status { return C.ikv_decode(d.raw, p.raw, &a) }); err != nil {
		return nil, err
	}
	runtime.KeepAlive(r.Plans)
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(cout)), n)...), nil
}

// LastSelection is the token ranges the last step read for sequence index
// seqIndex (into its Seqs) and kvHead.
func (d *Decoder) LastSelection(seqIndex, kvHead uint32) ([]TokenRange, error) {
	var n C.size_t
	if err := call(func() C.ikv_status {
		return C.ikv_decoder_last_selection(d.raw, C.uint32_t(seqIndex), C.uint32_t(kvHead), nil, 0, &n)
	}); err != nil {
		return nil, err
	}
	runs := make([]C.ikv_token_range, int(n)+1)
	if err := call(func() C.ikv_status {
		return C.ikv_decoder_last_selection(d.raw, C.uint32_t(seqIndex), C.uint32_t(kvHead), &runs[0], n, &n)
	}); err != nil {
		return nil, err
	}
	out := make([]TokenRange, int(n))
	for i := range out {
		out[i] = TokenRange{uint32(runs[i].begin), uint32(runs[i].end)}
	}
	return out, nil
}

func (d *Decoder) LastBytesRead() (uint64, error) {
	var b C.uint64_t
	err := call(func() C.ikv_status { return C.ikv_decoder_last_bytes_read(d.raw, &b) })
	return uint64(b), err
}

func (d *Decoder) Close() {
	if d.raw != nil {
		C.ikv_decoder_destroy(d.raw)
		d.raw = nil
	}
}

// structSizes reports, per config struct, the struct_size its default sets
// and the size of the struct this binding compiled against (the tests
// compare them: a binding built with another header would differ).
func structSizes() map[string][2]uintptr {
	return map[string][2]uintptr{
		"ikv_decode_args":   {uintptr(C.ikv_decode_args_default_v2().struct_size), C.sizeof_ikv_decode_args},
		"ikv_pool_config":   {uintptr(C.ikv_pool_default_config().struct_size), C.sizeof_ikv_pool_config},
		"ikv_router_config": {uintptr(C.ikv_router_default_config().struct_size), C.sizeof_ikv_router_config},
		"ikv_block_desc":    {uintptr(C.ikv_block_desc_default().struct_size), C.sizeof_ikv_block_desc},
	}
}
