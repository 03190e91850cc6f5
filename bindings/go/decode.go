package intentkv

/*
#include <stdlib.h>
#include <intentkv.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// MaxQueryTokens is the most query tokens one step may carry (IKV_MAX_QUERY_TOKENS).
const MaxQueryTokens = C.IKV_MAX_QUERY_TOKENS

// TopkScore is what query-aware selection ranks pages by (ikv_topk_score).
type TopkScore int

const (
	TopkQuest  TopkScore = C.IKV_TOPK_SCORE_QUEST
	TopkHybrid TopkScore = C.IKV_TOPK_SCORE_HYBRID
	TopkKeys   TopkScore = C.IKV_TOPK_SCORE_KEYS // hybrid candidates ranked again by their keys
)

func (s TopkScore) String() string {
	switch s {
	case TopkQuest:
		return "QUEST"
	case TopkHybrid:
		return "HYBRID"
	case TopkKeys:
		return "KEYS"
	}
	return fmt.Sprintf("TopkScore(%d)", int(s))
}

// TopkMode is how query-aware selection sizes its budget (ikv_topk_mode).
type TopkMode int

const (
	TopkFixed TopkMode = C.IKV_TOPK_FIXED // TopkTokenBudget tokens (off when it is 0)
	TopkMass  TopkMode = C.IKV_TOPK_MASS  // the budget covers TopkMass of the bounds' estimated attention mass
)

func (m TopkMode) String() string {
	switch m {
	case TopkFixed:
		return "FIXED"
	case TopkMass:
		return "MASS"
	}
	return fmt.Sprintf("TopkMode(%d)", int(m))
}

// DecodeRequest is one decode step at one layer for a batch of sequences
// (ikv_decode_args). Queries are [seq][query_token][q_head][head_dim], the
// outputs laid out alike, LSE [seq][query_token][q_head]. Query token t of
// a sequence of L stored tokens (at Layer) sits at position
// L - QueryTokens + t and attends causally. Zero values are the library's
// defaults, except that TopkMass 0 means its default 0.9.
type DecodeRequest struct {
	Layer  uint32
	Seqs   []uint32
	Plans  []*Plan // one per sequence (nil entries: dense), or empty: all dense
	QHeads uint32  // a multiple of the pool's KVHeads
	// QueryTokens per sequence, 1..MaxQueryTokens; 0 means 1.
	QueryTokens uint32
	QDType      DType     // F32: Q; F16/BF16: Q16
	Q           []float32 // queries for QDType F32
	Q16         []uint16  // queries for QDType F16/BF16, raw bits
	OutDType    DType     // F32: DecodeResult.Out; F16/BF16: DecodeResult.Out16
	LSE         bool      // also return the log of each softmax denominator (DecodeResult.LSE)
	Scale       float32   // 0: 1/sqrt(head_dim)
	Softcap     float32   // 0: off; else logits become Softcap*tanh(logit/Softcap)

	// Query-aware selection (see the header's ikv_decode_args).
	TopkTokenBudget    uint32
	TopkScore          TopkScore
	TopkMode           TopkMode
	TopkMass           float32 // TopkMass mode: the share to cover, in (0, 1]; 0 means 0.9
	TopkMinTokens      uint32  // TopkMass mode: fewest tokens a selection keeps
	QueryMemory        *QueryMemory
	Feedback           *PageFeedback // receives the mass each read page got
	TopkFeedbackWeight float32       // > 0: the feedback's averages are a prior of selection, in [0, 1]
}

// DecodeResult is what a step wrote.
type DecodeResult struct {
	Out   []float32 // OutDType F32
	Out16 []uint16  // OutDType F16/BF16: raw bits
	LSE   []float32 // with DecodeRequest.LSE; -Inf for a query with no key to read
}

// Decoder is an ikv_decoder: worker threads and scratch for decode steps.
// One decoder serves one goroutine at a time; several decoders may decode
// one pool concurrently.
type Decoder struct{ raw *C.ikv_decoder }

// NewDecoder creates a decoder with n_threads CPU worker threads including
// the caller (0: hardware threads); that is the whole ikv_decoder_config.
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

// Decode runs the step and returns the float32 output, laid out as Q
// (OutDType must be F32; use Step for the LSE or 16-bit outputs).
func (d *Decoder) Decode(p *Pool, r DecodeRequest) ([]float32, error) {
	if r.OutDType != DTypeF32 {
		return nil, bindErr(ErrInvalid, "Decoder.Decode: OutDType %v: use Decoder.Step for 16-bit outputs", r.OutDType)
	}
	res, err := d.Step(p, r)
	return res.Out, err
}

// Step runs one decode step (ikv_decode). Nothing is written on error.
func (d *Decoder) Step(p *Pool, r DecodeRequest) (DecodeResult, error) {
	defer runtime.KeepAlive(d)
	defer runtime.KeepAlive(p)
	defer runtime.KeepAlive(r.Plans)
	defer runtime.KeepAlive(r.QueryMemory)
	defer runtime.KeepAlive(r.Feedback)
	const m = "Decoder.Step"
	if p == nil {
		return DecodeResult{}, bindErr(ErrNull, "%s: the pool is nil", m)
	}
	if p.cfg.Backend == BackendCUDA {
		return DecodeResult{}, bindErr(ErrUnsupported, "%s: a CUDA pool decodes device buffers; this binding passes host memory", m)
	}
	nqt := r.QueryTokens
	if nqt == 0 {
		nqt = 1
	}
	if len(r.Seqs) == 0 || r.QHeads == 0 {
		return DecodeResult{}, bindErr(ErrInvalid, "%s: %d sequences and %d query heads: both must be positive", m, len(r.Seqs), r.QHeads)
	}
	rows := len(r.Seqs) * int(nqt) * int(r.QHeads)
	n := rows * int(p.cfg.HeadDim)
	var cq unsafe.Pointer
	switch r.QDType {
	case DTypeF32:
		if len(r.Q) != n || r.Q16 != nil {
			return DecodeResult{}, bindErr(ErrInvalid, "%s: Q has %d floats (Q16 %d) for %d sequences of %d query tokens of %d query heads of head_dim %d",
				m, len(r.Q), len(r.Q16), len(r.Seqs), nqt, r.QHeads, p.cfg.HeadDim)
		}
		cq = unsafe.Pointer(cFloats(r.Q))
	case DTypeF16, DTypeBF16:
		if len(r.Q16) != n || r.Q != nil {
			return DecodeResult{}, bindErr(ErrInvalid, "%s: Q16 has %d elements (Q %d) for %d sequences of %d query tokens of %d query heads of head_dim %d",
				m, len(r.Q16), len(r.Q), len(r.Seqs), nqt, r.QHeads, p.cfg.HeadDim)
		}
		cq = cHalves(r.Q16)
	default:
		return DecodeResult{}, bindErr(ErrInvalid, "%s: QDType %v", m, r.QDType)
	}
	defer C.free(cq)
	outSize := uintptr(4)
	switch r.OutDType {
	case DTypeF32:
	case DTypeF16, DTypeBF16:
		outSize = 2
	default:
		return DecodeResult{}, bindErr(ErrInvalid, "%s: OutDType %v", m, r.OutDType)
	}
	cout := cAlloc(n, outSize)
	defer C.free(cout)
	seqs := (*C.ikv_seq_id)(cAlloc(len(r.Seqs), 4))
	defer C.free(unsafe.Pointer(seqs))
	for i, s := range r.Seqs {
		unsafe.Slice(seqs, len(r.Seqs))[i] = C.ikv_seq_id(s)
	}
	a := C.ikv_decode_args_default_v3()
	if len(r.Plans) > 0 {
		if len(r.Plans) != len(r.Seqs) {
			return DecodeResult{}, bindErr(ErrInvalid, "%s: %d plans for %d sequences", m, len(r.Plans), len(r.Seqs))
		}
		plans := (**C.ikv_plan)(cAlloc(len(r.Plans), unsafe.Sizeof(uintptr(0))))
		defer C.free(unsafe.Pointer(plans))
		for i, pl := range r.Plans {
			var raw *C.ikv_plan
			if pl != nil {
				if pl.raw == nil {
					return DecodeResult{}, bindErr(ErrState, "%s: Plans[%d] is a closed plan", m, i)
				}
				raw = pl.raw
			}
			unsafe.Slice(plans, len(r.Plans))[i] = raw
		}
		a.plans = plans
	}
	var lse *C.float
	if r.LSE {
		lse = (*C.float)(cAlloc(rows, 4))
		defer C.free(unsafe.Pointer(lse))
		a.lse = lse
	}
	if r.QueryMemory != nil {
		if r.QueryMemory.raw == nil {
			return DecodeResult{}, bindErr(ErrState, "%s: QueryMemory is closed", m)
		}
		if err := r.QueryMemory.closedPool(m); err != nil {
			return DecodeResult{}, err
		}
		if r.QueryMemory.pool != p {
			return DecodeResult{}, bindErr(ErrInvalid, "%s: QueryMemory was made for another pool", m)
		}
		a.query_memory = r.QueryMemory.raw
	}
	if r.Feedback != nil {
		if r.Feedback.raw == nil {
			return DecodeResult{}, bindErr(ErrState, "%s: Feedback is closed", m)
		}
		if err := r.Feedback.closedPool(m); err != nil {
			return DecodeResult{}, err
		}
		if r.Feedback.pool != p {
			return DecodeResult{}, bindErr(ErrInvalid, "%s: Feedback was made for another pool", m)
		}
		a.feedback = r.Feedback.raw
	}
	a.layer, a.n_seqs, a.n_q_heads, a.n_query_tokens = C.uint32_t(r.Layer), C.uint32_t(len(r.Seqs)), C.uint32_t(r.QHeads), C.uint32_t(nqt)
	a.seqs = seqs
	a.q, a.q_dtype = cq, C.ikv_dtype(r.QDType)
	a.out, a.out_dtype = cout, C.ikv_dtype(r.OutDType)
	a.scale, a.softcap = C.float(r.Scale), C.float(r.Softcap)
	a.topk_token_budget = C.uint32_t(r.TopkTokenBudget)
	a.topk_score = C.ikv_topk_score(r.TopkScore)
	a.topk_mode = C.ikv_topk_mode(r.TopkMode)
	if r.TopkMass != 0 {
		a.topk_mass = C.float(r.TopkMass)
	}
	a.topk_min_tokens = C.uint32_t(r.TopkMinTokens)
	a.topk_feedback_weight = C.float(r.TopkFeedbackWeight)
	if err := call(func() C.ikv_status { return C.ikv_decode(d.raw, p.raw, &a) }); err != nil {
		return DecodeResult{}, err
	}
	var res DecodeResult
	if outSize == 4 {
		res.Out = goFloats((*C.float)(cout), n)
	} else {
		res.Out16 = append([]uint16(nil), unsafe.Slice((*uint16)(cout), n)...)
	}
	if r.LSE {
		res.LSE = goFloats(lse, rows)
	}
	return res, nil
}

// LastSelection is the token ranges the last step read for sequence index
// seqIndex (into its Seqs) and kvHead, as maximal runs in ascending order.
func (d *Decoder) LastSelection(seqIndex, kvHead uint32) ([]TokenRange, error) {
	defer runtime.KeepAlive(d)
	var n C.size_t
	if err := call(func() C.ikv_status {
		return C.ikv_decoder_last_selection(d.raw, C.uint32_t(seqIndex), C.uint32_t(kvHead), nil, 0, &n)
	}); err != nil {
		return nil, err
	}
	count := int(n)
	runs := (*C.ikv_token_range)(cAlloc(count, C.sizeof_ikv_token_range))
	defer C.free(unsafe.Pointer(runs))
	if err := call(func() C.ikv_status {
		return C.ikv_decoder_last_selection(d.raw, C.uint32_t(seqIndex), C.uint32_t(kvHead), runs, C.size_t(count), &n)
	}); err != nil {
		return nil, err
	}
	if int(n) < count {
		count = int(n)
	}
	out := make([]TokenRange, count)
	for i, r := range unsafe.Slice(runs, count) {
		out[i] = TokenRange{uint32(r.begin), uint32(r.end)}
	}
	return out, nil
}

// LastBytesRead is the K/V bytes (scales and scored key summaries included)
// the last successful step read.
func (d *Decoder) LastBytesRead() (uint64, error) {
	defer runtime.KeepAlive(d)
	var b C.uint64_t
	err := call(func() C.ikv_status { return C.ikv_decoder_last_bytes_read(d.raw, &b) })
	return uint64(b), err
}

// DecoderStats is ikv_decoder_stats: counters since the decoder was created.
type DecoderStats struct {
	Steps         uint64 // successful steps
	ListsBuilt    uint64 // of them, steps that built their page lists
	ListsReused   uint64 // steps that reused the previous step's lists
	LastBytesRead uint64 // as LastBytesRead
}

// Stats is ikv_decoder_get_stats.
func (d *Decoder) Stats() (DecoderStats, error) {
	defer runtime.KeepAlive(d)
	var s C.ikv_decoder_stats
	s.struct_size = C.uint32_t(C.sizeof_ikv_decoder_stats)
	if err := call(func() C.ikv_status { return C.ikv_decoder_get_stats(d.raw, &s) }); err != nil {
		return DecoderStats{}, err
	}
	return DecoderStats{uint64(s.steps), uint64(s.lists_built), uint64(s.lists_reused), uint64(s.last_bytes_read)}, nil
}

// Close frees the decoder. Idempotent.
func (d *Decoder) Close() {
	if d.raw != nil {
		C.ikv_decoder_destroy(d.raw)
		d.raw = nil
	}
}

// ---------------------------------------------------------------- query memory

// QueryMemory is an ikv_query_memory: what earlier turns of each sequence
// asked, so that query-aware selection (DecodeRequest.QueryMemory) keeps
// what mattered a turn ago. On CUDA pools the recall runs on the device
// (EndTurn writes a device copy and waits for the device). Changing calls need
// exclusive access, also against decodes that use the memory. Close it before
// its pool.
type QueryMemory struct {
	raw    *C.ikv_query_memory
	pool   *Pool // kept reachable: the pool must outlive the memory
	qHeads uint32
}

// QueryMemoryConfig is ikv_query_memory_config. Start from
// DefaultQueryMemoryConfig and change fields by name: a zero Turns is the
// mean form, not the default.
type QueryMemoryConfig struct {
	// QHeads is the model's query heads: a positive multiple of the pool's KVHeads.
	QHeads uint32
	// Decay is the recalled queries' weight (Turns >= 1), or that of a turn
	// one turn older (Turns 0); in (0, 1); 0 means the default 0.5.
	Decay float32
	// Turns is how many ended turns are kept apart, 1..64, the oldest
	// dropped first: a decode recalls, per query head, the kept turn whose
	// mean query is the most similar (cosine) to its current query. 0 keeps
	// one mean of the turns weighted Decay^age (the first version's memory).
	// Default 4.
	Turns uint32
}

// DefaultQueryMemoryConfig is ikv_query_memory_default_config's values
// (QHeads 0, to be set; Decay 0.5; Turns 4).
func DefaultQueryMemoryConfig() QueryMemoryConfig {
	c := C.ikv_query_memory_default_config_v2()
	return QueryMemoryConfig{QHeads: uint32(c.n_q_heads), Decay: float32(c.decay), Turns: uint32(c.turns)}
}

// NewQueryMemory creates a memory for the sequences of pool, for qHeads
// query heads (a positive multiple of the pool's KVHeads) and a decay in
// (0, 1) (0 means the default 0.5), keeping the default 4 turns apart
// (NewQueryMemoryWith sets Turns).
func NewQueryMemory(pool *Pool, qHeads uint32, decay float32) (*QueryMemory, error) {
	cfg := DefaultQueryMemoryConfig()
	cfg.QHeads, cfg.Decay = qHeads, decay
	return NewQueryMemoryWith(pool, cfg)
}

// NewQueryMemoryWith creates a memory for the sequences of pool
// (ikv_query_memory_create). Out-of-range fields return ErrInvalid naming
// the field (n_q_heads, decay, turns).
func NewQueryMemoryWith(pool *Pool, cfg QueryMemoryConfig) (*QueryMemory, error) {
	defer runtime.KeepAlive(pool)
	// cgo cannot call the header's function-like macro ikv_query_memory_default_config(): its v2 symbol.
	c := C.ikv_query_memory_default_config_v2()
	c.n_q_heads = C.uint32_t(cfg.QHeads)
	if cfg.Decay != 0 {
		c.decay = C.float(cfg.Decay)
	}
	c.turns = C.uint32_t(cfg.Turns)
	m := &QueryMemory{pool: pool, qHeads: cfg.QHeads}
	if err := call(func() C.ikv_status { return C.ikv_query_memory_create(pool.ptr(), &c, &m.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(m, (*QueryMemory).Close)
	return m, nil
}

func (m *QueryMemory) closedPool(method string) error {
	if m.raw != nil && m.pool.raw == nil {
		return bindErr(ErrState, "%s: the memory's pool was closed", method)
	}
	return nil
}

// Remember adds query tokens of seq at layer to its current turn: q is
// [token][q_head][head_dim] float32, unscaled, as passed to a decode.
func (m *QueryMemory) Remember(seq, layer uint32, q []float32) error {
	return m.remember("QueryMemory.Remember", seq, layer, len(q), DTypeF32, func() unsafe.Pointer { return unsafe.Pointer(cFloats(q)) })
}

// Remember16 is Remember for F16 or BF16 queries (raw bits of dtype).
func (m *QueryMemory) Remember16(seq, layer uint32, q []uint16, dtype DType) error {
	if dtype != DTypeF16 && dtype != DTypeBF16 {
		return bindErr(ErrInvalid, "QueryMemory.Remember16: dtype %v: 16-bit queries are F16 or BF16", dtype)
	}
	return m.remember("QueryMemory.Remember16", seq, layer, len(q), dtype, func() unsafe.Pointer { return cHalves(q) })
}

func (m *QueryMemory) remember(method string, seq, layer uint32, n int, dtype DType, copyIn func() unsafe.Pointer) error {
	defer runtime.KeepAlive(m)
	if err := m.closedPool(method); err != nil {
		return err
	}
	row := int(m.qHeads) * int(m.pool.cfg.HeadDim)
	if row == 0 || n%row != 0 {
		return bindErr(ErrInvalid, "%s: q has %d elements, not a multiple of n_q_heads*head_dim = %d", method, n, row)
	}
	cq := copyIn()
	defer C.free(cq)
	return call(func() C.ikv_status {
		return C.ikv_query_memory_remember(m.raw, C.ikv_seq_id(seq), C.uint32_t(layer), cq, C.ikv_dtype(dtype), C.uint32_t(n/row))
	})
}

// EndTurn ends seq's current turn: its mean query joins the memory.
func (m *QueryMemory) EndTurn(seq uint32) error {
	defer runtime.KeepAlive(m)
	if err := m.closedPool("QueryMemory.EndTurn"); err != nil {
		return err
	}
	return call(func() C.ikv_status { return C.ikv_query_memory_end_turn(m.raw, C.ikv_seq_id(seq)) })
}

// Forget forgets seq (all turns, and its current one).
func (m *QueryMemory) Forget(seq uint32) error {
	defer runtime.KeepAlive(m)
	if err := m.closedPool("QueryMemory.Forget"); err != nil {
		return err
	}
	return call(func() C.ikv_status { return C.ikv_query_memory_forget(m.raw, C.ikv_seq_id(seq)) })
}

// Reset forgets every sequence.
func (m *QueryMemory) Reset() error {
	defer runtime.KeepAlive(m)
	if err := m.closedPool("QueryMemory.Reset"); err != nil {
		return err
	}
	return call(func() C.ikv_status { return C.ikv_query_memory_reset(m.raw) })
}

// Close frees the memory. Idempotent.
func (m *QueryMemory) Close() {
	if m.raw != nil {
		C.ikv_query_memory_destroy(m.raw)
		m.raw = nil
	}
}

// ---------------------------------------------------------------- page feedback

// PageFeedback is an ikv_page_feedback: the attention mass each page a
// decode read received (DecodeRequest.Feedback), as an exponential moving
// average per sequence, layer, kv-head and page. On CUDA pools a decode
// with feedback does not wait for its shares: Get, BlockScores, Forget,
// Reset and Close wait for their copy and add them first (a decode waits
// only when 8 earlier decodes' copies are in flight, or for its own layer's
// with the top-k prior); a decode with feedback cannot be captured in a
// CUDA graph. Calls on one feedback object,
// decodes that pass it included, need the caller's ordering. Close it before
// its pool.
type PageFeedback struct {
	raw  *C.ikv_page_feedback
	pool *Pool // kept reachable: the pool must outlive the feedback
}

// NewPageFeedback creates feedback for the sequences of pool; rate is the
// weight of a step's share in the average, in (0, 1] (0 means the default 0.25).
func NewPageFeedback(pool *Pool, rate float32) (*PageFeedback, error) {
	defer runtime.KeepAlive(pool)
	c := C.ikv_page_feedback_default_config()
	if rate != 0 {
		c.rate = C.float(rate)
	}
	f := &PageFeedback{pool: pool}
	if err := call(func() C.ikv_status { return C.ikv_page_feedback_create(pool.ptr(), &c, &f.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(f, (*PageFeedback).Close)
	return f, nil
}

func (f *PageFeedback) closedPool(method string) error {
	if f.raw != nil && f.pool.raw == nil {
		return bindErr(ErrState, "%s: the feedback's pool was closed", method)
	}
	return nil
}

// Get is the averages of seq at layer and kvHead for every page fed back
// so far (index = page; pages never read: 0; an unknown sequence: empty).
func (f *PageFeedback) Get(seq, layer, kvHead uint32) ([]float32, error) {
	defer runtime.KeepAlive(f)
	if err := f.closedPool("PageFeedback.Get"); err != nil {
		return nil, err
	}
	var n C.uint32_t
	if err := call(func() C.ikv_status {
		return C.ikv_page_feedback_get(f.raw, C.ikv_seq_id(seq), C.uint32_t(layer), C.uint32_t(kvHead), nil, 0, &n)
	}); err != nil {
		return nil, err
	}
	count := int(n)
	mass := (*C.float)(cAlloc(count, 4))
	defer C.free(unsafe.Pointer(mass))
	if err := call(func() C.ikv_status {
		return C.ikv_page_feedback_get(f.raw, C.ikv_seq_id(seq), C.uint32_t(layer), C.uint32_t(kvHead), mass, C.uint32_t(count), &n)
	}); err != nil {
		return nil, err
	}
	return goFloats(mass, count), nil
}

// BlockScores re-scores the ATTEND blocks of layout from seq's feedback
// (the most attended block scores 1; blocks without feedback keep theirs).
func (f *PageFeedback) BlockScores(seq uint32, layout *Layout) error {
	defer runtime.KeepAlive(f)
	defer runtime.KeepAlive(layout)
	if err := f.closedPool("PageFeedback.BlockScores"); err != nil {
		return err
	}
	return call(func() C.ikv_status { return C.ikv_page_feedback_block_scores(f.raw, C.ikv_seq_id(seq), layout.ptr()) })
}

// Forget forgets seq's averages.
func (f *PageFeedback) Forget(seq uint32) error {
	defer runtime.KeepAlive(f)
	if err := f.closedPool("PageFeedback.Forget"); err != nil {
		return err
	}
	return call(func() C.ikv_status { return C.ikv_page_feedback_forget(f.raw, C.ikv_seq_id(seq)) })
}

// Reset forgets every sequence's averages.
func (f *PageFeedback) Reset() error {
	defer runtime.KeepAlive(f)
	if err := f.closedPool("PageFeedback.Reset"); err != nil {
		return err
	}
	return call(func() C.ikv_status { return C.ikv_page_feedback_reset(f.raw) })
}

// Close frees the feedback. Idempotent.
func (f *PageFeedback) Close() {
	if f.raw != nil {
		C.ikv_page_feedback_destroy(f.raw)
		f.raw = nil
	}
}
