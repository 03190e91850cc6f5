/* An outside program built against the installed library: routes a
 * synthetic session and prints the summary. Exits non-zero on any failure. */
#include <stdio.h>

#include <intentkv.h>

int main(void) {
    if (ikv_version() != IKV_VERSION_NUMBER) {
        fprintf(stderr, "header %d != library %u\n", IKV_VERSION_NUMBER, ikv_version());
        return 1;
    }
    ikv_synth_config sc = ikv_synth_default_config();
    sc.seq_len = 8192;
    ikv_layout *layout = NULL;
    ikv_router *router = NULL;
    ikv_plan *plan = NULL;
    ikv_router_config rc = ikv_router_default_config();
    rc.token_budget = 4096;
    if (ikv_synth_layout(&sc, &layout) != IKV_OK || ikv_router_create(&rc, &router) != IKV_OK ||
        ikv_router_route(router, layout, sc.seq_len, &plan) != IKV_OK) {
        fprintf(stderr, "consumer: %s\n", ikv_last_error());
        return 1;
    }
    ikv_plan_summary s;
    ikv_plan_get_summary(plan, &s);
    printf("consumer: intentkv %s routed %u of %u tokens into %u pages\n", ikv_version_string(), s.tokens_selected,
           s.seq_len, s.pages_selected);
    ikv_plan_destroy(plan);
    ikv_router_destroy(router);
    ikv_layout_destroy(layout);
    return s.tokens_selected > 0 && s.tokens_selected <= 4096 ? 0 : 1;
}
