/*
 * gguf.c — GGUF v2/v3 reader.
 *
 * The whole file is validated once, at open; afterwards every accessor hands
 * out pointers into the (read-only) mapping that are known to be in bounds.
 * The format is little-endian throughout; values are assembled byte by byte
 * so the reader does not depend on the host's byte order or on alignment.
 *
 * Defensive rules, because a GGUF file is untrusted input:
 *  - every length/count is checked against the bytes that remain BEFORE it is
 *    used, so no arithmetic can overflow and no read can leave the buffer;
 *  - no allocation is sized by a declared count: the kv/tensor arrays grow as
 *    entries are actually parsed, so a header claiming 2^62 entries fails on
 *    the count check and never reaches malloc;
 *  - duplicate detection and lookup use a merge sort of indices (O(n log n)
 *    worst case, deterministic, immune to crafted hash collisions);
 *  - recursion (arrays of arrays) is bounded by DS4_GGUF_MAX_DEPTH.
 *
 * What is validated as UTF-8: keys and tensor names (they are identifiers the
 * rest of the engine matches on). String VALUES are returned as raw bytes and
 * may hold anything, as in llama.cpp (gguf.cpp does not check them either);
 * the Python layer decodes them and hands back bytes when they are not UTF-8.
 */
#include "ds4.h"
#include "error.h"
#include "quants/quants.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32 /* gguf.h GGUF_DEFAULT_ALIGNMENT */
#define GGUF_MAX_DIMS 4           /* ggml.h GGML_MAX_DIMS */
/* Smallest possible encodings, used to bound declared counts by the bytes
 * left: a kv is key length (8) + empty key + value type (4) + a 1-byte
 * value; a tensor info is name length (8) + empty name + n_dims (4) + one
 * dim (8) + type (4) + offset (8). */
#define MIN_KV_BYTES 13
#define MIN_TENSOR_BYTES 32
/* Longest name quoted in an error message, so a message stays readable and
 * fits ds4_error.message. */
#define NAME_QUOTE_MAX 96

struct ds4_gguf {
    const uint8_t *base;
    uint64_t size;
    void *map;          /* our mmap, or NULL for open_memory */
    size_t map_len;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int64_t n_kv, n_tensors;
    ds4_gguf_kv *kv;
    ds4_gguf_tensor *tensors;
    int64_t *kv_by_key;       /* kv indices sorted by key bytes */
    int64_t *tensor_by_name;  /* tensor indices sorted by name bytes */
};

/* ------------------------------------------------------------- helpers -- */

/* Quote a (possibly invalid, possibly huge) name for a message: printable
 * ASCII and valid UTF-8 sequences as they are, anything else as \xNN, cut at
 * NAME_QUOTE_MAX bytes on a character boundary. */
static int utf8_seq_len(const uint8_t *s, uint64_t n);

static void quote_name(char *out, size_t cap, const uint8_t *s, uint64_t len) {
    size_t o = 0;
    uint64_t i = 0;
    if (cap < 8) { if (cap) out[0] = 0; return; }
    out[o++] = '\'';
    while (i < len && i < NAME_QUOTE_MAX && o + 6 < cap) {
        uint8_t c = s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
            out[o++] = (char)c;
            i++;
            continue;
        }
        int k = c >= 0x80 ? utf8_seq_len(s + i, len - i) : 0;
        if (k > 0) {
            if (o + (size_t)k + 6 >= cap) break;
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (uint64_t)k;
        } else {
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
            i++;
        }
    }
    out[o++] = '\'';
    if (i < len && o + 4 < cap) { memcpy(out + o, "...", 3); o += 3; }
    out[o] = 0;
}

/* Length of the valid UTF-8 sequence starting at s, or 0 if it is not one.
 * Rejects overlongs, surrogates (U+D800..DFFF) and code points > U+10FFFF,
 * following Unicode 15 Table 3-7 (well-formed byte sequences). */
static int utf8_seq_len(const uint8_t *s, uint64_t n) {
    uint8_t c = s[0];
    int len;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return 0; /* continuation byte, C0/C1 (always overlong), F5..FF */
    if (n < (uint64_t)len) return 0;
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return len;
}

/* Offset of the first byte that is not valid UTF-8, or n if all are. */
static uint64_t utf8_check(const uint8_t *s, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        int k = utf8_seq_len(s + i, n - i);
        if (k == 0) return i;
        i += (uint64_t)k;
    }
    return n;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) {
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static const char *value_type_name(uint32_t t) {
    static const char *const names[] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32",
                                        "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
                                        "UINT64", "INT64", "FLOAT64"};
    return t <= DS4_GGUF_FLOAT64 ? names[t] : "?";
}

/* Bytes of a fixed-size value type; 0 for STRING/ARRAY. */
static uint64_t scalar_size(uint32_t t) {
    static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return sz[t];
}

/* ---------------------------------------------------------------- parse -- */

typedef struct {
    const uint8_t *p;
    uint64_t size;
    uint64_t pos;
    ds4_error *err;
    /* The entry being parsed, for messages. Kept as parts and formatted only
     * when a message is written: formatting per entry costs more than the
     * parse itself on a 200k-entry table. */
    const char *kind;      /* "header", "kv", "tensor" */
    int64_t index;
    const uint8_t *name;   /* key / tensor name once read and validated, else NULL */
    uint64_t name_len;
    char where_buf[NAME_QUOTE_MAX * 4 + 48];
} parser;

/* "header", "kv 3", "key 'a.b' (kv 3)", "tensor 'w' (tensor 5)" */
static const char *where(parser *ps) {
    if (ps->kind[0] == 'h') return ps->kind;
    if (!ps->name) {
        snprintf(ps->where_buf, sizeof ps->where_buf, "%s %lld", ps->kind, (long long)ps->index);
    } else {
        char q[NAME_QUOTE_MAX * 4 + 8];
        quote_name(q, sizeof q, ps->name, ps->name_len);
        snprintf(ps->where_buf, sizeof ps->where_buf, "%s %s (%s %lld)",
                 ps->kind[0] == 'k' ? "key" : "tensor", q, ps->kind, (long long)ps->index);
    }
    return ps->where_buf;
}

static void set_entry(parser *ps, const char *kind, int64_t index) {
    ps->kind = kind;
    ps->index = index;
    ps->name = NULL;
    ps->name_len = 0;
}

static uint64_t left(const parser *ps) { return ps->size - ps->pos; }

static int need(parser *ps, uint64_t n, const char *field) {
    if (n <= left(ps)) return DS4_OK;
    return ds4_fail(ps->err, DS4_ERR_TRUNCATED,
                    "%s: %s needs %llu bytes at offset %llu but only %llu remain "
                    "(file size %llu)",
                    where(ps), field, (unsigned long long)n, (unsigned long long)ps->pos,
                    (unsigned long long)left(ps), (unsigned long long)ps->size);
}

static int rd_u32(parser *ps, uint32_t *v, const char *field) {
    int rc = need(ps, 4, field);
    if (rc) return rc;
    *v = le32(ps->p + ps->pos);
    ps->pos += 4;
    return DS4_OK;
}

static int rd_u64(parser *ps, uint64_t *v, const char *field) {
    int rc = need(ps, 8, field);
    if (rc) return rc;
    *v = le64(ps->p + ps->pos);
    ps->pos += 8;
    return DS4_OK;
}

static int rd_string(parser *ps, const uint8_t **s, uint64_t *len, const char *field) {
    uint64_t start = ps->pos;
    int rc = rd_u64(ps, len, field);
    if (rc) return rc;
    if (*len > left(ps))
        return ds4_fail(ps->err, DS4_ERR_BAD_STRING,
                        "%s: %s length %llu (at offset %llu) runs past the end of the "
                        "file: only %llu bytes remain",
                        where(ps), field, (unsigned long long)*len, (unsigned long long)start,
                        (unsigned long long)left(ps));
    *s = ps->p + ps->pos;
    ps->pos += *len;
    return DS4_OK;
}

static int check_name_utf8(parser *ps, const uint8_t *s, uint64_t len, const char *what,
                           int64_t index) {
    uint64_t bad = utf8_check(s, len);
    if (bad == len) return DS4_OK;
    char q[NAME_QUOTE_MAX * 4 + 8];
    quote_name(q, sizeof q, s, len);
    return ds4_fail(ps->err, DS4_ERR_BAD_STRING,
                    "%s %lld: name %s is not valid UTF-8 (byte 0x%02x at position %llu)",
                    what, (long long)index, q, s[bad], (unsigned long long)bad);
}

/* Check one array header (element type + count) and skip its elements.
 * depth is the nesting level of this array (1 for a kv's own array). */
static int skip_array(parser *ps, int depth, uint32_t *elem_type_out, uint64_t *count_out);

static int check_value_type(parser *ps, uint32_t t, const char *field) {
    if (t <= DS4_GGUF_FLOAT64) return DS4_OK;
    return ds4_fail(ps->err, DS4_ERR_BAD_VALUE_TYPE, "%s: unknown %s %u (valid: 0..12)",
                    where(ps), field, t);
}

static int skip_array(parser *ps, int depth, uint32_t *elem_type_out, uint64_t *count_out) {
    uint32_t et;
    uint64_t count;
    int rc;
    if ((rc = rd_u32(ps, &et, "array element type")) ||
        (rc = check_value_type(ps, et, "array element type")) ||
        (rc = rd_u64(ps, &count, "array length")))
        return rc;
    if (et == DS4_GGUF_ARRAY && depth >= DS4_GGUF_MAX_DEPTH)
        return ds4_fail(ps->err, DS4_ERR_NESTING,
                        "%s: arrays nested %d deep (an array of arrays at depth %d); "
                        "at most %d levels are allowed",
                        where(ps), depth + 1, depth, DS4_GGUF_MAX_DEPTH);
    /* Bound the count by the smallest encoding of one element before using
     * it: this is what makes count*size below overflow-free. */
    uint64_t min_elem = et == DS4_GGUF_STRING ? 8 : et == DS4_GGUF_ARRAY ? 12 : scalar_size(et);
    if (count > left(ps) / min_elem)
        return ds4_fail(ps->err, DS4_ERR_BAD_COUNT,
                        "%s: array length %llu (of %s, at depth %d) is larger than the file "
                        "allows: %llu bytes remain, each element needs at least %llu",
                        where(ps), (unsigned long long)count, value_type_name(et), depth,
                        (unsigned long long)left(ps), (unsigned long long)min_elem);
    if (elem_type_out) *elem_type_out = et;
    if (count_out) *count_out = count;
    if (et == DS4_GGUF_STRING) {
        for (uint64_t i = 0; i < count; i++) {
            uint64_t len, start = ps->pos;
            if ((rc = rd_u64(ps, &len, "array element string length"))) return rc;
            if (len > left(ps))
                return ds4_fail(ps->err, DS4_ERR_BAD_STRING,
                                "%s: array element %llu: string length %llu (at offset %llu) "
                                "runs past the end of the file: only %llu bytes remain",
                                where(ps), (unsigned long long)i, (unsigned long long)len,
                                (unsigned long long)start, (unsigned long long)left(ps));
            ps->pos += len;
        }
    } else if (et == DS4_GGUF_ARRAY) {
        for (uint64_t i = 0; i < count; i++)
            if ((rc = skip_array(ps, depth + 1, NULL, NULL))) return rc;
    } else {
        ps->pos += count * min_elem;
    }
    return DS4_OK;
}

static int parse_kv(parser *ps, int64_t index, ds4_gguf_kv *kv) {
    const uint8_t *key;
    uint64_t key_len;
    uint32_t type;
    int rc;
    set_entry(ps, "kv", index);
    if ((rc = rd_string(ps, &key, &key_len, "key"))) return rc;
    if ((rc = check_name_utf8(ps, key, key_len, "kv", index))) return rc;
    ps->name = key;
    ps->name_len = key_len;
    if ((rc = rd_u32(ps, &type, "value type")) || (rc = check_value_type(ps, type, "value type")))
        return rc;
    kv->key = (const char *)key;
    kv->key_len = key_len;
    kv->type = (int)type;
    kv->array_type = -1;
    kv->array_count = 0;
    if (type == DS4_GGUF_STRING) {
        /* value: the characters; the u64 length prefix is skipped, just as an
         * array's element type and count are. */
        uint64_t len;
        if ((rc = rd_string(ps, &kv->value, &len, "string value"))) return rc;
        kv->value_nbytes = len;
    } else if (type == DS4_GGUF_ARRAY) {
        uint32_t et;
        uint64_t count, start;
        /* the header is 12 bytes; the elements start right after it */
        start = ps->pos + 12;
        if ((rc = skip_array(ps, 1, &et, &count))) return rc;
        kv->array_type = (int)et;
        kv->array_count = count;
        kv->value = ps->p + start;
        kv->value_nbytes = ps->pos - start;
    } else {
        uint64_t n = scalar_size(type);
        if ((rc = need(ps, n, value_type_name(type)))) return rc;
        kv->value = ps->p + ps->pos;
        kv->value_nbytes = n;
        ps->pos += n;
    }
    return DS4_OK;
}

static int parse_tensor(parser *ps, int64_t index, ds4_gguf_tensor *t) {
    const uint8_t *name;
    uint64_t name_len, offset;
    uint32_t n_dims, type;
    int rc;
    set_entry(ps, "tensor", index);
    if ((rc = rd_string(ps, &name, &name_len, "name"))) return rc;
    if ((rc = check_name_utf8(ps, name, name_len, "tensor", index))) return rc;
    ps->name = name;
    ps->name_len = name_len;
    if ((rc = rd_u32(ps, &n_dims, "n_dims"))) return rc;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return ds4_fail(ps->err, DS4_ERR_BAD_DIMS, "%s: n_dims is %u; it must be 1..%d",
                        where(ps), n_dims, GGUF_MAX_DIMS);
    int64_t nelem = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t v;
        char field[16];
        snprintf(field, sizeof field, "ne[%u]", d);
        if ((rc = rd_u64(ps, &v, field))) return rc;
        /* Dims are int64 in ggml; a stored value >= 2^63 would be negative. */
        if (v == 0 || v > (uint64_t)INT64_MAX)
            return ds4_fail(ps->err, DS4_ERR_BAD_DIMS,
                            "%s: dimension ne[%u] is %lld; every dimension must be >= 1",
                            where(ps), d, (long long)v);
        t->ne[d] = (int64_t)v;
        if (__builtin_mul_overflow(nelem, (int64_t)v, &nelem))
            return ds4_fail(ps->err, DS4_ERR_BAD_DIMS,
                            "%s: the product of the dimensions overflows int64 at ne[%u]=%llu",
                            where(ps), d, (unsigned long long)v);
    }
    if ((rc = rd_u32(ps, &type, "type"))) return rc;
    if (type >= DS4_TYPE_COUNT || ds4_type_traits_table[type].block_size == 0)
        return ds4_fail(ps->err, DS4_ERR_BAD_TENSOR_TYPE, "%s: unknown ggml type id %u",
                        where(ps), type);
    const ds4_type_traits *tr = &ds4_type_traits_table[type];
    if (t->ne[0] % tr->block_size != 0)
        return ds4_fail(ps->err, DS4_ERR_BAD_ROW,
                        "%s: row length ne[0]=%lld is not a multiple of %s's block size %lld",
                        where(ps), (long long)t->ne[0], tr->name, (long long)tr->block_size);
    int64_t nbytes;
    /* rows are whole blocks, so nelem is a multiple of block_size too */
    if (__builtin_mul_overflow(nelem / tr->block_size, tr->type_size, &nbytes))
        return ds4_fail(ps->err, DS4_ERR_BAD_DIMS,
                        "%s: %lld elements of %s overflow a 64-bit byte size", where(ps),
                        (long long)nelem, tr->name);
    if ((rc = rd_u64(ps, &offset, "offset"))) return rc;
    t->name = (const char *)name;
    t->name_len = name_len;
    t->type = (int)type;
    t->n_dims = (int)n_dims;
    t->offset = offset;
    t->nbytes = (uint64_t)nbytes;
    t->data = NULL; /* set once the data section's start is known */
    return DS4_OK;
}

/* ------------------------------------------------------------ sorting -- */

typedef int (*cmp_fn)(const ds4_gguf *g, int64_t a, int64_t b);

static int cmp_bytes(const char *a, uint64_t na, const char *b, uint64_t nb) {
    uint64_t n = na < nb ? na : nb;
    int c = n ? memcmp(a, b, (size_t)n) : 0;
    if (c) return c;
    return na < nb ? -1 : na > nb;
}

static int cmp_kv_key(const ds4_gguf *g, int64_t a, int64_t b) {
    return cmp_bytes(g->kv[a].key, g->kv[a].key_len, g->kv[b].key, g->kv[b].key_len);
}

static int cmp_tensor_name(const ds4_gguf *g, int64_t a, int64_t b) {
    return cmp_bytes(g->tensors[a].name, g->tensors[a].name_len, g->tensors[b].name,
                     g->tensors[b].name_len);
}

static int cmp_tensor_offset(const ds4_gguf *g, int64_t a, int64_t b) {
    uint64_t x = g->tensors[a].offset, y = g->tensors[b].offset;
    return x < y ? -1 : x > y;
}

/* Stable bottom-up merge sort of n indices; tmp holds n. A merge sort rather
 * than qsort: qsort has no context argument in C11 and its worst case is not
 * guaranteed; stability makes "first" and "second" in duplicate messages
 * follow file order. */
static void sort_indices(int64_t *a, int64_t *tmp, int64_t n, cmp_fn cmp, const ds4_gguf *g) {
    int64_t *src = a, *dst = tmp;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n;
            int64_t hi = mid + w < n ? mid + w : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = cmp(g, src[j], src[i]) < 0 ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        int64_t *t = src; src = dst; dst = t;
        if (w > n / 2) break; /* next w would be >= n; also guards w*2 overflow */
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
}

/* ---------------------------------------------------------------- open -- */

/* Grow an array of elem-sized items so it can hold need items. Doubling from
 * what was actually parsed keeps allocation proportional to real entries. */
static int grow(void **arr, int64_t *cap, int64_t need_n, size_t elem, ds4_error *err) {
    if (need_n <= *cap) return DS4_OK;
    int64_t nc = *cap ? *cap * 2 : 64;
    if (nc < need_n) nc = need_n;
    if ((uint64_t)nc > SIZE_MAX / elem)
        return ds4_fail(err, DS4_ERR_NOMEM, "GGUF table of %lld entries is too large",
                        (long long)nc);
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p)
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory growing a GGUF table to %lld entries",
                        (long long)nc);
    *arr = p;
    *cap = nc;
    return DS4_OK;
}

static int parse_all(ds4_gguf *g, ds4_error *err) {
    parser ps = {.p = g->base, .size = g->size, .pos = 0, .err = err};
    int rc;
    set_entry(&ps, "header", 0);

    /* magic: "GGUF" */
    static const uint8_t magic[4] = {'G', 'G', 'U', 'F'};
    uint64_t mlen = g->size < 4 ? g->size : 4;
    if (mlen && memcmp(g->base, magic, (size_t)mlen) != 0) {
        char q[NAME_QUOTE_MAX * 4 + 8];
        quote_name(q, sizeof q, g->base, mlen);
        return ds4_fail(err, DS4_ERR_BAD_MAGIC,
                        "not a GGUF file: magic is %s, expected 'GGUF'", q);
    }
    if ((rc = need(&ps, 4, "magic"))) return rc;
    ps.pos = 4;

    uint32_t version;
    if ((rc = rd_u32(&ps, &version, "version"))) return rc;
    if (version != 2 && version != 3) {
        uint32_t swapped = __builtin_bswap32(version);
        if (swapped == 2 || swapped == 3)
            return ds4_fail(err, DS4_ERR_BAD_VERSION,
                            "GGUF version field reads %u: this is a big-endian GGUF v%u file; "
                            "only little-endian files are supported", version, swapped);
        return ds4_fail(err, DS4_ERR_BAD_VERSION,
                        "GGUF version %u is not supported (only versions 2 and 3)", version);
    }
    g->version = version;

    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(&ps, &n_tensors, "tensor count")) || (rc = rd_u64(&ps, &n_kv, "kv count")))
        return rc;
    if (n_kv > left(&ps) / MIN_KV_BYTES)
        return ds4_fail(err, DS4_ERR_BAD_COUNT,
                        "kv count %llu is larger than the file allows: %llu bytes follow the "
                        "header and each kv needs at least %d",
                        (unsigned long long)n_kv, (unsigned long long)left(&ps), MIN_KV_BYTES);
    if (n_tensors > (left(&ps) - n_kv * MIN_KV_BYTES) / MIN_TENSOR_BYTES)
        return ds4_fail(err, DS4_ERR_BAD_COUNT,
                        "tensor count %llu is larger than the file allows: %llu bytes follow "
                        "the header, %llu kvs need at least %llu of them and each tensor "
                        "needs at least %d",
                        (unsigned long long)n_tensors, (unsigned long long)left(&ps),
                        (unsigned long long)n_kv, (unsigned long long)(n_kv * MIN_KV_BYTES),
                        MIN_TENSOR_BYTES);

    /* --- key/value pairs --- */
    int64_t cap = 0;
    for (int64_t i = 0; i < (int64_t)n_kv; i++) {
        if ((rc = grow((void **)&g->kv, &cap, i + 1, sizeof *g->kv, err))) return rc;
        if ((rc = parse_kv(&ps, i, &g->kv[i]))) return rc;
        g->n_kv = i + 1;
    }
    if (g->n_kv) {
        int64_t *tmp = malloc((size_t)g->n_kv * sizeof *tmp);
        g->kv_by_key = malloc((size_t)g->n_kv * sizeof *g->kv_by_key);
        if (!tmp || !g->kv_by_key) {
            free(tmp);
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory indexing %lld keys",
                            (long long)g->n_kv);
        }
        for (int64_t i = 0; i < g->n_kv; i++) g->kv_by_key[i] = i;
        sort_indices(g->kv_by_key, tmp, g->n_kv, cmp_kv_key, g);
        free(tmp);
        for (int64_t i = 1; i < g->n_kv; i++) {
            int64_t a = g->kv_by_key[i - 1], b = g->kv_by_key[i];
            if (cmp_kv_key(g, a, b) == 0) {
                char q[NAME_QUOTE_MAX * 4 + 8];
                quote_name(q, sizeof q, (const uint8_t *)g->kv[b].key, g->kv[b].key_len);
                return ds4_fail(err, DS4_ERR_DUPLICATE_KEY, "duplicate key %s (kv %lld and kv %lld)",
                                q, (long long)a, (long long)b);
            }
        }
    }

    /* --- alignment --- */
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = ds4_gguf_find_kv(g, "general.alignment");
    if (ai >= 0) {
        const ds4_gguf_kv *kv = &g->kv[ai];
        if (kv->type != DS4_GGUF_UINT32)
            return ds4_fail(err, DS4_ERR_BAD_ALIGNMENT,
                            "key 'general.alignment' (kv %lld) has type %s; it must be UINT32",
                            (long long)ai, value_type_name((uint32_t)kv->type));
        uint32_t a = le32(kv->value);
        if (a == 0 || (a & (a - 1)) != 0)
            return ds4_fail(err, DS4_ERR_BAD_ALIGNMENT,
                            "key 'general.alignment' (kv %lld) is %u; it must be a nonzero "
                            "power of two", (long long)ai, a);
        g->alignment = a;
    }

    /* --- tensor infos --- */
    cap = 0;
    for (int64_t i = 0; i < (int64_t)n_tensors; i++) {
        if ((rc = grow((void **)&g->tensors, &cap, i + 1, sizeof *g->tensors, err))) return rc;
        if ((rc = parse_tensor(&ps, i, &g->tensors[i]))) return rc;
        g->n_tensors = i + 1;
    }

    /* The data section starts at the aligned end of the tensor table. pos <=
     * size, so this only overflows for a file within `alignment` of 2^64. */
    uint64_t pad = (g->alignment - ps.pos % g->alignment) % g->alignment;
    if (__builtin_add_overflow(ps.pos, pad, &g->data_offset))
        return ds4_fail(err, DS4_ERR_BAD_OFFSET, "data section offset overflows");
    uint64_t data_size = g->size > g->data_offset ? g->size - g->data_offset : 0;

    if (g->n_tensors) {
        int64_t n = g->n_tensors;
        int64_t *tmp = malloc((size_t)n * sizeof *tmp);
        g->tensor_by_name = malloc((size_t)n * sizeof *g->tensor_by_name);
        if (!tmp || !g->tensor_by_name) {
            free(tmp);
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory indexing %lld tensors",
                            (long long)n);
        }
        for (int64_t i = 0; i < n; i++) g->tensor_by_name[i] = i;
        sort_indices(g->tensor_by_name, tmp, n, cmp_tensor_name, g);
        for (int64_t i = 1; i < n; i++) {
            int64_t a = g->tensor_by_name[i - 1], b = g->tensor_by_name[i];
            if (cmp_tensor_name(g, a, b) == 0) {
                char q[NAME_QUOTE_MAX * 4 + 8];
                quote_name(q, sizeof q, (const uint8_t *)g->tensors[b].name,
                           g->tensors[b].name_len);
                free(tmp);
                return ds4_fail(err, DS4_ERR_DUPLICATE_TENSOR,
                                "duplicate tensor name %s (tensor %lld and tensor %lld)", q,
                                (long long)a, (long long)b);
            }
        }

        for (int64_t i = 0; i < n; i++) {
            ds4_gguf_tensor *t = &g->tensors[i];
            char q[NAME_QUOTE_MAX * 4 + 8];
            if (t->offset % g->alignment != 0 || t->offset > data_size ||
                t->nbytes > data_size - t->offset) {
                quote_name(q, sizeof q, (const uint8_t *)t->name, t->name_len);
                free(tmp);
                if (t->offset % g->alignment != 0)
                    return ds4_fail(err, DS4_ERR_BAD_OFFSET,
                                    "tensor %s (tensor %lld): offset %llu is not a multiple of "
                                    "the alignment %llu",
                                    q, (long long)i, (unsigned long long)t->offset,
                                    (unsigned long long)g->alignment);
                /* offset+nbytes may wrap; say so rather than print a wrapped end */
                uint64_t end;
                int wraps = __builtin_add_overflow(t->offset, t->nbytes, &end);
                return ds4_fail(err, DS4_ERR_BAD_OFFSET,
                                "tensor %s (tensor %lld): bytes at offset %llu + %llu %s "
                                "past the end of the data section (%llu bytes from file "
                                "offset %llu)",
                                q, (long long)i, (unsigned long long)t->offset,
                                (unsigned long long)t->nbytes,
                                wraps ? "wrap around 2^64,": "run", (unsigned long long)data_size,
                                (unsigned long long)g->data_offset);
            }
            t->data = g->base + g->data_offset + t->offset;
        }

        /* Overlap: after sorting by offset, each tensor must end at or before
         * the next one starts. All ends are in bounds now, so no overflow. */
        for (int64_t i = 0; i < n; i++) tmp[i] = i;
        int64_t *tmp2 = malloc((size_t)n * sizeof *tmp2);
        if (!tmp2) {
            free(tmp);
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory sorting %lld tensors",
                            (long long)n);
        }
        sort_indices(tmp, tmp2, n, cmp_tensor_offset, g);
        free(tmp2);
        for (int64_t i = 1; i < n; i++) {
            const ds4_gguf_tensor *a = &g->tensors[tmp[i - 1]], *b = &g->tensors[tmp[i]];
            if (a->offset + a->nbytes > b->offset) {
                char qa[NAME_QUOTE_MAX * 4 + 8], qb[NAME_QUOTE_MAX * 4 + 8];
                quote_name(qa, sizeof qa, (const uint8_t *)a->name, a->name_len);
                quote_name(qb, sizeof qb, (const uint8_t *)b->name, b->name_len);
                rc = ds4_fail(err, DS4_ERR_OVERLAP,
                              "tensor %s (bytes %llu..%llu) overlaps tensor %s (bytes "
                              "%llu..%llu) in the data section",
                              qa, (unsigned long long)a->offset,
                              (unsigned long long)(a->offset + a->nbytes), qb,
                              (unsigned long long)b->offset,
                              (unsigned long long)(b->offset + b->nbytes));
                free(tmp);
                return rc;
            }
        }
        free(tmp);
    }
    return ds4_ok(err);
}

static int open_common(const uint8_t *data, uint64_t size, void *map, size_t map_len,
                       ds4_gguf **out, ds4_error *err) {
    ds4_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (map) munmap(map, map_len);
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory opening a GGUF");
    }
    g->base = data;
    g->size = size;
    g->map = map;
    g->map_len = map_len;
    int rc = parse_all(g, err);
    if (rc) {
        ds4_gguf_close(g);
        return rc;
    }
    *out = g;
    return DS4_OK;
}

int ds4_gguf_open_memory(const void *data, uint64_t size, ds4_gguf **out, ds4_error *err) {
    if (!out) return ds4_fail(err, DS4_ERR_ARG, "ds4_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!data && size) return ds4_fail(err, DS4_ERR_ARG, "ds4_gguf_open_memory: data is NULL");
    static const uint8_t empty[1] = {0};
    return open_common(data ? data : empty, size, NULL, 0, out, err);
}

int ds4_gguf_open(const char *path, ds4_gguf **out, ds4_error *err) {
    if (!out) return ds4_fail(err, DS4_ERR_ARG, "ds4_gguf_open: out is NULL");
    *out = NULL;
    if (!path) return ds4_fail(err, DS4_ERR_ARG, "ds4_gguf_open: path is NULL");
    /* O_NONBLOCK: opening a FIFO would otherwise wait for a writer before
     * the regular-file check below could refuse it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ds4_fail(err, DS4_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ds4_fail(err, DS4_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ds4_fail(err, DS4_ERR_IO, "'%s' is not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size > SIZE_MAX) {
        close(fd);
        return ds4_fail(err, DS4_ERR_IO, "'%s' (%llu bytes) is too large to map", path,
                        (unsigned long long)size);
    }
    void *map = NULL;
    if (size) {
        map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ds4_fail(err, DS4_ERR_IO, "cannot mmap '%s': %s", path, strerror(e));
        }
    }
    close(fd); /* the mapping stays valid without the descriptor */
    static const uint8_t empty[1] = {0};
    int rc = open_common(map ? map : empty, size, map, (size_t)size, out, err);
    if (rc && err) {
        /* Prefix the path so a message is useful on its own. */
        char msg[sizeof err->message];
        memcpy(msg, err->message, sizeof msg);
        msg[sizeof msg - 1] = 0;
        ds4_fail(err, rc, "%s: %s", path, msg);
    }
    return rc;
}

void ds4_gguf_close(ds4_gguf *g) {
    if (!g) return;
    if (g->map) munmap(g->map, g->map_len);
    free(g->kv);
    free(g->tensors);
    free(g->kv_by_key);
    free(g->tensor_by_name);
    free(g);
}

/* ----------------------------------------------------------- accessors -- */

uint32_t ds4_gguf_version(const ds4_gguf *g) { return g ? g->version : 0; }
uint64_t ds4_gguf_alignment(const ds4_gguf *g) { return g ? g->alignment : 0; }
uint64_t ds4_gguf_data_offset(const ds4_gguf *g) { return g ? g->data_offset : 0; }
uint64_t ds4_gguf_file_size(const ds4_gguf *g) { return g ? g->size : 0; }
int64_t ds4_gguf_n_kv(const ds4_gguf *g) { return g ? g->n_kv : 0; }
int64_t ds4_gguf_n_tensors(const ds4_gguf *g) { return g ? g->n_tensors : 0; }

int ds4_gguf_get_kv(const ds4_gguf *g, int64_t i, ds4_gguf_kv *out, ds4_error *err) {
    if (!g || !out) return ds4_fail(err, DS4_ERR_ARG, "ds4_gguf_get_kv: NULL argument");
    if (i < 0 || i >= g->n_kv)
        return ds4_fail(err, DS4_ERR_ARG, "kv index %lld out of range (the file has %lld)",
                        (long long)i, (long long)g->n_kv);
    *out = g->kv[i];
    return ds4_ok(err);
}

int ds4_gguf_get_tensor(const ds4_gguf *g, int64_t i, ds4_gguf_tensor *out, ds4_error *err) {
    if (!g || !out) return ds4_fail(err, DS4_ERR_ARG, "ds4_gguf_get_tensor: NULL argument");
    if (i < 0 || i >= g->n_tensors)
        return ds4_fail(err, DS4_ERR_ARG, "tensor index %lld out of range (the file has %lld)",
                        (long long)i, (long long)g->n_tensors);
    *out = g->tensors[i];
    return ds4_ok(err);
}

/* Binary search over an index sorted by name bytes. */
static int64_t find_sorted(const ds4_gguf *g, const int64_t *sorted, int64_t n, const char *name,
                           int is_kv) {
    if (!g || !name || !sorted) return -1;
    uint64_t len = strlen(name);
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2, i = sorted[mid];
        int c = is_kv ? cmp_bytes(g->kv[i].key, g->kv[i].key_len, name, len)
                      : cmp_bytes(g->tensors[i].name, g->tensors[i].name_len, name, len);
        if (c == 0) return i;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

int64_t ds4_gguf_find_kv(const ds4_gguf *g, const char *key) {
    return g ? find_sorted(g, g->kv_by_key, g->n_kv, key, 1) : -1;
}

int64_t ds4_gguf_find_tensor(const ds4_gguf *g, const char *name) {
    return g ? find_sorted(g, g->tensor_by_name, g->n_tensors, name, 0) : -1;
}
