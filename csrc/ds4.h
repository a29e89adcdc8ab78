/*
 * ds4.h — the whole public C API of the ds4py core.
 *
 * The cffi build (build_core.py) reads this file, so keep it plain C that
 * cffi's parser accepts: no preprocessor conditionals below the marker, no
 * inline functions, no macros other than integer constants.
 *
 * Conventions
 *  - Every function that can fail returns an int status (DS4_OK == 0, else a
 *    ds4_status code) and fills the caller's ds4_error with a message naming
 *    the key, tensor or argument at fault. The core never prints, exits or
 *    aborts.
 *  - Lengths are int64_t element counts unless the name says bytes.
 */
#ifndef DS4_H
#define DS4_H

#include <stddef.h>
#include <stdint.h>

/* --- cffi reads from here on --- */

typedef enum {
    DS4_OK = 0,
    DS4_ERR_IO = 1,              /* open/stat/mmap failed */
    DS4_ERR_ARG = 2,             /* bad argument from the caller */
    DS4_ERR_NOMEM = 3,
    DS4_ERR_UNSUPPORTED = 4,     /* type/ISA/feature known but not runnable */
    DS4_ERR_BAD_MODEL = 5,       /* a valid GGUF whose keys/tensors do not form a consistent model */
    DS4_ERR_TRUNCATED = 10,      /* a read ran past the end of the file */
    DS4_ERR_BAD_MAGIC = 11,
    DS4_ERR_BAD_VERSION = 12,
    DS4_ERR_BAD_COUNT = 13,      /* tensor/kv count larger than the file allows */
    DS4_ERR_BAD_STRING = 14,     /* string length past the file, or not UTF-8 */
    DS4_ERR_BAD_VALUE_TYPE = 15, /* unknown metadata value type */
    DS4_ERR_NESTING = 16,        /* arrays nested deeper than DS4_GGUF_MAX_DEPTH */
    DS4_ERR_DUPLICATE_KEY = 17,
    DS4_ERR_BAD_ALIGNMENT = 18,  /* general.alignment zero, not a power of two, or wrong type */
    DS4_ERR_BAD_DIMS = 19,       /* n_dims out of range, zero/negative dim, product overflow */
    DS4_ERR_BAD_TENSOR_TYPE = 20,/* unknown ggml type id */
    DS4_ERR_BAD_ROW = 21,        /* row length not a multiple of the type's block size */
    DS4_ERR_BAD_OFFSET = 22,     /* misaligned, outside data, wrapping */
    DS4_ERR_OVERLAP = 23,        /* two tensors share bytes */
    DS4_ERR_DUPLICATE_TENSOR = 24,
    DS4_ERR_NOT_FOUND = 25,
    DS4_ERR_INTERNAL = 26        /* a self-check found the core inconsistent (ds4_pool_check) */
} ds4_status;

typedef struct {
    int code;          /* a ds4_status */
    char message[512]; /* NUL-terminated, names the key/tensor/argument */
} ds4_error;

/* ---------------------------------------------------------------- types -- */

/* ggml type ids as GGUF files store them. 36 and 37 are ds4's own affine
 * 64-wide formats: ggml left those ids free (IQ4_NL_4_4/_4_8 were removed), so
 * a GGUF carrying them is "ds4-only". */
enum {
    DS4_TYPE_F32 = 0, DS4_TYPE_F16 = 1, DS4_TYPE_Q4_0 = 2, DS4_TYPE_Q4_1 = 3,
    DS4_TYPE_Q5_0 = 6, DS4_TYPE_Q5_1 = 7, DS4_TYPE_Q8_0 = 8, DS4_TYPE_Q8_1 = 9,
    DS4_TYPE_Q2_K = 10, DS4_TYPE_Q3_K = 11, DS4_TYPE_Q4_K = 12, DS4_TYPE_Q5_K = 13,
    DS4_TYPE_Q6_K = 14, DS4_TYPE_Q8_K = 15, DS4_TYPE_IQ2_XXS = 16,
    DS4_TYPE_IQ2_XS = 17, DS4_TYPE_IQ3_XXS = 18, DS4_TYPE_IQ1_S = 19,
    DS4_TYPE_IQ4_NL = 20, DS4_TYPE_IQ3_S = 21, DS4_TYPE_IQ2_S = 22,
    DS4_TYPE_IQ4_XS = 23, DS4_TYPE_I8 = 24, DS4_TYPE_I16 = 25, DS4_TYPE_I32 = 26,
    DS4_TYPE_I64 = 27, DS4_TYPE_F64 = 28, DS4_TYPE_IQ1_M = 29, DS4_TYPE_BF16 = 30,
    DS4_TYPE_TQ1_0 = 34, DS4_TYPE_TQ2_0 = 35, DS4_TYPE_Q4_64A = 36,
    DS4_TYPE_Q2_64A = 37, DS4_TYPE_MXFP4 = 39, DS4_TYPE_NVFP4 = 40,
    DS4_TYPE_Q1_0 = 41, DS4_TYPE_Q2_0 = 42,
    DS4_TYPE_COUNT = 43
};

/* Capability flags of a type (ds4_type_info.flags). */
enum {
    DS4_TYPE_KNOWN = 1,      /* size is known: a GGUF tensor of it can be read */
    DS4_TYPE_DEQUANT = 2,    /* ds4_dequantize_row works */
    DS4_TYPE_DOT = 4,        /* ds4_vec_dot works (a weight type we compute with) */
    DS4_TYPE_QUANTIZE = 8,   /* ds4_quantize_row works */
    DS4_TYPE_DS4_ONLY = 16   /* not a ggml type: ds4's own id */
};

typedef struct {
    const char *name;     /* "Q4_K", "Q4_64A", ... ; static storage */
    int64_t block_size;   /* weights per block */
    int64_t type_size;    /* bytes per block */
    int vec_dot_type;     /* activation type paired with it; -1 if none */
    int flags;            /* DS4_TYPE_* bits */
} ds4_type_info;

/* Fails (DS4_ERR_BAD_TENSOR_TYPE) for an id that is not a type. */
int ds4_type_get_info(int type, ds4_type_info *out, ds4_error *err);

/* ------------------------------------------------------------ CPU / ISA -- */

/* Kernel instruction-set levels. AUTO picks the best one the CPU and the OS
 * grant, unless the environment sets DS4_FORCE_SCALAR=1. */
enum {
    DS4_ISA_AUTO = 0, DS4_ISA_SCALAR = 1, DS4_ISA_AVX2 = 2, DS4_ISA_AVX512 = 3,
    DS4_ISA_NEON = 4
};

/* Bit i set when ISA level i can run here: the CPU has it, the OS saves its
 * registers (XCR0), and its kernels were compiled into this build. */
int ds4_isa_available(void);
/* The ISA that AUTO resolves to (after DS4_FORCE_SCALAR). */
int ds4_isa_auto(void);
const char *ds4_isa_name(int isa);

/* ------------------------------------------------------------- kernels -- */

/* Every kernel takes an explicit isa (DS4_ISA_AUTO for normal use); asking
 * for an ISA this machine lacks is DS4_ERR_UNSUPPORTED, never a crash.
 * n is the number of weights; it must be a multiple of the type's block size. */

/* src: n/block_size blocks of `type`; dst: n floats. */
int ds4_dequantize_row(int isa, int type, const void *src, float *dst,
                       int64_t n, ds4_error *err);

/* Quantize n floats into `type` blocks (activation types Q8_0, Q8_1, Q8_K,
 * F16, BF16, F32 and the ds4 weight types Q4_64A/Q2_64A). For Q8_0 the
 * rounding follows llama.cpp's x86-64 AVX2 build (round-to-nearest-even of
 * x*(127/amax)); ds4_quantize_row_q8_0_ref follows ggml's reference
 * quantizer (roundf(x/d)). */
int ds4_quantize_row(int isa, int type, const float *src, void *dst,
                     int64_t n, ds4_error *err);
int ds4_quantize_row_q8_0_ref(const float *src, void *dst, int64_t n,
                              ds4_error *err);

/* Quantize n_rows x n_per_row weights (row-major floats) into `type` rows,
 * byte for byte what llama.cpp's ggml_quantize_chunk(type, src, dst, 0,
 * n_rows, n_per_row, imatrix = NULL) writes (quantize_row_<type>_ref and
 * friends; quants/quantize_weights.c says what is matched and how). Types:
 * F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL,
 * IQ4_XS; any other is DS4_ERR_UNSUPPORTED (so a call with n_rows == 0 probes
 * support). n_per_row must be a multiple of the block size (32, or 256 for
 * the K-quants and IQ4_XS): DS4_ERR_BAD_ROW. dst receives n_rows rows of
 * n_per_row/block_size*type_size bytes, no alignment needed. Rows and blocks
 * are independent (no imatrix, no whole-row statistics), so callers may
 * split the work over threads by rows; this function runs on the calling
 * thread only. Scalar, deterministic, independent of the CPU's ISA. */
int ds4_quantize_weights(int type, const float *src, void *dst, int64_t n_rows,
                         int64_t n_per_row, ds4_error *err);

/* Dot product of one row of `type` (n weights) with an activation row.
 * act_type is either DS4_TYPE_F32 (plain floats) or the type's paired
 * vec_dot_type (already quantized with ds4_quantize_row). */
int ds4_vec_dot(int isa, int type, const void *w, int act_type,
                const void *act, int64_t n, float *out, ds4_error *err);

/* The matrix product the forward pass runs in fast precision, on the calling
 * thread: out[r*n_out + o] = W_o . act_r for n_out weight rows of `type`
 * (row o at w + o*w_row_bytes, n weights) and nr activation rows of the
 * paired vec_dot_type (row r at act + r*act_stride). multi_row = 1 uses the
 * ISA's multi-row kernel where it has one for `type` (each weight block
 * read once for all rows; DS4_ERR_UNSUPPORTED where it has none, so a call
 * with nr == 0 probes), 0 calls ds4_vec_dot's kernel row by row; the two
 * must agree bit for bit (tests/test_matmul_rows.py). For tests and
 * bench/bench_kernels.py; allocates a packing buffer per call. */
int ds4_matmul_rows(int isa, int type, const void *w, size_t w_row_bytes, int64_t n_out,
                    const void *act, size_t act_stride, int64_t n, int64_t nr,
                    int multi_row, float *out, ds4_error *err);
/* Name of the multi-row kernel `isa` runs for `type` (NULL: none). */
const char *ds4_matmul_rows_kernel(int isa, int type);

/* One token's gated-DeltaNet update of nr state rows of dk floats (row m
 * at S + m*dk, forward/gdn.c): S_m *= decay; u = S_m . k;
 * d = (v[m] - u) * beta; S_m += k * d; then, if out, out[m] = S_m . q.
 * kernel = 1 runs `isa`'s multi-row kernel (DS4_ERR_UNSUPPORTED where it
 * has none), 0 the portable per-row loop over the ISA's float dot; the two
 * must agree bit for bit (tests/test_prefill_kernels.py). For tests. */
int ds4_gdn_rows(int isa, int kernel, float *S, int64_t nr, const float *k, const float *q,
                 int64_t dk, float decay, const float *v, float beta, float *out,
                 ds4_error *err);
/* y[i] = x[i] / (1 + expf(-x[i])) * (m ? m[i] : 1) for i < n, as the
 * forward pass computes SiLU on `isa`: its vectorised kernel where the set
 * has one (bit for bit the C formula), else the C formula; *vectorised
 * says which ran. For tests. */
int ds4_silu_row(int isa, float *y, const float *x, const float *m, int64_t n,
                 int *vectorised, ds4_error *err);

/* Memory bandwidth in GB/s (1e9 bytes/s), best of reps passes over
 * `bytes`-sized arrays with n_threads threads (csrc/membw.c): READ sums one
 * array, TRIAD is STREAM's a = b + s*c (3 arrays' bytes per pass). For the
 * CPU benchmark's bandwidth bound (bench/bench_cpu.py). */
enum { DS4_MEMBW_READ = 0, DS4_MEMBW_TRIAD = 1 };
int ds4_membw(int n_threads, int kind, size_t bytes, int reps, double *gbps, ds4_error *err);

/* The thread pool under stress (csrc/pool.c, for tests): n_jobs jobs of
 * 1..max_items items on n_threads threads, item i of job j writing j into
 * slot i; fails, naming the job and item, unless every item of every job
 * ran exactly once and before its job returned. */
int ds4_pool_check(int n_threads, int n_jobs, int64_t max_items, ds4_error *err);

/* DS4PY_PATHS=1 (read once, at the core's first check): the forward pass
 * records which kernel variant each layer's matvec / GEMM, attention, GDN
 * recurrence and MoE actually ran. This writes the record as text lines
 * (NUL-terminated when it fits in cap) and returns its length without the
 * NUL; 0 when the switch is off. */
int64_t ds4_paths_report(char *buf, int64_t cap);

/* ---------------------------------------------------------------- GGUF -- */

typedef struct ds4_gguf ds4_gguf;

enum {
    DS4_GGUF_UINT8 = 0, DS4_GGUF_INT8 = 1, DS4_GGUF_UINT16 = 2,
    DS4_GGUF_INT16 = 3, DS4_GGUF_UINT32 = 4, DS4_GGUF_INT32 = 5,
    DS4_GGUF_FLOAT32 = 6, DS4_GGUF_BOOL = 7, DS4_GGUF_STRING = 8,
    DS4_GGUF_ARRAY = 9, DS4_GGUF_UINT64 = 10, DS4_GGUF_INT64 = 11,
    DS4_GGUF_FLOAT64 = 12,
    DS4_GGUF_MAX_DEPTH = 8       /* arrays of arrays nest at most this deep */
};

/* One metadata entry. Pointers point into the mapped file and live as long
 * as the ds4_gguf. value/value_nbytes cover the encoded value exactly as in
 * the file (for an array: its elements, after the element type and count;
 * for a string: its bytes, after the u64 length, so value_nbytes is the
 * string length), already validated, so a reader may walk them without
 * bounds surprises. Keys and tensor names are valid UTF-8; string values are
 * not checked (any bytes). An array length too large for the file is
 * DS4_ERR_BAD_COUNT. */
typedef struct {
    const char *key;         /* not NUL-terminated */
    uint64_t key_len;
    int type;                /* DS4_GGUF_* */
    int array_type;          /* element type when type == ARRAY, else -1 */
    uint64_t array_count;    /* element count when type == ARRAY */
    const uint8_t *value;
    uint64_t value_nbytes;
} ds4_gguf_kv;

typedef struct {
    const char *name;        /* not NUL-terminated */
    uint64_t name_len;
    int type;                /* ggml type id */
    int n_dims;              /* 1..4 */
    int64_t ne[4];           /* GGUF order: ne[0] is the row length; unused = 1 */
    uint64_t offset;         /* from the start of the data section */
    uint64_t nbytes;
    const uint8_t *data;     /* into the mapping */
} ds4_gguf_tensor;

/* Open and fully validate a file (read-only mmap). On failure *out is NULL. */
int ds4_gguf_open(const char *path, ds4_gguf **out, ds4_error *err);
/* Same over a caller buffer (which must outlive the handle); used by fuzzing. */
int ds4_gguf_open_memory(const void *data, uint64_t size, ds4_gguf **out,
                         ds4_error *err);
void ds4_gguf_close(ds4_gguf *g);

uint32_t ds4_gguf_version(const ds4_gguf *g);
uint64_t ds4_gguf_alignment(const ds4_gguf *g);
uint64_t ds4_gguf_data_offset(const ds4_gguf *g);  /* file offset of tensor data */
uint64_t ds4_gguf_file_size(const ds4_gguf *g);
int64_t ds4_gguf_n_kv(const ds4_gguf *g);
int64_t ds4_gguf_n_tensors(const ds4_gguf *g);
int ds4_gguf_get_kv(const ds4_gguf *g, int64_t i, ds4_gguf_kv *out, ds4_error *err);
int ds4_gguf_get_tensor(const ds4_gguf *g, int64_t i, ds4_gguf_tensor *out,
                        ds4_error *err);
/* Index of a key / tensor by name, or -1. */
int64_t ds4_gguf_find_kv(const ds4_gguf *g, const char *key);
int64_t ds4_gguf_find_tensor(const ds4_gguf *g, const char *name);

/* --------------------------------------------------------------- model -- */

typedef struct ds4_model ds4_model;
typedef struct ds4_session ds4_session;

enum { DS4_ARCH_QWEN35 = 0, DS4_ARCH_QWEN35MOE = 1 };
enum { DS4_PRECISION_FAST = 0, DS4_PRECISION_EXACT = 1 };
enum { DS4_LAYER_GDN = 0, DS4_LAYER_ATTN = 1, DS4_LAYER_NEXTN = 2 };

/* Every dimension of a loaded Qwen3.5 model (names follow the GGUF keys;
 * qwen35-spec.md §1). */
typedef struct {
    int arch;                 /* DS4_ARCH_* */
    int64_t n_vocab;
    int64_t n_embd;
    int64_t n_layer_all;      /* block_count: trunk + nextn blocks */
    int64_t n_main;           /* trunk layers run by the forward pass */
    int64_t n_nextn;          /* nextn_predict_layers (0 or 1) */
    int64_t n_ctx_train;      /* context_length */
    float rms_eps;
    /* gated attention */
    int64_t n_head, n_head_kv, head_dim, n_rot;
    float rope_base;
    float attn_scale;         /* resolved: attention.scale, or 1/sqrt(head_dim) */
    /* gated delta net */
    int64_t ssm_conv_kernel;  /* K */
    int64_t ssm_d_state;      /* d_k == d_v */
    int64_t ssm_n_k;          /* group_count */
    int64_t ssm_n_v;          /* time_step_rank */
    int64_t ssm_d_inner;      /* n_v * d_v */
    /* FFN */
    int64_t n_ff;             /* dense FFN width (0 for MoE) */
    int64_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp; /* MoE (0 for dense) */
    int tied_head;            /* 1 when output.weight is absent */
    int fused_gate_up_exps;   /* 1 when the file has ffn_gate_up_exps */
} ds4_model_config;

typedef struct {
    int precision;            /* DS4_PRECISION_* */
    int n_threads;            /* <= 0: one per online CPU */
    int64_t n_ctx;            /* <= 0: min(context_length, 8192) */
    const char *draft_head;   /* NULL, or the path of a standalone nextn (MTP) head GGUF
                                 to run as this model's head (ds4_model_nextn_source);
                                 read during ds4_model_load only */
} ds4_model_params;

/* Load and bind a qwen35/qwen35moe GGUF. Everything the engine cannot run
 * (architecture, a missing or mis-shaped tensor, a tensor type without
 * kernels) is refused here with a message naming it. */
int ds4_model_load(const char *path, const ds4_model_params *params,
                   ds4_model **out, ds4_error *err);
void ds4_model_free(ds4_model *m);
void ds4_model_get_config(const ds4_model *m, ds4_model_config *out);
/* DS4_LAYER_* of block il (0 <= il < n_layer_all), or -1 when out of range. */
int ds4_model_layer_kind(const ds4_model *m, int64_t il);
/* Where the model's nextn (MTP) head comes from: 0 = none; bit
 * DS4_NEXTN_BUNDLED = the model file carries one; bit DS4_NEXTN_DRAFT_HEAD =
 * a draft_head file was attached and is the head that runs (with both bits,
 * the file's own head is ignored).
 * A draft_head file is the layout llama.cpp's converter writes for MTP-only
 * output (convert_hf_to_gguf.py --mtp): the trunk's metadata, blk.N.* of
 * the head (N = the trunk's layer count), and optionally token_embd /
 * output_norm / output, which the head then uses instead of the trunk's.
 * Refused at load, naming the reason: a file with any other blk.k (a full
 * model is not a head, whatever it carries), another architecture (an MoE
 * head on a dense trunk or the reverse), a head for a trunk of another
 * depth, a tensor whose shape does not match the trunk (named), or a
 * non-shape setting that differs (rms eps, rope, attention scale, experts
 * per token; the key is named). */
enum { DS4_NEXTN_BUNDLED = 1, DS4_NEXTN_DRAFT_HEAD = 2 };
int ds4_model_nextn_source(const ds4_model *m);
int64_t ds4_model_n_ctx(const ds4_model *m);
int ds4_model_precision(const ds4_model *m);
int ds4_model_n_threads(const ds4_model *m);

/* The tensors the loader bound, for inspection and tests: one entry per
 * filled slot, globals first (layer -1), then each block in ds4_layer field
 * order. A nextn block without its own shared_head_norm has output_norm.weight
 * in that slot (llama.cpp's fallback). Pointers live as long as the model. */
typedef struct {
    const char *name;         /* GGUF tensor name (NUL-terminated) */
    const char *role;         /* slot: "token_embd", "attn_q", "nextn_eh_proj", ... */
    int64_t layer;            /* block index, or -1 for a global tensor */
    int type;
    int n_dims;
    int64_t ne[4];
    const void *data;         /* into the mapping */
    size_t row_bytes;         /* bytes of one ne[0]-long row */
    size_t expert_bytes;      /* bytes of one ne[0] x ne[1] matrix */
} ds4_model_tensor_info;

int64_t ds4_model_n_tensors(const ds4_model *m);
int ds4_model_get_tensor(const ds4_model *m, int64_t i, ds4_model_tensor_info *out,
                         ds4_error *err);

int ds4_session_new(ds4_model *m, ds4_session **out, ds4_error *err);
void ds4_session_free(ds4_session *s);
/* Evaluate n tokens after the session's current position. want_rows:
 * 0 = logits of the last row only, 1 = logits of every row. Hidden states
 * (post-final-norm) are always kept for the same rows. A prompt past n_ctx
 * fails with DS4_ERR_ARG and leaves the session unchanged. */
int ds4_session_eval(ds4_session *s, const int32_t *tokens, int64_t n,
                     int all_rows, ds4_error *err);
/* Results of the last eval, owned by the session, valid until the next eval
 * or free: rows x n_vocab logits / rows x n_embd hidden (row-major). */
const float *ds4_session_logits(const ds4_session *s, int64_t *n_rows);
const float *ds4_session_hidden(const ds4_session *s, int64_t *n_rows);
int64_t ds4_session_n_past(const ds4_session *s);

/* ds4_session_eval plus the residual stream after trunk layers layers[0..
 * n_layers) (each 0 <= l < n_main; repeats allowed) for the same rows as the
 * logits. n_layers == 0 is ds4_session_eval. */
int ds4_session_eval_layers(ds4_session *s, const int32_t *tokens, int64_t n,
                            int all_rows, const int64_t *layers, int64_t n_layers,
                            ds4_error *err);
/* Those rows of the last eval: rows x n_layers x n_embd (row-major), owned
 * by the session like the logits. NULL with *n_layers == 0 when the last
 * eval asked for none. */
const float *ds4_session_layer_hidden(const ds4_session *s, int64_t *n_rows,
                                      int64_t *n_layers);

/* The nextn (MTP) head (csrc/forward/nextn.c; qwen35-spec.md §7), with its
 * own KV cache in the session. Row r is (tokens[r], hiddens[r], positions[r])
 * where hiddens[r] (n_embd floats) is the trunk's post-final-norm hidden of
 * position positions[r]-1 (ds4_session_hidden), or the head's own output
 * hidden of the previous row when chaining drafts. Positions must be
 * consecutive. An empty head takes any first position (llama.cpp mirrors a
 * fresh sequence from position 1; position 0 may instead be given a zero
 * hidden); later rows continue the head's KV or rewind into it: rows at
 * positions >= positions[0] are replaced. Both precisions and batch
 * invariance as the trunk: n rows in one call equal n one-row calls bit for
 * bit. DS4_ERR_UNSUPPORTED when the model has no head; a failed call
 * changes nothing. */
int ds4_session_nextn_eval(ds4_session *s, const int32_t *tokens, const float *hiddens,
                           const int64_t *positions, int64_t n, ds4_error *err);
/* ds4_session_nextn_eval with a choice of outputs: DS4_NEXTN_OUT_ALL is
 * ds4_session_nextn_eval; DS4_NEXTN_OUT_KV writes only the head's KV
 * entries of the rows (bit for bit those OUT_ALL writes) and computes no
 * logits or hidden: a row's K/V do not depend on the head's attention, FFN
 * or LM head, so catching the head up skips them. After an OUT_KV call
 * ds4_session_nextn_logits/hidden show 0 rows. */
enum { DS4_NEXTN_OUT_KV = 0, DS4_NEXTN_OUT_ALL = 1 };
int ds4_session_nextn_eval_out(ds4_session *s, const int32_t *tokens, const float *hiddens,
                               const int64_t *positions, int64_t n, int out, ds4_error *err);
/* Head priming: the one admission decision for drafting with the nextn head
 * (prefill and decode alike). With priming on, every trunk row the session
 * commits reaches the head's KV, batched and KV-only (DS4_NEXTN_OUT_KV):
 * an eval's rows (row p = token p with the trunk's post-final-norm hidden
 * of p-1; position 0 has no row) wait until 64 have gathered or something
 * reads or changes the head (a verify, a nextn call, a snapshot, priming
 * off), which first catches the head up in one call -- so this is
 * invisible to callers, and ds4_session_nextn_range/covered report the
 * head as caught up (session.c "Deferred rows"); a verify's rows reach
 * the head when they are committed -- at
 * ds4_session_accept(k) (its k rows, one call), or all n at the next eval or
 * snapshot -- and restore brings the snapshot's head KV and last hidden
 * back. The head then always holds positions [1, n_past) (or from 0, if a
 * caller primed position 0), which is what a draft at n_past needs, and
 * whatever drafts wrote past n_past is overwritten by the rows that commit.
 * Turning it on needs a head that already holds [1, n_past) (true at
 * n_past <= 1), and no verify waiting for its accept: DS4_ERR_ARG names
 * the missing positions otherwise, so a session can never prime from a
 * history with a gap. Off (the default) the head is only what
 * ds4_session_nextn_eval writes. DS4_ERR_UNSUPPORTED without a head. */
int ds4_session_set_nextn_prime(ds4_session *s, int on, ds4_error *err);
int ds4_session_nextn_prime(const ds4_session *s);
/* 1 when the head holds every position a draft at n_past needs: [1, n_past)
 * (n_past <= 1: nothing needed). */
int ds4_session_nextn_covered(const ds4_session *s);
/* Give the head the committed rows waiting for it (session.c "Deferred
 * rows") now, in one batched call, instead of inside the next nextn call or
 * verify: a caller that times its speculative rounds (ds4py.spec.runner)
 * keeps the priming of a plain stretch out of the first round after it.
 * Returns how many rows the head got (0: none were waiting, priming off, or
 * s is NULL). Cannot fail: the rows' head pages were reserved when they
 * were deferred. */
int64_t ds4_session_nextn_catch_up(ds4_session *s);

/* One row (token, hidden) at the head's next position (or, when the head
 * is empty, at the trunk's n_past): one draft step. */
int ds4_session_nextn_draft(ds4_session *s, int32_t token, const float *hidden,
                            ds4_error *err);
/* Results of the last nextn call, owned by the session: rows x n_vocab
 * logits and rows x n_embd output hiddens (the head's post-norm rows). The
 * logits are valid until the next nextn call; the hidden rows stay valid
 * through the next nextn call (so they may be its input) and no longer. */
const float *ds4_session_nextn_logits(const ds4_session *s, int64_t *n_rows);
const float *ds4_session_nextn_hidden(const ds4_session *s, int64_t *n_rows);
/* The head's KV: positions [*first, *next) (empty when equal). */
void ds4_session_nextn_range(const ds4_session *s, int64_t *first, int64_t *next);

/* Snapshots (csrc/session.c). A snapshot is the session's whole state at
 * one point: position, KV pages of every KV layer (trunk and nextn head),
 * GDN conv + recurrent states, and the last result row (logits, hidden),
 * so a restored session continues at once (ds4_session_logits/hidden show
 * that row). Taking one is cheap: the KV pages covering [0, n_past) are
 * shared, reference counted, and copied only when the session next writes
 * into a page the snapshot shares (at most one page per K/V of each
 * attention layer per snapshot); the recurrent states are copied. A
 * snapshot stays valid and unchanged whatever the session does next, and
 * until ds4_snapshot_free; it may outlive its session. Restoring it (any
 * number of times, into any session of the same ds4_model; another model's
 * session is DS4_ERR_ARG) leaves that session exactly as the snapshot's
 * session was: the next evals are bit-identical to a fresh evaluation of
 * the same tokens. Its memory is counted in the snapshotting session's
 * counters. */
typedef struct ds4_snapshot ds4_snapshot;
int ds4_session_snapshot(ds4_session *s, ds4_snapshot **out, ds4_error *err);
int ds4_session_restore(ds4_session *s, const ds4_snapshot *snap, ds4_error *err);
void ds4_snapshot_free(ds4_snapshot *snap);
int64_t ds4_snapshot_n_past(const ds4_snapshot *snap);
/* 1 when the snapshot's nextn head holds [1, n_past) and it has its last
 * hidden row: it can be restored into a session with head priming on (a
 * snapshot without that history is refused there, DS4_ERR_ARG). */
int ds4_snapshot_nextn_covered(const ds4_snapshot *snap);

/* Bytes the snapshot allocated itself (recurrent states, last row, page
 * table), not the pages it shares. */
uint64_t ds4_snapshot_bytes(const ds4_snapshot *snap);

/* KV pages (K and V counted separately) alive in this process, in every
 * session and snapshot: each is freed when its last holder lets go. */
int64_t ds4_kv_live_pages(void);

/* Speculative verification. ds4_session_verify evaluates n tokens
 * (1 <= n <= DS4_VERIFY_MAX) after n_past as one batch and keeps the logits
 * and hidden of every row (plus the residual stream after the given trunk
 * layers, as ds4_session_eval_layers; n_layers may be 0), bit-identical to
 * n one-token evals. ds4_session_accept(k), 1 <= k <= n, then leaves the
 * session exactly as if only the first k tokens had been evaluated:
 * n_past = before + k, results show row k-1 (the verify's other rows stay
 * readable in the buffer until the next eval), the nextn head's KV is cut
 * back to n_past if it went past it (with head priming on, the k accepted
 * rows are first given to it in one KV-only call:
 * ds4_session_set_nextn_prime). Accept applies to the last verify only and
 * only until another eval, verify, restore or accept; anything
 * else is DS4_ERR_ARG. An eval right after a verify keeps all n rows. */
enum { DS4_VERIFY_MAX = 16 };
int ds4_session_verify(ds4_session *s, const int32_t *tokens, int64_t n,
                       const int64_t *layers, int64_t n_layers, ds4_error *err);
int ds4_session_accept(ds4_session *s, int64_t k, ds4_error *err);
/* What verify keeps for rollback on a model of config c with n_gdn_layers
 * GDN layers (computed, nothing allocated): *per_row bytes per verified
 * row, and *per_state bytes of one full recurrent state, which a session
 * keeps once (allocated at its first verify) as the replay's base; keeping
 * a full state per row instead would cost *per_state per row. */
void ds4_rollback_bytes(const ds4_model_config *c, int64_t n_gdn_layers,
                        uint64_t *per_row, uint64_t *per_state);

/* Cumulative counts of a session since ds4_session_new.
 *  allocs / alloc_bytes: every heap allocation (malloc, calloc, realloc) the
 *    session makes for itself: forward scratch, recurrent state, KV pages and
 *    their tables, result buffers (not the thread pool's own few at session
 *    creation). The decode path allocates only when a step enters a new KV
 *    page (256 positions, forward.h DS4_KV_PAGE): one K and one V page per
 *    attention layer plus one realloc of the split-K partials. A page
 *    allocation is the page plus a 64-byte reference-count header
 *    (forward.h DS4_KV_PAGE_HEADER). After a snapshot, the first write into
 *    a page it shares copies that page (one K and one V page per attention
 *    layer); a session's first verify allocates a second recurrent state
 *    and room for its rows' rollback inputs (grown, never shrunk, when a
 *    later verify has more rows). Snapshots' own memory is counted here.
 *  weight_bytes: bytes of model weights the forward pass read: per matmul
 *    job n_out * row_bytes (each weight row is read once per job, however
 *    many token rows share it; a MoE layer has one job per routed expert
 *    actually used in the chunk; the LM head is one job), one token_embd row
 *    per token, and every small F32 tensor a layer reads (norms, conv taps,
 *    ssm_a, dt bias; output_norm when the chunk has output rows) once per
 *    chunk; an eval runs in chunks of 256 rows (forward.h DS4_CHUNK_ROWS). */
typedef struct {
    uint64_t allocs;
    uint64_t alloc_bytes;
    uint64_t weight_bytes;
} ds4_counters;

void ds4_session_counters(const ds4_session *s, ds4_counters *out);

/* The core's own greedy decode loop (csrc/bench_loop.c), the baseline for
 * the Python front's overhead: n times, evaluate one token (first, then each
 * result) with ds4_session_eval and take the argmax of its logits (ties: the
 * lowest id; a NaN logit fails), writing the n chosen ids to out. Only public
 * session calls; s must be a session of m. Stops at the first failing eval
 * (out then holds the ids chosen before it). */
int ds4_greedy_loop(const ds4_model *m, ds4_session *s, int32_t first, int64_t n, int32_t *out,
                    ds4_error *err);

/* Greedy speculative rounds with the nextn head (csrc/spec_round.c), so a
 * round costs the front two calls. Both use only the public session API; s
 * must be a session of m.
 * ds4_spec_propose: k (1 <= k < DS4_VERIFY_MAX) chained greedy drafts after
 * the committed, not yet evaluated token `last`: step 1 is (last, the
 * session's last hidden row) at n_past, step j > 1 the previous draft with
 * the head's own output hidden at n_past + j - 1 (ds4_session_nextn_eval
 * rows); each draft is the argmax of the head's logits (ties: the lowest
 * id; a NaN fails). DS4_ERR_ARG unless the head holds [1, n_past)
 * (ds4_session_nextn_covered).
 * ds4_spec_verify_greedy: ds4_session_verify(tokens, n) and the argmax of
 * every row into argmax[0..n) (ties: the lowest id; a NaN fails after the
 * verify). Follow with ds4_session_accept. */
int ds4_spec_propose(const ds4_model *m, ds4_session *s, int32_t last, int64_t k, int32_t *out,
                     ds4_error *err);
int ds4_spec_verify_greedy(const ds4_model *m, ds4_session *s, const int32_t *tokens, int64_t n,
                           int32_t *argmax, ds4_error *err);

/* -------------------------------------------------------------- DFlash -- */

/* A classic DFlash drafter bound to a target model (csrc/forward/dflash.h
 * holds the contract: file layout, forward pass, rounds). ds4_dflash_load
 * refuses, naming the key or tensor, what it cannot run: another
 * architecture, DFlash2 (version 2, conv/selector keys or tensors), a
 * version above 2, a tap outside the target's trunk, an embedding width or
 * mask token the target does not have, a block size outside 2..16, a
 * causal or windowed mask, a file with its own embedding / LM head, a
 * missing, mis-shaped, unexpected or non-dequantizable tensor. The drafter
 * reads the target's token_embd and LM head: the target must outlive it. */
enum { DS4_DFLASH_MAX_TAPS = 16, DS4_DFLASH_MAX_BLOCK = 16 };
typedef struct ds4_dflash ds4_dflash;
typedef struct ds4_dflash_ctx ds4_dflash_ctx;
typedef struct {
    int64_t version;          /* dflash.version as stored (0 or 1) */
    int64_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim;
    int64_t block_size;       /* B: the anchor row + B-1 draft rows */
    int64_t n_taps;
    int64_t target_layers[DS4_DFLASH_MAX_TAPS]; /* 0-based trunk layers (v0 shifted) */
    int64_t mask_token_id;
    float rms_eps, rope_base;
} ds4_dflash_config;

int ds4_dflash_load(const char *path, const ds4_model *target, ds4_dflash **out,
                    ds4_error *err);
void ds4_dflash_free(ds4_dflash *d);
void ds4_dflash_get_config(const ds4_dflash *d, ds4_dflash_config *out);

/* A drafting context: the drafter's persistent per-layer KV of context rows
 * (positions [0, n)) and its scratch; one per target session. Threads: the
 * target model's n_threads. Results are independent of the thread count. */
int ds4_dflash_ctx_new(ds4_dflash *d, ds4_dflash_ctx **out, ds4_error *err);
void ds4_dflash_ctx_free(ds4_dflash_ctx *c);
int64_t ds4_dflash_ctx_n(const ds4_dflash_ctx *c);
/* Context rows at positions pos0 .. pos0+n-1 from the target's taps: n x
 * n_taps x n_embd floats (ds4_session_layer_hidden's layout, layers =
 * target_layers). 0 <= pos0 <= ctx_n: rows from pos0 on are replaced (a
 * rollback and an append in one call); past the target's n_ctx is
 * DS4_ERR_ARG. A failed call changes nothing. */
int ds4_dflash_ctx_add(ds4_dflash_ctx *c, const float *taps, int64_t pos0, int64_t n,
                       ds4_error *err);
/* Forget positions >= n (n <= ctx_n): exact rollback, nothing recomputed. */
int ds4_dflash_ctx_truncate(ds4_dflash_ctx *c, int64_t n, ds4_error *err);
/* One block at position pos == ctx_n: rows [anchor, MASK x (B-1)]; writes
 * the B-1 drafts (argmax, lowest id on ties) to drafts. The context is not
 * changed (the block rows' K/V are used in this pass only). */
int ds4_dflash_propose(ds4_dflash_ctx *c, int32_t anchor, int64_t pos, int32_t *drafts,
                       ds4_error *err);
/* The same, but only the first n_drafts (1..B-1) rows go through the LM
 * head (all B rows still run the layers: the block attends to itself), so
 * a round that wants k < B-1 drafts does not pay for B-1 logits rows. */
int ds4_dflash_propose_n(ds4_dflash_ctx *c, int32_t anchor, int64_t pos, int64_t n_drafts,
                         int32_t *drafts, ds4_error *err);
/* The last propose's logits: n_drafts x n_vocab (B-1 after ds4_dflash_propose),
 * owned by the context, valid until its next propose or free. */
const float *ds4_dflash_logits(const ds4_dflash_ctx *c, int64_t *n_rows);

/* ---------------------------------------------------------------- Metal -- */

/* 1 when a Metal device is usable; else 0 and err says why ("Metal is not
 * available on this platform" off macOS). */
int ds4_metal_available(ds4_error *err);

#endif /* DS4_H */
