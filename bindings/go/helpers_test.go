package intentkv

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// f16Bits rounds x to the nearest IEEE half (ties to even), plainly in
// float64 (exact: only scalings by powers of two). Finite |x| < 65520 only.
func f16Bits(x float32) uint16 {
	v := float64(x)
	var sign uint16
	if math.Signbit(v) {
		sign, v = 0x8000, -v
	}
	if v < math.Ldexp(1, -14) { // subnormal (or zero): units of 2^-24
		return sign | uint16(math.RoundToEven(math.Ldexp(v, 24)))
	}
	_, e := math.Frexp(v) // v = f * 2^e, f in [0.5, 1)
	e--                   // v in [2^e, 2^(e+1))
	m := uint32(math.RoundToEven(math.Ldexp(v, 10-e)))
	if m == 2048 {
		m, e = 1024, e+1
	}
	return sign | uint16(uint32(e+15)<<10) | uint16(m-1024)
}

// f16Float is the value of half bits h.
func f16Float(h uint16) float32 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e, m := int(h>>10)&31, float64(h&1023)
	if e == 0 {
		return float32(sign * math.Ldexp(m, -24))
	}
	return float32(sign * math.Ldexp(1024+m, e-25))
}

// bf16Bits rounds x to the nearest bfloat16 (ties to even); finite x only.
func bf16Bits(x float32) uint16 {
	b := math.Float32bits(x)
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

func bf16Float(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// bf16Down / bf16Up round x to a bfloat16 toward -inf / +inf.
func bf16Down(x float32) float32 {
	t := math.Float32frombits(math.Float32bits(x) &^ 0xffff) // toward zero
	if t > x {                                               // negative x: one ulp further from zero
		t = math.Float32frombits(math.Float32bits(t) + 0x10000)
	}
	return t
}

func bf16Up(x float32) float32 { return -bf16Down(-x) }

// relL2 is ||got - want|| / ||want||.
func relL2(got []float32, want []float64) float64 {
	num, den := 0.0, 0.0
	for i := range want {
		d := float64(got[i]) - want[i]
		num += d * d
		den += want[i] * want[i]
	}
	return math.Sqrt(num / den)
}

// attend is float64 attention of one query row over the rows of k and v
// (each [n][dim]) with the given scale and softcap; it returns out and the
// natural log of the softmax denominator (-Inf and zeros for no key).
func attend(q []float64, k, v [][]float32, scale, softcap float64) ([]float64, float64) {
	out := make([]float64, len(q))
	if len(k) == 0 {
		return out, math.Inf(-1)
	}
	logits := make([]float64, len(k))
	top := math.Inf(-1)
	for i := range k {
		s := 0.0
		for d := range q {
			s += q[d] * float64(k[i][d])
		}
		s *= scale
		if softcap > 0 {
			s = softcap * math.Tanh(s/softcap)
		}
		logits[i] = s
		top = math.Max(top, s)
	}
	den := 0.0
	for i := range k {
		w := math.Exp(logits[i] - top)
		den += w
		for d := range out {
			out[d] += w * float64(v[i][d])
		}
	}
	for d := range out {
		out[d] /= den
	}
	return out, top + math.Log(den)
}

// rowsOf slices a [token][kv_head][dim] array into the rows of one kv-head at the given tokens.
func rowsOf(x []float32, tokens []uint32, heads, head, dim int) [][]float32 {
	out := make([][]float32, len(tokens))
	for i, t := range tokens {
		base := (int(t)*heads + head) * dim
		out[i] = x[base : base+dim]
	}
	return out
}

func planTokens(t *testing.T, p *Plan) []uint32 {
	t.Helper()
	pages, err := p.Pages()
	if err != nil {
		t.Fatal(err)
	}
	var out []uint32
	for _, pg := range pages {
		for tk := pg.TokenBegin; tk < pg.TokenEnd; tk++ {
			out = append(out, tk)
		}
	}
	return out
}

func runTokens(runs []TokenRange) []uint32 {
	var out []uint32
	for _, r := range runs {
		for tk := r.Begin; tk < r.End; tk++ {
			out = append(out, tk)
		}
	}
	return out
}

func span(begin, end uint32) []uint32 {
	out := make([]uint32, 0, end-begin)
	for t := begin; t < end; t++ {
		out = append(out, t)
	}
	return out
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// expectErr checks that err is an *Error with this status, whose name is
// the status's and whose sentence contains substr.
func expectErr(t *testing.T, err error, status Status, substr string) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("expected %v (%q), got %v", status, substr, err)
	}
	if e.Status != status || e.Name != status.String() || !errors.Is(err, status) || !strings.Contains(e.Message, substr) {
		t.Fatalf("expected %v containing %q, got %v (status %d)", status, substr, err, int(e.Status))
	}
	if !strings.HasPrefix(err.Error(), status.String()+": ") {
		t.Fatalf("Error() = %q", err.Error())
	}
	return e
}

func newTestPool(t *testing.T, cfg PoolConfig) *Pool {
	t.Helper()
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
