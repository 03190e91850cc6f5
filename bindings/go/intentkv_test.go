package intentkv

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"sync"
	"testing"
)

const (
	seqLen, layers, kvHeads, qHeads, headDim, page = 512, 2, 2, 4, 64, 16
)

func randomFloats(r *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.Float64()*2 - 1)
	}
	return out
}

// reference is float64 attention of q [qHeads][headDim] over tokens of the stored k, v.
func reference(q, k, v []float32, tokens []uint32) []float64 {
	out := make([]float64, len(q))
	group := qHeads / kvHeads
	scale := 1 / math.Sqrt(headDim)
	for h := 0; h < qHeads; h++ {
		kh := h / group
		logits := make([]float64, len(tokens))
		top := math.Inf(-1)
		for i, t := range tokens {
			s := 0.0
			for d := 0; d < headDim; d++ {
				s += float64(q[h*headDim+d]) * float64(k[(int(t)*kvHeads+kh)*headDim+d])
			}
			logits[i] = s * scale
			top = math.Max(top, logits[i])
		}
		sum := 0.0
		for i := range logits {
			logits[i] = math.Exp(logits[i] - top)
			sum += logits[i]
		}
		for i, t := range tokens {
			for d := 0; d < headDim; d++ {
				out[h*headDim+d] += logits[i] / sum * float64(v[(int(t)*kvHeads+kh)*headDim+d])
			}
		}
	}
	return out
}

func newSession(t *testing.T) (*Pool, uint32, *Plan) {
	t.Helper()
	layout, err := NewLayout()
	if err != nil {
		t.Fatal(err)
	}
	defer layout.Close()
	for _, b := range []Block{
		{Name: "system", Kind: KindSystemPrompt, Policy: PolicyAlways, Start: 0, End: 64, Score: 1},
		{Name: "doc-a", Kind: KindRetrievedDoc, Policy: PolicyAttend, Start: 64, End: 256, Score: 0.9},
		{Name: "doc-b", Kind: KindRetrievedDoc, Policy: PolicyAttend, Start: 256, End: 448, Score: 0.1},
		{Name: "turn", Kind: KindConversation, Policy: PolicyRecent, Start: 448, End: seqLen, Score: 1},
	} {
		if _, err := layout.Add(b); err != nil {
			t.Fatal(err)
		}
	}
	cfg := DefaultRouterConfig()
	cfg.RecentWindow = 64
	router, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer router.Close()
	plan, err := router.Route(layout, seqLen)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := NewPool(PoolConfig{Layers: layers, KVHeads: kvHeads, HeadDim: headDim, PageSize: page, CapacityBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	seq, err := pool.SeqCreate()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(7))
	for l := uint32(0); l < layers; l++ {
		n := seqLen * kvHeads * headDim
		if err := pool.Append(seq, l, randomFloats(r, n), randomFloats(r, n)); err != nil {
			t.Fatal(err)
		}
	}
	return pool, seq, plan
}

func TestRouteAppendDecodeMatchesFloat64(t *testing.T) {
	pool, seq, plan := newSession(t)
	defer pool.Close()
	defer plan.Close()
	if n, err := pool.SeqLength(seq); err != nil || n != seqLen {
		t.Fatalf("length %d, %v", n, err)
	}
	dec, err := NewDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	q := randomFloats(rand.New(rand.NewSource(9)), qHeads*headDim)
	out, err := dec.Decode(pool, DecodeRequest{Layer: 1, Seqs: []uint32{seq}, Plans: []*Plan{plan}, QHeads: qHeads, Q: q})
	if err != nil {
		t.Fatal(err)
	}
	pages, err := plan.Pages()
	if err != nil {
		t.Fatal(err)
	}
	var tokens []uint32
	for _, p := range pages {
		for tk := p.TokenBegin; tk < p.TokenEnd; tk++ {
			tokens = append(tokens, tk)
		}
	}
	if sel, _ := plan.TokensSelected(); int(sel) != len(tokens) || sel == seqLen {
		t.Fatalf("plan selects %d tokens, its pages hold %d", sel, len(tokens))
	}
	runs, err := dec.LastSelection(0, 1) // what the step read: the plan's tokens
	if err != nil {
		t.Fatal(err)
	}
	var read []uint32
	for _, r := range runs {
		for tk := r.Begin; tk < r.End; tk++ {
			read = append(read, tk)
		}
	}
	if len(read) != len(tokens) {
		t.Fatalf("read %d tokens, the plan has %d", len(read), len(tokens))
	}
	k, v, err := pool.Read(seq, 1, 0, seqLen)
	if err != nil {
		t.Fatal(err)
	}
	want := reference(q, k, v, tokens)
	num, den := 0.0, 0.0
	for i := range want {
		num += (float64(out[i]) - want[i]) * (float64(out[i]) - want[i])
		den += want[i] * want[i]
	}
	if rel := math.Sqrt(num / den); rel > 1e-5 {
		t.Fatalf("relative error %g against float64", rel)
	}
	if b, err := dec.LastBytesRead(); err != nil || b == 0 {
		t.Fatalf("bytes read %d, %v", b, err)
	}
	// Query-aware top-k by the hybrid score inside the plan reads a subset of it.
	if _, err := dec.Decode(pool, DecodeRequest{Layer: 1, Seqs: []uint32{seq}, Plans: []*Plan{plan}, QHeads: qHeads,
		Q: q, TopkTokenBudget: 160, TopkScore: TopkHybrid}); err != nil {
		t.Fatal(err)
	}
	runs, _ = dec.LastSelection(0, 0)
	n := uint32(0)
	for _, r := range runs {
		n += r.End - r.Begin
	}
	if n == 0 || n > 160 {
		t.Fatalf("top-k read %d tokens for a budget of 160", n)
	}
	// Hybrid candidates ranked again by their keys: within the budget too.
	if _, err := dec.Decode(pool, DecodeRequest{Layer: 1, Seqs: []uint32{seq}, Plans: []*Plan{plan}, QHeads: qHeads,
		Q: q, TopkTokenBudget: 160, TopkScore: TopkKeys}); err != nil {
		t.Fatal(err)
	}
	runs, _ = dec.LastSelection(0, 0)
	n = 0
	for _, r := range runs {
		n += r.End - r.Begin
	}
	if n == 0 || n > 160 {
		t.Fatalf("keys top-k read %d tokens for a budget of 160", n)
	}
}

func TestErrorsCarryStatusAndSentenceAndChangeNothing(t *testing.T) {
	layout, err := NewLayout()
	if err != nil {
		t.Fatal(err)
	}
	defer layout.Close()
	if _, err := layout.Add(Block{Name: "a", Kind: KindOther, Policy: PolicyAttend, Start: 0, End: 100, Score: 0.5}); err != nil {
		t.Fatal(err)
	}
	_, err = layout.Add(Block{Name: "b", Kind: KindOther, Policy: PolicyAttend, Start: 50, End: 150, Score: 0.5})
	var e *Error
	if !errors.As(err, &e) || e.Name != "IKV_E_OVERLAP" || !strings.Contains(e.Message, "overlaps") {
		t.Fatalf("overlapping block: %v", err)
	}
	if layout.Count() != 1 {
		t.Fatalf("a refused add changed the layout: %d blocks", layout.Count())
	}
	if _, err := NewPool(PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 48, PageSize: 16, CapacityBytes: 1 << 20}); err == nil || !strings.Contains(err.Error(), "head_dim") {
		t.Fatalf("head_dim 48: %v", err)
	}
	pool, seq, plan := newSession(t)
	defer pool.Close()
	defer plan.Close()
	dec, _ := NewDecoder(1)
	defer dec.Close()
	q := make([]float32, qHeads*headDim)
	_, err = dec.Decode(pool, DecodeRequest{Seqs: []uint32{seq + 1000}, QHeads: qHeads, Q: q})
	if !errors.As(err, &e) || e.Name != "IKV_E_NOT_FOUND" || !strings.Contains(e.Message, "args->seqs[0]") {
		t.Fatalf("unknown sequence: %v", err)
	}
	_, err = dec.Decode(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: 3, Q: make([]float32, 3*headDim)})
	if !errors.As(err, &e) || e.Name != "IKV_E_INVALID" || !strings.Contains(e.Message, "n_q_heads") {
		t.Fatalf("3 query heads over 2 kv-heads: %v", err)
	}
	if err := pool.Append(seq, 0, make([]float32, 5), make([]float32, 5)); err == nil {
		t.Fatal("a short append was accepted")
	}
	if n, _ := pool.SeqLength(seq); n != seqLen {
		t.Fatalf("refused calls changed the sequence: %d tokens", n)
	}
}

func TestStructSizesMatchTheLibrary(t *testing.T) {
	for name, s := range structSizes() {
		if s[0] != s[1] {
			t.Errorf("%s: the library's default says %d bytes, this binding compiled %d", name, s[0], s[1])
		}
	}
	pool := newTestPool(t, PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 64, PageSize: 16, CapacityBytes: 1 << 20})
	if s := appendStructSize(pool); s[0] != s[1] {
		t.Errorf("ikv_append: the library's default says %d bytes, this binding compiled %d", s[0], s[1])
	}
	// Structs without a default: sizes from the header's field lists (64-bit).
	want := map[string]uintptr{
		"ikv_token_range": 8, "ikv_block_info": 4 + 64 + 4*7, "ikv_plan_page": 16, "ikv_block_decision": 20,
		"ikv_plan_summary": 4*6 + 4*5 + 4*3, "ikv_plan_cost": 8 * 9, "ikv_precision_policy": 40,
		"ikv_pool_stats": 8 + 8*3 + 8*5*2 + 8*2 + 8 + 8 + 8*4 + 8 + 8, "ikv_decoder_stats": 8 + 8*5,
		"ikv_runtime_info": 4*4 + 64 + 16 + 64 + 32, "ikv_tier_policy": 4 * 5, "ikv_tier_step_report": 4*4 + 8,
	}
	for name, size := range plainStructSizes() {
		if want[name] != size {
			t.Errorf("%s: %d bytes, the header's fields make %d", name, size, want[name])
		}
	}
	if n := structSizes()["ikv_decode_args"][1]; n != 152 {
		t.Errorf("ikv_decode_args: %d bytes, the header's v3 fields make 152", n)
	}
	// ikv_query_memory_config v2: struct_size, n_q_heads, decay (12 bytes: the first layout), then turns.
	if n := structSizes()["ikv_query_memory_config"][1]; n != 16 {
		t.Errorf("ikv_query_memory_config: %d bytes, the header's v2 fields make 16", n)
	}
	// ikv_pool_config v2: 7 uint32/enum fields, padding, capacity_bytes, default_format and kv_dtype (48
	// bytes: the first layout), then host_capacity_bytes.
	if n := structSizes()["ikv_pool_config"][1]; n != 4*7+4+8+4+4+8 {
		t.Errorf("ikv_pool_config: %d bytes, the header's v2 fields make %d", n, 4*7+4+8+4+4+8)
	}
}

func TestVersionRuntimeInfoAndNames(t *testing.T) {
	n := VersionNumber()
	if n != HeaderVersion {
		t.Fatalf("linked library %d, header %d", n, HeaderVersion)
	}
	if want := fmt.Sprintf("%d.%d.%d", n/10000, n/100%100, n%100); Version() != want {
		t.Fatalf("version string %q, number %d", Version(), n)
	}
	info, err := GetRuntimeInfo()
	must(t, err)
	if info.Version != n {
		t.Fatalf("runtime info version %d", info.Version)
	}
	found := false
	for _, isa := range info.CPUISAAvailable {
		found = found || isa == info.CPUISA
	}
	if !found || !strings.Contains("avx512 avx2 neon scalar", info.CPUISA) {
		t.Fatalf("cpu isa %q of %v", info.CPUISA, info.CPUISAAvailable)
	}
	if !info.CUDABuilt && (info.CUDADeviceCount != 0 || info.CUDAArchs != "" || info.CUDADeviceName != "") {
		t.Fatalf("CPU build with CUDA details: %+v", info)
	}
	expectErr(t, runtimeInfoWithSize(4), ErrInvalid, "struct_size")

	names := []string{"IKV_OK", "IKV_E_INVALID", "IKV_E_NULL", "IKV_E_RANGE", "IKV_E_NOMEM", "IKV_E_BUDGET",
		"IKV_E_OVERLAP", "IKV_E_UNSUPPORTED", "IKV_E_NO_DEVICE", "IKV_E_DEVICE", "IKV_E_SHARED", "IKV_E_EVICTED",
		"IKV_E_NOT_FOUND", "IKV_E_STATE", "IKV_E_INTERNAL"}
	statuses := []Status{StatusOK, ErrInvalid, ErrNull, ErrRange, ErrNoMem, ErrBudget, ErrOverlap, ErrUnsupported,
		ErrNoDevice, ErrDevice, ErrShared, ErrEvicted, ErrNotFound, ErrState, ErrInternal}
	for i, s := range statuses {
		if int(s) != -i || s.String() != names[i] {
			t.Errorf("status %d: %d %q, want %d %q", i, int(s), s.String(), -i, names[i])
		}
	}
	if Status(-99).String() != "IKV_UNKNOWN_STATUS" {
		t.Errorf("unknown status: %q", Status(-99).String())
	}
	got := []string{FormatF16.String(), FormatBF16.String(), FormatFP8E4M3.String(), FormatINT8.String(),
		FormatINT4.String(), FormatAuto.String(), KindToolOutput.String(), PolicyRecent.String(),
		ReasonBudgetExhausted.String(), DTypeBF16.String(), TopkMass.String(), LogWarn.String()}
	want := []string{"f16", "bf16", "fp8_e4m3", "int8", "int4", "auto", "tool_output", "RECENT",
		"budget_exhausted", "BF16", "MASS", "WARN"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("name %d: %q, want %q", i, got[i], want[i])
		}
	}
}

func TestLogCallbackReceivesErrorSentences(t *testing.T) {
	var mu sync.Mutex
	var got []string
	SetLogCallback(func(level LogLevel, message string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, level.String()+" "+message)
	}, LogWarn)
	defer SetLogCallback(nil, LogWarn)
	layout, err := NewLayout()
	must(t, err)
	defer layout.Close()
	err = layout.Validate(0)
	must(t, err) // an empty layout fits any length: nothing logged
	_, err = layout.FindToken(5)
	e := expectErr(t, err, ErrNotFound, "ikv_layout_find_token")
	mu.Lock()
	if len(got) != 1 || got[0] != "ERROR "+e.Message {
		t.Fatalf("log %q, the error %q", got, e.Message)
	}
	mu.Unlock()
	// A new sink replaces the old; nil removes it.
	var second []string
	SetLogCallback(func(level LogLevel, message string) { second = append(second, message) }, LogError)
	_, err = layout.Get(77)
	expectErr(t, err, ErrNotFound, "ikv_layout_get")
	SetLogCallback(nil, LogWarn)
	_, err = layout.Get(78)
	expectErr(t, err, ErrNotFound, "ikv_layout_get")
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || len(second) != 1 || !strings.Contains(second[0], "77") {
		t.Fatalf("first sink %q, second %q", got, second)
	}
}
