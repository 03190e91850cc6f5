package intentkv

import (
	"math"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

func TestHalfAppendsReadBackRounded(t *testing.T) {
	const heads, dim, tokens = 2, 64, 40
	r := rand.New(rand.NewSource(11))
	k, v := randomFloats(r, tokens*heads*dim), randomFloats(r, tokens*heads*dim)
	for i := range k { // a wider range, and a few subnormal halves
		k[i] *= 8
		if i%97 == 0 {
			v[i] *= 1e-5
		}
	}
	cases := []struct {
		name     string
		dtype    DType
		format   Format
		bits     func(float32) uint16
		value    func(uint16) float32
		asFloats bool // append float32, let the library round
	}{
		{"F16 bits into F16 pages", DTypeF16, FormatF16, f16Bits, f16Float, false},
		{"BF16 bits into BF16 pages", DTypeBF16, FormatBF16, bf16Bits, bf16Float, false},
		{"F32 into F16 pages", DTypeF32, FormatF16, f16Bits, f16Float, true},
		{"F32 into BF16 pages", DTypeF32, FormatBF16, bf16Bits, bf16Float, true},
	}
	for _, c := range cases {
		pool := newTestPool(t, PoolConfig{Layers: 2, KVHeads: heads, HeadDim: dim, PageSize: 16, CapacityBytes: 8 << 20,
			DefaultFormat: c.format, KVDType: c.dtype})
		if cfg, _ := pool.Config(); cfg.KVDType != c.dtype || cfg.DefaultFormat != c.format {
			t.Fatalf("%s: config %+v", c.name, cfg)
		}
		seq, err := pool.SeqCreate()
		must(t, err)
		kb, vb := make([]uint16, len(k)), make([]uint16, len(v))
		for i := range k {
			kb[i], vb[i] = c.bits(k[i]), c.bits(v[i])
		}
		if c.asFloats {
			must(t, pool.Append(seq, 1, k, v))
		} else {
			must(t, pool.Append16(seq, 1, kb, vb))
			// the same values to every layer at once, [layer][token][head][dim]
			all := append(append([]uint16(nil), kb...), kb...)
			must(t, pool.AppendWith(seq, AppendArgs{Layer: AllLayers, K16: all, V16: all}))
		}
		gk, gv, err := pool.Read(seq, 1, 0, tokens)
		must(t, err)
		for i := range k {
			if gk[i] != c.value(kb[i]) || gv[i] != c.value(vb[i]) {
				t.Fatalf("%s: element %d: read %g, %g; the inputs rounded are %g, %g (from %g, %g)",
					c.name, i, gk[i], gv[i], c.value(kb[i]), c.value(vb[i]), k[i], v[i])
			}
		}
		if !c.asFloats {
			if n, _ := pool.LayerLength(seq, 0); n != tokens {
				t.Fatalf("%s: layer 0 holds %d tokens", c.name, n)
			}
			if n, _ := pool.LayerLength(seq, 1); n != 2*tokens {
				t.Fatalf("%s: layer 1 holds %d tokens", c.name, n)
			}
			g0, _, _ := pool.Read(seq, 0, 0, tokens)
			g1, _, _ := pool.Read(seq, 1, tokens, 2*tokens)
			if !reflect.DeepEqual(g0, gk) || !reflect.DeepEqual(g1, gk) {
				t.Fatalf("%s: the all-layers append stored other values", c.name)
			}
			// float32 input is refused by a 16-bit pool, and the reverse
			expectErr(t, pool.Append(seq, 0, k, v), ErrInvalid, "K16 and V16")
		} else {
			expectErr(t, pool.Append16(seq, 0, kb, vb), ErrInvalid, "[]float32")
		}
	}
}

func TestAppendBatchStridesAndFormatsEqualPlainAppends(t *testing.T) {
	const layers, dim, n, nseq = 2, 64, 5, 3
	cfg := PoolConfig{Layers: layers, KVHeads: 1, HeadDim: dim, PageSize: 8, CapacityBytes: 8 << 20, DefaultFormat: FormatINT8}
	batched, single := newTestPool(t, cfg), newTestPool(t, cfg)
	var seqs, ones []uint32
	for i := 0; i < nseq; i++ {
		a, err := batched.SeqCreate()
		must(t, err)
		b, err := single.SeqCreate()
		must(t, err)
		seqs, ones = append(seqs, a), append(ones, b)
	}
	// [layer][seq][token][head][dim], every value distinct
	data := make([]float32, layers*nseq*n*dim)
	for i := range data {
		data[i] = 0.001*float32(i) - 1
	}
	must(t, batched.AppendBatch(seqs, AppendArgs{Layer: AllLayers, K: data, V: data}))
	for i, s := range ones {
		var part []float32
		for l := 0; l < layers; l++ {
			start := (l*nseq + i) * n * dim
			part = append(part, data[start:start+n*dim]...)
		}
		must(t, single.Append(s, AllLayers, part, part))
	}
	// One token to layer 1 of each: padded rows (token stride dim+8) through
	// strides, against plain appends.
	padded := make([]float32, nseq*(dim+8))
	for i := range padded {
		padded[i] = 0.5 - 0.002*float32(i)
	}
	must(t, batched.AppendBatch(seqs, AppendArgs{Layer: 1, K: padded, V: padded, Tokens: 1, SeqStride: dim + 8}))
	for i, s := range ones {
		row := padded[i*(dim+8) : i*(dim+8)+dim]
		must(t, single.Append(s, 1, row, row))
	}
	for i := range seqs {
		for l := uint32(0); l < layers; l++ {
			length := uint32(n)
			if l == 1 {
				length++
			}
			ak, av, err := batched.Read(seqs[i], l, 0, length)
			must(t, err)
			bk, bv, err := single.Read(ones[i], l, 0, length)
			must(t, err)
			if !reflect.DeepEqual(ak, bk) || !reflect.DeepEqual(av, bv) {
				t.Fatalf("sequence %d layer %d: the batched append stored other values", i, l)
			}
		}
		if n, _ := batched.SeqLength(seqs[i]); n != 5 {
			t.Fatalf("sequence %d: length %d", i, n)
		}
	}
	must(t, batched.Sync()) // a CPU pool has nothing pending
	// A plan's formats for new pages.
	plan, err := PlanFromRangesFormat([]TokenRange{{0, 16}}, 16, 8, FormatINT4)
	must(t, err)
	defer plan.Close()
	fresh, err := batched.SeqCreate()
	must(t, err)
	kv := make([]float32, 16*dim)
	must(t, batched.AppendWith(fresh, AppendArgs{Layer: AllLayers, K: append(kv, kv...), V: append(kv, kv...), Formats: plan}))
	for page := uint32(0); page < 2; page++ {
		if f, _ := batched.PageFormat(fresh, page); f != FormatINT4 {
			t.Fatalf("page %d: %v, the plan says int4", page, f)
		}
	}
	// Refusals change nothing.
	before, _ := batched.Stats()
	err = batched.AppendBatch([]uint32{seqs[0], seqs[0]}, AppendArgs{Layer: 0, K: padded[:2*dim], V: padded[:2*dim]})
	expectErr(t, err, ErrInvalid, "listed twice")
	err = batched.AppendBatch(seqs, AppendArgs{Layer: 1, K: padded, V: padded, Tokens: 2, SeqStride: dim + 8})
	expectErr(t, err, ErrInvalid, "the strides reach element")
	err = batched.AppendWith(seqs[0], AppendArgs{Layer: 0, K: padded, V: padded, Tokens: 1, HeadStride: -1})
	expectErr(t, err, ErrInvalid, "negative")
	err = batched.AppendWith(seqs[0], AppendArgs{Layer: 0, K: padded, V: padded, TokenStride: 4})
	expectErr(t, err, ErrInvalid, "set Tokens")
	err = batched.AppendWith(seqs[0], AppendArgs{Layer: 0, K: padded, V: padded, Tokens: 2, TokenStride: 4})
	expectErr(t, err, ErrInvalid, "ikv_pool_append")
	err = batched.AppendWith(seqs[0], AppendArgs{Layer: 0, K: padded[:dim], V: padded[:dim], Flags: 0x80})
	expectErr(t, err, ErrInvalid, "flags")
	err = batched.AppendBatch(nil, AppendArgs{Layer: 0, K: padded[:dim], V: padded[:dim]})
	expectErr(t, err, ErrInvalid, "no sequences")
	err = batched.Append(seqs[1], 2, padded[:dim], padded[:dim])
	expectErr(t, err, ErrRange, "layer")
	if after, _ := batched.Stats(); after != before {
		t.Fatalf("refused appends changed the pool: %+v -> %+v", before, after)
	}
}

func TestReserve(t *testing.T) {
	const dim, page = 64, 8
	pool := newTestPool(t, PoolConfig{Layers: 1, KVHeads: 1, HeadDim: dim, PageSize: page, CapacityBytes: 8 << 20})
	seq, err := pool.SeqCreate()
	must(t, err)
	data := make([]float32, 5*dim)
	must(t, pool.Append(seq, 0, data, data))
	must(t, pool.Reserve([]uint32{seq}, 20)) // up to 25 tokens: 4 pages, allocated now
	if s, _ := pool.Stats(); s.PagesUsed != 4 {
		t.Fatalf("pages used %d with room, want 4", s.PagesUsed)
	}
	must(t, pool.Reserve([]uint32{seq}, 0))
	if s, _ := pool.Stats(); s.PagesUsed != 1 {
		t.Fatalf("pages used %d after the room ended, want 1", s.PagesUsed)
	}
	if err := pool.Reserve([]uint32{seq, seq}, 4); err == nil {
		t.Fatal("a sequence listed twice was accepted")
	}
}

func TestForkTruncateEvictFormatsStats(t *testing.T) {
	const dim, page = 64, 8
	pool := newTestPool(t, PoolConfig{Layers: 1, KVHeads: 1, HeadDim: dim, PageSize: page, CapacityBytes: 8 << 20})
	seq, err := pool.SeqCreate()
	must(t, err)
	data := make([]float32, 40*dim)
	for i := range data {
		data[i] = 0.01 * float32(i%300)
	}
	must(t, pool.Append(seq, 0, data, data))
	child, err := pool.Fork(seq)
	must(t, err)
	if n, _ := pool.SeqLength(child); n != 40 {
		t.Fatalf("fork length %d", n)
	}
	s, _ := pool.Stats()
	if s.PagesUsed != 5 || s.Sequences != 2 || s.TokensTotal != 80 {
		t.Fatalf("a fork shares its pages: %+v", s)
	}
	must(t, pool.Truncate(child, 5))
	pk, _, _ := pool.Read(seq, 0, 0, 40)
	ck, _, _ := pool.Read(child, 0, 0, 35)
	if n, _ := pool.SeqLength(child); n != 35 || !reflect.DeepEqual(ck, pk[:35*dim]) {
		t.Fatalf("truncated fork: %d tokens", n)
	}
	must(t, pool.Evict(seq, 0, 16))
	for _, c := range []struct {
		seq, token uint32
		evicted    bool
	}{{seq, 3, true}, {seq, 15, true}, {seq, 16, false}, {child, 3, false}} {
		if e, err := pool.IsEvicted(c.seq, c.token); err != nil || e != c.evicted {
			t.Fatalf("seq %d token %d: evicted %v, %v", c.seq, c.token, e, err)
		}
	}
	_, _, err = pool.Read(seq, 0, 0, 8)
	expectErr(t, err, ErrEvicted, "ikv_seq_read")
	_, err = pool.PageFormat(seq, 0)
	expectErr(t, err, ErrEvicted, "ikv_seq_page_format")
	expectErr(t, pool.Evict(seq, 3, 16), ErrInvalid, "ikv_seq_evict")
	expectErr(t, pool.Evict(seq, 40, 48), ErrRange, "ikv_seq_evict")
	expectErr(t, pool.SetPageFormat(seq, 2, FormatINT8), ErrShared, "ikv_seq_set_page_format")
	expectErr(t, pool.Truncate(seq, 41), ErrRange, "ikv_seq_truncate")
	if n, _ := pool.SeqLength(seq); n != 40 {
		t.Fatalf("refused calls changed the sequence: %d tokens", n)
	}
	must(t, pool.SeqDestroy(child))
	expectErr(t, pool.SeqDestroy(child), ErrNotFound, "ikv_seq_destroy")
	must(t, pool.SetPageFormat(seq, 2, FormatINT8))
	if f, _ := pool.PageFormat(seq, 2); f != FormatINT8 {
		t.Fatalf("page 2: %v", f)
	}
	// A plan's formats for every live, unshared, full page.
	plan, err := PlanFromRangesFormat([]TokenRange{{0, 40}}, 40, page, FormatINT4)
	must(t, err)
	defer plan.Close()
	must(t, pool.ApplyPlanFormats(seq, plan))
	for p := uint32(2); p < 5; p++ {
		if f, _ := pool.PageFormat(seq, p); f != FormatINT4 {
			t.Fatalf("page %d after the plan: %v", p, f)
		}
	}
	other, _ := PlanFromRanges(nil, 40, 16)
	defer other.Close()
	expectErr(t, pool.ApplyPlanFormats(seq, other), ErrInvalid, "page_size")
	s, err = pool.Stats()
	must(t, err)
	if s.Sequences != 1 || s.TokensTotal != 40 || s.PagesUsed != 3 || s.PagesByFormat[FormatINT4] != 3 {
		t.Fatalf("stats %+v", s)
	}
	sum := uint64(0)
	for f := Format(0); f < FormatCount; f++ {
		if s.BytesByFormat[f] != s.PagesByFormat[f]*pool.PageBytes(f) {
			t.Fatalf("%v: %d bytes for %d pages of %d", f, s.BytesByFormat[f], s.PagesByFormat[f], pool.PageBytes(f))
		}
		sum += s.BytesByFormat[f]
	}
	if sum != s.UsedBytes || s.ReservedBytes < s.UsedBytes || s.CapacityBytes != 8<<20 {
		t.Fatalf("stats %+v", s)
	}
	if pool.PageBytes(FormatF16) < 2*page*dim*2 || pool.PageBytes(FormatINT4) >= pool.PageBytes(FormatINT8) ||
		pool.PageBytes(Format(9)) != 0 {
		t.Fatalf("page bytes f16 %d int8 %d int4 %d", pool.PageBytes(FormatF16), pool.PageBytes(FormatINT8), pool.PageBytes(FormatINT4))
	}
}

func TestPageSummaryBoundsTheStoredKeys(t *testing.T) {
	const heads, dim, page = 2, 32, 16
	pool := newTestPool(t, PoolConfig{Layers: 2, KVHeads: heads, HeadDim: dim, PageSize: page, CapacityBytes: 8 << 20})
	seq, _ := pool.SeqCreate()
	r := rand.New(rand.NewSource(5))
	must(t, pool.Append(seq, AllLayers, randomFloats(r, 2*40*heads*dim), randomFloats(r, 2*40*heads*dim)))
	k, _, err := pool.Read(seq, 1, 0, 40)
	must(t, err)
	for pg := uint32(0); pg < 3; pg++ {
		s, err := pool.PageSummary(seq, 1, 1, pg)
		must(t, err)
		lo, hi := pg*page, pg*page+page
		if hi > 40 {
			hi = 40
		}
		if s.Tokens != hi-lo {
			t.Fatalf("page %d summarizes %d tokens", pg, s.Tokens)
		}
		for d := 0; d < dim; d++ {
			mn, mx, mean := math.Inf(1), math.Inf(-1), 0.0
			for tk := lo; tk < hi; tk++ {
				x := float64(k[(int(tk)*heads+1)*dim+d])
				mn, mx, mean = math.Min(mn, x), math.Max(mx, x), mean+x
			}
			mean /= float64(hi - lo)
			if s.KMin[d] != bf16Down(float32(mn)) || s.KMax[d] != bf16Up(float32(mx)) {
				t.Fatalf("page %d channel %d: [%g, %g], the keys' bounds rounded out are [%g, %g]",
					pg, d, s.KMin[d], s.KMax[d], bf16Down(float32(mn)), bf16Up(float32(mx)))
			}
			// rounded to the nearest bfloat16 (2^-9 relative), of a float32 mean
			if math.Abs(float64(s.KMean[d])-mean) > math.Abs(mean)/256+1e-6 {
				t.Fatalf("page %d channel %d: mean %g, the keys' %g", pg, d, s.KMean[d], mean)
			}
		}
	}
	_, err = pool.PageSummary(seq, 1, 2, 0)
	expectErr(t, err, ErrRange, "ikv_seq_page_summary")
	_, err = pool.PageSummary(seq+9, 1, 0, 0)
	expectErr(t, err, ErrNotFound, "ikv_seq_page_summary")
}

func TestPoolConfigAndErrors(t *testing.T) {
	def := DefaultPoolConfig()
	if def != (PoolConfig{Layers: 32, KVHeads: 8, HeadDim: 128, PageSize: 16, CapacityBytes: 1 << 30,
		DefaultFormat: FormatF16, KVDType: DTypeF32, Backend: BackendCPU}) {
		t.Fatalf("default pool config %+v", def)
	}
	_, err := NewPool(PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 65, PageSize: 16, CapacityBytes: 1 << 20})
	expectErr(t, err, ErrInvalid, "head_dim")
	_, err = NewPool(PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 64, PageSize: 16, CapacityBytes: 1 << 20, KVDType: DType(7)})
	expectErr(t, err, ErrInvalid, "kv_dtype")
	if info, _ := GetRuntimeInfo(); info.CUDADeviceCount == 0 {
		_, err = NewPool(PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 64, PageSize: 16, CapacityBytes: 1 << 20, Backend: BackendCUDA})
		expectErr(t, err, ErrNoDevice, "ikv_pool_create")
	}
	pool := newTestPool(t, PoolConfig{Layers: 2, KVHeads: 1, HeadDim: 64, PageSize: 16, CapacityBytes: 1 << 20})
	seq, _ := pool.SeqCreate()
	half := make([]float32, 64)
	for i := range half {
		half[i] = 0.5
	}
	must(t, pool.Append(seq, 0, half, half))
	if n, _ := pool.SeqLength(seq); n != 0 { // layer 1 has no token yet
		t.Fatalf("length %d with one layer appended", n)
	}
	must(t, pool.Append(seq, 1, half, half))
	_, _, err = pool.Read(seq, 0, 0, 2)
	expectErr(t, err, ErrRange, "ikv_seq_read")
	_, err = pool.SeqLength(seq + 99)
	expectErr(t, err, ErrNotFound, "ikv_seq_length")
	_, err = pool.LayerLength(seq, 2)
	expectErr(t, err, ErrRange, "layer")
	bad := append([]float32(nil), half...)
	bad[17] = float32(math.NaN())
	expectErr(t, pool.Append(seq, 0, bad, half), ErrInvalid, "ikv_pool_append")
	expectErr(t, pool.Append(seq, 0, half[:10], half[:10]), ErrInvalid, "multiple of 64")
	expectErr(t, pool.Append(seq, 0, half, half[:10]), ErrInvalid, "V 10")
	_, err = pool.Fork(seq + 99)
	expectErr(t, err, ErrNotFound, "ikv_seq_fork")
	if n, _ := pool.SeqLength(seq); n != 1 {
		t.Fatalf("refused calls changed the sequence: %d tokens", n)
	}
	// A pool of capacity for one page refuses the second.
	tiny := newTestPool(t, PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 64, PageSize: 16, CapacityBytes: pool.PageBytes(FormatF16) / 2})
	s2, _ := tiny.SeqCreate()
	many := make([]float32, 32*64)
	expectErr(t, tiny.Append(s2, 0, many, many), ErrNoMem, "ikv_pool_append")
	pool.Close()
	_, err = pool.Stats()
	expectErr(t, err, ErrNull, "pool")
	expectErr(t, pool.Append(seq, 0, half, half), ErrNull, "pool")
}

// A new sequence of 20 tokens in both layers of a 2-layer, head_dim 64, page 8
// pool: pages 0 and 1 full, page 2 partial.
func appendTwentyTokens(t *testing.T, pool *Pool) uint32 {
	t.Helper()
	seq, err := pool.SeqCreate()
	must(t, err)
	data := make([]float32, 2*20*64)
	for i := range data {
		data[i] = 0.01 * float32(i)
	}
	must(t, pool.Append(seq, AllLayers, data, data))
	return seq
}

func TestHostTierOnCPUPool(t *testing.T) {
	_, err := NewPool(PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 64, PageSize: 8, CapacityBytes: 8 << 20, HostCapacityBytes: 1 << 20})
	expectErr(t, err, ErrInvalid, "host_capacity_bytes")
	if def := DefaultPoolConfig(); def.HostCapacityBytes != 0 {
		t.Fatalf("default host_capacity_bytes %d", def.HostCapacityBytes)
	}
	pool := newTestPool(t, PoolConfig{Layers: 2, KVHeads: 1, HeadDim: 64, PageSize: 8, CapacityBytes: 8 << 20})
	if cfg, _ := pool.Config(); cfg.HostCapacityBytes != 0 {
		t.Fatalf("config host_capacity_bytes %d", cfg.HostCapacityBytes)
	}
	seq := appendTwentyTokens(t, pool)
	before, err := pool.Stats()
	must(t, err)
	if before.HostUsedBytes != 0 || before.HostPages != 0 || before.BytesOffloaded != 0 || before.BytesFetched != 0 {
		t.Fatalf("host tier stats of a CPU pool: %+v", before)
	}
	storedK, storedV, err := pool.Read(seq, 1, 0, 20)
	must(t, err)
	for name, move := range map[string]func(seq, begin, end uint32) (uint32, error){"Offload": pool.Offload, "Fetch": pool.Fetch} {
		n, err := move(seq, 0, 20)
		expectErr(t, err, ErrUnsupported, "host tier")
		if n != 0 {
			t.Fatalf("%s moved %d pages on a CPU pool", name, n)
		}
		if after, _ := pool.Stats(); after != before {
			t.Fatalf("a refused %s changed the stats: %+v, before %+v", name, after, before)
		}
	}
	for page := uint32(0); page < 3; page++ {
		tier, err := pool.PageTier(seq, page)
		must(t, err)
		if tier != TierDevice || tier.String() != "device" {
			t.Fatalf("page %d: tier %v", page, tier)
		}
	}
	_, err = pool.PageTier(seq, 3)
	expectErr(t, err, ErrRange, "ikv_seq_page_tier")
	_, err = pool.PageTier(seq+99, 0)
	expectErr(t, err, ErrNotFound, "")
	if after, _ := pool.Stats(); after != before {
		t.Fatalf("stats changed: %+v, before %+v", after, before)
	}
	k, v, err := pool.Read(seq, 1, 0, 20)
	must(t, err)
	if !reflect.DeepEqual(k, storedK) || !reflect.DeepEqual(v, storedV) {
		t.Fatal("refused moves changed the stored values")
	}
	if TierHost.String() != "host" {
		t.Fatalf("TierHost is %q", TierHost)
	}
}

func TestTierPolicyOnCPUPool(t *testing.T) {
	pool := newTestPool(t, PoolConfig{Layers: 2, KVHeads: 1, HeadDim: 64, PageSize: 8, CapacityBytes: 8 << 20})
	seq := appendTwentyTokens(t, pool)
	before, err := pool.Stats()
	must(t, err)
	if before.HostPageReads != 0 || before.HostReservedBytes != 0 {
		t.Fatalf("host page reads / host reserved bytes of a CPU pool: %d / %d", before.HostPageReads,
			before.HostReservedBytes)
	}
	storedK, storedV, err := pool.Read(seq, 1, 0, 20)
	must(t, err)

	// The policy's fields are checked before the pool: ErrInvalid naming the field.
	bad := []struct {
		policy TierPolicy
		field  string
	}{
		{TierPolicy{DeviceHigh: 1.5}, "policy->device_high"},
		{TierPolicy{DeviceHigh: -0.25}, "policy->device_high"},
		{TierPolicy{DeviceHigh: float32(math.NaN())}, "policy->device_high"},
		{TierPolicy{DeviceHigh: 0.5, DeviceLow: 0.75}, "policy->device_low"},
		{TierPolicy{DeviceLow: -1}, "policy->device_low"},
		{TierPolicy{Flags: 0x2}, "policy->flags"},
	}
	for _, c := range bad {
		policy := c.policy
		e := expectErr(t, pool.SetTierPolicy(&policy), ErrInvalid, c.field)
		if !strings.Contains(e.Message, "ikv_pool_set_tier_policy") {
			t.Fatalf("%+v: %v", c.policy, e)
		}
	}
	// Valid policies (the zero value is the default one), and turning it off: a CPU pool has no host tier.
	for _, policy := range []*TierPolicy{{}, {IdleSteps: 4, DeviceHigh: 0.8, DeviceLow: 0.5},
		{DeviceHigh: 1, DeviceLow: 1}, {DeviceHigh: 0.5}, {Flags: TierNoPrefetch}, nil} {
		e := expectErr(t, pool.SetTierPolicy(policy), ErrUnsupported, "host tier")
		if !strings.Contains(e.Message, "ikv_pool_set_tier_policy") {
			t.Fatalf("%+v: %v", policy, e)
		}
	}

	// TierStep: with or without plans, no sequences, an unknown sequence (the pool is checked first).
	plan, err := PlanFromRanges([]TokenRange{{0, 8}, {16, 20}}, 20, 8)
	must(t, err)
	defer plan.Close()
	steps := []struct {
		seqs  []uint32
		plans []*Plan
	}{
		{[]uint32{seq}, nil}, {[]uint32{seq}, []*Plan{plan}}, {[]uint32{seq}, []*Plan{nil}},
		{nil, nil}, {[]uint32{}, []*Plan{}}, {[]uint32{seq + 99}, nil},
	}
	for _, s := range steps {
		r, err := pool.TierStep(s.seqs, s.plans)
		e := expectErr(t, err, ErrUnsupported, "host tier")
		if !strings.Contains(e.Message, "ikv_pool_tier_step") || r != (TierStepReport{}) {
			t.Fatalf("TierStep(%v, %v): %+v, %v", s.seqs, s.plans, r, e)
		}
	}
	_, err = pool.TierStep([]uint32{seq}, []*Plan{plan, nil})
	expectErr(t, err, ErrInvalid, "Pool.TierStep: 2 plans for 1 sequences")
	closedPlan, err := PlanFromRanges([]TokenRange{{0, 8}}, 20, 8)
	must(t, err)
	closedPlan.Close()
	_, err = pool.TierStep([]uint32{seq}, []*Plan{closedPlan})
	expectErr(t, err, ErrState, "closed plan")
	expectErr(t, pool.ApplyPlanFormats(seq, closedPlan), ErrState, "closed plan")

	if after, _ := pool.Stats(); after != before {
		t.Fatalf("refused tier calls changed the stats: %+v, before %+v", after, before)
	}
	k, v, err := pool.Read(seq, 1, 0, 20)
	must(t, err)
	if !reflect.DeepEqual(k, storedK) || !reflect.DeepEqual(v, storedV) {
		t.Fatal("refused tier calls changed the stored values")
	}
	for page := uint32(0); page < 3; page++ {
		if tier, err := pool.PageTier(seq, page); err != nil || tier != TierDevice {
			t.Fatalf("page %d: tier %v, %v", page, tier, err)
		}
	}

	// A closed pool reaches the library as NULL.
	closed, err := NewPool(PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 64, PageSize: 8, CapacityBytes: 1 << 20})
	must(t, err)
	closed.Close()
	expectErr(t, closed.SetTierPolicy(&TierPolicy{}), ErrNull, "ikv_pool_set_tier_policy")
	_, err = closed.TierStep(nil, nil)
	expectErr(t, err, ErrNull, "ikv_pool_tier_step")
}
