package intentkv_test

import (
	"fmt"

	"intentkv"
)

// Route a context of a system prompt, two documents and the newest turn under
// a budget, and see which tokens the step will read and why.
func Example() {
	layout, _ := intentkv.NewLayout()
	defer layout.Close()
	layout.Add(intentkv.Block{Name: "system", Kind: intentkv.KindSystemPrompt, Policy: intentkv.PolicyAlways, Start: 0, End: 100, Score: 1})
	layout.Add(intentkv.Block{Name: "doc-7", Kind: intentkv.KindRetrievedDoc, Policy: intentkv.PolicyAttend, Start: 100, End: 900, Score: 0.83})
	layout.Add(intentkv.Block{Name: "doc-9", Kind: intentkv.KindRetrievedDoc, Policy: intentkv.PolicyAttend, Start: 900, End: 1800, Score: 0.2})
	layout.Add(intentkv.Block{Name: "turn", Kind: intentkv.KindConversation, Policy: intentkv.PolicyRecent, Start: 1800, End: 2048, Score: 1})
	cfg := intentkv.DefaultRouterConfig()
	cfg.TokenBudget, cfg.RecentWindow = 1200, 248
	router, _ := intentkv.NewRouter(cfg)
	defer router.Close()
	plan, err := router.Route(layout, 2048)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer plan.Close()
	n, _ := plan.TokensSelected()
	fmt.Printf("the step reads %d of 2048 tokens\n", n)
	decisions, _ := plan.Decisions()
	for _, d := range decisions {
		b, _ := layout.Get(d.BlockID)
		fmt.Printf("%-6s [%4d, %4d) %-15v read %4d tokens as %v\n", b.Name, d.Start, d.End, d.Reason, d.TokensSelected, d.Format)
	}
	// Output:
	// the step reads 1148 of 2048 tokens
	// system [   0,  100) always          read  100 tokens as f16
	// doc-7  [ 100,  900) score           read  800 tokens as f16
	// doc-9  [ 900, 1800) below_threshold read    0 tokens as int4
	// turn   [1800, 2048) recent_window   read  248 tokens as f16
}

// Fill a pool with one sequence, decode one step through a plan of its
// first and last pages, and read the log-sum-exp that merges partial steps.
func ExampleDecoder_Step() {
	pool, err := intentkv.NewPool(intentkv.PoolConfig{Layers: 1, KVHeads: 1, HeadDim: 64, PageSize: 16, CapacityBytes: 8 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	seq, _ := pool.SeqCreate()
	k, v := make([]float32, 64*64), make([]float32, 64*64) // 64 tokens, [token][kv_head][head_dim]
	for i := range v {
		v[i] = 0.25
	}
	if err := pool.Append(seq, 0, k, v); err != nil {
		fmt.Println(err)
		return
	}
	plan, _ := intentkv.PlanFromRanges([]intentkv.TokenRange{{Begin: 0, End: 16}, {Begin: 48, End: 64}}, 64, 16)
	defer plan.Close()
	decoder, _ := intentkv.NewDecoder(1)
	defer decoder.Close()
	res, err := decoder.Step(pool, intentkv.DecodeRequest{Seqs: []uint32{seq}, Plans: []*intentkv.Plan{plan},
		QHeads: 2, Q: make([]float32, 2*64), LSE: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	runs, _ := decoder.LastSelection(0, 0)
	// Zero keys: every logit is 0, so the output is V's value and lse = log(32 tokens).
	fmt.Printf("out %.2f, lse %.4f, read %v\n", res.Out[0], res.LSE[0], runs)
	// Output: out 0.25, lse 3.4657, read [{0 16} {48 64}]
}
