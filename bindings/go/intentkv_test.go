package intentkv

import (
	"errors"
	"math"
	"math/rand"
	"strings"
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
		{"system", KindSystemPrompt, PolicyAlways, 0, 64, 1},
		{"doc-a", KindRetrievedDoc, PolicyAttend, 64, 256, 0.9},
		{"doc-b", KindRetrievedDoc, PolicyAttend, 256, 448, 0.1},
		{"turn", KindConversation, PolicyRecent, 448, seqLen, 1},
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
	pool, err := NewPool(PoolConfig{layers, kvHeads, headDim, page, 64 << 20})
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
}

func TestErrorsCarryStatusAndSentenceAndChangeNothing(t *testing.T) {
	layout, err := NewLayout()
	if err != nil {
		t.Fatal(err)
	}
	defer layout.Close()
	if _, err := layout.Add(Block{"a", KindOther, PolicyAttend, 0, 100, 0.5}); err != nil {
		t.Fatal(err)
	}
	_, err = layout.Add(Block{"b", KindOther, PolicyAttend, 50, 150, 0.5})
	var e *Error
	if !errors.As(err, &e) || e.Name != "IKV_E_OVERLAP" || !strings.Contains(e.Message, "overlaps") {
		t.Fatalf("overlapping block: %v", err)
	}
	if layout.Count() != 1 {
		t.Fatalf("a refused add changed the layout: %d blocks", layout.Count())
	}
	if _, err := NewPool(PoolConfig{1, 1, 48, 16, 1 << 20}); err == nil || !strings.Contains(err.Error(), "head_dim") {
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
}
