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

// OverBudget is what the router does when mandatory blocks alone exceed the
// token budget (ikv_over_budget).
type OverBudget int

const (
	OverBudgetFail OverBudget = C.IKV_OVER_BUDGET_FAIL // Route fails with ErrBudget (default)
	OverBudgetKeep OverBudget = C.IKV_OVER_BUDGET_KEEP // keep every mandatory block, flag the plan, log a warning
)

func (o OverBudget) String() string {
	switch o {
	case OverBudgetFail:
		return "FAIL"
	case OverBudgetKeep:
		return "KEEP"
	}
	return fmt.Sprintf("OverBudget(%d)", int(o))
}

// PrecisionPolicy is the router's precision table (ikv_precision_policy).
type PrecisionPolicy struct {
	AlwaysFormat, GlobalFormat, RecentFormat Format
	AttendHigh, AttendMid, AttendLow         Format
	AttendHighScore, AttendMidScore          float32
	Demote1Pressure, Demote2Pressure         float32
}

// RouterConfig is ikv_router_config. Start from DefaultRouterConfig and
// change fields by name: every field is passed as is.
type RouterConfig struct {
	PageSize, TokenBudget, RecentWindow uint32
	AttendThreshold                     float32
	MemoryPressure                      float32 // in [0, 1]
	PrefetchDepth                       uint32  // prefetch hints to emit, in pages
	UnlabeledScore                      float32 // score of tokens in no block (routed as ATTEND)
	OverBudget                          OverBudget
	Precision                           PrecisionPolicy
}

func routerConfigFromC(c *C.ikv_router_config) RouterConfig {
	p := &c.precision
	return RouterConfig{
		PageSize: uint32(c.page_size), TokenBudget: uint32(c.token_budget), RecentWindow: uint32(c.recent_window),
		AttendThreshold: float32(c.attend_threshold), MemoryPressure: float32(c.memory_pressure),
		PrefetchDepth: uint32(c.prefetch_depth), UnlabeledScore: float32(c.unlabeled_score),
		OverBudget: OverBudget(c.over_budget),
		Precision: PrecisionPolicy{
			AlwaysFormat: Format(p.always_format), GlobalFormat: Format(p.global_format), RecentFormat: Format(p.recent_format),
			AttendHigh: Format(p.attend_high), AttendMid: Format(p.attend_mid), AttendLow: Format(p.attend_low),
			AttendHighScore: float32(p.attend_high_score), AttendMidScore: float32(p.attend_mid_score),
			Demote1Pressure: float32(p.demote1_pressure), Demote2Pressure: float32(p.demote2_pressure),
		},
	}
}

// DefaultRouterConfig is ikv_router_default_config's values.
func DefaultRouterConfig() RouterConfig {
	c := C.ikv_router_default_config()
	return routerConfigFromC(&c)
}

// Router is an ikv_router. Route may run from several goroutines at once;
// SetPressure needs exclusive access.
type Router struct{ raw *C.ikv_router }

// NewRouter validates and copies cfg.
func NewRouter(cfg RouterConfig) (*Router, error) {
	c := C.ikv_router_default_config()
	c.page_size, c.token_budget, c.recent_window = C.uint32_t(cfg.PageSize), C.uint32_t(cfg.TokenBudget), C.uint32_t(cfg.RecentWindow)
	c.attend_threshold, c.memory_pressure = C.float(cfg.AttendThreshold), C.float(cfg.MemoryPressure)
	c.prefetch_depth, c.unlabeled_score = C.uint32_t(cfg.PrefetchDepth), C.float(cfg.UnlabeledScore)
	c.over_budget = C.ikv_over_budget(cfg.OverBudget)
	p, q := &c.precision, cfg.Precision
	p.always_format, p.global_format, p.recent_format = C.ikv_format(q.AlwaysFormat), C.ikv_format(q.GlobalFormat), C.ikv_format(q.RecentFormat)
	p.attend_high, p.attend_mid, p.attend_low = C.ikv_format(q.AttendHigh), C.ikv_format(q.AttendMid), C.ikv_format(q.AttendLow)
	p.attend_high_score, p.attend_mid_score = C.float(q.AttendHighScore), C.float(q.AttendMidScore)
	p.demote1_pressure, p.demote2_pressure = C.float(q.Demote1Pressure), C.float(q.Demote2Pressure)
	r := &Router{}
	if err := call(func() C.ikv_status { return C.ikv_router_create(&c, &r.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(r, (*Router).Close)
	return r, nil
}

// Config is a copy of the router's config (ikv_router_get_config).
func (r *Router) Config() (RouterConfig, error) {
	defer runtime.KeepAlive(r)
	var c C.ikv_router_config
	c.struct_size = C.uint32_t(C.sizeof_ikv_router_config)
	if err := call(func() C.ikv_status { return C.ikv_router_get_config(r.raw, &c) }); err != nil {
		return RouterConfig{}, err
	}
	return routerConfigFromC(&c), nil
}

// SetPressure changes the memory pressure, in [0, 1].
func (r *Router) SetPressure(memoryPressure float32) error {
	defer runtime.KeepAlive(r)
	return call(func() C.ikv_status { return C.ikv_router_set_pressure(r.raw, C.float(memoryPressure)) })
}

// Route routes a layout for a sequence of seqLen tokens into a plan.
func (r *Router) Route(l *Layout, seqLen uint32) (*Plan, error) {
	defer runtime.KeepAlive(r)
	defer runtime.KeepAlive(l)
	var raw *C.ikv_plan
	if err := call(func() C.ikv_status { return C.ikv_router_route(r.raw, l.ptr(), C.uint32_t(seqLen), &raw) }); err != nil {
		return nil, err
	}
	return newPlan(raw), nil
}

// Close frees the router. Idempotent.
func (r *Router) Close() {
	if r.raw != nil {
		C.ikv_router_destroy(r.raw)
		r.raw = nil
	}
}

// ---------------------------------------------------------------- plans

// Page flags of a plan (PlanPage.Flags).
const (
	PageMandatory = C.IKV_PAGE_MANDATORY // from ALWAYS/GLOBAL/recent window: top-k never drops it
	PagePartial   = C.IKV_PAGE_PARTIAL   // TokenBegin/TokenEnd cut inside the page
)

// PlanPage is one selected page of a plan (ikv_plan_page).
type PlanPage struct {
	Page, TokenBegin, TokenEnd uint32
	Format                     Format
	Flags                      uint8 // PageMandatory | PagePartial
}

// Reason is why the router decided what it did for a block (ikv_reason).
type Reason int

const (
	ReasonAlways          Reason = C.IKV_REASON_ALWAYS
	ReasonGlobal          Reason = C.IKV_REASON_GLOBAL
	ReasonRecentWindow    Reason = C.IKV_REASON_RECENT_WINDOW
	ReasonScore           Reason = C.IKV_REASON_SCORE
	ReasonPolicySkip      Reason = C.IKV_REASON_POLICY_SKIP
	ReasonBelowThreshold  Reason = C.IKV_REASON_BELOW_THRESHOLD
	ReasonBudgetExhausted Reason = C.IKV_REASON_BUDGET_EXHAUSTED
	ReasonOutsideWindow   Reason = C.IKV_REASON_OUTSIDE_WINDOW
	ReasonOverBudgetKept  Reason = C.IKV_REASON_OVER_BUDGET_KEPT
)

// String is ikv_reason_name, e.g. "below_threshold".
func (r Reason) String() string { return C.GoString(C.ikv_reason_name(C.ikv_reason(r))) }

// UnlabeledGap is Decision.BlockID of a gap between layout blocks.
const UnlabeledGap = math.MaxUint32

// Decision is the router's decision for one block (ikv_block_decision).
type Decision struct {
	BlockID        uint32 // the layout's id; UnlabeledGap for a gap
	Start, End     uint32
	TokensSelected uint32
	Selected       bool
	Format         Format // meaningful when Selected
	Reason         Reason
}

// PlanSummary is ikv_plan_summary.
type PlanSummary struct {
	SeqLen, PageSize              uint32
	TokensSelected, TokensSkipped uint32
	PagesSelected, PagesTotal     uint32
	TokensByFormat                [FormatCount]uint32
	MandatoryTokens, TokenBudget  uint32
	OverBudget                    bool
}

// ModelShape is the model shape of the cost model (ikv_model_shape).
type ModelShape struct{ Layers, QHeads, KVHeads, HeadDim uint32 }

// DefaultModelShape is ikv_model_shape_default (32 layers, 32 q-heads, 8 kv-heads, head_dim 128).
func DefaultModelShape() ModelShape {
	s := C.ikv_model_shape_default()
	return ModelShape{uint32(s.n_layers), uint32(s.n_q_heads), uint32(s.n_kv_heads), uint32(s.head_dim)}
}

// PlanCost is the bytes and FLOPs of one decode step under a plan (ikv_plan_cost).
type PlanCost struct {
	BytesByFormat             [FormatCount]uint64
	BytesTotal, BytesDenseF16 uint64
	Flops, FlopsDense         uint64
}

// Plan is an ikv_plan: the pages a step reads. Immutable; any number of
// goroutines may read one.
type Plan struct{ raw *C.ikv_plan }

func newPlan(raw *C.ikv_plan) *Plan {
	p := &Plan{raw: raw}
	runtime.SetFinalizer(p, (*Plan).Close)
	return p
}

// PlanFromRanges reads exactly the given token ranges, all pages in F16.
func PlanFromRanges(ranges []TokenRange, seqLen, pageSize uint32) (*Plan, error) {
	return PlanFromRangesFormat(ranges, seqLen, pageSize, FormatF16)
}

// PlanFromRangesFormat reads exactly the given token ranges (sorted or not,
// may touch, must not overlap), all pages marked format (ikv_plan_from_ranges).
func PlanFromRangesFormat(ranges []TokenRange, seqLen, pageSize uint32, format Format) (*Plan, error) {
	cr := (*C.ikv_token_range)(cAlloc(len(ranges), C.sizeof_ikv_token_range))
	defer C.free(unsafe.Pointer(cr))
	for i, r := range ranges {
		unsafe.Slice(cr, len(ranges))[i] = C.ikv_token_range{begin: C.uint32_t(r.Begin), end: C.uint32_t(r.End)}
	}
	var raw *C.ikv_plan
	err := call(func() C.ikv_status {
		return C.ikv_plan_from_ranges(cr, C.size_t(len(ranges)), C.uint32_t(seqLen), C.uint32_t(pageSize), C.ikv_format(format), &raw)
	})
	if err != nil {
		return nil, err
	}
	return newPlan(raw), nil
}

// Pages are the plan's selected pages (shared by all kv-heads), copied out.
func (p *Plan) Pages() ([]PlanPage, error) {
	defer runtime.KeepAlive(p)
	var pages *C.ikv_plan_page
	var n C.size_t
	if err := call(func() C.ikv_status { return C.ikv_plan_pages(p.raw, &pages, &n) }); err != nil {
		return nil, err
	}
	out := make([]PlanPage, int(n))
	if n > 0 {
		for i, pg := range unsafe.Slice(pages, int(n)) {
			out[i] = PlanPage{uint32(pg.page), uint32(pg.token_begin), uint32(pg.token_end), Format(pg.format), uint8(pg.flags)}
		}
	}
	return out, nil
}

// Summary is the plan's summary counts.
func (p *Plan) Summary() (PlanSummary, error) {
	defer runtime.KeepAlive(p)
	var s C.ikv_plan_summary
	if err := call(func() C.ikv_status { return C.ikv_plan_get_summary(p.raw, &s) }); err != nil {
		return PlanSummary{}, err
	}
	out := PlanSummary{
		SeqLen: uint32(s.seq_len), PageSize: uint32(s.page_size),
		TokensSelected: uint32(s.tokens_selected), TokensSkipped: uint32(s.tokens_skipped),
		PagesSelected: uint32(s.pages_selected), PagesTotal: uint32(s.pages_total),
		MandatoryTokens: uint32(s.mandatory_tokens), TokenBudget: uint32(s.token_budget), OverBudget: s.over_budget != 0,
	}
	for i := range out.TokensByFormat {
		out.TokensByFormat[i] = uint32(s.tokens_by_format[i])
	}
	return out, nil
}

// TokensSelected is the plan summary's token count.
func (p *Plan) TokensSelected() (uint32, error) {
	s, err := p.Summary()
	return s.TokensSelected, err
}

// SkippedPages are the pages no token of which is read, ascending.
func (p *Plan) SkippedPages() ([]uint32, error) {
	defer runtime.KeepAlive(p)
	var pages *C.uint32_t
	var n C.size_t
	if err := call(func() C.ikv_status { return C.ikv_plan_skipped_pages(p.raw, &pages, &n) }); err != nil {
		return nil, err
	}
	return goUint32s(pages, int(n)), nil
}

// Prefetch are pages likely needed by the next step, most likely first.
func (p *Plan) Prefetch() ([]uint32, error) {
	defer runtime.KeepAlive(p)
	var pages *C.uint32_t
	var n C.size_t
	if err := call(func() C.ikv_status { return C.ikv_plan_prefetch(p.raw, &pages, &n) }); err != nil {
		return nil, err
	}
	return goUint32s(pages, int(n)), nil
}

// Decisions is one decision per layout block in start order, plus gaps.
func (p *Plan) Decisions() ([]Decision, error) {
	defer runtime.KeepAlive(p)
	var ds *C.ikv_block_decision
	var n C.size_t
	if err := call(func() C.ikv_status { return C.ikv_plan_decisions(p.raw, &ds, &n) }); err != nil {
		return nil, err
	}
	out := make([]Decision, int(n))
	if n > 0 {
		for i, d := range unsafe.Slice(ds, int(n)) {
			out[i] = Decision{uint32(d.block_id), uint32(d.start), uint32(d.end), uint32(d.tokens_selected),
				d.selected != 0, Format(d.format), Reason(d.reason)}
		}
	}
	return out, nil
}

// PageFormat is the storage format the plan assigns to token page page.
func (p *Plan) PageFormat(page uint32) (Format, error) {
	defer runtime.KeepAlive(p)
	var f C.ikv_format
	err := call(func() C.ikv_status { return C.ikv_plan_page_format(p.raw, C.uint32_t(page), &f) })
	return Format(f), err
}

// Cost is the bytes and FLOPs of one decode step (one query token, all
// layers) under the plan for a model shape (ikv_plan_get_cost).
func (p *Plan) Cost(shape ModelShape) (PlanCost, error) {
	defer runtime.KeepAlive(p)
	s := C.ikv_model_shape_default()
	s.n_layers, s.n_q_heads, s.n_kv_heads, s.head_dim = C.uint32_t(shape.Layers), C.uint32_t(shape.QHeads), C.uint32_t(shape.KVHeads), C.uint32_t(shape.HeadDim)
	var c C.ikv_plan_cost
	if err := call(func() C.ikv_status { return C.ikv_plan_get_cost(p.raw, &s, &c) }); err != nil {
		return PlanCost{}, err
	}
	out := PlanCost{BytesTotal: uint64(c.bytes_total), BytesDenseF16: uint64(c.bytes_dense_f16), Flops: uint64(c.flops), FlopsDense: uint64(c.flops_dense)}
	for i := range out.BytesByFormat {
		out.BytesByFormat[i] = uint64(c.bytes_by_format[i])
	}
	return out, nil
}

// Close frees the plan. Idempotent.
func (p *Plan) Close() {
	if p.raw != nil {
		C.ikv_plan_destroy(p.raw)
		p.raw = nil
	}
}
