/*
 * intentkv.h — intent-aware KV-cache execution for long-context LLM decoding.
 *
 * One header, C11, no C++ in it. Every symbol is ikv_* / IKV_*.
 *
 * The data path (see docs/ARCHITECTURE.md):
 *
 *   layout  semantic blocks of the context: [start, end) token ranges, a kind,
 *           a policy (ALWAYS, ATTEND, SKIP, RECENT, GLOBAL), a score.
 *   router  layout + budget + memory pressure -> plan: the token pages a decode
 *           step reads, exact token bounds, a storage format per page, prefetch
 *           hints, and a decision with a reason for every block.
 *   pool    paged KV storage. A page holds page_size tokens of every layer and
 *           kv-head of one sequence in one format (F16, BF16, FP8-E4M3, INT8,
 *           INT4); block tables, sharing by fork, eviction, key summaries.
 *   decoder attention for one decode step that reads only the planned pages and
 *           dequantizes inside the load (SIMD CPU kernels or CUDA kernels).
 *
 * Conventions that hold for every call:
 *   - Fallible calls return ikv_status: IKV_OK (0) or a negative error code.
 *     On error ikv_last_error() holds a sentence naming the argument and the
 *     bound it broke, and the objects involved are left exactly as they were,
 *     unless the call's own documentation names the errors after which part
 *     of its work stands (ikv_pool_reserve, ikv_pool_tier_step,
 *     ikv_pool_sync, ikv_query_memory_end_turn, ikv_decode with
 *     args->append, and IKV_E_DEVICE from appends and ikv_seq_truncate on
 *     CUDA pools).
 *   - Every call that returns ikv_status returns IKV_E_NULL for a NULL
 *     required handle or out-pointer, and may return IKV_E_INTERNAL (a
 *     library bug, never expected), whether or not its Errors list names
 *     them. IKV_E_NOMEM covers host and device memory alike. Where several
 *     of a call's errors apply at once, it returns one of them (which one
 *     is unspecified: e.g. a tier call on a CPU pool may report
 *     IKV_E_UNSUPPORTED before checking its other arguments).
 *   - No call aborts, throws, or prints; install ikv_set_log_callback() to see
 *     warnings.
 *   - Config structs carry struct_size as their first field. Always start from
 *     the matching *_default_config() and change fields by name; the library
 *     reads only the first struct_size bytes, so programs built against an
 *     older header keep working when fields are appended. A struct the
 *     library fills (*_get_config, *_get_stats, ikv_runtime_info_get) is
 *     written up to the smaller of its struct_size and the library's own
 *     size, and struct_size is set to the bytes written.
 *   - Units: token positions and counts are tokens; sizes in *_bytes are bytes;
 *     strides are in elements of the array's dtype.
 *   - Handles are opaque. The creator owns a handle and frees it with the
 *     matching *_destroy(); destroy(NULL) is a no-op.
 *   - Calls that take no handle, or only handles they create, are
 *     thread-safe. Each handle's rules are stated where it is declared.
 *   - Every *_default* function returns its struct by value; when that
 *     struct grows it gets a new _vN symbol and the header's name becomes a
 *     macro for it (the older symbols stay and fill their own layouts).
 *     Structs without struct_size (array elements, and the filled
 *     ikv_block_info, ikv_plan_summary, ikv_plan_cost) have a fixed layout:
 *     new information gets a new struct and call. IKV_FMT_COUNT is part of
 *     the ABI and stays 5 (the per-format arrays keep 5 entries).
 *   - Enum-typed fields are int-sized (the platform ABI's enum): code built
 *     with -fshort-enums or an equivalent is not ABI-compatible.
 */
#ifndef INTENTKV_H
#define INTENTKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Export and version                                                        */
/* ------------------------------------------------------------------------ */

#if defined(_WIN32) && defined(IKV_BUILD_SHARED)
#define IKV_API __declspec(dllexport)
#elif defined(_WIN32) && defined(IKV_USE_SHARED)
#define IKV_API __declspec(dllimport)
#elif defined(__GNUC__) || defined(__clang__)
#define IKV_API __attribute__((visibility("default")))
#else
#define IKV_API
#endif

#define IKV_VERSION_MAJOR 0
#define IKV_VERSION_MINOR 1
#define IKV_VERSION_PATCH 0
/** MAJOR*10000 + MINOR*100 + PATCH, as ikv_version() returns it. */
#define IKV_VERSION_NUMBER (IKV_VERSION_MAJOR * 10000 + IKV_VERSION_MINOR * 100 + IKV_VERSION_PATCH)

/** The version of the library actually linked (compare with IKV_VERSION_NUMBER). Thread-safe. */
IKV_API unsigned ikv_version(void);
/** "MAJOR.MINOR.PATCH" of the linked library; static storage. Thread-safe. */
IKV_API const char *ikv_version_string(void);

/* ------------------------------------------------------------------------ */
/* Status, errors, logging                                                   */
/* ------------------------------------------------------------------------ */

typedef enum ikv_status {
    IKV_OK = 0,
    IKV_E_INVALID = -1,      /**< an argument is outside its documented domain */
    IKV_E_NULL = -2,         /**< a required pointer or handle is NULL */
    IKV_E_RANGE = -3,        /**< a token, page, layer, head or index is out of range */
    IKV_E_NOMEM = -4,        /**< pool capacity exhausted or host/device allocation failed */
    IKV_E_BUDGET = -5,       /**< mandatory blocks alone exceed the router's token budget */
    IKV_E_OVERLAP = -6,      /**< a layout block overlaps another block */
    IKV_E_UNSUPPORTED = -7,  /**< valid request this build or machine cannot serve */
    IKV_E_NO_DEVICE = -8,    /**< CUDA requested but not built in, or no GPU present */
    IKV_E_DEVICE = -9,       /**< a CUDA call failed; the message names it */
    IKV_E_SHARED = -10,      /**< the page is shared by several sequences (fork) */
    IKV_E_EVICTED = -11,     /**< the tokens asked for were evicted */
    IKV_E_NOT_FOUND = -12,   /**< no such block id or sequence id */
    IKV_E_STATE = -13,       /**< the object is not in a state that allows the call */
    IKV_E_INTERNAL = -14     /**< a bug in intentkv; please report the message */
} ikv_status;

/** Name of a status code, e.g. "IKV_E_RANGE"; "IKV_UNKNOWN_STATUS" for others. Static storage. */
IKV_API const char *ikv_status_name(ikv_status status);

/**
 * The sentence describing the last failure of an ikv_* call on the calling
 * thread, e.g. "ikv_layout_add: block 'doc3' [900, 800) has end at or before start".
 * Empty string if the thread's last failing call has not happened yet; a
 * successful call leaves it as it was. The pointer is valid until the next
 * ikv_* call on the same thread (copy the sentence to keep it). Thread-local.
 */
IKV_API const char *ikv_last_error(void);

typedef enum ikv_log_level {
    IKV_LOG_DEBUG = 0,
    IKV_LOG_INFO = 1,
    IKV_LOG_WARN = 2,
    IKV_LOG_ERROR = 3
} ikv_log_level;

/* message: valid only during the call, at most 511 bytes (longer sentences
 * are cut); user: what ikv_set_log_callback was given, kept until the sink is
 * replaced. */
typedef void (*ikv_log_fn)(ikv_log_level level, const char *message, void *user);

/**
 * Install a process-wide log sink (NULL removes it). Messages at or above
 * min_level are delivered (levels compare as integers: a min_level above
 * IKV_LOG_ERROR delivers nothing, not even error sentences, and one below
 * IKV_LOG_DEBUG everything), possibly from library worker threads, so the sink
 * must be thread-safe. Every failing call also sends its error sentence at
 * IKV_LOG_ERROR. Without a sink nothing is printed anywhere. Deliveries are
 * serialized, and once this call returns no other thread is inside the sink
 * it replaced. Messages are sent while the library may hold its own locks,
 * so the sink must not call the library, except ikv_set_log_callback (this
 * call, which then takes effect for later messages) and ikv_last_error;
 * once the sink returns, ikv_last_error() holds what it held before.
 */
IKV_API void ikv_set_log_callback(ikv_log_fn fn, void *user, ikv_log_level min_level);

/* ------------------------------------------------------------------------ */
/* Runtime information                                                       */
/* ------------------------------------------------------------------------ */

typedef struct ikv_runtime_info {
    uint32_t struct_size;       /**< set to sizeof(ikv_runtime_info) before the call */
    unsigned version;           /**< ikv_version() */
    int cuda_built;             /**< 1 if the library was compiled with the CUDA backend */
    int cuda_device_count;      /**< GPUs visible now (0 without CUDA or GPU) */
    char cuda_device_name[64];  /**< name of device 0, "" if none */
    char cpu_isa[16];           /**< SIMD path in use: "avx512", "avx2", "neon" or "scalar" */
    char cpu_isa_available[64]; /**< paths this CPU supports, comma separated */
    char cuda_archs[32];        /**< SM architectures compiled in, e.g. "80,90"; "" without CUDA */
} ikv_runtime_info;

/**
 * Fill *info. The CPU ISA is chosen once per process from the CPU's features;
 * the environment variable IKV_CPU_ISA (avx512 | avx2 | neon | scalar), read at
 * that first choice, forces a path (it must be supported, else the best one
 * is used and a warning is logged). On CPUs with AVX512-VNNI the avx512 path
 * sums INT8 values with integer dot products (docs/FORMATS.md gives the
 * bound this adds); IKV_CPU_VNNI=off (or 0), read at the same moment, keeps
 * fp32 sums. cpu_isa is "avx512" either way. Thread-safe.
 * Errors: IKV_E_NULL (info), IKV_E_INVALID (struct_size too small).
 */
IKV_API ikv_status ikv_runtime_info_get(ikv_runtime_info *info);

/* ------------------------------------------------------------------------ */
/* Shared vocabulary                                                         */
/* ------------------------------------------------------------------------ */

/** Storage format of a KV page. Errors bounds are in docs/FORMATS.md. */
typedef enum ikv_format {
    IKV_FMT_F16 = 0,      /**< IEEE half; lossless for |x| <= 65504 up to half rounding */
    IKV_FMT_BF16 = 1,     /**< bfloat16, round to nearest even; finite values beyond the largest bf16 saturate to it */
    IKV_FMT_FP8_E4M3 = 2, /**< FP8 E4M3 with one float scale per page, layer and kv-head (K and V each); saturates
                               beyond about 3.376e38 so that every stored value is finite (docs/FORMATS.md) */
    IKV_FMT_INT8 = 3,     /**< symmetric int8; K scaled per channel over the page, V per token (KIVI); saturates
                               beyond about 3.376e38, as FP8 */
    IKV_FMT_INT4 = 4,     /**< asymmetric 4-bit, packed; K per channel over the page, V per token in groups of 32 channels;
                               minimums and scales are halves, so values beyond +-65504 saturate (docs/FORMATS.md) */
    IKV_FMT_COUNT = 5,
    IKV_FMT_AUTO = 255    /**< "no preference" (layout precision hints; as a pool's default_format: a plan's
                               format where an append passes one, else F16) */
} ikv_format;

/** Name of a format, e.g. "int8" ("auto" for IKV_FMT_AUTO); "?" for others. Static storage. */
IKV_API const char *ikv_format_name(ikv_format format);

/** Element type of engine-side arrays (K, V, queries, outputs). */
typedef enum ikv_dtype {
    IKV_DTYPE_F32 = 0,
    IKV_DTYPE_F16 = 1,
    IKV_DTYPE_BF16 = 2
} ikv_dtype;

typedef enum ikv_backend {
    IKV_BACKEND_CPU = 0,
    IKV_BACKEND_CUDA = 1
} ikv_backend;

/** A half-open token range [begin, end). */
typedef struct ikv_token_range {
    uint32_t begin;
    uint32_t end;
} ikv_token_range;

/* ------------------------------------------------------------------------ */
/* Layouts: the semantic blocks of a context                                 */
/* ------------------------------------------------------------------------ */

typedef struct ikv_layout ikv_layout;

typedef enum ikv_block_kind {
    IKV_KIND_SYSTEM_PROMPT = 0,
    IKV_KIND_MEMORY_SUMMARY = 1,
    IKV_KIND_RETRIEVED_DOC = 2,
    IKV_KIND_TOOL_OUTPUT = 3,
    IKV_KIND_SCRATCHPAD = 4,
    IKV_KIND_CONVERSATION = 5,
    IKV_KIND_REASONING = 6,
    IKV_KIND_OTHER = 7,
    IKV_KIND_COUNT = 8
} ikv_block_kind;

typedef enum ikv_policy {
    IKV_POLICY_ALWAYS = 0, /**< always read, at the router's always-format (full precision by default) */
    IKV_POLICY_ATTEND = 1, /**< read if its score clears the threshold and it wins budget (its part inside the
                                recent window is read regardless: ikv_router_route) */
    IKV_POLICY_SKIP = 2,   /**< never read: zero bytes */
    IKV_POLICY_RECENT = 3, /**< read the part of it inside the router's recent window */
    IKV_POLICY_GLOBAL = 4, /**< always read, may be compressed (memory summaries) */
    IKV_POLICY_COUNT = 5
} ikv_policy;

IKV_API const char *ikv_block_kind_name(ikv_block_kind kind);
IKV_API const char *ikv_policy_name(ikv_policy policy);

/** Longest block name in bytes, excluding the terminating NUL. */
#define IKV_NAME_MAX 63

/** A block as the caller describes it (ikv_layout_at and ikv_layout_get return ikv_block_info). */
typedef struct ikv_block_desc {
    uint32_t struct_size;     /**< sizeof(ikv_block_desc); set by ikv_block_desc_default() */
    const char *name;         /**< UTF-8, 1..IKV_NAME_MAX bytes; copied on add */
    ikv_block_kind kind;
    uint32_t start;           /**< first token */
    uint32_t end;             /**< one past the last token; end > start */
    ikv_policy policy;
    float score;              /**< relevance in [0, 1]; finite */
    ikv_format precision_hint;/**< IKV_FMT_AUTO or a format the router should use for this block */
    uint32_t turn;            /**< conversation turn that produced the block */
} ikv_block_desc;

/** A block as stored: its stable id plus a copy of its description. */
typedef struct ikv_block_info {
    uint32_t id;                   /**< stable for the block's lifetime; never reused by this layout */
    char name[IKV_NAME_MAX + 1];
    ikv_block_kind kind;
    uint32_t start, end;
    ikv_policy policy;
    float score;
    ikv_format precision_hint;
    uint32_t turn;
} ikv_block_info;

/** A description with struct_size set, kind OTHER, policy ATTEND, score 0.5, hint AUTO, all else 0. */
IKV_API ikv_block_desc ikv_block_desc_default(void);

/** Create an empty layout. Errors: IKV_E_NULL, IKV_E_NOMEM. */
IKV_API ikv_status ikv_layout_create(ikv_layout **out);
/** Free a layout. Plans routed from it stay valid (they hold copies). */
IKV_API void ikv_layout_destroy(ikv_layout *layout);
/** Deep copy (e.g. to try a re-scoring). Errors: IKV_E_NULL, IKV_E_NOMEM. */
IKV_API ikv_status ikv_layout_clone(const ikv_layout *layout, ikv_layout **out);

/**
 * Add a block. It must not overlap any existing block (IKV_E_OVERLAP), must
 * have end > start (IKV_E_RANGE), a finite score in [0,1] (IKV_E_INVALID), a
 * valid kind, policy and hint (IKV_E_INVALID), and a name of 1..IKV_NAME_MAX
 * bytes (IKV_E_INVALID; a NULL name, like a NULL layout or block, is
 * IKV_E_NULL). Blocks may be added in any order; there may be gaps.
 * id_out (may be NULL) receives the new block's id. Errors: IKV_E_NULL,
 * IKV_E_INVALID (also block->struct_size), IKV_E_RANGE (also when the
 * layout has used all 2^32-1 ids), IKV_E_OVERLAP, IKV_E_NOMEM.
 */
IKV_API ikv_status ikv_layout_add(ikv_layout *layout, const ikv_block_desc *block, uint32_t *id_out);
/** Replace block id's description with *block, under add's rules (overlap ignores the block itself).
 * Errors: as ikv_layout_add, and IKV_E_NOT_FOUND; the description's own fields are checked first
 * (a bad field for an unknown id gives the field's error), then the id, then overlap. */
IKV_API ikv_status ikv_layout_update(ikv_layout *layout, uint32_t id, const ikv_block_desc *block);
/** Re-score one block (the common multi-turn update). Errors: IKV_E_NULL, IKV_E_NOT_FOUND, IKV_E_INVALID. */
IKV_API ikv_status ikv_layout_set_score(ikv_layout *layout, uint32_t id, float score);
/** Remove a block. Errors: IKV_E_NULL, IKV_E_NOT_FOUND. */
IKV_API ikv_status ikv_layout_remove(ikv_layout *layout, uint32_t id);

/** Number of blocks (0 for NULL). */
IKV_API size_t ikv_layout_count(const ikv_layout *layout);
/** The index-th block in ascending start order. Errors: IKV_E_NULL, IKV_E_RANGE. */
IKV_API ikv_status ikv_layout_at(const ikv_layout *layout, size_t index, ikv_block_info *out);
/** The block with this id. Errors: IKV_E_NULL, IKV_E_NOT_FOUND. */
IKV_API ikv_status ikv_layout_get(const ikv_layout *layout, uint32_t id, ikv_block_info *out);
/** The block covering token. Errors: IKV_E_NULL, IKV_E_NOT_FOUND (token in a gap). */
IKV_API ikv_status ikv_layout_find_token(const ikv_layout *layout, uint32_t token, uint32_t *id_out);
/**
 * Check the layout against a sequence of seq_len tokens: every block ends at or
 * before seq_len (IKV_E_RANGE names the first that does not). Overlap, score
 * and name rules are enforced on every add/update, so only ranges remain.
 * Errors: IKV_E_NULL, IKV_E_RANGE.
 */
IKV_API ikv_status ikv_layout_validate(const ikv_layout *layout, uint32_t seq_len);

/** Thread-safety of layouts: const calls may run concurrently; a mutating call needs exclusive access. */

/* ------------------------------------------------------------------------ */
/* Synthetic agentic sessions (for demos, tests and benchmarks)              */
/* ------------------------------------------------------------------------ */

typedef struct ikv_synth_config {
    uint32_t struct_size;
    uint32_t seq_len;        /**< total tokens, >= 1024 (8K, 32K, 128K are the usual sizes) */
    uint32_t n_documents;    /**< retrieved documents, 0..256 */
    uint32_t n_tool_outputs; /**< old tool outputs, 0..256 */
    uint32_t n_turns;        /**< conversation turns, >= 1 */
    uint64_t seed;           /**< same seed, same layout */
} ikv_synth_config;

/** 32K tokens, 8 documents, 4 tool outputs, 6 turns, seed 42. */
IKV_API ikv_synth_config ikv_synth_default_config(void);

/**
 * Build a realistic agentic layout that exactly tiles [0, seq_len): a system
 * prompt (ALWAYS), a memory summary (GLOBAL), documents with seeded scores
 * (ATTEND; some SKIP), tool outputs (ATTEND, low scores), a scratchpad
 * (SKIP), earlier turns (ATTEND) and the newest turn (RECENT). Deterministic
 * for a given config. Every block holds at least one token, so the config's
 * 3 + n_documents + n_tool_outputs + n_turns blocks must not outnumber
 * seq_len. Errors: IKV_E_NULL, IKV_E_INVALID (a field out of its range, or
 * more blocks than tokens), IKV_E_NOMEM.
 */
IKV_API ikv_status ikv_synth_layout(const ikv_synth_config *config, ikv_layout **out);

/* ------------------------------------------------------------------------ */
/* Routers and plans                                                         */
/* ------------------------------------------------------------------------ */

typedef struct ikv_router ikv_router;
typedef struct ikv_plan ikv_plan;

/** What the router does when mandatory blocks alone exceed token_budget. */
typedef enum ikv_over_budget {
    IKV_OVER_BUDGET_FAIL = 0, /**< return IKV_E_BUDGET and no plan (default) */
    IKV_OVER_BUDGET_KEEP = 1  /**< keep every mandatory block, flag the plan (summary.over_budget) and log a warning */
} ikv_over_budget;

/**
 * The precision table (IntentQuantizer, configurable). For an ATTEND block
 * with score s:  s >= attend_high_score -> attend_high, s >= attend_mid_score
 * -> attend_mid, else attend_low. Memory pressure p then demotes every block
 * that is not ALWAYS by one step along F16/BF16 -> FP8 -> INT8 -> INT4 when
 * p >= demote1_pressure and by two when p >= demote2_pressure. A block's
 * precision_hint, when not AUTO, wins over the table and pressure. ALWAYS
 * blocks take always_format (never demoted), GLOBAL blocks global_format,
 * RECENT blocks and blocks read only through the recent window
 * recent_format, SKIP blocks attend_low (the format their skipped pages
 * report). A page's format (ikv_plan_page.format, ikv_plan_page_format):
 * with selected tokens, the highest precision (the enum's order, F16 first)
 * among the blocks and unlabeled gaps that have a selected token in it;
 * without, the lowest among every block and gap that touches it. Every
 * format field is a storage format (F16 ... INT4), not IKV_FMT_AUTO
 * (IKV_E_INVALID). Fixed layout: new precision settings are appended to
 * ikv_router_config.
 */
typedef struct ikv_precision_policy {
    ikv_format always_format;   /**< default F16 */
    ikv_format global_format;   /**< default FP8_E4M3 */
    ikv_format recent_format;   /**< default F16 (the newest tokens matter most) */
    ikv_format attend_high;     /**< default F16 */
    ikv_format attend_mid;      /**< default INT8 */
    ikv_format attend_low;      /**< default INT4 */
    float attend_high_score;    /**< in [0, 1]; default 0.8 */
    float attend_mid_score;     /**< in [0, attend_high_score]; default 0.5 */
    float demote1_pressure;     /**< in [0, demote2_pressure]; default 0.5 */
    float demote2_pressure;     /**< in [0, 1]; default 0.85 */
} ikv_precision_policy;

typedef struct ikv_router_config {
    uint32_t struct_size;
    uint32_t page_size;         /**< tokens per page: power of two in [8, 128]; default 16 */
    uint32_t token_budget;      /**< tokens a step may read; 0 = unlimited; default 0 */
    uint32_t recent_window;     /**< newest tokens always read (unless SKIP); default 512 */
    float memory_pressure;      /**< in [0, 1]; default 0 */
    float attend_threshold;     /**< ATTEND blocks below it are not read on their score (their part in the recent
                                     window still is); in [0, 1]; default 0.3 */
    uint32_t prefetch_depth;    /**< prefetch hints to emit, in pages; default 4 */
    float unlabeled_score;      /**< tokens in no block are routed as ATTEND with this score; in [0, 1]; default 0 */
    ikv_over_budget over_budget;
    ikv_precision_policy precision;
} ikv_router_config;

IKV_API ikv_router_config ikv_router_default_config(void);

/** Create a router (validates and copies config). Errors: IKV_E_NULL, IKV_E_INVALID (names the field), IKV_E_NOMEM. */
IKV_API ikv_status ikv_router_create(const ikv_router_config *config, ikv_router **out);
IKV_API void ikv_router_destroy(ikv_router *router);
/**
 * Copy of the router's config into *out. Set out->struct_size to
 * sizeof(ikv_router_config) first (as for every struct the library fills).
 * Errors: IKV_E_NULL, IKV_E_INVALID (struct_size smaller than the first
 * published version of the struct).
 */
IKV_API ikv_status ikv_router_get_config(const ikv_router *router, ikv_router_config *out);
/** Change the memory pressure (the knob an engine turns most). Thread-safe: it may run while other
 * threads route with this router; a route uses the pressure it read at its start.
 * Errors: IKV_E_NULL, IKV_E_INVALID. */
IKV_API ikv_status ikv_router_set_pressure(ikv_router *router, float memory_pressure);

/**
 * Route a layout for a sequence of seq_len tokens (seq_len >= 1; every block
 * must end at or before it). Mandatory tokens (ALWAYS, GLOBAL, the recent
 * window) are placed first; ATTEND blocks at or above the threshold follow by
 * descending score (ties: the later block first), whole blocks: a block that
 * does not fit what is left of the budget is passed over and the next ones
 * are still tried. SKIP blocks are never read, not even inside the recent
 * window. A block read only because it reaches into the recent window (an
 * ATTEND block or unlabeled gap below the threshold or over the budget) takes
 * recent_format and the reason IKV_REASON_RECENT_WINDOW; an ATTEND block (or
 * gap) at or above the threshold is read on its score (IKV_REASON_SCORE) and
 * keeps the precision table's format, also when it lies wholly inside the
 * window (its tokens there cost no budget). When mandatory tokens exceed the
 * budget (IKV_OVER_BUDGET_KEEP), every block with a mandatory token reports
 * IKV_REASON_OVER_BUDGET_KEPT instead of ALWAYS, GLOBAL or RECENT_WINDOW,
 * except an ATTEND block (or gap) read on its score, which keeps
 * IKV_REASON_SCORE.
 * The caller owns *plan_out (ikv_plan_destroy). The router is not changed and
 * may route from several threads at once.
 * Errors: IKV_E_NULL, IKV_E_INVALID (seq_len 0), IKV_E_RANGE (a block beyond
 * seq_len), IKV_E_BUDGET (see ikv_over_budget), IKV_E_NOMEM.
 */
IKV_API ikv_status ikv_router_route(const ikv_router *router, const ikv_layout *layout, uint32_t seq_len,
                                    ikv_plan **plan_out);

/**
 * A plan that reads exactly the given token ranges of a seq_len-token
 * sequence (ranges sorted or not, may touch, must not overlap, must lie in
 * [0, seq_len)), all pages marked format. For engines with their own
 * selection, and for tests. Errors: IKV_E_NULL, IKV_E_INVALID, IKV_E_RANGE,
 * IKV_E_OVERLAP, IKV_E_NOMEM.
 */
IKV_API ikv_status ikv_plan_from_ranges(const ikv_token_range *ranges, size_t n_ranges, uint32_t seq_len,
                                        uint32_t page_size, ikv_format format, ikv_plan **plan_out);

IKV_API void ikv_plan_destroy(ikv_plan *plan);

/* Page flags in a plan (ikv_plan_page.flags). */
/** Holds tokens of ALWAYS/GLOBAL blocks or the recent window: query-aware selection never drops it. An
 *  entry is one run of selected tokens within a page, so touching mandatory and optional runs of a page
 *  form one entry, flagged as a whole (summary.mandatory_tokens counts the mandatory tokens alone). */
#define IKV_PAGE_MANDATORY 0x1u
/** token_begin/token_end cut inside the page's page_size slots (the last page of a sequence whose length is
 *  not a multiple of page_size is always flagged, even when the entry holds every token it has). */
#define IKV_PAGE_PARTIAL 0x2u

/**
 * One selected page, kernel-ready. page = token index / page_size.
 * [token_begin, token_end) are absolute token positions inside that page; a
 * page that two blocks share may appear once with the union if contiguous, or
 * more than once with disjoint bounds. Entries are sorted by (page, token_begin).
 */
typedef struct ikv_plan_page {
    uint32_t page;
    uint32_t token_begin;
    uint32_t token_end;
    uint8_t format;    /**< ikv_format the router chose for storing this page */
    uint8_t flags;     /**< IKV_PAGE_* */
    uint16_t reserved; /**< 0 */
} ikv_plan_page;

/** Why the router decided what it did for a block. */
typedef enum ikv_reason {
    IKV_REASON_ALWAYS = 0,            /**< policy ALWAYS: read */
    IKV_REASON_GLOBAL = 1,            /**< policy GLOBAL: read */
    IKV_REASON_RECENT_WINDOW = 2,     /**< read because it lies (partly) in the recent window */
    IKV_REASON_SCORE = 3,             /**< ATTEND: score cleared the threshold and fit the budget */
    IKV_REASON_POLICY_SKIP = 4,       /**< policy SKIP: never read */
    IKV_REASON_BELOW_THRESHOLD = 5,   /**< ATTEND: score below attend_threshold */
    IKV_REASON_BUDGET_EXHAUSTED = 6,  /**< ATTEND: cleared the threshold but did not fit the budget */
    IKV_REASON_OUTSIDE_WINDOW = 7,    /**< policy RECENT: entirely older than the recent window */
    IKV_REASON_OVER_BUDGET_KEPT = 8,  /**< mandatory, kept although mandatory tokens exceed the budget (an ATTEND
                                           block read on its score inside the window keeps IKV_REASON_SCORE) */
    IKV_REASON_COUNT = 9
} ikv_reason;

IKV_API const char *ikv_reason_name(ikv_reason reason);

typedef struct ikv_block_decision {
    uint32_t block_id;         /**< the layout's id (UINT32_MAX for an unlabeled gap) */
    uint32_t start, end;       /**< the block's range */
    uint32_t tokens_selected;  /**< tokens of the block the plan reads */
    uint8_t selected;          /**< 1 if any token is read */
    uint8_t format;            /**< ikv_format chosen (meaningful when selected) */
    uint16_t reason;           /**< ikv_reason */
} ikv_block_decision;

typedef struct ikv_plan_summary {
    uint32_t seq_len;
    uint32_t page_size;
    uint32_t tokens_selected;
    uint32_t tokens_skipped;
    uint32_t pages_selected;     /**< distinct pages read */
    uint32_t pages_total;        /**< ceil(seq_len / page_size) */
    uint32_t tokens_by_format[IKV_FMT_COUNT];
    uint32_t mandatory_tokens;
    uint32_t token_budget;       /**< the router's budget (0 = unlimited) */
    int over_budget;             /**< mandatory tokens exceed the budget (IKV_OVER_BUDGET_KEEP) */
} ikv_plan_summary;

/** Summary counts. Errors: IKV_E_NULL. */
IKV_API ikv_status ikv_plan_get_summary(const ikv_plan *plan, ikv_plan_summary *out);
/* The plan's lists below (pages, skipped pages, prefetch hints, decisions) point into the plan and stay
 * valid until it is destroyed; an empty list gives *count 0 and a NULL pointer (plans from
 * ikv_plan_from_ranges have no decisions). Errors: IKV_E_NULL. */
/** Selected pages (shared by all kv-heads). *pages points into the plan, valid until it is destroyed. */
IKV_API ikv_status ikv_plan_pages(const ikv_plan *plan, const ikv_plan_page **pages, size_t *count);
/** Pages skipped entirely (no token read), ascending. Points into the plan. */
IKV_API ikv_status ikv_plan_skipped_pages(const ikv_plan *plan, const uint32_t **pages, size_t *count);
/**
 * Pages likely needed by the next step (not selected now), most likely first:
 * the page the next token lands in (pages_total when seq_len is a multiple of
 * page_size: a page not allocated yet, outside ikv_plan_page_format's range),
 * then the unread pages of ATTEND blocks and unlabeled gaps not read whole
 * (read in part, or not at all), best score first (equal scores: the newer
 * block first). Plans from ikv_plan_from_ranges have none.
 * Points into the plan.
 */
IKV_API ikv_status ikv_plan_prefetch(const ikv_plan *plan, const uint32_t **pages, size_t *count);
/** One decision per layout block in start order, plus gaps. Points into the plan. */
IKV_API ikv_status ikv_plan_decisions(const ikv_plan *plan, const ikv_block_decision **decisions, size_t *count);
/** Storage format the plan assigns to token page `page` (selected or not; skipped pages get the lowest format of
 * their blocks). Errors: IKV_E_NULL, IKV_E_RANGE (page >= pages_total). */
IKV_API ikv_status ikv_plan_page_format(const ikv_plan *plan, uint32_t page, ikv_format *out);

/** Model shape for the cost model. */
typedef struct ikv_model_shape {
    uint32_t struct_size;
    uint32_t n_layers;
    uint32_t n_q_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
} ikv_model_shape;

/** 32 layers, 32 q-heads, 8 kv-heads, head_dim 128 (a Llama-3-8B-like shape). */
IKV_API ikv_model_shape ikv_model_shape_default(void);

/** Bytes and FLOPs of one decode step (one query token, all layers) under a plan. */
typedef struct ikv_plan_cost {
    uint64_t bytes_by_format[IKV_FMT_COUNT]; /**< K+V bytes read, scales included (key summaries are not read) */
    uint64_t bytes_total;
    uint64_t bytes_dense_f16;                /**< every token in F16 */
    uint64_t flops;                          /**< 4 * tokens * head_dim * n_q_heads * n_layers */
    uint64_t flops_dense;
} ikv_plan_cost;

/**
 * Cost of a plan for a model shape, in the bytes a decode of the plan reads
 * from a pool's pages (the count ikv_decoder_last_bytes_read makes: K and V
 * rows and their scales; the key summaries a page also stores are not read).
 * Errors: IKV_E_NULL, IKV_E_INVALID (shape->struct_size smaller than the
 * first version of ikv_model_shape, a zero field, head_dim not a multiple
 * of 16, n_q_heads not a multiple of n_kv_heads, or a shape so large that a
 * figure would pass 64 bits; *out is then unchanged).
 */
IKV_API ikv_status ikv_plan_get_cost(const ikv_plan *plan, const ikv_model_shape *shape, ikv_plan_cost *out);

/** Plans are immutable after creation: any number of threads may read one. */

/* ------------------------------------------------------------------------ */
/* KV page pool                                                              */
/* ------------------------------------------------------------------------ */

typedef struct ikv_pool ikv_pool;
typedef uint32_t ikv_seq_id;

typedef struct ikv_pool_config {
    uint32_t struct_size;
    ikv_backend backend;        /**< CPU (default) or CUDA */
    int device;                 /**< CUDA device ordinal; default 0; CPU pools ignore it */
    uint32_t n_layers;          /**< 1..65536 */
    uint32_t n_kv_heads;        /**< 1..65536 */
    uint32_t head_dim;          /**< 32, 64, 80, 96, 128 or 256 (CUDA pools: 32, 64, 128 or 256; 80 and 96 are
                                     refused there with IKV_E_UNSUPPORTED) */
    uint32_t page_size;         /**< power of two in [8, 128]; default 16 */
    uint64_t capacity_bytes;    /**< bytes of page storage (all formats, scales included); default 1 GiB;
                                     >= 1 (a pool smaller than a page refuses every append: IKV_E_NOMEM) */
    ikv_format default_format;  /**< format of new pages when no plan says otherwise; default F16 */
    ikv_dtype kv_dtype;         /**< element type of the K/V the engine appends; default F16 */
    /* Later fields: a caller built with an older header (smaller struct_size) gets their defaults. */
    uint64_t host_capacity_bytes; /**< CUDA pools: bytes of pinned host memory for a host tier of pages
                                       (ikv_seq_offload); 0 (default) = no host tier. CPU pools: must be 0.
                                       A pool with a host tier keeps the slab memory it allocated in both
                                       tiers until it is destroyed (reserved_bytes does not shrink): pages
                                       move back and forth, pinned allocation costs about 0.5 ms per MB and
                                       freeing device or pinned memory synchronizes the device */
} ikv_pool_config;

/**
 * The defaults of every field (CPU backend, device 0, 32 layers, 8 kv-heads,
 * head_dim 128, page 16, 1 GiB, F16 pages, F16 K/V, no host tier). A struct
 * returned by value cannot grow under a program built with an older header
 * (its return slot is the older size), so each version of the struct has its
 * own symbol and ikv_pool_default_config() names this header's:
 * ikv_pool_default_config_v2. The unversioned symbol stays exported for
 * programs built against the first header and fills only that version's
 * fields (struct_size 48 on 64-bit, through kv_dtype).
 */
IKV_API ikv_pool_config ikv_pool_default_config_v2(void);
#define ikv_pool_default_config() ikv_pool_default_config_v2()

/**
 * Create a pool. Page storage comes from mimalloc (host) or cudaMalloc
 * (device) in slabs as pages are needed, up to capacity_bytes: live pages
 * never pass it. The slab memory held (ikv_pool_stats.reserved_bytes) also
 * counts the free pages of part-used slabs, which only their own format can
 * use, and on the host the padding that aligns each page to 64 bytes, so it
 * can pass capacity_bytes by that padding (up to 63 bytes per page, where a
 * page's bytes are not a multiple of 64), by those free pages, and by the
 * empty slabs kept: each format keeps at most one (a CUDA pool with a host
 * tier keeps all), so with several formats, or a call that allocates a page
 * before it frees one (a truncate copying a shared tail), up to one slab per
 * format (a slab holds at most a 16th of capacity_bytes, at least one page,
 * and at most 1 MiB on the host or 64 MiB on a device). A call that fails
 * for lack of memory may leave a slab it allocated held (empty, in
 * reserved_bytes, reused by later calls). A CPU pool also gives back
 * other formats' empty slabs
 * before a new slab would pass capacity_bytes (a CUDA pool does not free
 * device slabs to make room: a free waits for the device).
 * Errors: IKV_E_NULL, IKV_E_INVALID (names the field), IKV_E_NO_DEVICE (CUDA
 * not built, no GPU, or config->device not a device ordinal), IKV_E_UNSUPPORTED (a CUDA pool of head_dim 80 or
 * 96), IKV_E_DEVICE, IKV_E_NOMEM.
 */
IKV_API ikv_status ikv_pool_create(const ikv_pool_config *config, ikv_pool **out);
/** Free the pool and every sequence in it. No call on the pool may be in flight. */
IKV_API void ikv_pool_destroy(ikv_pool *pool);
/** Copy of the pool's config; set out->struct_size first. Errors: IKV_E_NULL, IKV_E_INVALID (struct_size). */
IKV_API ikv_status ikv_pool_get_config(const ikv_pool *pool, ikv_pool_config *out);

/** Bytes one page occupies in a format (all layers and kv-heads, scales included). 0 on bad input. */
IKV_API uint64_t ikv_pool_page_bytes(const ikv_pool *pool, ikv_format format);

typedef struct ikv_pool_stats {
    uint32_t struct_size;
    uint64_t capacity_bytes;
    uint64_t used_bytes;                      /**< bytes of live pages (CUDA pools with a host tier: of those in
                                                   device memory, the ones capacity_bytes bounds) */
    uint64_t pages_used;                      /**< live pages, every tier */
    uint64_t pages_by_format[IKV_FMT_COUNT];  /**< every tier */
    uint64_t bytes_by_format[IKV_FMT_COUNT];  /**< every tier */
    uint64_t reserved_bytes;                  /**< slab memory held, >= used_bytes */
    uint64_t staging_bytes;                   /**< fp32 copies of partial tail pages (device memory on CUDA pools):
                                                   2*n_kv_heads*page_size*head_dim*4 bytes per layer with a partial
                                                   tail page (a CPU pool keeps another 16 + 32*head_dim bytes per
                                                   kv-head beside each, the page's running statistics, not counted
                                                   here: docs/FORMATS.md) */
    uint32_t n_sequences;
    uint64_t tokens_total;                    /**< sum of sequence lengths */
    /* Later fields (a caller built with an older header gets the fields it knows): the host tier */
    uint64_t host_used_bytes;                 /**< bytes of pages in the host tier (<= host_capacity_bytes) */
    uint64_t host_pages;                      /**< pages in the host tier */
    uint64_t bytes_offloaded;                 /**< page bytes moved device -> host since the pool was created */
    uint64_t bytes_fetched;                   /**< page bytes moved host -> device since the pool was created */
    uint64_t host_page_reads;                 /**< pages in host memory that decode calls listed, one per page and
                                                   call (read over the bus: the stalls the tier policy avoids; with
                                                   query-aware top-k, host-tier candidates, which it may read;
                                                   counted when a call is made or captured, not at graph replay) */
    uint64_t host_reserved_bytes;             /**< pinned host slab memory the host tier holds, >= host_used_bytes
                                                   (kept while the pool lives: see host_capacity_bytes) */
} ikv_pool_stats;

/** Errors: IKV_E_NULL, IKV_E_INVALID (struct_size). */
IKV_API ikv_status ikv_pool_get_stats(const ikv_pool *pool, ikv_pool_stats *out);

/** Create an empty sequence. Errors: IKV_E_NULL, IKV_E_NOMEM. */
IKV_API ikv_status ikv_seq_create(ikv_pool *pool, ikv_seq_id *id_out);
/** Destroy a sequence; its pages are released (shared pages when their last user goes). Errors: IKV_E_NULL,
 * IKV_E_NOT_FOUND. */
IKV_API ikv_status ikv_seq_destroy(ikv_pool *pool, ikv_seq_id seq);
/** Tokens stored in every layer (a token appended to only some layers does not count yet).
 * Errors: IKV_E_NULL, IKV_E_NOT_FOUND. */
IKV_API ikv_status ikv_seq_length(const ikv_pool *pool, ikv_seq_id seq, uint32_t *length_out);
/**
 * Tokens stored in one layer (per-layer appends make layers differ inside a
 * step; a decode at that layer reads this many). Thread-safety: as
 * ikv_seq_length. Errors: IKV_E_NULL, IKV_E_NOT_FOUND, IKV_E_RANGE (layer).
 */
IKV_API ikv_status ikv_seq_layer_length(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t *length_out);

/** Pass as ikv_append.layer to append the same tokens to every layer at once. */
#define IKV_ALL_LAYERS UINT32_MAX

/**
 * K and V of n_tokens new tokens. Element (t, h, d) of layer l is at
 * k[l*layer_stride + t*token_stride + h*head_stride + d] (d contiguous), in
 * the pool's kv_dtype. Strides are in elements; layer_stride is read only for
 * IKV_ALL_LAYERS. k and v share strides.
 */
typedef struct ikv_append {
    uint32_t struct_size;
    uint32_t layer;             /**< 0..n_layers-1, or IKV_ALL_LAYERS */
    uint32_t n_tokens;          /**< >= 1 */
    const void *k;
    const void *v;
    int64_t token_stride;       /**< default n_kv_heads*head_dim */
    int64_t head_stride;        /**< default head_dim */
    int64_t layer_stride;       /**< default n_tokens*n_kv_heads*head_dim */
    int src_on_device;          /**< CUDA pools: 1 if k/v are device pointers (never copied to the host) */
    void *stream;               /**< CUDA pools: cudaStream_t that wrote k/v (waited for), NULL = default stream */
    const ikv_plan *formats;    /**< optional: new pages take ikv_plan_page_format(); else default_format */
    /* Later fields: a caller built with an older header (smaller struct_size) gets their defaults. */
    int64_t seq_stride;         /**< ikv_pool_append_batch: elements from one sequence's rows to the next's;
                                     default n_tokens*n_kv_heads*head_dim. Ignored by ikv_pool_append. */
    uint32_t flags;             /**< IKV_APPEND_* bits; default 0 */
} ikv_append;

/**
 * ikv_append.flags: do not wait for the device (CUDA pools, device input).
 * The append's device work (page initialization, copy-on-write, staging,
 * quantize-on-write) is enqueued on args->stream and the call returns
 * without synchronizing, so an engine's layer loop (append, then decode on
 * the same stream) never stalls the GPU and can be issued ahead of it.
 * Everything checked on the host is checked as usual and a failure changes
 * nothing (arguments, capacity, evicted pages). What is not: the finiteness
 * of the input, which needs the device's answer. A non-finite element is
 * stored as 0, and the first one met is reported by ikv_pool_sync.
 * Work that reads the appended tokens (ikv_decode) must run on args->stream
 * or be ordered after it by the engine. The pool's synchronous calls (reads,
 * truncate, fork, format changes, appends without this flag) first wait for
 * its asynchronous appends. Requires src_on_device on a CUDA pool; a CPU
 * pool accepts the flag and appends synchronously, checked, as without it.
 * One exception to "without synchronizing": an append that needs more of
 * the pool's device buffers than earlier appends did (the first one that
 * writes whole pages, or more whole pages at once than before, or more than
 * 64 page writes at once and more than before) waits for the earlier
 * asynchronous appends and allocates them; a one-token append never does once the pool has
 * appended a token. Make the largest such append once before the loop that
 * must not stall (as for graph capture). k and v must stay allocated and
 * unchanged until args->stream has run the append.
 */
#define IKV_APPEND_ASYNC 0x1u

/**
 * Fills struct_size and the default strides for a pool and token count
 * (layer 0, no plan, flags 0; seq_stride for a dense batch of n_tokens per
 * sequence). Returned by value, so each version of the struct has its own
 * symbol (as ikv_pool_default_config) and ikv_append_default() names this
 * header's: ikv_append_default_v2. The unversioned symbol stays exported for
 * programs built against the first header and fills only that version's
 * fields (struct_size 80 on 64-bit, through `formats`). (Programs built
 * against the headers that added seq_stride and flags while the symbol was
 * still unversioned get that first layout too: their later fields are read
 * as their defaults until they are rebuilt.) NULL pool: zero strides.
 */
IKV_API ikv_append ikv_append_default_v2(const ikv_pool *pool, uint32_t n_tokens);
#define ikv_append_default(pool, n_tokens) ikv_append_default_v2(pool, n_tokens)

/**
 * Append tokens to one layer (or all). Tokens land at positions
 * [layer_length, layer_length + n_tokens) of that layer; the sequence length
 * grows when every layer has them. Quantize on write: a page's format is fixed
 * when the page is first allocated. While the tail page is partial, the pool
 * keeps an fp32 copy of its tokens (staging) and the page always holds what
 * quantizing all its tokens at once from that copy stores, so scales cover
 * the page's true range and a page's error bound is that of one quantization
 * (token-by-token appends store the same bytes as one bulk append). A CPU
 * pool gets there incrementally: an append encodes its new rows and
 * re-quantizes older rows only where a scale widened (docs/FORMATS.md).
 * Atomic: on error nothing was written and no page was allocated (one
 * exception, on CUDA pools: an IKV_E_DEVICE raised by the device while the
 * rows are written, after every check and allocation succeeded, leaves the
 * pages allocated and the lengths advanced with the new rows undefined; roll
 * them back with ikv_seq_truncate or destroy the sequence). Device memory
 * that runs out is IKV_E_NOMEM, before anything changes.
 * Strides must be >= head_dim. K and V must be finite: a NaN or inf anywhere
 * is rejected with IKV_E_INVALID naming its layer, token, head and channel
 * (with IKV_APPEND_ASYNC it is stored as 0 and reported by ikv_pool_sync).
 * Errors: IKV_E_NULL, IKV_E_NOT_FOUND, IKV_E_RANGE (layer; a layer that
 * would hold more than 2^32-1 tokens; a batch of more than 2^32-1 tokens in
 * all), IKV_E_INVALID (n_tokens, strides, non-finite values, a plan of
 * another page_size, unknown flags, src_on_device on a CPU pool,
 * IKV_APPEND_ASYNC with host input on a CUDA pool, a stream
 * that is capturing a CUDA graph unless the sequences have room reserved:
 * ikv_pool_reserve; with room: host input, more than page_size tokens,
 * sequences with and without room in one batch, no IKV_APPEND_ASYNC on a
 * capturing stream, more than 1024 sequences; args->struct_size below the
 * first version's), IKV_E_RANGE (on a CUDA
 * pool, an append that would pass a reserved room; a CPU pool allocates
 * pages past it as without room), IKV_E_NOMEM (capacity), IKV_E_EVICTED
 * (the page the tokens land in was evicted), IKV_E_DEVICE.
 */
IKV_API ikv_status ikv_pool_append(ikv_pool *pool, ikv_seq_id seq, const ikv_append *args);

/**
 * ikv_pool_append to n_seqs sequences at once: the engine's decode step
 * appends each sequence's new token(s) to one layer (or all) in one call.
 * Sequence seqs[i] gets args->n_tokens tokens whose element (t, h, d) of
 * layer l is at k[l*layer_stride + i*seq_stride + t*token_stride +
 * h*head_stride + d] (layer_stride only for IKV_ALL_LAYERS; for a dense
 * [layers][n_seqs][n_tokens][heads][head_dim] tensor set layer_stride to
 * n_seqs*seq_stride: the default suits one sequence). args->formats, when
 * set, applies to every sequence's new pages.
 * The bytes stored equal n_seqs calls of ikv_pool_append, and so do the pages
 * used: a shared page whose holders are all in the batch and all write into
 * it (a fork and its parent) is copied for all but the last of them, which
 * writes it in place, as the single calls would (the same holds for
 * ikv_pool_reserve). On a CUDA pool the
 * whole batch is checked for finiteness by one kernel with one 8-byte
 * read-back and written by one launch per round (a one-token batch is one
 * round), so the call costs about what a one-sequence append does.
 * Atomic over the batch: on error no sequence changed and no page was
 * allocated. Thread-safety: as ikv_pool_append on each of the sequences.
 * Errors: those of ikv_pool_append (a non-finite value is named with its
 * sequence), IKV_E_NULL (seqs), IKV_E_INVALID (n_seqs 0, a sequence listed
 * twice, seq_stride < head_dim when n_seqs > 1).
 */
IKV_API ikv_status ikv_pool_append_batch(ikv_pool *pool, const ikv_seq_id *seqs, uint32_t n_seqs,
                                         const ikv_append *args);

/**
 * Wait until the pool's asynchronous appends (IKV_APPEND_ASYNC) are done on
 * the device, and report the first non-finite input element any of them met
 * since the previous ikv_pool_sync: IKV_E_INVALID naming its sequence, K or
 * V, layer, token, head and channel (the element was stored as 0). The
 * report is then cleared. Engines call it where they synchronize anyway (end
 * of a step) or when debugging. Thread-safe with the pool's other calls (not
 * ikv_pool_tier_step, which needs the pool to itself; and on a CUDA pool
 * with rooms it changes those sequences' lengths: see "Thread-safety of
 * pools" below).
 * On a CUDA pool it also brings the host's view of the sequences with
 * reserved room (ikv_pool_reserve) up to their device lengths: after graph
 * replays, ikv_seq_length and the other host-side readers count the tokens
 * the replays appended once this call returned. An append to such a
 * sequence that would have passed its room wrote nothing (and did not
 * advance the length): reported here as IKV_E_RANGE naming the sequence and
 * layer, and the replay of a graph captured with a room that has since been
 * replaced or ended (or whose sequence was destroyed) as IKV_E_STATE. The
 * first incident found is reported and every one found is cleared (the
 * non-finite report takes precedence).
 * Errors: IKV_E_NULL, IKV_E_INVALID, IKV_E_RANGE, IKV_E_STATE (as above),
 * IKV_E_NOMEM (host memory for collecting the device's lengths),
 * IKV_E_DEVICE. A CPU pool has nothing pending: IKV_OK.
 */
IKV_API ikv_status ikv_pool_sync(ikv_pool *pool);

/**
 * Room reserved ahead, for an engine that captures its whole decode step,
 * every layer's append and decode, in one CUDA graph and replays it while
 * the sequences grow (as serving engines run decode).
 *
 * Makes the next n_tokens tokens of every layer of each sequence land in
 * pages allocated now: pages for positions up to (the longest layer's
 * length) + n_tokens are allocated in the pool's default format (an
 * append's args->formats does not apply to them), every shared page a
 * token of the room will land in is copied now (copy-on-write: the tail
 * page, and with layers of unequal lengths every shared page from the
 * shortest layer's tail on), and the memory is charged to the pool at once
 * (ikv_pool_stats counts the pages; ikv_seq_page_format reports them).
 * Calling it again replaces the room, measured from the lengths then (pages
 * no token reaches are released once the new room is in place; until then
 * they still count against capacity_bytes); n_tokens = 0 ends it. Atomic: on
 * error no sequence changed (except IKV_E_DEVICE from writing a room's
 * device record: the sequences before it have their new rooms, it and those
 * after keep their old rooms with the new pages allocated).
 *
 * CPU pools: that is all: appends into the room allocate no pages (unless a
 * fork shares the tail page again: it is copied on the next append), and
 * ikv_seq_fork shares a sequence's tokens, not its room. A CPU pool keeps no
 * record of the room beyond its pages: ikv_seq_truncate releases every page
 * past the new length, the room's included (reserve again after a
 * rollback).
 * CUDA pools: while a sequence has room, the device keeps its stored length
 * per layer, and its appends (device input) and decodes read it there: an
 * append writes at the device's length and advances it, and ikv_decode reads
 * each sequence up to the length its layer has when the kernels run. So such
 * appends (with IKV_APPEND_ASYNC) and decodes may run on a stream that is
 * capturing a CUDA graph (any capture mode), and each replay of the graph
 * appends the next tokens and decodes over them. Byte for byte, a replay
 * stores and outputs what the same calls made eagerly with the same room do.
 * The rules while a CUDA sequence has room:
 *  - an append carries at most page_size tokens per sequence, lists only
 *    sequences with room and at most 1024 of them (IKV_E_INVALID otherwise);
 *    one that would pass the room writes nothing and is reported by
 *    ikv_pool_sync (IKV_E_RANGE), or by the call itself (IKV_E_RANGE) when
 *    the host already knows it would or the append is synchronous;
 *  - the host takes the lengths from the device in ikv_pool_sync (and
 *    ikv_pool_reserve): until then ikv_seq_length and the other reading
 *    calls count neither replayed nor asynchronous appends to such
 *    sequences (a synchronous append is counted when it returns);
 *  - a graph holds the room it was captured with: after ikv_pool_reserve
 *    replaces or ends the room, or the sequence is destroyed, its replays
 *    append and read nothing for that sequence and ikv_pool_sync reports
 *    IKV_E_STATE; capture the step again. A graph also holds the page
 *    addresses of its capture: evicting pages or moving them between tiers
 *    needs a new capture too;
 *  - eager appends may be mixed with replays; decodes follow ikv_decode's
 *    rules for graphs (one decoder per captured step);
 *  - ikv_seq_fork (of it), ikv_seq_truncate and format changes are refused
 *    with IKV_E_STATE: end the room first (n_tokens = 0);
 *  - a decode's list of pages covers the room, so ikv_decoder_last_bytes_read
 *    and the page-list statistics count the room's pages as listed.
 * Thread-safety: as ikv_pool_append on each of the sequences. On a CUDA pool
 * this call, ikv_pool_sync, ikv_seq_destroy of a sequence with room and a
 * synchronous append (no IKV_APPEND_ASYNC) to one wait for the whole device
 * (the replays the pool never sees), so they must not run while a stream
 * captures in global or thread-local mode (a device-wide wait invalidates
 * such a capture): call them between steps, for example every few hundred
 * steps. Errors: IKV_E_NULL (pool, seqs), IKV_E_NOT_FOUND, IKV_E_INVALID
 * (n_seqs 0, a sequence listed twice), IKV_E_RANGE (a length beyond
 * 2^32-1), IKV_E_NOMEM (capacity, or host memory), IKV_E_EVICTED (a page the room's tokens
 * land in was evicted), IKV_E_DEVICE.
 */
IKV_API ikv_status ikv_pool_reserve(ikv_pool *pool, const ikv_seq_id *seqs, uint32_t n_seqs, uint32_t n_tokens);

/**
 * Fork: a new sequence sharing all of parent's pages by reference. Full pages
 * stay shared; a shared partial tail page is copied by whichever sequence
 * appends to it first (copy-on-write). Waits for the pool's asynchronous
 * appends first (IKV_APPEND_ASYNC). Errors: IKV_E_NULL, IKV_E_NOT_FOUND,
 * IKV_E_NOMEM, IKV_E_STATE (parent has room reserved on a CUDA pool:
 * ikv_pool_reserve), IKV_E_DEVICE (CUDA pools: waiting for the asynchronous
 * appends or copying the parent's staging; nothing changed).
 */
IKV_API ikv_status ikv_seq_fork(ikv_pool *pool, ikv_seq_id parent, ikv_seq_id *child_out);

/**
 * Roll back the last n_tokens of every layer (speculative decoding). Pages
 * that become empty are released, and so is every page past the new length
 * (n_tokens 0 changes no token; on a CPU pool it releases the pages of a
 * room reserved past the length: ikv_pool_reserve). If the new tail page is
 * partial its kept tokens are re-staged from their stored (dequantized)
 * values, so a later append re-quantizes them once more: the bound then
 * applies twice, and FORMATS.md says so. Waits for the pool's asynchronous
 * appends first (IKV_APPEND_ASYNC). Errors: IKV_E_NULL, IKV_E_NOT_FOUND,
 * IKV_E_RANGE (n_tokens > length), IKV_E_EVICTED (the new tail page would
 * be partial and is evicted; rolling back to a page boundary among evicted
 * pages is allowed), IKV_E_STATE (layers of unequal length, or room reserved on
 * a CUDA pool: ikv_pool_reserve), IKV_E_NOMEM (copy of a shared tail page,
 * when the pages the rollback releases do not free room for it),
 * IKV_E_DEVICE (CUDA pools: from the wait for asynchronous appends nothing
 * changed; raised while the new tail page is rewritten, it leaves the
 * rollback done and that page's contents undefined).
 */
IKV_API ikv_status ikv_seq_truncate(ikv_pool *pool, ikv_seq_id seq, uint32_t n_tokens);

/**
 * Evict whole pages [begin, end): begin and end are multiples of page_size
 * and end <= the length rounded down to a page (a partial tail page, the
 * one still being written, is never evicted; a full last page may be). The
 * pages are released (shared ones when their last user goes) and their block
 * table entries point at a dead sentinel; positions of the surviving tokens do
 * not move and decode treats evicted tokens as absent. Evicting an already
 * evicted page is allowed and does nothing. Errors: IKV_E_NOT_FOUND,
 * IKV_E_RANGE, IKV_E_INVALID (not page aligned).
 */
IKV_API ikv_status ikv_seq_evict(ikv_pool *pool, ikv_seq_id seq, uint32_t begin, uint32_t end);

/** 1 if token's page was evicted, 0 if live. token below the longest layer's stored length (which
 *  ikv_seq_length gives when the layers are equal). Errors: IKV_E_NOT_FOUND, IKV_E_RANGE. */
IKV_API ikv_status ikv_seq_is_evicted(const ikv_pool *pool, ikv_seq_id seq, uint32_t token, int *evicted_out);

/**
 * Tiered memory (CUDA pools created with host_capacity_bytes > 0): move the
 * pages of seq overlapping tokens [begin, end) between device memory and the
 * pool's pinned host memory. Every page is in exactly one tier; its block
 * table entry, format, bytes and key summary are the same in both, and a
 * decode reads a host-tier page where it is, over the bus (mapped pinned
 * memory): the output is the same byte for byte, only slower. So an engine
 * keeps on the device what its plans read (ikv_plan_pages, the prefetch
 * hints of ikv_plan_prefetch) and offloads the rest.
 *
 * ikv_seq_offload moves device pages to the host; ikv_seq_fetch brings host
 * pages back. Moved are the whole pages in range that this sequence alone
 * holds and whose every layer is complete; pages a fork shares, the partial
 * tail page, evicted pages and pages already in the target tier stay where
 * they are. *moved_out (may be NULL) receives how many pages moved (on
 * success only: an error leaves it as it was).
 * The copies are enqueued on stream (a cudaStream_t of the pool's device;
 * NULL = the default stream) behind the work already on it, and the call
 * returns without waiting: work on that stream afterwards (decodes, appends)
 * sees the pages in their new place; work on other streams that reads these
 * pages must be ordered by the engine (an event) before this call and after
 * the copies. The pool's synchronous calls wait for the copies. A page's old
 * memory is reused only once its copy is done.
 * Atomic: when the target tier lacks room for all of them (capacity_bytes on
 * the device, host_capacity_bytes on the host), nothing moves: IKV_E_NOMEM.
 * A format change (ikv_seq_set_page_format, ikv_seq_apply_plan_formats)
 * re-stores a host-tier page in device memory: it needs device room, as for
 * any page it re-stores, and the page is then a device page.
 * Thread-safety: as a format change (the sequence's calls are the caller's
 * to order). Errors: IKV_E_NULL, IKV_E_NOT_FOUND, IKV_E_RANGE (begin > end
 * or end beyond the sequence), IKV_E_INVALID (a stream that is capturing a
 * CUDA graph: move pages before or after the capture), IKV_E_UNSUPPORTED (a
 * CPU pool, or no host tier), IKV_E_NOMEM, IKV_E_DEVICE.
 */
IKV_API ikv_status ikv_seq_offload(ikv_pool *pool, ikv_seq_id seq, uint32_t begin, uint32_t end, void *stream,
                                   uint32_t *moved_out);
IKV_API ikv_status ikv_seq_fetch(ikv_pool *pool, ikv_seq_id seq, uint32_t begin, uint32_t end, void *stream,
                                 uint32_t *moved_out);

/** 1 if page `page` of seq is in the host tier, 0 if in device memory (CPU pools: always 0).
 *  Errors: IKV_E_NULL, IKV_E_NOT_FOUND, IKV_E_RANGE (page beyond the sequence's pages: those holding its
 *  tokens and those of its room, ikv_pool_reserve), IKV_E_EVICTED. */
IKV_API ikv_status ikv_seq_page_tier(const ikv_pool *pool, ikv_seq_id seq, uint32_t page, int *on_host_out);

/**
 * The automatic tier policy of a CUDA pool with a host tier: the pool keeps
 * a step count and, per page, the last step that used it; ikv_pool_tier_step
 * (once per engine step) offloads pages idle for idle_steps steps when device
 * memory is under pressure, and fetches the pages the step's plans read.
 * A field left 0 takes its default, so a zeroed struct with struct_size set
 * is the default policy.
 */
#define IKV_TIER_NO_PREFETCH 0x1u /**< ikv_pool_tier_step fetches nothing: the step's pages stay where they are and
                                       decodes read host-tier ones over the bus (measuring the fetch's worth) */
typedef struct ikv_tier_policy {
    uint32_t struct_size;
    uint32_t idle_steps; /**< a page no ikv_pool_tier_step named for at least this many steps is idle: offloaded
                              under pressure; a page used more recently moves only to make room for the pages
                              a step reads; default 8 */
    float device_high;   /**< pressure: a step offloads when device-resident page bytes, with what it is about to
                              fetch, would exceed this share of capacity_bytes; in (0, 1]; default 0.9 */
    float device_low;    /**< it then offloads idle pages, least recently used first, down to this share; in
                              (0, device_high]; default min(0.75, device_high) */
    uint32_t flags;      /**< IKV_TIER_* */
} ikv_tier_policy;

/**
 * Turn the automatic tier policy on (policy != NULL; fields checked, 0 =
 * default) or off (NULL). Changes no page; the next ikv_pool_tier_step acts.
 * Thread-safety: as ikv_pool_tier_step. Errors: IKV_E_NULL (pool),
 * IKV_E_INVALID (struct_size, or a field out of range: named),
 * IKV_E_UNSUPPORTED (a CPU pool, or a CUDA pool without a host tier).
 */
IKV_API ikv_status ikv_pool_set_tier_policy(ikv_pool *pool, const ikv_tier_policy *policy);

/** What one ikv_pool_tier_step did. Set struct_size first. */
typedef struct ikv_tier_step_report {
    uint32_t struct_size;
    uint32_t pages_fetched;   /**< pages moved host -> device by this call */
    uint32_t pages_offloaded; /**< pages moved device -> host by this call */
    uint32_t pages_on_host;   /**< pages this step's plans read that are still in host memory after the call (no
                                   device room, shared by a fork, a partial tail page, or IKV_TIER_NO_PREFETCH):
                                   the step's decodes read them over the bus */
    uint64_t step;            /**< the pool's step count after this call (the first call makes it 1) */
} ikv_tier_step_report;

/**
 * One step of the automatic tier policy; call it once per engine step,
 * before the step's decodes, with the sequences the step decodes and the
 * plans it passes them (plans NULL, or plans[i] NULL: the whole sequence;
 * n_seqs may be 0 for a step that only relieves pressure, e.g. between
 * prefill chunks). In order:
 *   1. the step count advances and every page the step reads is marked used
 *      now: each plan's pages and its prefetch hints (ikv_plan_prefetch), or
 *      every page of a sequence without a plan;
 *   2. under pressure (see ikv_tier_policy), device pages of any sequence of
 *      the pool that no step marked for idle_steps steps move to the host,
 *      least recently used first, down to device_low; when the pages this
 *      step reads still lack room below device_high, pages it does not read
 *      follow, least recently used first, though used recently: what the
 *      step reads outranks what earlier steps read. All as far as the host
 *      tier has room;
 *   3. unless IKV_TIER_NO_PREFETCH, the marked pages in host memory move to
 *      the device, plan pages before prefetch hints, as far as device_high
 *      allows (the room above it is left to the step's appends).
 * Moves follow ikv_seq_offload's rules (pages a fork shares and partial tail
 * pages stay). Fetches are enqueued on stream (NULL = the default stream)
 * behind the work on it: decodes enqueued on that stream afterwards read the
 * pages in their new place; work on other streams must be ordered by the
 * engine. Offloads run on a copy stream of the pool's own, behind the work
 * enqueued on stream so far, so the bus carries both directions at once and
 * the engine's stream does not wait for them: a fetch into device memory an
 * offload empties waits for that copy on the device; a later decode (on any
 * stream) that reads an offloaded page in host memory, a later move, and the
 * pool's synchronous calls (ikv_pool_sync among them) wait for the
 * offloads' copies. The engine's stream does not: a step's work is done
 * when its stream is, while its offloads may still be copying in the
 * background (cudaDeviceSynchronize waits for them too).
 * The policy knows only what tier_step is told: with query-aware top-k, the
 * plan is the candidate set, so its pages count as used whether top-k picks
 * them or not; a sequence decoded without being named here looks idle. A
 * decode that reads a host-tier page is still exact (counted in
 * ikv_pool_stats.host_page_reads).
 * *report (may be NULL) says what moved and what stayed on the host.
 * Thread-safety: it reads every sequence of the pool, so no other call on
 * this pool may run during it (decodes still executing on a stream are
 * fine). Errors (nothing changed): IKV_E_NULL, IKV_E_UNSUPPORTED (a CPU
 * pool or no host tier), IKV_E_STATE (no policy set:
 * ikv_pool_set_tier_policy), IKV_E_NOT_FOUND (a sequence), IKV_E_INVALID
 * (a plan of another page size, a capturing stream, or
 * report->struct_size); IKV_E_NOMEM (host memory for its bookkeeping,
 * or pinned slabs that cannot be allocated) after marking, with no page
 * moved and *report not written; IKV_E_DEVICE likewise, except that a CUDA
 * error striking while the copies are being enqueued leaves the pages that
 * were moving undefined (the device is failing).
 */
IKV_API ikv_status ikv_pool_tier_step(ikv_pool *pool, const ikv_seq_id *seqs, const ikv_plan *const *plans,
                                      uint32_t n_seqs, void *stream, ikv_tier_step_report *report);

/** The storage format of page `page` (tokens [page*page_size, (page+1)*page_size)). Errors: IKV_E_NOT_FOUND,
 *  IKV_E_RANGE (page beyond the sequence's pages: those holding its tokens and those of its room), IKV_E_EVICTED. */
IKV_API ikv_status ikv_seq_page_format(const ikv_pool *pool, ikv_seq_id seq, uint32_t page, ikv_format *out);

/**
 * Re-store page `page` of a sequence in another format: dequantize to fp32,
 * quantize to the new format. Demotion (e.g. F16 -> INT4) loses bits;
 * promotion (INT4 -> F16) restores the precision of storage, not the lost
 * bits. An unshared page already in that format is left as it is (nothing
 * re-stored; a shared one is refused as any).
 * Errors: IKV_E_NULL, IKV_E_NOT_FOUND, IKV_E_RANGE, IKV_E_INVALID
 * (format), IKV_E_EVICTED, IKV_E_SHARED (page shared with a fork),
 * IKV_E_NOMEM, IKV_E_STATE (room reserved on a CUDA pool:
 * ikv_pool_reserve), IKV_E_DEVICE (CUDA pools).
 */
IKV_API ikv_status ikv_seq_set_page_format(ikv_pool *pool, ikv_seq_id seq, uint32_t page, ikv_format format);

/**
 * Re-store every live, unshared, full page of a sequence in the format the
 * plan assigns it (evicted and shared pages, and pages the plan does not
 * cover, are skipped, not refused). Full: every layer holds the page's
 * page_size tokens (where layers differ in length, the shortest decides). Atomic: if any page cannot change, none
 * does. Errors: IKV_E_NULL (pool, plan), IKV_E_NOT_FOUND, IKV_E_INVALID
 * (plan page_size differs), IKV_E_STATE (room reserved on a CUDA pool),
 * IKV_E_NOMEM, IKV_E_DEVICE (CUDA pools).
 */
IKV_API ikv_status ikv_seq_apply_plan_formats(ikv_pool *pool, ikv_seq_id seq, const ikv_plan *plan);

/**
 * Read tokens [begin, end) of a layer back, dequantized to fp32, into
 * k_out and v_out laid out [token][kv_head][head_dim] (host memory, also for
 * CUDA pools). Errors: IKV_E_NULL, IKV_E_NOT_FOUND, IKV_E_RANGE, IKV_E_EVICTED,
 * IKV_E_NOMEM, IKV_E_DEVICE (CUDA pools).
 */
IKV_API ikv_status ikv_seq_read(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t begin, uint32_t end,
                                float *k_out, float *v_out);

/**
 * Key summary of one page, layer and kv-head, kept current on append,
 * truncate, eviction and format change: per-channel min and max and the mean
 * of K over the page's live tokens (as stored, i.e. dequantized), head_dim
 * floats each, host memory. The page keeps them as bfloat16: k_min rounded
 * down and k_max rounded up (so they still bound every stored key; each is
 * less than 2^-7 relative away from the exact value, or at most 2^-133 away
 * where that value is below 2^-126 and bf16 is subnormal), k_mean the bf16
 * nearest the mean (summed in double in token order; ties to even, one
 * rounding); these calls return those values. Any pointer may be NULL.
 * n_tokens_out: tokens summarized. Errors: IKV_E_NULL (pool),
 * IKV_E_NOT_FOUND, IKV_E_RANGE (layer or kv_head out of range, or a page
 * that holds no token of the layer yet), IKV_E_EVICTED, IKV_E_NOMEM,
 * IKV_E_DEVICE (CUDA pools).
 */
IKV_API ikv_status ikv_seq_page_summary(const ikv_pool *pool, ikv_seq_id seq, uint32_t layer, uint32_t kv_head,
                                        uint32_t page, float *k_min, float *k_max, float *k_mean,
                                        uint32_t *n_tokens_out);

/*
 * Thread-safety of pools: calls on different sequences may run concurrently
 * from different threads (appends, reserves, forks, truncates, evictions,
 * destroys); reads and decodes of a sequence may run while other sequences
 * change. A fork only reads its parent: forks of one parent may run at once,
 * and beside reads and decodes of it. Calls that change one sequence need
 * the caller's ordering against every other call on that sequence (and on
 * its fork parent/children for format changes). ikv_pool_get_stats may run
 * beside any of these (the statistics are a consistent snapshot; totals of a
 * call still running may not include it yet), and so may ikv_pool_sync,
 * except on a CUDA pool with room reserved (ikv_pool_reserve), where it
 * brings those sequences' lengths up to their device lengths: there it is a
 * change of each of them. ikv_pool_tier_step and ikv_pool_destroy need the
 * pool to themselves.
 */

/* ------------------------------------------------------------------------ */
/* Decode                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct ikv_decoder ikv_decoder;

/**
 * Query memory (after IntentKV): what earlier turns of each sequence asked,
 * so that query-aware selection does not drop what mattered a turn ago
 * because of one unusual query now.
 *
 * For each sequence, layer and query head the memory keeps the mean query of
 * each of the last `turns` ended turns (ikv_query_memory_config.turns), and a
 * decode recalls, for each query head, the remembered turn whose mean is the
 * most similar (cosine) to that head's current query (query token 0; on
 * equal cosines the newest turn, and a zero vector has cosine 0): an
 * earlier intent that the current query resembles, even weakly, comes back
 * whole. With turns = 0 (the first version's memory) it keeps one query
 * instead: the turns' means averaged with weights decay^age (the last ended
 * turn weighs 1, the one before decay, ...). A decode that passes the memory
 * (ikv_decode_args.query_memory) with query-aware selection on scores each
 * candidate page with the recalled queries too, as `group` more query heads
 * of the kv-group whose scores count log(decay) lower: a page's score is
 * max(score with the current queries, score with the recalled ones +
 * log(decay)), i.e. the memory's attention-weight estimate counts decay
 * times (Quest: bounds; hybrid: each row shifted by its best first).
 * Sequences the memory has no ended turn for score as without it.
 *
 * The engine tells the memory what a turn asked (ikv_query_memory_remember,
 * per layer, any number of query tokens; their mean is the turn's query) and
 * when the turn ends (ikv_query_memory_end_turn).
 * Host memory: n_layers * n_q_heads * head_dim * (8 + 4 * max(turns, 1))
 * bytes per sequence. Measured (bench/RESULTS.md section 6): the mean form
 * lowered recall when the attended document returned (it weighs the turn
 * in between most); the turns form raised it.
 * CUDA pools: from its first ended turn a sequence also has a device copy of
 * its ended turns (n_layers * n_q_heads * head_dim * 4 * max(turns, 1) bytes
 * plus 8 per layer rounded up to 16, on the pool's device) that the decode's
 * recall kernel reads: the recall and the scores run on the device, with no
 * host round trip. end_turn rewrites that copy after waiting for the device
 * (every stream) to finish the work already enqueued, and returns once the
 * copy is on the device; forget, reset and destroy free it (cudaFree waits
 * for the device too). So none of these may run while any stream of the
 * device is capturing a graph in global or thread-local mode (the wait would
 * invalidate that capture), and each is a full device wait: end the turns
 * of a batch between steps, not inside one. A call may pass a memory for
 * at most 256 sequences (IKV_E_UNSUPPORTED beyond). A decode captured into a
 * CUDA graph reads the device copies of the sequences that had one at the
 * capture, at their fixed addresses: replays see the turns ended since, but
 * a sequence whose first turn ended after the capture is scored without its
 * memory until the step is captured again, and forgetting a sequence (or
 * reset, destroy) invalidates graphs that read its copy.
 * Thread-safety: calls that change a memory need exclusive access to it
 * (for every sequence: remembering for two sequences at once is two changes
 * of one memory); a decode only reads it, so several decodes may use one
 * memory at once, but no change may run while a decode that uses it runs
 * (on the host; on CUDA pools end_turn waits for the device itself).
 */
typedef struct ikv_query_memory ikv_query_memory;

typedef struct ikv_query_memory_config {
    uint32_t struct_size;
    uint32_t n_q_heads;  /**< the model's query heads: a positive multiple of the pool's n_kv_heads */
    float decay;         /**< the recalled queries' weight (turns >= 1), or that of a turn one turn older
                              (turns = 0); in (0, 1); default 0.5 */
    /* Later fields: a caller built with an older header (smaller struct_size) gets turns = 0. */
    uint32_t turns;      /**< ended turns kept apart, 1..64, the oldest dropped first; 0 = one decayed mean
                              (the first version); default 4 */
} ikv_query_memory_config;

/**
 * n_q_heads 0 (must be set), decay 0.5, turns 4. Versioned as
 * ikv_pool_default_config is: the unversioned symbol stays exported for
 * programs built against the first header and fills that version's fields
 * (struct_size 12, through decay).
 */
IKV_API ikv_query_memory_config ikv_query_memory_default_config_v2(void);
#define ikv_query_memory_default_config() ikv_query_memory_default_config_v2()

/**
 * A memory for the sequences of pool (it takes n_layers and head_dim from
 * the pool; it is used only with that pool). The pool must outlive it.
 * Errors: IKV_E_NULL, IKV_E_INVALID (struct_size, n_q_heads, decay, turns),
 * IKV_E_NOMEM.
 */
IKV_API ikv_status ikv_query_memory_create(const ikv_pool *pool, const ikv_query_memory_config *config,
                                           ikv_query_memory **out);
IKV_API void ikv_query_memory_destroy(ikv_query_memory *memory);

/**
 * Add n_tokens query tokens of sequence seq at layer to the current turn:
 * q[(t * n_q_heads + h) * head_dim + d] in q_dtype (host memory), unscaled,
 * as passed to ikv_decode. Errors: IKV_E_NULL, IKV_E_RANGE (layer),
 * IKV_E_INVALID (n_tokens 0, q_dtype, a non-finite value), IKV_E_NOMEM.
 */
IKV_API ikv_status ikv_query_memory_remember(ikv_query_memory *memory, ikv_seq_id seq, uint32_t layer,
                                             const void *q, ikv_dtype q_dtype, uint32_t n_tokens);

/**
 * End seq's current turn: for each layer with remembered queries, the
 * turn's mean query is kept (turns >= 1: in place of the oldest once
 * `turns` are kept) or joins m (turns = 0: m = (mean + decay * W * m) /
 * (1 + decay * W), W = 1 + decay * W); layers without any keep theirs. A
 * sequence with nothing remembered is left as it is. On a CUDA pool it then
 * writes the sequence's device copy (see ikv_query_memory). Errors:
 * IKV_E_NULL; CUDA pools: IKV_E_NOMEM (the device copy could not be
 * allocated: nothing changed), IKV_E_DEVICE (while preparing the
 * sequence's first device copy: nothing changed; while waiting or copying
 * afterwards: the turn has ended on the host, and a later end_turn of the
 * sequence writes the device copy again; until then decodes recall what the
 * copy held before).
 */
IKV_API ikv_status ikv_query_memory_end_turn(ikv_query_memory *memory, ikv_seq_id seq);

/** Forget seq (all turns, and its current one), e.g. when the sequence is destroyed. Errors: IKV_E_NULL. */
IKV_API ikv_status ikv_query_memory_forget(ikv_query_memory *memory, ikv_seq_id seq);

/** Forget every sequence. Errors: IKV_E_NULL. */
IKV_API ikv_status ikv_query_memory_reset(ikv_query_memory *memory);

/**
 * Attention feedback: the attention mass each page a decode read really
 * received, kept per sequence, layer, kv-head and page as an exponential
 * moving average, for the engine's router (ikv_page_feedback_block_scores
 * turns it into layout block scores) and as a prior of query-aware selection
 * (ikv_decode_args.topk_feedback_weight).
 *
 * A decode that passes it (ikv_decode_args.feedback) computes, for every
 * (sequence, kv-head) and page it read, the page's share of the softmax: the
 * sum over the page's read tokens of exp(logit - lse), averaged over the
 * kv-group's query heads and the step's query tokens (causal: a token after
 * a query's position adds nothing for that query; every query row counts in
 * the average, one that reads nothing or whose query holds a NaN or an inf
 * adding 0). lse is the row's log-sum-exp over the logits the measurement
 * itself computes, so a row's shares over the pages it read sum to 1 up to
 * rounding whatever the logits' magnitude (the CUDA multi-token GEMM path
 * below takes the GEMM's lse instead: where logits pass ~1e6 in magnitude,
 * whose fp32 rounding is no longer small, its shares can pass 1). For each such page,
 * ema = (1 - rate) * ema + rate * share (ema starts at 0); pages the step did
 * not read keep their ema. On CPU pools this costs one more pass over the
 * keys the step read; on CUDA pools the decode's kernel sums each page's
 * share as it reads the page (no second pass), except where the step takes
 * the multi-token GEMM path (long drafts), which reads the keys again once
 * per 16 query rows per kv-head (n_query_tokens x n_q_heads / n_kv_heads);
 * V is never read again, and these reads are not counted by
 * ikv_decoder_last_bytes_read.
 * CUDA pools: the device measures the shares (fp32 sums of the decode's own
 * weights; the CPU sums in double, so the two agree within the decode's
 * tolerance: float rounding with F32 queries, the 16-bit operands' rounding
 * on tensor cores), and the decode enqueues their
 * copy into pinned host memory, where the averages live, and returns without
 * waiting for it. Up to 8 decodes' copies are in flight per feedback (an
 * engine's layers, decoded one after another): a 9th decode first waits for
 * the oldest, and a decode with the prior (below) for the earlier decodes
 * of its own layer. ikv_page_feedback_get, _block_scores, _forget, _reset
 * and _destroy first wait for every copy in flight and add those shares:
 * what any call sees holds every decode before it. These waits are legal
 * while a stream captures a graph (this thread waits in relaxed capture
 * mode). A decode with feedback on a stream capturing a CUDA graph is
 * refused (IKV_E_INVALID) before anything is enqueued (the averages are kept
 * on the host, which replays would not reach). When such a copy failed (a
 * device error), the call that waits for it returns IKV_E_DEVICE and those
 * shares are lost; the averages are otherwise unchanged (a decode's own
 * work may have been enqueued already, as for any IKV_E_DEVICE). The prior
 * (ikv_decode_args.topk_feedback_weight > 0 with query-aware selection) is
 * computed from the averages on the host and copied to the device with each
 * such call; it selects the pages a CPU pool selects (up to float rounding
 * where a score and a prior nearly tie).
 * Device memory (the decoder's scratch, CUDA pools): 8 bytes per query row
 * (n_query_tokens x n_q_heads / n_kv_heads) per 16 rows of every list entry,
 * per kv-head and sequence of the call, plus 12 bytes per list entry.
 * Host memory: 5 bytes per page, layer and kv-head of each sequence fed back;
 * CUDA pools also up to 8 pinned buffers, each of 8 bytes per list entry and
 * 4 per list (sequences x kv-heads lists of the longest list's entries) of
 * the largest decode it served, kept until the feedback is destroyed.
 * Thread-safety: a decode writes it; calls on one feedback object, decodes
 * that pass it included, need the caller's ordering.
 */
typedef struct ikv_page_feedback ikv_page_feedback;

typedef struct ikv_page_feedback_config {
    uint32_t struct_size;
    float rate;  /**< weight of a step's share in the average, in (0, 1]; default 0.25 */
} ikv_page_feedback_config;

/** rate 0.25. */
IKV_API ikv_page_feedback_config ikv_page_feedback_default_config(void);

/**
 * Feedback for the sequences of pool (used only with that pool, which must
 * outlive it). Errors: IKV_E_NULL, IKV_E_INVALID (struct_size, rate),
 * IKV_E_NOMEM.
 */
IKV_API ikv_status ikv_page_feedback_create(const ikv_pool *pool, const ikv_page_feedback_config *config,
                                            ikv_page_feedback **out);
/** Destroys feedback (NULL: no-op); waits for a CUDA decode's copy of shares still in flight. */
IKV_API void ikv_page_feedback_destroy(ikv_page_feedback *feedback);

/**
 * The averages of seq at layer and kv_head for pages [0, capacity) into
 * mass (pages never fed back: 0); *n_pages_out receives how many pages of
 * that layer and kv-head have been fed back so far (the highest page read +
 * 1; 0 for an unknown sequence). Errors: IKV_E_NULL (feedback, n_pages_out, mass with
 * capacity > 0), IKV_E_RANGE (layer, kv_head), IKV_E_DEVICE (above: an earlier
 * CUDA decode's shares).
 */
IKV_API ikv_status ikv_page_feedback_get(const ikv_page_feedback *feedback, ikv_seq_id seq, uint32_t layer,
                                         uint32_t kv_head, float *mass, uint32_t capacity, uint32_t *n_pages_out);

/**
 * Re-score the ATTEND blocks of layout from seq's feedback: a block's mass is
 * the sum of the averages of the pages it overlaps (a page shared by two
 * blocks counts for both), averaged over layers and kv-heads; each block
 * with any page fed back (read by a decode with this feedback, also where its
 * share was 0) gets its mass divided by the largest block's (so the most
 * attended block scores 1; 0 where every fed-back block's mass is 0), the
 * others keep their score. Atomic: on
 * error the layout is unchanged. Errors: IKV_E_NULL, IKV_E_NOMEM,
 * IKV_E_DEVICE (as ikv_page_feedback_get).
 */
IKV_API ikv_status ikv_page_feedback_block_scores(const ikv_page_feedback *feedback, ikv_seq_id seq,
                                                  ikv_layout *layout);

/** Forget seq's averages. Errors: IKV_E_NULL, IKV_E_DEVICE (as ikv_page_feedback_get; nothing is forgotten). */
IKV_API ikv_status ikv_page_feedback_forget(ikv_page_feedback *feedback, ikv_seq_id seq);
/** Forget every sequence's. Errors: IKV_E_NULL, IKV_E_DEVICE (as ikv_page_feedback_forget). */
IKV_API ikv_status ikv_page_feedback_reset(ikv_page_feedback *feedback);

typedef struct ikv_decoder_config {
    uint32_t struct_size;
    uint32_t n_threads;         /**< CPU worker threads incl. the caller, at most 1024; 0 = hardware threads; default 0 */
} ikv_decoder_config;

IKV_API ikv_decoder_config ikv_decoder_default_config(void);

/**
 * A decoder owns worker threads (CPU) and scratch (host and device), and
 * keeps the page lists of its last call for the next (ikv_decoder_get_stats).
 * One decoder serves one caller thread at a time (its getters, ikv_decoder_
 * last_bytes_read, _last_selection and _get_stats, count as calls on it);
 * use one decoder per engine thread. Several decoders may decode the same
 * pool concurrently. Outputs are deterministic for a given decoder
 * configuration, but decoders with different n_threads split the work
 * differently and may differ in the last bits (within the tests' float64
 * bounds). On CUDA
 * pools a decoder's calls share its device scratch: issue them on one
 * stream, or order the streams (an event) between calls on different ones.
 * Errors: IKV_E_NULL, IKV_E_INVALID, IKV_E_NOMEM (also when a worker thread
 * cannot start).
 */
IKV_API ikv_status ikv_decoder_create(const ikv_decoder_config *config, ikv_decoder **out);
IKV_API void ikv_decoder_destroy(ikv_decoder *decoder);

/**
 * Query tokens one ikv_decode step may carry: 2048, the chunk size of chunked
 * prefill in common serving engines (512..2048 tokens per chunk) and far above
 * any speculative-verification window. Multi-token steps on a CUDA pool run
 * through cuBLASLt GEMMs once they have enough query rows (docs/CUDA.md).
 */
#define IKV_MAX_QUERY_TOKENS 2048

/**
 * How query-aware selection (ikv_decode_args) decides how many pages to keep.
 *
 * IKV_TOPK_MASS (adaptive budgets, after EntmaxKV): the budget follows how
 * peaked the step's attention looks. For each sequence and kv-head, each
 * candidate entry i (the non-mandatory ones) gets the estimated attention
 * weight w_i = n_i * exp(bound_i - max_j bound_j), n_i its token span and
 * bound_i its Quest bound (the scaled logit upper bound that fixed top-k
 * ranks by, before softcap), or the score topk_score ranks by instead, with
 * the feedback prior where topk_feedback_weight is on. Candidates are taken in bound order (ties:
 * earlier entry first) until the weight taken reaches topk_mass * sum_i w_i;
 * the budget is then the mandatory tokens plus the tokens taken, raised to
 * topk_min_tokens and lowered to topk_token_budget (0: no upper limit), and
 * the fixed rule selects under it. A few pages whose bounds stand out cover
 * the mass alone; flat bounds (diffuse attention) take many. The estimate
 * uses upper bounds, not the true logits: it is a budget rule, not a
 * guarantee of the mass kept (bench/RESULTS.md measures what it keeps).
 * On a CUDA pool the weights are summed on the device in another order, so
 * the budget can differ from a CPU pool's where the share is reached within
 * rounding.
 */
typedef enum ikv_topk_mode {
    IKV_TOPK_FIXED = 0, /**< topk_token_budget tokens (top-k is off when it is 0) */
    IKV_TOPK_MASS = 1   /**< budget from the bounds' estimated mass share (see above); always on */
} ikv_topk_mode;

/**
 * What query-aware selection ranks candidate pages by (ikv_decode_args.topk_score).
 *
 * IKV_TOPK_SCORE_QUEST (default): the Quest upper bound of topk_token_budget's
 * description. IKV_TOPK_SCORE_HYBRID: for each query head g of the kv-group,
 * with q_g scaled as for attention (scale),
 *   s_ig = (sum_d max(q_gd*kmin_d, q_gd*kmax_d) + sum_d q_gd*kmean_d) / 2,
 * the mean of the page's logit ceiling and of the logit of its mean key
 * (k_mean of ikv_seq_page_summary); each head's scores are then shifted by
 * that head's largest s over the candidates (the non-mandatory entries of
 * the sequence), and the page's score is max_g of the shifted s_ig. Why: the
 * bound alone favours pages whose keys spread widely, and a max over raw
 * bounds lets the one head whose logits run highest take the whole budget;
 * shifted, every head's best page scores 0 and the group's heads share the
 * budget (bench/RESULTS.md section 6 measures both). It reads k_mean too:
 * 6 * head_dim summary bytes per page and kv-head instead of 4. Every other
 * rule (mandatory entries, ties, NaN last, the budget of ikv_topk_mode, with
 * this score in place of the bound) is unchanged.
 *
 * IKV_TOPK_SCORE_KEYS: two passes. The first ranks by the hybrid score and
 * selects, by the rules above, candidates for twice the budget's
 * non-mandatory tokens (the budget: topk_token_budget, or under
 * IKV_TOPK_MASS the one the rule derives from the hybrid scores; with M
 * mandatory tokens and budget T > M the candidates' budget is
 * M + 2 * (T - M)). The second reads each non-mandatory candidate's keys
 * (every token of its span, dequantized as the decode reads them) and scores
 * it by its share of the attention over the candidates: for each scored row
 * r (the group's query heads at the first query token, scaled by scale,
 * logits softcapped when softcap > 0; with a query memory, also the rows it
 * recalls) lse_r(i) = log sum over the entry's tokens of exp(logit), and
 *   s_i = log sum_r w_r * exp(lse_r(i) - Z_r),  Z_r = log sum_j exp(lse_r(j))
 * over the non-mandatory candidates j, w_r = 1 for the query heads and the
 * memory's decay for its rows (0 for a sequence it has nothing for at this
 * layer); a row whose Z_r is not finite (a query holding a NaN or an inf)
 * is left out of the sum, so the other rows rank the candidates. The budget then selects among the candidates by s_i, by the same
 * rules (ties: earlier entry first; NaN last; stop at the first that does not
 * fit). A feedback prior (topk_feedback_weight) applies to the first pass.
 * Why: page summaries rank pages by what their keys could do, and on real
 * attention they miss 6% of the best page choice's mass at a 12.5% budget;
 * the candidates' keys give each page its true share (for one query head,
 * the same ranking as the best choice within the candidates), at the cost of
 * reading the candidates' K rows: ikv_decoder_last_bytes_read counts them,
 * and bench/RESULTS.md section 6w measures recall, bytes and time. On a CUDA
 * pool both passes run on the device (kernels/keys_rerank.cu) for at most 16
 * scored rows per kv-head; the logits are summed in another order there, so
 * candidates whose scores differ by rounding can rank the other way.
 */
typedef enum ikv_topk_score {
    IKV_TOPK_SCORE_QUEST = 0,
    IKV_TOPK_SCORE_HYBRID = 1,
    IKV_TOPK_SCORE_KEYS = 2
} ikv_topk_score;

/**
 * One decode step at one layer for a batch of sequences.
 *
 * Queries: q[((b * n_query_tokens + t) * n_q_heads + h) * head_dim + d] in
 * q_dtype. Query token t of sequence b sits at position
 * L_b - n_query_tokens + t, where L_b is the number of tokens stored in this
 * layer (the step's own K/V appended first), and attends causally: keys at positions <= its
 * own (their K/V must already be appended). Query head h uses kv-head
 * h / (n_q_heads / n_kv_heads).
 * Keys read: the plan's pages and bounds (plans[b], NULL = dense: every live
 * token), minus evicted tokens, minus tokens after the query's position
 * (plan entries at or beyond L_b are ignored, so a plan routed for a longer
 * or shorter sequence is clipped, never an error).
 * Output: out[((b * n_query_tokens + t) * n_q_heads + h) * head_dim + d] in
 * out_dtype; lse (optional, fp32, same index without d) receives the natural
 * log of the softmax denominator in the scaled-logit domain, so partial
 * attentions merge exactly. A query with no key to read (empty selection)
 * gets out = 0 and lse = -INFINITY. A query row of q holding a NaN or an inf
 * that reads at least one key gets NaN in every channel of out and in lse,
 * and adds nothing to attention feedback shares. Logits are fp32: a row
 * that reads a key but none of whose scaled logits scale * (q . k) comes out
 * finite (they overflow fp32's ~3.4e38, e.g. under a scale near FLT_MAX;
 * CUDA's fused kernel computes them as (scale * log2(e)) * (q . k), which
 * overflows from scale ~2.4e38) gets the same NaN outputs instead of the
 * empty result, softcap or not (a softcap does not cap an overflowed
 * logit); where only some of a row's logits overflow, its outputs are
 * unspecified. (One exception: in a CUDA decode whose kernels write
 * args->append's token, below, a row whose logits all overflow while its q
 * is finite gets the empty result.) The other rows are
 * computed as usual, from what their kv-head reads: with query-aware
 * selection the row still enters its kv-head's scores, where an inf can
 * change the pages the group's other rows read.
 * CUDA pools: q, out, lse are device pointers; the call enqueues on stream and
 * returns without synchronizing (a feedback may wait for earlier decodes'
 * copies: see ikv_page_feedback). CPU pools: host pointers, done on return.
 * CUDA graphs: a call on a capturing stream is captured whole, in any
 * capture mode (global, thread-local, relaxed); each replay reads q (and an
 * append's k and v) and writes out and lse at the addresses the captured
 * call was given, which must stay allocated while the graph may be
 * replayed. When the decoder's page lists
 * from its last eager call on the same stream are still exact for the call
 * (ikv_decoder_stats: same pool, sequences, lengths, plans and block tables),
 * the graph reads those device lists at replay, as an eager call reusing them
 * does; otherwise their upload becomes a copy node reading the decoder's
 * pinned staging at replay time. Either way the lists are those of the
 * captured call. A capture cannot allocate: run
 * the same call (same batch, plans and selection, or a larger one) eagerly
 * once first; a captured call that would grow the decoder's staging, device
 * lists or workspace is refused with IKV_E_STATE (one whose workspace is too
 * small may leave its upload node in the graph being captured: discard it).
 * One capture holds at most 8 calls of a decoder whose lists differ from the
 * call before on that decoder (each keeps its own pinned staging for the
 * replays); a ninth is refused with IKV_E_STATE (use another decoder).
 * Run no other ikv_decode on that decoder while the graph may still be
 * replayed (they refill the device lists, and another capture the staging);
 * eager calls afterwards work as before.
 * Environment (read once per process): IKV_CUDA_MULTI_TOKEN=auto|fused|gemm
 * picks the CUDA path of multi-token steps; IKV_CUDA_DECODE_COMPUTE=
 * auto|simt|tensor-cores how the fused CUDA decode computes for F16/BF16
 * queries (tensor cores: 16-bit operands, fp32 accumulation; auto, the
 * default: tensor cores for a step of more than 4 query rows per kv-head
 * (n_query_tokens x n_q_heads / n_kv_heads), and when the step reads INT8,
 * FP8 or INT4 pages (any pages on a device whose memory feeds each SM at
 * 30 GB/s or more, such as the H200) and its longest list is long enough to
 * keep every CTA busy, about 24 chunks of 16 rows each at the split count
 * chosen; fp32 FMAs otherwise; F32 queries always use fp32 FMAs);
 * IKV_CUDA_TOPK_CLUSTERS=on|off forces the top-k
 * selection onto thread-block clusters of 8 blocks per (sequence, kv-head)
 * or off them (default: on for at most 16 such pairs with more than 4096
 * candidate pages each, sm_90+); IKV_CUDA_SCORE=simt computes top-k page
 * scores in fp32 FMAs instead of on tensor cores (default: tensor cores on
 * sm_80+ for up to 8 scored query rows per kv-head, the fp32 query carried
 * exactly as three bf16 parts); IKV_CUDA_PDL=0 launches the step's kernels without
 * programmatic dependent launch (used by default on sm_90 and newer: each
 * kernel of the step waits for the previous one's results on the device, so
 * the next launch overlaps the previous kernel's tail); IKV_FUSED_APPEND=0
 * makes a decode with args->append enqueue the append as
 * ikv_pool_append_batch does instead of writing the token in the decode's
 * kernels (same bytes; for side-by-side timing).
 */
typedef struct ikv_decode_args {
    uint32_t struct_size;
    uint32_t layer;
    uint32_t n_seqs;              /**< >= 1 */
    const ikv_seq_id *seqs;       /**< n_seqs ids (host memory); an id may repeat (each listing is decoded on its own,
                                       and with feedback each is one update of the sequence's averages), not with append */
    const ikv_plan *const *plans; /**< n_seqs plans or NULL entries; NULL array = all dense */
    uint32_t n_query_tokens;      /**< 1..IKV_MAX_QUERY_TOKENS */
    uint32_t n_q_heads;           /**< multiple of the pool's n_kv_heads */
    const void *q;                /**< not checked for finiteness: a row holding a NaN or inf that reads a key gets NaN
                                       outputs (above) */
    ikv_dtype q_dtype;
    void *out;
    ikv_dtype out_dtype;
    float *lse;                   /**< optional */
    float scale;                  /**< 0 = 1/sqrt(head_dim); finite, >= 0 (logits that overflow fp32: above) */
    float softcap;                /**< 0 = off; else logits become softcap*tanh(logit/softcap); finite, >= 0 */
    /**
     * Query-aware selection: when > 0, for each sequence and kv-head the
     * decoder keeps the plan's mandatory pages and adds the plan's other pages
     * (or, with no plan, all live pages) in descending order of the Quest upper
     * bound sum_d max(q_d*kmin_d, q_d*kmax_d) (max over the group's query heads
     * of the first query token) until topk_token_budget tokens are taken.
     * Precisely: each plan entry counts its token span (clipped to the stored
     * length; evicted entries are dropped); mandatory entries count first; the
     * others are taken in bound order (ties: earlier entry first) while the
     * total stays <= topk_token_budget, stopping at the first that does not
     * fit. kmin/kmax are the page's key summary (ikv_seq_page_summary).
     * Runs on the backend of the pool (on the GPU with no host round trip).
     */
    uint32_t topk_token_budget;
    void *stream;                 /**< CUDA: cudaStream_t; NULL = default stream */
    /* Later fields: a caller built with an older header (smaller struct_size) gets their defaults. */
    /**
     * How query-aware selection sizes each (sequence, kv-head)'s budget:
     * IKV_TOPK_FIXED (default) uses topk_token_budget as described above;
     * IKV_TOPK_MASS sizes it from the step's own bounds (ikv_topk_mode).
     */
    ikv_topk_mode topk_mode;
    float topk_mass;              /**< IKV_TOPK_MASS: estimated attention-mass share to cover, in (0, 1]; default 0.9 */
    uint32_t topk_min_tokens;     /**< IKV_TOPK_MASS: fewest tokens a selection keeps (mandatory ones count); default 0 */
    ikv_topk_score topk_score;    /**< what pages are ranked by: IKV_TOPK_SCORE_QUEST (default), _HYBRID or _KEYS */
    const ikv_query_memory *query_memory; /**< optional, with query-aware selection: see ikv_query_memory */
    ikv_page_feedback *feedback;  /**< optional: receives the mass each read page got (ikv_page_feedback) */
    /**
     * With feedback and query-aware selection, > 0 makes the averages a prior:
     * a candidate's score becomes max(score - the best candidate's score,
     * log(topk_feedback_weight * ema)), so a page that recently held a share
     * m of the attention ranks at least as a page whose score is log(weight * m)
     * below the best (a page without feedback keeps score - best: the pages'
     * order among themselves is unchanged). Every rule that reads the score
     * (ties, NaN last, IKV_TOPK_MASS's weights w_i) reads it with the prior.
     * In [0, 1]; default 0 (off).
     */
    float topk_feedback_weight;
    /**
     * Optional: the step's new tokens, appended to args->layer of each of
     * args->seqs before the decode reads them (a decode that appends).
     * Same effect, byte for byte (pages, key summaries, outputs), as
     * ikv_pool_append_batch(pool, seqs, n_seqs, append) followed by this call
     * with append NULL, with these differences:
     *  - append->layer must be args->layer and append->stream args->stream
     *    (IKV_E_INVALID otherwise);
     *  - the decode's arguments and the CUDA kernels' limits are checked
     *    first (n_query_tokens against the length after the append), so a
     *    rejected call appended nothing; only IKV_E_NOMEM, IKV_E_DEVICE and,
     *    on a CUDA pool, IKV_E_UNSUPPORTED for more candidate pages than its
     *    top-k handles, met once the append has been enqueued, may leave the
     *    tokens appended (wholly or, after IKV_E_DEVICE, in part);
     *  - on a CUDA pool, when every sequence has room (ikv_pool_reserve), the
     *    append carries one token per sequence with IKV_APPEND_ASYNC, the
     *    pages the rooms hold are F16 or BF16, there is no query-aware
     *    selection (topk_token_budget 0 and IKV_TOPK_FIXED), no feedback
     *    and at most 8 query rows per kv-head (n_query_tokens x n_q_heads /
     *    n_kv_heads), and each sequence's list reads every position of its
     *    room with one entry per page (a dense decode, or a plan whose
     *    entries cover the room), the decode's own kernels write the token:
     *    an engine's captured layer is then two kernel launches instead of
     *    four (no append and no room clip kernel; a graph's first such
     *    decode, and an eager one after a call that clipped the lists or,
     *    once a graph that clips them was captured on this decoder, every
     *    eager one, adds one small kernel; bench/RESULTS.md sections 7c,
     *    7f, 7g). Otherwise the
     *    append is enqueued first, as by ikv_pool_append_batch.
     * Ownership: the ikv_append and the K/V it points to are the caller's;
     * device K/V must stay valid until the stream has passed the call (as
     * for an IKV_APPEND_ASYNC append). Thread-safety: that of
     * ikv_pool_append_batch on args->seqs plus that of ikv_decode.
     * Errors: those of ikv_pool_append_batch (their sentences begin
     * "ikv_decode (args->append)"), and IKV_E_INVALID naming
     * args->append->layer, ->stream or ->struct_size when they do not fit.
     * ikv_decoder_stats.appends_fused counts the calls whose token the
     * decode's kernels wrote. Default NULL.
     */
    const ikv_append *append;
} ikv_decode_args;

/**
 * The defaults of every field (struct_size = sizeof(ikv_decode_args), n_seqs
 * and n_query_tokens 1, F32 dtypes, top-k off, IKV_TOPK_FIXED, topk_mass 0.9,
 * IKV_TOPK_SCORE_QUEST, all else 0/NULL). A struct returned by value cannot
 * grow under a program built with an older header (its return slot is the
 * older size), so each version of the struct has its own symbol and
 * ikv_decode_args_default() names this header's: ikv_decode_args_default_v3.
 * The unversioned symbol stays exported for programs built against the first
 * header and fills only that version's fields (struct_size 104 on 64-bit);
 * ikv_decode_args_default_v2 likewise for the header before `append`
 * (through topk_feedback_weight). Programs built against the headers between
 * the first and the one that introduced ikv_decode_args_default_v2 (which
 * added topk_mode, topk_score, query_memory and feedback while the symbol
 * was unversioned) get the first layout: a decode reads their later fields
 * as defaults until they are rebuilt (one symbol cannot write a larger
 * struct without overrunning the first header's callers).
 */
IKV_API ikv_decode_args ikv_decode_args_default_v3(void);
#define ikv_decode_args_default() ikv_decode_args_default_v3()

/**
 * Run the step. Errors (nothing is written on error, except the tokens of
 * args->append: see there): IKV_E_NULL,
 * IKV_E_NOT_FOUND (a sequence), IKV_E_RANGE (layer), IKV_E_INVALID (heads,
 * n_query_tokens, dtypes, a plan of another page size, n_query_tokens > length
 * (for a sequence with room on a CUDA pool the host knows only the room's
 * end, so the check uses it: a step of more query tokens than the device's
 * length reads positions before the sequence as masked, and is the engine's
 * error),
 * topk_mode, under IKV_TOPK_MASS topk_mass outside (0, 1] or topk_min_tokens
 * above a non-zero topk_token_budget, topk_score, a query_memory of another pool or other
 * n_q_heads, a feedback of another pool, topk_feedback_weight; on a CUDA
 * pool, feedback on a stream that is capturing a graph),
 * IKV_E_UNSUPPORTED (a CUDA pool with query-aware selection: more than 256
 * scored rows per kv-head with IKV_TOPK_SCORE_HYBRID (query heads, twice
 * with a query memory), a kv-group's queries larger than the device's
 * shared memory per block, more candidate pages than its top-k handles, a
 * query memory with more than 256 sequences; IKV_TOPK_SCORE_KEYS with more
 * than 16 scored rows per kv-head),
 * IKV_E_STATE (a captured call that would have to grow the decoder's
 * buffers: see CUDA graphs above), IKV_E_NOMEM (host or device memory for
 * the decoder's lists and scratch), IKV_E_DEVICE.
 */
IKV_API ikv_status ikv_decode(ikv_decoder *decoder, ikv_pool *pool, const ikv_decode_args *args);

/**
 * Bytes of K/V storage (scales included) the last successful ikv_decode on
 * this decoder read: for every (sequence, kv-head) and every run of tokens of
 * one page it read, the K and V rows plus that page's scales (per-channel K
 * scales of INT8/INT4 count once per run). With top-k selection the key
 * summaries' k_min and k_max it scores count too (4 * head_dim bytes per
 * scored entry and kv-head, so a page listed as two entries counts twice;
 * 6 * head_dim with k_mean under IKV_TOPK_SCORE_HYBRID and
 * IKV_TOPK_SCORE_KEYS: the CPU scores the non-mandatory entries, CUDA every
 * entry); IKV_TOPK_SCORE_KEYS also counts its non-mandatory candidates' K
 * rows and K scales (FP8 4 bytes, INT8 and INT4 4 * head_dim per entry);
 * on CUDA the selection never leaves the device, so the rows count as the
 * budget's tokens at the entries' mean row cost, and IKV_TOPK_SCORE_KEYS'
 * candidates' keys as half that cost for twice the budget's tokens (an
 * estimate; the CPU count is exact). Errors: IKV_E_NULL.
 */
IKV_API ikv_status ikv_decoder_last_bytes_read(const ikv_decoder *decoder, uint64_t *bytes_out);

/**
 * The tokens the last successful ikv_decode on this decoder read for the
 * sequence at index seq_index of that call's seqs, at kv-head kv_head: the
 * plan's entries (or every live page) clipped to the stored length, evicted
 * pages dropped, narrowed by query-aware selection, as maximal runs of
 * consecutive tokens in ascending order (a query token reads the part at or
 * before its position). Writes the first min(capacity, count) runs to ranges
 * (NULL is allowed with capacity 0) and the count to *n_out, so a first call
 * with capacity 0 sizes the array. For evaluation and logging, not for the
 * hot path: on a CUDA pool with query-aware selection the runs live on the
 * device and this call waits for the decoder's last stream and copies them.
 * Errors: IKV_E_NULL (decoder, n_out, ranges with capacity > 0), IKV_E_STATE
 * (the decoder's last ikv_decode call failed, was captured into a CUDA graph,
 * or there was none),
 * IKV_E_RANGE (seq_index, kv_head), IKV_E_NOMEM, IKV_E_DEVICE.
 */
IKV_API ikv_status ikv_decoder_last_selection(const ikv_decoder *decoder, uint32_t seq_index, uint32_t kv_head,
                                              ikv_token_range *ranges, size_t capacity, size_t *n_out);

/**
 * Counters of a decoder since it was created, for engines that want to see
 * what their calls cost. Each successful ikv_decode either built its page
 * lists (which tokens of which pages each sequence reads: block-table
 * snapshots and list building on the host, and on CUDA an upload) or reused
 * those of the previous successful call on this decoder. It reuses them when
 * the pool, the sequences (in order), their stored lengths at the call's
 * layer and the plans (the same plan objects) are those of that call, and no
 * sequence's block table changed since: no page was allocated, copied
 * (copy-on-write), evicted, truncated away or given another format. An
 * engine calling ikv_decode once per layer with the same batch and plans,
 * each layer appended to before its decode, therefore builds lists once per
 * step: the first layer's call sees new lengths and builds, the next layers'
 * calls see the same lengths and reuse (an append that stays inside
 * allocated pages leaves the block tables as they were; one that opens a
 * page changes them, so the next call builds even within a step).
 * A call on a capturing CUDA stream reuses them on the same conditions (and
 * stream); when it builds instead, the graph holds its own upload and the
 * first eager call after it builds again.
 * Set struct_size before the call; fields beyond it are not written.
 * Errors: IKV_E_NULL, IKV_E_INVALID (struct_size below 16, the first
 * version's struct_size, reserved and steps).
 */
typedef struct ikv_decoder_stats {
    uint32_t struct_size;
    uint32_t reserved;       /**< 0 */
    uint64_t steps;          /**< successful ikv_decode calls */
    uint64_t lists_built;    /**< of them, calls that built their page lists */
    uint64_t lists_reused;   /**< calls that reused the previous call's lists */
    uint64_t last_bytes_read;/**< as ikv_decoder_last_bytes_read */
    uint64_t appends_fused;  /**< calls whose args->append the decode's own kernels wrote (see ikv_decode_args.append) */
} ikv_decoder_stats;

IKV_API ikv_status ikv_decoder_get_stats(const ikv_decoder *decoder, ikv_decoder_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* INTENTKV_H */
