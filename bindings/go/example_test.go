package intentkv_test

import (
	"fmt"

	"intentkv"
)

// Route a context of a system prompt, two documents and the newest turn under
// a budget, and see which tokens the step will read.
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
	// Output: the step reads 1148 of 2048 tokens
}
