package intentkv

import (
	"reflect"
	"testing"
)

// routedLayout: 1024 tokens in 16-token pages, every kind of decision.
func routedLayout(t *testing.T) (*Layout, map[string]uint32) {
	t.Helper()
	layout, err := NewLayout()
	must(t, err)
	ids := map[string]uint32{}
	for _, b := range []Block{
		{Name: "sys", Kind: KindSystemPrompt, Policy: PolicyAlways, Start: 0, End: 64, Score: 1},
		{Name: "summary", Kind: KindMemorySummary, Policy: PolicyGlobal, Start: 64, End: 128, Score: 1},
		{Name: "hi", Kind: KindRetrievedDoc, Policy: PolicyAttend, Start: 128, End: 320, Score: 0.9},
		{Name: "mid", Kind: KindRetrievedDoc, Policy: PolicyAttend, Start: 320, End: 512, Score: 0.6},
		{Name: "lo", Kind: KindToolOutput, Policy: PolicyAttend, Start: 512, End: 640, Score: 0.35, PrecisionHint: Hint(FormatBF16)},
		{Name: "below", Kind: KindToolOutput, Policy: PolicyAttend, Start: 640, End: 768, Score: 0.1},
		{Name: "scratch", Kind: KindScratchpad, Policy: PolicySkip, Start: 768, End: 832, Score: 0.5},
		// [832, 896) is an unlabeled gap
		{Name: "turn", Kind: KindConversation, Policy: PolicyRecent, Start: 896, End: 1024, Score: 1},
	} {
		id, err := layout.Add(b)
		must(t, err)
		ids[b.Name] = id
	}
	return layout, ids
}

type decisionWant struct {
	selected bool
	format   Format
	reason   Reason
}

func checkDecisions(t *testing.T, plan *Plan, ids map[string]uint32, want map[string]decisionWant) {
	t.Helper()
	ds, err := plan.Decisions()
	must(t, err)
	byID := map[uint32]Decision{}
	total := uint32(0)
	for _, d := range ds {
		byID[d.BlockID] = d
		total += d.End - d.Start
	}
	if total != 1024 {
		t.Fatalf("decisions cover %d tokens", total)
	}
	for name, w := range want {
		id := uint32(UnlabeledGap)
		if name != "gap" {
			id = ids[name]
		}
		d, ok := byID[id]
		if !ok || d.Selected != w.selected || d.Reason != w.reason || (w.selected && d.Format != w.format) {
			t.Errorf("%s: %+v (%v, %v), want %+v", name, d, d.Format, d.Reason, w)
		}
		if w.selected && d.TokensSelected != d.End-d.Start || !w.selected && d.TokensSelected != 0 {
			t.Errorf("%s: %d of [%d, %d) selected", name, d.TokensSelected, d.Start, d.End)
		}
	}
}

func TestRouterPlanDecisionsSummaryFormatsAndPressure(t *testing.T) {
	layout, ids := routedLayout(t)
	defer layout.Close()
	cfg := DefaultRouterConfig()
	cfg.RecentWindow = 128
	router, err := NewRouter(cfg)
	must(t, err)
	defer router.Close()
	plan, err := router.Route(layout, 1024)
	must(t, err)
	defer plan.Close()
	checkDecisions(t, plan, ids, map[string]decisionWant{
		"sys": {true, FormatF16, ReasonAlways}, "summary": {true, FormatFP8E4M3, ReasonGlobal},
		"hi": {true, FormatF16, ReasonScore}, "mid": {true, FormatINT8, ReasonScore},
		"lo": {true, FormatBF16, ReasonScore}, "below": {false, 0, ReasonBelowThreshold},
		"scratch": {false, 0, ReasonPolicySkip}, "gap": {false, 0, ReasonBelowThreshold},
		"turn": {true, FormatF16, ReasonRecentWindow},
	})
	s, err := plan.Summary()
	must(t, err)
	want := PlanSummary{SeqLen: 1024, PageSize: 16, TokensSelected: 768, TokensSkipped: 256, PagesSelected: 48,
		PagesTotal: 64, TokensByFormat: [FormatCount]uint32{384, 128, 64, 192, 0}, MandatoryTokens: 256}
	if s != want {
		t.Fatalf("summary %+v, want %+v", s, want)
	}
	if n, _ := plan.TokensSelected(); n != 768 {
		t.Fatalf("tokens selected %d", n)
	}
	pages, err := plan.Pages()
	must(t, err)
	selected := map[uint32]bool{}
	for _, p := range pages {
		selected[p.Page] = true
		if f, err := plan.PageFormat(p.Page); err != nil || f != p.Format {
			t.Fatalf("page %d: format %v, its entry says %v (%v)", p.Page, f, p.Format, err)
		}
		mandatory := p.Page < 8 || p.Page >= 56
		if (p.Flags&PageMandatory != 0) != mandatory || p.Flags&PagePartial != 0 {
			t.Fatalf("page %d flags %#x", p.Page, p.Flags)
		}
	}
	skipped, err := plan.SkippedPages()
	must(t, err)
	if !equalU32(skipped, span(40, 56)) {
		t.Fatalf("skipped pages %v", skipped)
	}
	for _, p := range skipped { // the lowest format of their blocks: attend_low
		if f, _ := plan.PageFormat(p); f != FormatINT4 {
			t.Fatalf("skipped page %d: %v", p, f)
		}
	}
	prefetch, err := plan.Prefetch()
	must(t, err)
	if len(prefetch) > int(cfg.PrefetchDepth) {
		t.Fatalf("%d prefetch hints for a depth of %d", len(prefetch), cfg.PrefetchDepth)
	}
	for _, p := range prefetch {
		if selected[p] || p > 64 {
			t.Fatalf("prefetch hint %d is selected or out of range", p)
		}
	}
	// The page the next token lands in, then unread pages of ATTEND blocks,
	// best score first: "below" (0.1) is the only one.
	if !equalU32(prefetch, []uint32{64, 40, 41, 42}) {
		t.Fatalf("prefetch %v", prefetch)
	}
	_, err = plan.PageFormat(64)
	expectErr(t, err, ErrRange, "ikv_plan_page_format")

	// Pressure demotes every block but ALWAYS by one rung; a hint wins.
	must(t, router.SetPressure(0.6))
	pressed, err := router.Route(layout, 1024)
	must(t, err)
	defer pressed.Close()
	checkDecisions(t, pressed, ids, map[string]decisionWant{
		"sys": {true, FormatF16, ReasonAlways}, "summary": {true, FormatINT8, ReasonGlobal},
		"hi": {true, FormatFP8E4M3, ReasonScore}, "mid": {true, FormatINT4, ReasonScore},
		"lo": {true, FormatBF16, ReasonScore}, "turn": {true, FormatFP8E4M3, ReasonRecentWindow},
	})
	// A budget that fits the mandatory tokens and "hi" only.
	cfg.TokenBudget = 256 + 192 + 100
	cfg.Precision.AttendHigh = FormatINT8
	small, err := NewRouter(cfg)
	must(t, err)
	defer small.Close()
	budgeted, err := small.Route(layout, 1024)
	must(t, err)
	defer budgeted.Close()
	checkDecisions(t, budgeted, ids, map[string]decisionWant{
		"hi": {true, FormatINT8, ReasonScore}, "mid": {false, 0, ReasonBudgetExhausted},
		"lo": {false, 0, ReasonBudgetExhausted},
	})
	if s, _ := budgeted.Summary(); s.TokensSelected != 448 || s.TokenBudget != cfg.TokenBudget || s.OverBudget {
		t.Fatalf("budgeted summary %+v", s)
	}
	if pf, _ := budgeted.Prefetch(); !equalU32(pf, []uint32{64, 20, 21, 22}) { // then "mid" (0.6) first
		t.Fatalf("budgeted prefetch %v", pf)
	}
}

func TestRouterConfigRoundTripOverBudgetAndErrors(t *testing.T) {
	def := DefaultRouterConfig()
	wantDef := RouterConfig{PageSize: 16, RecentWindow: 512, AttendThreshold: 0.3, PrefetchDepth: 4,
		OverBudget: OverBudgetFail, Precision: PrecisionPolicy{
			AlwaysFormat: FormatF16, GlobalFormat: FormatFP8E4M3, RecentFormat: FormatF16, AttendHigh: FormatF16,
			AttendMid: FormatINT8, AttendLow: FormatINT4, AttendHighScore: 0.8, AttendMidScore: 0.5,
			Demote1Pressure: 0.5, Demote2Pressure: 0.85}}
	if def != wantDef {
		t.Fatalf("default router config %+v", def)
	}
	cfg := def
	cfg.PageSize, cfg.TokenBudget, cfg.RecentWindow, cfg.AttendThreshold = 32, 100, 64, 0.25
	cfg.MemoryPressure, cfg.PrefetchDepth, cfg.UnlabeledScore, cfg.OverBudget = 0.2, 7, 0.4, OverBudgetKeep
	cfg.Precision.AttendMid, cfg.Precision.Demote2Pressure = FormatINT4, 0.95
	router, err := NewRouter(cfg)
	must(t, err)
	defer router.Close()
	got, err := router.Config()
	must(t, err)
	if got != cfg {
		t.Fatalf("config %+v, created with %+v", got, cfg)
	}
	must(t, router.SetPressure(0.6))
	expectErr(t, router.SetPressure(1.5), ErrInvalid, "memory_pressure")
	got, _ = router.Config()
	if got.MemoryPressure != 0.6 {
		t.Fatalf("pressure %v after a refused change", got.MemoryPressure)
	}
	// Mandatory tokens (256) over a budget of 100: KEEP flags the plan.
	layout, ids := routedLayout(t)
	defer layout.Close()
	cfg.PageSize = 16
	cfg.RecentWindow = 128
	keep, err := NewRouter(cfg)
	must(t, err)
	defer keep.Close()
	plan, err := keep.Route(layout, 1024)
	must(t, err)
	defer plan.Close()
	s, _ := plan.Summary()
	if !s.OverBudget || s.MandatoryTokens != 256 || s.TokenBudget != 100 {
		t.Fatalf("over-budget summary %+v", s)
	}
	checkDecisions(t, plan, ids, map[string]decisionWant{"sys": {true, FormatF16, ReasonOverBudgetKept}})
	cfg.OverBudget = OverBudgetFail
	fail, err := NewRouter(cfg)
	must(t, err)
	defer fail.Close()
	_, err = fail.Route(layout, 1024)
	expectErr(t, err, ErrBudget, "ikv_router_route")
	_, err = fail.Route(layout, 1000)
	expectErr(t, err, ErrRange, "ikv_router_route")

	bad := def
	bad.PageSize = 12
	_, err = NewRouter(bad)
	expectErr(t, err, ErrInvalid, "page_size")
	bad = def
	bad.Precision.Demote1Pressure, bad.Precision.Demote2Pressure = 0.9, 0.8
	_, err = NewRouter(bad)
	expectErr(t, err, ErrInvalid, "demote1_pressure")
	router.Close()
	_, err = router.Config()
	expectErr(t, err, ErrNull, "router")
}

func TestPlanFromRangesAndCost(t *testing.T) {
	ranges := []TokenRange{{40, 48}, {0, 10}}
	shape := ModelShape{Layers: 4, QHeads: 8, KVHeads: 2, HeadDim: 64}
	if d := DefaultModelShape(); d != (ModelShape{32, 32, 8, 128}) {
		t.Fatalf("default model shape %+v", d)
	}
	f16, err := PlanFromRanges(ranges, 64, 16)
	must(t, err)
	defer f16.Close()
	pages, _ := f16.Pages()
	want := []PlanPage{{0, 0, 10, FormatF16, PagePartial}, {2, 40, 48, FormatF16, PagePartial}}
	if !reflect.DeepEqual(pages, want) {
		t.Fatalf("pages %+v", pages)
	}
	cost, err := f16.Cost(shape)
	must(t, err)
	subpages := uint64(shape.Layers * shape.KVHeads)
	perToken := uint64(4 * shape.HeadDim * shape.QHeads * shape.Layers)
	wantCost := PlanCost{BytesTotal: 18 * 4 * 64 * subpages, BytesDenseF16: 64 * 4 * 64 * subpages,
		Flops: perToken * 18, FlopsDense: perToken * 64}
	wantCost.BytesByFormat[FormatF16] = wantCost.BytesTotal
	if cost != wantCost {
		t.Fatalf("F16 cost %+v, want %+v", cost, wantCost)
	}
	int8, err := PlanFromRangesFormat(ranges, 64, 16, FormatINT8)
	must(t, err)
	defer int8.Close()
	cost, err = int8.Cost(shape)
	must(t, err)
	// Per page and kv-head: K and V rows of 64 bytes, per-channel K scales
	// (4*64 bytes) and per-token V scales (4 bytes a token).
	pageBytes := func(n uint64) uint64 { return 2*64*n + 4*64 + 4*n }
	if want := (pageBytes(10) + pageBytes(8)) * subpages; cost.BytesTotal != want || cost.BytesByFormat[FormatINT8] != want {
		t.Fatalf("INT8 cost %+v, want %d bytes", cost, want)
	}
	if f, _ := int8.PageFormat(1); f != FormatINT8 {
		t.Fatalf("page 1 format %v", f)
	}
	if sk, _ := int8.SkippedPages(); !equalU32(sk, []uint32{1, 3}) {
		t.Fatalf("skipped %v", sk)
	}
	_, err = int8.Cost(ModelShape{Layers: 4, QHeads: 8, KVHeads: 2, HeadDim: 65})
	expectErr(t, err, ErrInvalid, "head_dim")
	_, err = PlanFromRanges([]TokenRange{{0, 10}, {5, 20}}, 64, 16)
	expectErr(t, err, ErrOverlap, "ikv_plan_from_ranges")
	_, err = PlanFromRanges([]TokenRange{{0, 70}}, 64, 16)
	expectErr(t, err, ErrRange, "ikv_plan_from_ranges")
	empty, err := PlanFromRanges(nil, 64, 16)
	must(t, err)
	defer empty.Close()
	if s, _ := empty.Summary(); s.TokensSelected != 0 || s.PagesTotal != 4 {
		t.Fatalf("empty plan %+v", s)
	}
}
