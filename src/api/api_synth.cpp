// extern "C" boundary of the synthetic session generator.
#include <cstring>

#include "common/config.hpp"
#include "common/error.hpp"
#include "common/guard.hpp"
#include "layout/layout.hpp"
#include "synth/synth.hpp"

extern "C" {

IKV_API ikv_synth_config ikv_synth_default_config(void) {
    ikv_synth_config c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.seq_len = 32768;
    c.n_documents = 8;
    c.n_tool_outputs = 4;
    c.n_turns = 6;
    c.seed = 42;
    return c;
}

IKV_API ikv_status ikv_synth_layout(const ikv_synth_config *config, ikv_layout **out) {
    const char *fn = "ikv_synth_layout";
    IKV_CHECK_NULL(config, fn);
    IKV_CHECK_NULL(out, fn);
    IKV_CHECK_STRUCT(config, sizeof(ikv_synth_config), fn);
    const ikv_synth_config c = ikv::read_config(*config, ikv_synth_default_config());
    if (c.seq_len < 1024) return ikv::fail(IKV_E_INVALID, "%s: config->seq_len is %u, expected at least 1024", fn, c.seq_len);
    if (c.n_documents > 256)
        return ikv::fail(IKV_E_INVALID, "%s: config->n_documents is %u, expected 0..256", fn, c.n_documents);
    if (c.n_tool_outputs > 256)
        return ikv::fail(IKV_E_INVALID, "%s: config->n_tool_outputs is %u, expected 0..256", fn, c.n_tool_outputs);
    if (c.n_turns < 1) return ikv::fail(IKV_E_INVALID, "%s: config->n_turns is 0, expected at least 1", fn);
    if (ikv::synth_block_count(c) > c.seq_len)
        return ikv::fail(IKV_E_INVALID, "%s: config asks for %llu blocks, more than config->seq_len %u tokens", fn,
                         static_cast<unsigned long long>(ikv::synth_block_count(c)), c.seq_len);
    ikv_layout *layout = ikv::new_handle<ikv_layout>();
    if (layout == nullptr) return ikv::fail(IKV_E_NOMEM, "%s: out of host memory", fn);
    const ikv_status s = ikv::guarded(fn, [&] {
        ikv::synth_fill(c, *layout);
        return IKV_OK;
    });
    if (s != IKV_OK) {
        ikv::delete_handle(layout);
        return s;
    }
    *out = layout;
    return IKV_OK;
}

}  // extern "C"
