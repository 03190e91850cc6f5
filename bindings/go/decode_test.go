package intentkv

import (
	"math"
	"math/rand"
	"sort"
	"testing"
)

// stepReference is float64 attention of a step's queries ([token][q_head][dim])
// for one sequence of length stored tokens: query token t sits at
// length-nqt+t and reads the tokens of sel at or before it.
func stepReference(q []float64, k, v []float32, sel []uint32, length, nqt, qHeads, kvHeads, dim int,
	scale, softcap float64) (out []float64, lse []float64) {
	group := qHeads / kvHeads
	for t := 0; t < nqt; t++ {
		var tokens []uint32
		for _, tk := range sel {
			if int(tk) <= length-nqt+t {
				tokens = append(tokens, tk)
			}
		}
		for h := 0; h < qHeads; h++ {
			row := q[(t*qHeads+h)*dim : (t*qHeads+h+1)*dim]
			o, l := attend(row, rowsOf(k, tokens, kvHeads, h/group, dim), rowsOf(v, tokens, kvHeads, h/group, dim), scale, softcap)
			out = append(out, o...)
			lse = append(lse, l)
		}
	}
	return out, lse
}

func toF64(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

func TestStepBatchMultiTokenLSESoftcapMatchesFloat64(t *testing.T) {
	const heads, q, dim, nqt = 2, 4, 64, 3
	pool := newTestPool(t, PoolConfig{Layers: 2, KVHeads: heads, HeadDim: dim, PageSize: 16, CapacityBytes: 16 << 20})
	r := rand.New(rand.NewSource(21))
	lengths := []int{100, 70}
	var seqs []uint32
	for _, n := range lengths {
		s, err := pool.SeqCreate()
		must(t, err)
		must(t, pool.Append(s, AllLayers, randomFloats(r, 2*n*heads*dim), randomFloats(r, 2*n*heads*dim)))
		seqs = append(seqs, s)
	}
	plan, err := PlanFromRanges([]TokenRange{{0, 30}, {50, 100}}, 100, 16)
	must(t, err)
	defer plan.Close()
	sels := [][]uint32{append(span(0, 30), span(50, 100)...), span(0, 70)}
	qs := randomFloats(r, len(seqs)*nqt*q*dim)
	for i := range qs {
		qs[i] *= 3 // logits large enough for the softcap to matter
	}
	dec, err := NewDecoder(2)
	must(t, err)
	defer dec.Close()
	req := DecodeRequest{Layer: 1, Seqs: seqs, Plans: []*Plan{plan, nil}, QHeads: q, QueryTokens: nqt, Q: qs,
		LSE: true, Scale: 0.1, Softcap: 2.5}
	res, err := dec.Step(pool, req)
	must(t, err)
	if len(res.Out) != len(qs) || len(res.LSE) != len(seqs)*nqt*q || res.Out16 != nil {
		t.Fatalf("output sizes %d, %d", len(res.Out), len(res.LSE))
	}
	rows := nqt * q
	check := func(out []float32, lse []float32, qf []float64, tol float64, what string) {
		t.Helper()
		for b := range seqs {
			k, v, err := pool.Read(seqs[b], 1, 0, uint32(lengths[b]))
			must(t, err)
			wantOut, wantLSE := stepReference(qf[b*rows*dim:(b+1)*rows*dim], k, v, sels[b], lengths[b], nqt, q, heads, dim, 0.1, 2.5)
			if e := relL2(out[b*rows*dim:(b+1)*rows*dim], wantOut); e > tol {
				t.Fatalf("%s: sequence %d: relative error %g against float64", what, b, e)
			}
			for i, l := range wantLSE {
				if lse != nil && math.Abs(float64(lse[b*rows+i])-l) > 1e-5*math.Max(1, math.Abs(l)) {
					t.Fatalf("%s: sequence %d row %d: lse %g, float64 %g", what, b, i, lse[b*rows+i], l)
				}
			}
		}
	}
	check(res.Out, res.LSE, toF64(qs), 1e-5, "F32")
	for b, sel := range sels {
		runs, err := dec.LastSelection(uint32(b), 1)
		must(t, err)
		if !equalU32(runTokens(runs), sel) {
			t.Fatalf("sequence %d read %v", b, runs)
		}
	}
	// The same batch at layer 0 reuses the page lists; the counters are exact.
	req.Layer = 0
	_, err = dec.Step(pool, req)
	must(t, err)
	st, err := dec.Stats()
	must(t, err)
	last, _ := dec.LastBytesRead()
	// F16 pages: K and V rows of 2*dim bytes for every token read, per kv-head.
	if want := uint64(heads * (len(sels[0]) + len(sels[1])) * 2 * dim * 2); last != want {
		t.Fatalf("bytes read %d, want %d", last, want)
	}
	if st != (DecoderStats{Steps: 2, ListsBuilt: 1, ListsReused: 1, LastBytesRead: last}) {
		t.Fatalf("decoder stats %+v", st)
	}
	// BF16 queries and F16 outputs: against float64 of the rounded queries.
	req.Layer, req.Q, req.QDType, req.OutDType = 1, nil, DTypeBF16, DTypeF16
	req.Q16 = make([]uint16, len(qs))
	qr := make([]float64, len(qs))
	for i, x := range qs {
		req.Q16[i] = bf16Bits(x)
		qr[i] = float64(bf16Float(req.Q16[i]))
	}
	half, err := dec.Step(pool, req)
	must(t, err)
	if half.Out != nil || len(half.Out16) != len(qs) {
		t.Fatalf("16-bit output sizes %d, %d", len(half.Out), len(half.Out16))
	}
	out := make([]float32, len(half.Out16))
	for i, h := range half.Out16 {
		out[i] = f16Float(h)
	}
	check(out, half.LSE, qr, 1e-3, "BF16 in, F16 out")
	_, err = dec.Decode(pool, req)
	expectErr(t, err, ErrInvalid, "Decoder.Step")
}

func TestEmptySelectionGivesZerosAndMinusInfinity(t *testing.T) {
	pool := newTestPool(t, PoolConfig{Layers: 1, KVHeads: 2, HeadDim: 64, PageSize: 16, CapacityBytes: 8 << 20})
	seq, _ := pool.SeqCreate()
	r := rand.New(rand.NewSource(3))
	must(t, pool.Append(seq, 0, randomFloats(r, 100*2*64), randomFloats(r, 100*2*64)))
	must(t, pool.Evict(seq, 16, 64))
	plan, err := PlanFromRanges([]TokenRange{{20, 60}}, 100, 16) // only evicted tokens
	must(t, err)
	defer plan.Close()
	dec, _ := NewDecoder(1)
	defer dec.Close()
	res, err := dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, Plans: []*Plan{plan}, QHeads: 4, QueryTokens: 2,
		Q: randomFloats(r, 2*4*64), LSE: true})
	must(t, err)
	for _, x := range res.Out {
		if x != 0 {
			t.Fatalf("output %g for an empty selection", x)
		}
	}
	for _, l := range res.LSE {
		if !math.IsInf(float64(l), -1) {
			t.Fatalf("lse %g for an empty selection", l)
		}
	}
	if b, _ := dec.LastBytesRead(); b != 0 {
		t.Fatalf("%d bytes read", b)
	}
}

func TestTopkMassBudgetSelectsTheBestBoundedPages(t *testing.T) {
	const heads, q, dim, page, length = 2, 4, 64, 16, 256
	pool := newTestPool(t, PoolConfig{Layers: 1, KVHeads: heads, HeadDim: dim, PageSize: page, CapacityBytes: 8 << 20})
	seq, _ := pool.SeqCreate()
	r := rand.New(rand.NewSource(17))
	must(t, pool.Append(seq, 0, randomFloats(r, length*heads*dim), randomFloats(r, length*heads*dim)))
	qs := randomFloats(r, q*dim)
	dec, _ := NewDecoder(1)
	defer dec.Close()
	// A tiny mass share takes one page; TopkMinTokens raises the budget to 3 pages.
	_, err := dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: q, Q: qs, TopkMode: TopkMass, TopkMass: 1e-6,
		TopkMinTokens: 3 * page, TopkScore: TopkQuest})
	must(t, err)
	group := q / heads
	for h := 0; h < heads; h++ {
		// The Quest bound of every page from the pool's key summaries, in float64.
		type ranked struct {
			page  uint32
			bound float64
		}
		var pages []ranked
		for p := uint32(0); p < length/page; p++ {
			s, err := pool.PageSummary(seq, 0, uint32(h), p)
			must(t, err)
			best := math.Inf(-1)
			for g := 0; g < group; g++ {
				b := 0.0
				for d := 0; d < dim; d++ {
					x := float64(qs[(h*group+g)*dim+d])
					b += math.Max(x*float64(s.KMin[d]), x*float64(s.KMax[d]))
				}
				best = math.Max(best, b)
			}
			pages = append(pages, ranked{p, best})
		}
		sort.SliceStable(pages, func(i, j int) bool { return pages[i].bound > pages[j].bound })
		var want []uint32
		top := []uint32{pages[0].page, pages[1].page, pages[2].page}
		sort.Slice(top, func(i, j int) bool { return top[i] < top[j] })
		for _, p := range top {
			want = append(want, span(p*page, p*page+page)...)
		}
		runs, err := dec.LastSelection(0, uint32(h))
		must(t, err)
		if !equalU32(runTokens(runs), want) {
			t.Fatalf("kv-head %d read %v, the three best bounded pages are %v", h, runs, top)
		}
	}
	// Rows of the 48 tokens read plus the k_min/k_max summaries scored (4*dim bytes a page), per kv-head.
	if b, _ := dec.LastBytesRead(); b != uint64(heads*(3*page*2*dim*2+(length/page)*4*dim)) {
		t.Fatalf("bytes read %d", b)
	}
	// The whole mass takes every page.
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: q, Q: qs, TopkMode: TopkMass, TopkMass: 1})
	must(t, err)
	if runs, _ := dec.LastSelection(0, 0); !equalU32(runTokens(runs), span(0, length)) {
		t.Fatalf("mass 1 read %v", runs)
	}
}

func TestQueryMemoryOfAnEarlierTurnJoinsTheSelection(t *testing.T) {
	const dim, page, length = 32, 16, 256
	pool := newTestPool(t, PoolConfig{Layers: 1, KVHeads: 1, HeadDim: dim, PageSize: page, CapacityBytes: 8 << 20})
	seq, _ := pool.SeqCreate()
	r := rand.New(rand.NewSource(5))
	k := randomFloats(r, length*dim)
	must(t, pool.Append(seq, 0, k, randomFloats(r, length*dim)))
	qNow := randomFloats(r, 2*dim)
	dec, _ := NewDecoder(1)
	defer dec.Close()
	mem, err := NewQueryMemory(pool, 2, 0.5)
	must(t, err)
	defer mem.Close()
	selection := func(m *QueryMemory) []uint32 {
		t.Helper()
		_, err := dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: 2, Q: qNow, TopkTokenBudget: 64, QueryMemory: m})
		must(t, err)
		runs, err := dec.LastSelection(0, 0)
		must(t, err)
		return runTokens(runs)
	}
	alone := selection(nil)
	if got := selection(mem); !equalU32(got, alone) {
		t.Fatalf("an empty memory changed the selection: %v, %v", got, alone)
	}
	// The first page the current query does not read.
	in := map[uint32]bool{}
	for _, tk := range alone {
		in[tk/page] = true
	}
	target := uint32(0)
	for in[target] {
		target++
	}
	// Refused calls remember nothing.
	qThen := make([]float32, 2*dim)
	for h := 0; h < 2; h++ {
		for d := 0; d < dim; d++ {
			qThen[h*dim+d] = 40 * k[int(target)*page*dim+d]
		}
	}
	expectErr(t, mem.Remember(seq, 1, qThen), ErrRange, "layer")
	expectErr(t, mem.Remember(seq, 0, qThen[:dim+1]), ErrInvalid, "multiple of n_q_heads*head_dim")
	expectErr(t, mem.Remember16(seq, 0, make([]uint16, 2*dim), DTypeF32), ErrInvalid, "F16 or BF16")
	bad := append([]float32(nil), qThen...)
	bad[dim+5] = float32(math.Inf(1))
	expectErr(t, mem.Remember(seq, 0, bad), ErrInvalid, "element")
	must(t, mem.EndTurn(seq))
	if got := selection(mem); !equalU32(got, alone) {
		t.Fatal("refused calls were remembered")
	}
	// An earlier turn's query that points at the target page's keys: it is read now too.
	must(t, mem.Remember(seq, 0, qThen))
	must(t, mem.EndTurn(seq))
	got := selection(mem)
	has := map[uint32]bool{}
	for _, tk := range got {
		has[tk] = true
	}
	for tk := target * page; tk < target*page+page; tk++ {
		if !has[tk] {
			t.Fatalf("page %d is not read with the memory: %v", target, got)
		}
	}
	must(t, mem.Forget(seq))
	if got := selection(mem); !equalU32(got, alone) {
		t.Fatal("a forgotten sequence still changes the selection")
	}
	// The same through BF16 queries, then Reset.
	q16 := make([]uint16, len(qThen))
	for i, x := range qThen {
		q16[i] = bf16Bits(x)
	}
	must(t, mem.Remember16(seq, 0, q16, DTypeBF16))
	must(t, mem.EndTurn(seq))
	if got := selection(mem); equalU32(got, alone) {
		t.Fatal("a BF16 turn changed nothing")
	}
	must(t, mem.Reset())
	if got := selection(mem); !equalU32(got, alone) {
		t.Fatal("a reset memory still changes the selection")
	}
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: 4, Q: make([]float32, 4*dim), TopkTokenBudget: 64, QueryMemory: mem})
	expectErr(t, err, ErrInvalid, "query heads")
	_, err = NewQueryMemory(pool, 0, 0.5)
	expectErr(t, err, ErrInvalid, "n_q_heads")
	_, err = NewQueryMemory(pool, 2, 1.5)
	expectErr(t, err, ErrInvalid, "decay")
	// A memory whose pool was closed refuses its calls; a closed memory is not "no memory".
	other, _ := NewPool(PoolConfig{Layers: 1, KVHeads: 1, HeadDim: dim, PageSize: page, CapacityBytes: 1 << 20})
	orphan, err := NewQueryMemory(other, 2, 0)
	must(t, err)
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: 2, Q: qNow, TopkTokenBudget: 64, QueryMemory: orphan})
	expectErr(t, err, ErrInvalid, "another pool")
	otherFb, err := NewPageFeedback(other, 0)
	must(t, err)
	other.Close()
	expectErr(t, orphan.EndTurn(seq), ErrState, "pool was closed")
	// A decode refuses them too (the closed pool's memory may be a new pool's by then).
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: 2, Q: qNow, TopkTokenBudget: 64, QueryMemory: orphan})
	expectErr(t, err, ErrState, "pool was closed")
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: 2, Q: qNow, Feedback: otherFb})
	expectErr(t, err, ErrState, "pool was closed")
	otherFb.Close()
	orphan.Close()
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: 2, Q: qNow, TopkTokenBudget: 64, QueryMemory: orphan})
	expectErr(t, err, ErrState, "QueryMemory is closed")
}

func TestQueryMemoryTurns(t *testing.T) {
	def := DefaultQueryMemoryConfig()
	if want := (QueryMemoryConfig{QHeads: 0, Decay: 0.5, Turns: 4}); def != want {
		t.Fatalf("DefaultQueryMemoryConfig() = %+v, want %+v", def, want)
	}
	pool := newTestPool(t, PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 32, PageSize: 16, CapacityBytes: 1 << 20})
	for _, turns := range []uint32{0, 1, 4, 64} {
		cfg := def
		cfg.QHeads, cfg.Turns = 2, turns
		m, err := NewQueryMemoryWith(pool, cfg)
		must(t, err)
		m.Close()
	}
	_, err := NewQueryMemoryWith(pool, QueryMemoryConfig{QHeads: 2, Decay: 0.5, Turns: 65})
	expectErr(t, err, ErrInvalid, "turns")
	_, err = NewQueryMemoryWith(pool, QueryMemoryConfig{QHeads: 2, Decay: 1.5, Turns: 4})
	expectErr(t, err, ErrInvalid, "decay")
	// A zero Decay takes the default; a zero Turns is the mean form (accepted).
	m, err := NewQueryMemoryWith(pool, QueryMemoryConfig{QHeads: 2})
	must(t, err)
	m.Close()
}

// feedbackShares is, per kv-head and page, the page's share of one step's
// softmax (averaged over the group's heads and query tokens), in float64.
func feedbackShares(q []float32, k []float32, sel []uint32, length, nqt, qHeads, kvHeads, dim, page int) [][]float64 {
	group := qHeads / kvHeads
	nPages := (length + page - 1) / page
	shares := make([][]float64, kvHeads)
	for h := range shares {
		shares[h] = make([]float64, nPages)
		for t := 0; t < nqt; t++ {
			var tokens []uint32
			for _, tk := range sel {
				if int(tk) <= length-nqt+t {
					tokens = append(tokens, tk)
				}
			}
			for g := 0; g < group; g++ {
				row := q[(t*qHeads+h*group+g)*dim : (t*qHeads+h*group+g+1)*dim]
				logits := make([]float64, len(tokens))
				top, den := math.Inf(-1), 0.0
				for i, tk := range tokens {
					s := 0.0
					for d := 0; d < dim; d++ {
						s += float64(row[d]) * float64(k[(int(tk)*kvHeads+h)*dim+d])
					}
					logits[i] = s / math.Sqrt(float64(dim))
					top = math.Max(top, logits[i])
				}
				for _, l := range logits {
					den += math.Exp(l - top)
				}
				for i, tk := range tokens {
					shares[h][int(tk)/page] += math.Exp(logits[i]-top) / den / float64(group*nqt)
				}
			}
		}
	}
	return shares
}

func TestPageFeedbackAveragesAndBlockScores(t *testing.T) {
	const heads, q, dim, page, length, rate = 2, 4, 32, 16, 100, 0.5
	const nPages = (length + page - 1) / page
	pool := newTestPool(t, PoolConfig{Layers: 1, KVHeads: heads, HeadDim: dim, PageSize: page, CapacityBytes: 8 << 20})
	seq, _ := pool.SeqCreate()
	r := rand.New(rand.NewSource(8))
	must(t, pool.Append(seq, 0, randomFloats(r, length*heads*dim), randomFloats(r, length*heads*dim)))
	k, _, _ := pool.Read(seq, 0, 0, length)
	fb, err := NewPageFeedback(pool, rate)
	must(t, err)
	defer fb.Close()
	dec, _ := NewDecoder(1)
	defer dec.Close()
	avg := make([][]float64, heads)
	for h := range avg {
		avg[h] = make([]float64, nPages)
	}
	step := func(plan *Plan, sel []uint32, nqt int) {
		t.Helper()
		qs := randomFloats(r, nqt*q*dim)
		req := DecodeRequest{Seqs: []uint32{seq}, QHeads: q, QueryTokens: uint32(nqt), Q: qs, Feedback: fb}
		if plan != nil {
			req.Plans = []*Plan{plan}
		}
		_, err := dec.Step(pool, req)
		must(t, err)
		shares := feedbackShares(qs, k, sel, length, nqt, q, heads, dim, page)
		for h := range avg {
			for _, p := range uniquePages(sel, page) {
				avg[h][p] = (1-rate)*avg[h][p] + rate*shares[h][p]
			}
		}
	}
	expect := func(what string) {
		t.Helper()
		for h := range avg {
			got, err := fb.Get(seq, 0, uint32(h))
			must(t, err)
			if len(got) != nPages {
				t.Fatalf("%s: kv-head %d: %d pages fed back", what, h, len(got))
			}
			for p, want := range avg[h] {
				if math.Abs(float64(got[p])-want) > 1e-5+1e-4*want {
					t.Fatalf("%s: kv-head %d page %d: %g, float64 %g", what, h, p, got[p], want)
				}
			}
		}
	}
	step(nil, span(0, length), 1)
	sum := 0.0
	for _, a := range avg[0] {
		sum += a
	}
	if math.Abs(sum-rate) > 1e-9 {
		t.Fatalf("the reference's shares sum to %g", sum/rate)
	}
	expect("dense step")
	plan, err := PlanFromRanges([]TokenRange{{0, 40}, {77, 100}}, length, page)
	must(t, err)
	defer plan.Close()
	step(plan, append(span(0, 40), span(77, 100)...), 2)
	expect("plan step, two query tokens")
	// Refused calls feed nothing back.
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: q, Q: make([]float32, q*dim), Feedback: fb,
		TopkTokenBudget: 32, TopkFeedbackWeight: 2})
	expectErr(t, err, ErrInvalid, "topk_feedback_weight")
	expect("after a refused step")
	// The averages as a prior of top-k selection.
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: q, Q: randomFloats(r, q*dim),
		TopkTokenBudget: 32, TopkFeedbackWeight: 0.7})
	must(t, err)
	// Block scores: ATTEND blocks by the summed averages of their pages, the largest 1.
	layout, _ := NewLayout()
	defer layout.Close()
	bounds := [][2]uint32{{0, 40}, {40, 90}, {90, 100}}
	var ids []uint32
	for i, b := range bounds {
		policy := PolicyAttend
		if i == 2 {
			policy = PolicyAlways
		}
		id, err := layout.Add(Block{Name: string(rune('a' + i)), Policy: policy, Start: b[0], End: b[1], Score: 0.25})
		must(t, err)
		ids = append(ids, id)
	}
	must(t, fb.BlockScores(seq, layout))
	mass := make([]float64, 2)
	for i := range mass {
		for h := range avg {
			for p := bounds[i][0] / page; p < (bounds[i][1]+page-1)/page; p++ {
				mass[i] += avg[h][p]
			}
		}
	}
	top := math.Max(mass[0], mass[1])
	for i, id := range ids {
		b, _ := layout.Get(id)
		want := 0.25
		if i < 2 {
			want = mass[i] / top
		}
		if math.Abs(float64(b.Score)-want) > 1e-4 {
			t.Fatalf("block %d score %g, want %g", i, b.Score, want)
		}
	}
	_, err = fb.Get(seq, 1, 0)
	expectErr(t, err, ErrRange, "layer")
	_, err = fb.Get(seq, 0, 2)
	expectErr(t, err, ErrRange, "kv_head")
	expectErr(t, fb.BlockScores(seq, nil), ErrNull, "layout")
	_, err = NewPageFeedback(pool, 1.5)
	expectErr(t, err, ErrInvalid, "rate")
	must(t, fb.Forget(seq))
	if got, err := fb.Get(seq, 0, 0); err != nil || len(got) != 0 {
		t.Fatalf("forgotten sequence: %v, %v", got, err)
	}
	must(t, fb.Reset())
	if got, _ := fb.Get(seq+7, 0, 0); len(got) != 0 {
		t.Fatalf("unknown sequence: %v", got)
	}
}

func uniquePages(sel []uint32, page int) []int {
	var out []int
	for _, tk := range sel {
		p := int(tk) / page
		if len(out) == 0 || out[len(out)-1] != p {
			out = append(out, p)
		}
	}
	return out
}

func TestDecodeErrorsChangeNothing(t *testing.T) {
	pool, seq, plan := newSession(t)
	defer pool.Close()
	defer plan.Close()
	dec, _ := NewDecoder(1)
	defer dec.Close()
	q := make([]float32, qHeads*headDim)
	_, err := dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q})
	must(t, err)
	before, _ := dec.Stats()
	cases := []struct {
		req    DecodeRequest
		status Status
		substr string
	}{
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q, TopkMode: TopkMass, TopkMass: 1.5}, ErrInvalid, "topk_mass"},
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q, TopkMode: TopkMode(5)}, ErrInvalid, "topk_mode"},
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q, TopkMode: TopkMass, TopkTokenBudget: 16, TopkMinTokens: 32}, ErrInvalid, "topk_min_tokens"},
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q, TopkScore: TopkScore(4), TopkTokenBudget: 16}, ErrInvalid, "topk_score"},
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q, Scale: -1}, ErrInvalid, "scale"},
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q, Softcap: float32(math.NaN())}, ErrInvalid, "softcap"},
		{DecodeRequest{Layer: 2, Seqs: []uint32{seq}, QHeads: qHeads, Q: q}, ErrRange, "layer"},
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, QueryTokens: MaxQueryTokens + 1,
			Q: make([]float32, (MaxQueryTokens+1)*qHeads*headDim)}, ErrInvalid, "n_query_tokens"},
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q[:10]}, ErrInvalid, "Q has 10 floats"},
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, QDType: DTypeF16, Q: q}, ErrInvalid, "Q16 has 0"},
		{DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q, OutDType: DType(9)}, ErrInvalid, "OutDType"},
		{DecodeRequest{Seqs: []uint32{seq, seq}, Plans: []*Plan{plan}, QHeads: qHeads, Q: append(q, q...)}, ErrInvalid, "1 plans for 2"},
		{DecodeRequest{QHeads: qHeads}, ErrInvalid, "0 sequences"},
	}
	for i, c := range cases {
		_, err := dec.Step(pool, c.req)
		if err == nil {
			t.Fatalf("case %d accepted", i)
		}
		expectErr(t, err, c.status, c.substr)
	}
	// A failed step leaves no selection to report; the counters count successes only.
	_, err = dec.LastSelection(0, 0)
	expectErr(t, err, ErrState, "ikv_decoder_last_selection")
	if after, _ := dec.Stats(); after.Steps != before.Steps || after.ListsBuilt != before.ListsBuilt {
		t.Fatalf("refused steps counted: %+v -> %+v", before, after)
	}
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, QHeads: qHeads, Q: q})
	must(t, err)
	_, err = dec.LastSelection(1, 0)
	expectErr(t, err, ErrRange, "seq_index")
	_, err = dec.LastSelection(0, kvHeads)
	expectErr(t, err, ErrRange, "kv_head")
	closed, _ := PlanFromRanges([]TokenRange{{0, 16}}, seqLen, page)
	closed.Close()
	_, err = dec.Step(pool, DecodeRequest{Seqs: []uint32{seq}, Plans: []*Plan{closed}, QHeads: qHeads, Q: q})
	expectErr(t, err, ErrState, "Plans[0] is a closed plan")
	cuda := &Pool{cfg: PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 64, Backend: BackendCUDA}}
	_, err = dec.Step(cuda, DecodeRequest{Seqs: []uint32{0}, QHeads: 1, Q: make([]float32, 64)})
	expectErr(t, err, ErrUnsupported, "CUDA pool")
	_, err = NewDecoder(1 << 20)
	expectErr(t, err, ErrInvalid, "n_threads")
	dec.Close()
	_, err = dec.Stats()
	expectErr(t, err, ErrNull, "decoder")
}
