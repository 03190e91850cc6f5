package intentkv

/*
#include <stdlib.h>
#include <intentkv.h>
*/
import "C"

import (
	"runtime"
	"strings"
	"unsafe"
)

// Policy of a layout block (ikv_policy).
type Policy int

const (
	PolicyAlways Policy = C.IKV_POLICY_ALWAYS // always read, at the router's always-format
	PolicyAttend Policy = C.IKV_POLICY_ATTEND // read if its score clears the threshold and it wins budget
	PolicySkip   Policy = C.IKV_POLICY_SKIP   // never read
	PolicyRecent Policy = C.IKV_POLICY_RECENT // read the part inside the recent window
	PolicyGlobal Policy = C.IKV_POLICY_GLOBAL // always read, may be compressed
)

// String is ikv_policy_name, e.g. "ATTEND".
func (p Policy) String() string { return C.GoString(C.ikv_policy_name(C.ikv_policy(p))) }

// Kind of a layout block (ikv_block_kind).
type Kind int

const (
	KindSystemPrompt  Kind = C.IKV_KIND_SYSTEM_PROMPT
	KindMemorySummary Kind = C.IKV_KIND_MEMORY_SUMMARY
	KindRetrievedDoc  Kind = C.IKV_KIND_RETRIEVED_DOC
	KindToolOutput    Kind = C.IKV_KIND_TOOL_OUTPUT
	KindScratchpad    Kind = C.IKV_KIND_SCRATCHPAD
	KindConversation  Kind = C.IKV_KIND_CONVERSATION
	KindReasoning     Kind = C.IKV_KIND_REASONING
	KindOther         Kind = C.IKV_KIND_OTHER
)

// String is ikv_block_kind_name, e.g. "retrieved_doc".
func (k Kind) String() string { return C.GoString(C.ikv_block_kind_name(C.ikv_block_kind(k))) }

// NameMax is the longest block name in bytes (IKV_NAME_MAX).
const NameMax = C.IKV_NAME_MAX

// Block describes a layout block: tokens [Start, End) (ikv_block_desc).
// Every field is passed as is: there are no hidden defaults except that a
// nil PrecisionHint is IKV_FMT_AUTO.
type Block struct {
	Name          string // UTF-8, 1..NameMax bytes
	Kind          Kind
	Policy        Policy
	Start, End    uint32
	Score         float32 // relevance in [0, 1]
	PrecisionHint *Format // nil: no preference (FormatAuto); else the format the router uses for the block (see Hint)
	Turn          uint32  // conversation turn that produced the block
}

// BlockInfo is a block as stored: its stable id and its description (ikv_block_info).
type BlockInfo struct {
	ID uint32
	Block
}

// Layout is an ikv_layout: the semantic blocks of a context. Methods that
// only read may run concurrently; a mutating one needs exclusive access.
type Layout struct{ raw *C.ikv_layout }

func newLayout(raw *C.ikv_layout) *Layout {
	l := &Layout{raw: raw}
	runtime.SetFinalizer(l, (*Layout).Close)
	return l
}

// NewLayout creates an empty layout.
func NewLayout() (*Layout, error) {
	var raw *C.ikv_layout
	if err := call(func() C.ikv_status { return C.ikv_layout_create(&raw) }); err != nil {
		return nil, err
	}
	return newLayout(raw), nil
}

// SynthConfig configures SynthLayout (ikv_synth_config).
type SynthConfig struct {
	SeqLen      uint32 // total tokens, >= 1024
	Documents   uint32 // retrieved documents, 0..256
	ToolOutputs uint32 // old tool outputs, 0..256
	Turns       uint32 // conversation turns, >= 1
	Seed        uint64 // same seed, same layout
}

// DefaultSynthConfig is ikv_synth_default_config's values (32K tokens, 8
// documents, 4 tool outputs, 6 turns, seed 42).
func DefaultSynthConfig() SynthConfig {
	c := C.ikv_synth_default_config()
	return SynthConfig{uint32(c.seq_len), uint32(c.n_documents), uint32(c.n_tool_outputs), uint32(c.n_turns), uint64(c.seed)}
}

// SynthLayout builds a realistic agentic layout that exactly tiles [0,
// SeqLen) (ikv_synth_layout); deterministic for a given config.
func SynthLayout(cfg SynthConfig) (*Layout, error) {
	c := C.ikv_synth_default_config()
	c.seq_len, c.n_documents, c.n_tool_outputs = C.uint32_t(cfg.SeqLen), C.uint32_t(cfg.Documents), C.uint32_t(cfg.ToolOutputs)
	c.n_turns, c.seed = C.uint32_t(cfg.Turns), C.uint64_t(cfg.Seed)
	var raw *C.ikv_layout
	if err := call(func() C.ikv_status { return C.ikv_synth_layout(&c, &raw) }); err != nil {
		return nil, err
	}
	return newLayout(raw), nil
}

// desc converts b; the caller frees the name with C.free.
func desc(method string, b Block) (C.ikv_block_desc, *C.char, error) {
	d := C.ikv_block_desc_default()
	if strings.IndexByte(b.Name, 0) >= 0 {
		return d, nil, bindErr(ErrInvalid, "%s: block name %q contains a NUL byte", method, b.Name)
	}
	name := C.CString(b.Name)
	d.name = name
	d.kind = C.ikv_block_kind(b.Kind)
	d.policy = C.ikv_policy(b.Policy)
	d.start, d.end = C.uint32_t(b.Start), C.uint32_t(b.End)
	d.score = C.float(b.Score)
	d.precision_hint = C.IKV_FMT_AUTO
	if b.PrecisionHint != nil {
		d.precision_hint = C.ikv_format(*b.PrecisionHint)
	}
	d.turn = C.uint32_t(b.Turn)
	return d, name, nil
}

func blockInfo(c *C.ikv_block_info) BlockInfo {
	b := BlockInfo{ID: uint32(c.id), Block: Block{
		Name: goChars(&c.name[0]), Kind: Kind(c.kind), Policy: Policy(c.policy),
		Start: uint32(c.start), End: uint32(c.end), Score: float32(c.score), Turn: uint32(c.turn),
	}}
	if f := Format(c.precision_hint); f != FormatAuto {
		b.PrecisionHint = &f
	}
	return b
}

// Add adds a block and returns its id; a refused block changes nothing.
func (l *Layout) Add(b Block) (uint32, error) {
	defer runtime.KeepAlive(l)
	d, name, err := desc("Layout.Add", b)
	if err != nil {
		return 0, err
	}
	defer C.free(unsafe.Pointer(name))
	var id C.uint32_t
	err = call(func() C.ikv_status { return C.ikv_layout_add(l.raw, &d, &id) })
	return uint32(id), err
}

// Update replaces block id's description under Add's rules.
func (l *Layout) Update(id uint32, b Block) error {
	defer runtime.KeepAlive(l)
	d, name, err := desc("Layout.Update", b)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(name))
	return call(func() C.ikv_status { return C.ikv_layout_update(l.raw, C.uint32_t(id), &d) })
}

// SetScore re-scores one block.
func (l *Layout) SetScore(id uint32, score float32) error {
	defer runtime.KeepAlive(l)
	return call(func() C.ikv_status { return C.ikv_layout_set_score(l.raw, C.uint32_t(id), C.float(score)) })
}

// Remove removes a block.
func (l *Layout) Remove(id uint32) error {
	defer runtime.KeepAlive(l)
	return call(func() C.ikv_status { return C.ikv_layout_remove(l.raw, C.uint32_t(id)) })
}

// Count is the number of blocks (0 for a closed layout).
func (l *Layout) Count() int {
	defer runtime.KeepAlive(l)
	return int(C.ikv_layout_count(l.raw))
}

// At is the index-th block in ascending start order.
func (l *Layout) At(index int) (BlockInfo, error) {
	defer runtime.KeepAlive(l)
	if index < 0 {
		return BlockInfo{}, bindErr(ErrRange, "Layout.At: index %d is negative", index)
	}
	var info C.ikv_block_info
	if err := call(func() C.ikv_status { return C.ikv_layout_at(l.raw, C.size_t(index), &info) }); err != nil {
		return BlockInfo{}, err
	}
	return blockInfo(&info), nil
}

// Blocks is every block in ascending start order.
func (l *Layout) Blocks() ([]BlockInfo, error) {
	n := l.Count()
	out := make([]BlockInfo, 0, n)
	for i := 0; i < n; i++ {
		b, err := l.At(i)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// Get is the block with this id.
func (l *Layout) Get(id uint32) (BlockInfo, error) {
	defer runtime.KeepAlive(l)
	var info C.ikv_block_info
	if err := call(func() C.ikv_status { return C.ikv_layout_get(l.raw, C.uint32_t(id), &info) }); err != nil {
		return BlockInfo{}, err
	}
	return blockInfo(&info), nil
}

// FindToken is the id of the block covering token (ErrNotFound in a gap).
func (l *Layout) FindToken(token uint32) (uint32, error) {
	defer runtime.KeepAlive(l)
	var id C.uint32_t
	err := call(func() C.ikv_status { return C.ikv_layout_find_token(l.raw, C.uint32_t(token), &id) })
	return uint32(id), err
}

// Validate checks that every block ends at or before seqLen.
func (l *Layout) Validate(seqLen uint32) error {
	defer runtime.KeepAlive(l)
	return call(func() C.ikv_status { return C.ikv_layout_validate(l.raw, C.uint32_t(seqLen)) })
}

// Clone is a deep copy (e.g. to try a re-scoring).
func (l *Layout) Clone() (*Layout, error) {
	defer runtime.KeepAlive(l)
	var raw *C.ikv_layout
	if err := call(func() C.ikv_status { return C.ikv_layout_clone(l.raw, &raw) }); err != nil {
		return nil, err
	}
	return newLayout(raw), nil
}

// ptr is the handle for the library: NULL for a nil or closed layout.
func (l *Layout) ptr() *C.ikv_layout {
	if l == nil {
		return nil
	}
	return l.raw
}

// Close frees the layout (plans routed from it stay valid). Idempotent.
func (l *Layout) Close() {
	if l.raw != nil {
		C.ikv_layout_destroy(l.raw)
		l.raw = nil
	}
}
