package intentkv

import (
	"reflect"
	"testing"
)

func TestLayoutAddUpdateRemoveIterateFindClone(t *testing.T) {
	layout, err := NewLayout()
	must(t, err)
	defer layout.Close()
	sys := Block{Name: "system", Kind: KindSystemPrompt, Policy: PolicyAlways, Start: 0, End: 100, Score: 1}
	doc := Block{Name: "doc", Kind: KindRetrievedDoc, Policy: PolicyAttend, Start: 200, End: 300, Score: 0.7,
		PrecisionHint: Hint(FormatINT8), Turn: 3}
	sysID, err := layout.Add(sys)
	must(t, err)
	docID, err := layout.Add(doc)
	must(t, err)
	blocks, err := layout.Blocks()
	must(t, err)
	if want := []BlockInfo{{sysID, sys}, {docID, doc}}; !reflect.DeepEqual(blocks, want) {
		t.Fatalf("blocks %+v, want %+v", blocks, want)
	}
	if id, err := layout.FindToken(250); err != nil || id != docID {
		t.Fatalf("token 250: block %d, %v", id, err)
	}
	doc.Start, doc.Score, doc.PrecisionHint, doc.Name = 150, 0.25, nil, "doc-v2"
	must(t, layout.Update(docID, doc))
	got, err := layout.Get(docID)
	must(t, err)
	if want := (BlockInfo{docID, doc}); !reflect.DeepEqual(got, want) {
		t.Fatalf("updated %+v, want %+v", got, want)
	}
	must(t, layout.SetScore(docID, 0.9))
	if last, _ := layout.At(1); last.Score != 0.9 || last.ID != docID {
		t.Fatalf("re-scored block %+v", last)
	}
	must(t, layout.Validate(300))
	clone, err := layout.Clone()
	must(t, err)
	must(t, clone.Remove(sysID))
	if clone.Count() != 1 || layout.Count() != 2 {
		t.Fatalf("clone %d blocks, original %d", clone.Count(), layout.Count())
	}
	if b, _ := clone.At(0); b.ID != docID || b.Name != "doc-v2" {
		t.Fatalf("clone keeps %+v", b)
	}
	clone.Close()
	clone.Close() // idempotent
	expectErr(t, clone.Remove(docID), ErrNull, "layout")
	if clone.Count() != 0 {
		t.Fatal("a closed layout counts blocks")
	}
	must(t, layout.Remove(sysID))
	if ids, _ := layout.Blocks(); len(ids) != 1 || ids[0].ID != docID {
		t.Fatalf("after remove: %+v", ids)
	}
}

func TestLayoutErrorsLeaveItUnchanged(t *testing.T) {
	layout, err := NewLayout()
	must(t, err)
	defer layout.Close()
	first, err := layout.Add(Block{Name: "a", Kind: KindOther, Policy: PolicyAttend, Start: 0, End: 10, Score: 0.5})
	must(t, err)
	second, err := layout.Add(Block{Name: "b", Kind: KindOther, Policy: PolicyAttend, Start: 20, End: 30, Score: 0.5})
	must(t, err)
	before, _ := layout.Blocks()
	_, err = layout.Add(Block{Name: "c", Policy: PolicyAttend, Start: 5, End: 15, Score: 0.5})
	expectErr(t, err, ErrOverlap, "ikv_layout_add")
	_, err = layout.Add(Block{Name: "c", Policy: PolicyAttend, Start: 50, End: 40, Score: 0.5})
	expectErr(t, err, ErrRange, "ikv_layout_add")
	_, err = layout.Add(Block{Name: "c", Policy: PolicyAttend, Start: 40, End: 50, Score: 1.5})
	expectErr(t, err, ErrInvalid, "score")
	_, err = layout.Add(Block{Name: "", Policy: PolicyAttend, Start: 40, End: 50, Score: 0.5})
	expectErr(t, err, ErrInvalid, "name")
	_, err = layout.Add(Block{Name: "c\x00d", Policy: PolicyAttend, Start: 40, End: 50, Score: 0.5})
	expectErr(t, err, ErrInvalid, "NUL")
	_, err = layout.Add(Block{Name: "c", Policy: PolicyAttend, Start: 40, End: 50, Score: 0.5, PrecisionHint: Hint(Format(9))})
	expectErr(t, err, ErrInvalid, "ikv_layout_add")
	expectErr(t, layout.Update(second, Block{Name: "b", Policy: PolicyAttend, Start: 5, End: 30, Score: 0.5}), ErrOverlap, "ikv_layout_update")
	expectErr(t, layout.SetScore(second, -1), ErrInvalid, "ikv_layout_set_score")
	expectErr(t, layout.SetScore(second+100, 0.5), ErrNotFound, "ikv_layout_set_score")
	expectErr(t, layout.Remove(first+100), ErrNotFound, "ikv_layout_remove")
	_, err = layout.FindToken(15)
	expectErr(t, err, ErrNotFound, "ikv_layout_find_token")
	_, err = layout.At(2)
	expectErr(t, err, ErrRange, "ikv_layout_at")
	_, err = layout.Get(first + 100)
	expectErr(t, err, ErrNotFound, "ikv_layout_get")
	expectErr(t, layout.Validate(25), ErrRange, "ikv_layout_validate")
	after, _ := layout.Blocks()
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("refused calls changed the layout: %+v -> %+v", before, after)
	}
}

func TestSynthLayoutTilesTheSequenceDeterministically(t *testing.T) {
	if d := DefaultSynthConfig(); d != (SynthConfig{SeqLen: 32768, Documents: 8, ToolOutputs: 4, Turns: 6, Seed: 42}) {
		t.Fatalf("default synth config %+v", d)
	}
	cfg := SynthConfig{SeqLen: 4096, Documents: 5, ToolOutputs: 2, Turns: 3, Seed: 7}
	a, err := SynthLayout(cfg)
	must(t, err)
	defer a.Close()
	b, err := SynthLayout(cfg)
	must(t, err)
	defer b.Close()
	blocks, err := a.Blocks()
	must(t, err)
	again, _ := b.Blocks()
	if !reflect.DeepEqual(blocks, again) {
		t.Fatal("the same seed gave two layouts")
	}
	if blocks[0].Start != 0 || blocks[len(blocks)-1].End != cfg.SeqLen {
		t.Fatalf("blocks span [%d, %d)", blocks[0].Start, blocks[len(blocks)-1].End)
	}
	docs := 0
	for i, blk := range blocks {
		if i > 0 && blocks[i-1].End != blk.Start {
			t.Fatalf("gap or overlap between %+v and %+v", blocks[i-1], blk)
		}
		if blk.Kind == KindRetrievedDoc {
			docs++
		}
	}
	if docs != 5 || blocks[0].Policy != PolicyAlways || blocks[len(blocks)-1].Policy != PolicyRecent {
		t.Fatalf("%d documents, first %v, last %v", docs, blocks[0].Policy, blocks[len(blocks)-1].Policy)
	}
	must(t, a.Validate(cfg.SeqLen))
	cfg.SeqLen = 100
	_, err = SynthLayout(cfg)
	expectErr(t, err, ErrInvalid, "seq_len")
}
