/*
 * kernels_api.c — the public, argument-checked entry points over the kernel
 * sets (ds4_dequantize_row, ds4_quantize_row, ds4_vec_dot, type info).
 */
#include "quants.h"
#include "../error.h"

#include <math.h>
#include <stdlib.h>

static int check_type(int type, ds4_error *err) {
    if (type < 0 || type >= DS4_TYPE_COUNT || ds4_type_traits_table[type].block_size == 0)
        return ds4_fail(err, DS4_ERR_BAD_TENSOR_TYPE, "unknown ggml type id %d", type);
    return DS4_OK;
}

static const char *type_label(int type) {
    return ds4_type_traits_table[type].name;
}

static int check_len(int type, int64_t n, ds4_error *err) {
    int64_t bs = ds4_type_traits_table[type].block_size;
    if (n < 0 || n % bs != 0)
        return ds4_fail(err, DS4_ERR_BAD_ROW,
                        "row length %lld is not a multiple of %s's block size %lld",
                        (long long)n, type_label(type), (long long)bs);
    return DS4_OK;
}

static int get_set(int isa, const ds4_kernel_set **k, ds4_error *err) {
    *k = ds4_kernels_for(isa);
    if (!*k)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "ISA %s is not available on this CPU",
                        ds4_isa_name(isa));
    return DS4_OK;
}

int ds4_type_get_info(int type, ds4_type_info *out, ds4_error *err) {
    int rc = check_type(type, err);
    if (rc) return rc;
    const ds4_type_traits *t = &ds4_type_traits_table[type];
    const ds4_kernel_set *k = ds4_kernels_for(DS4_ISA_SCALAR);
    out->name = t->name;
    out->block_size = t->block_size;
    out->type_size = t->type_size;
    out->vec_dot_type = t->vec_dot_type;
    out->flags = DS4_TYPE_KNOWN;
    if (k->to_float[type]) out->flags |= DS4_TYPE_DEQUANT;
    if (k->from_float[type]) out->flags |= DS4_TYPE_QUANTIZE;
    if (t->vec_dot_type >= 0 && k->vec_dot[type] && k->vec_dot_f32[type])
        out->flags |= DS4_TYPE_DOT;
    if (t->ds4_only) out->flags |= DS4_TYPE_DS4_ONLY;
    return ds4_ok(err);
}

int ds4_dequantize_row(int isa, int type, const void *src, float *dst, int64_t n,
                       ds4_error *err) {
    const ds4_kernel_set *k;
    int rc;
    if ((rc = check_type(type, err)) || (rc = check_len(type, n, err)) ||
        (rc = get_set(isa, &k, err)))
        return rc;
    if (!k->to_float[type])
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "dequantizing %s is not supported",
                        type_label(type));
    if (n) k->to_float[type](src, dst, n);
    return ds4_ok(err);
}

int ds4_quantize_row(int isa, int type, const float *src, void *dst, int64_t n,
                     ds4_error *err) {
    const ds4_kernel_set *k;
    int rc;
    if ((rc = check_type(type, err)) || (rc = check_len(type, n, err)) ||
        (rc = get_set(isa, &k, err)))
        return rc;
    if (!k->from_float[type])
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "quantizing to %s is not supported",
                        type_label(type));
    if (n) k->from_float[type](src, dst, n);
    return ds4_ok(err);
}

int ds4_vec_dot(int isa, int type, const void *w, int act_type, const void *act,
                int64_t n, float *out, ds4_error *err) {
    const ds4_kernel_set *k;
    int rc;
    if ((rc = check_type(type, err)) || (rc = check_len(type, n, err)) ||
        (rc = get_set(isa, &k, err)))
        return rc;
    int paired = ds4_type_traits_table[type].vec_dot_type;
    if (paired < 0)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s is not a weight type ds4 computes with",
                        type_label(type));
    ds4_vec_dot_fn fn;
    if (act_type == DS4_TYPE_F32) {
        fn = k->vec_dot_f32[type];
    } else if (act_type == paired) {
        if ((rc = check_len(paired, n, err))) return rc;
        fn = k->vec_dot[type];
    } else {
        return ds4_fail(err, DS4_ERR_ARG,
                        "%s weights pair with F32 or %s activations, not type id %d",
                        type_label(type), type_label(paired), act_type);
    }
    if (!fn)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "no dot kernel for %s", type_label(type));
    *out = 0.0f;
    if (n) fn(n, out, w, act);
    return ds4_ok(err);
}

const char *ds4_matmul_rows_kernel(int isa, int type) {
    const ds4_kernel_set *k = ds4_kernels_for(isa);
    if (!k || type < 0 || type >= DS4_TYPE_COUNT) return NULL;
    return k->dot_rows[type] ? k->dot_rows_name[type] : NULL;
}

int ds4_matmul_rows(int isa, int type, const void *w, size_t w_row_bytes, int64_t n_out,
                    const void *act, size_t act_stride, int64_t n, int64_t nr,
                    int multi_row, float *out, ds4_error *err) {
    const ds4_kernel_set *k;
    int rc;
    if ((rc = check_type(type, err)) || (rc = check_len(type, n, err)) ||
        (rc = get_set(isa, &k, err)))
        return rc;
    const int paired = ds4_type_traits_table[type].vec_dot_type;
    if (paired < 0 || !k->vec_dot[type])
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s is not a weight type ds4 computes with",
                        type_label(type));
    if ((rc = check_len(paired, n, err))) return rc;
    if (n_out < 0 || nr < 0)
        return ds4_fail(err, DS4_ERR_ARG, "negative matrix size (%lld outputs, %lld rows)",
                        (long long)n_out, (long long)nr);
    if (multi_row && !k->dot_rows[type])
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "ISA %s has no multi-row kernel for %s",
                        ds4_isa_name(isa), type_label(type));
    if (n_out == 0 || nr == 0) return ds4_ok(err);
    if (!multi_row) {
        for (int64_t r = 0; r < nr; r++)
            for (int64_t o = 0; o < n_out; o++) {
                float s = 0.0f;
                if (n) k->vec_dot[type](n, &s, (const uint8_t *)w + (size_t)o * w_row_bytes,
                                        (const uint8_t *)act + (size_t)r * act_stride);
                out[r * n_out + o] = s;
            }
        return ds4_ok(err);
    }
    /* Rows in the kernel's layout: packed copies, or the caller's rows. */
    const size_t rb = ds4_rows_act_bytes(k, type, n);
    uint8_t *packed = NULL;
    const void **ptr = malloc((size_t)nr * sizeof *ptr);
    float *s = malloc((size_t)nr * sizeof *s);
    if (k->pack_rows[type]) packed = malloc(rb * (size_t)nr + 1);
    if (!ptr || !s || (k->pack_rows[type] && !packed)) {
        free(ptr); free(s); free(packed);
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for %lld packed rows", (long long)nr);
    }
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *a = (const uint8_t *)act + (size_t)r * act_stride;
        if (packed) {
            k->pack_rows[type](a, packed + (size_t)r * rb, n);
            ptr[r] = packed + (size_t)r * rb;
        } else {
            ptr[r] = a;
        }
    }
    if (k->dot_tile[type]) {
        /* the forward's tile calls (matmul.c): ds4_tile_out weight rows, the tail fewer */
        const int64_t to = ds4_tile_out(k, type);
        for (int64_t o = 0; o < n_out; o += to)
            k->dot_tile[type](n, (int)(n_out - o < to ? n_out - o : to),
                              (int)nr, out + o, n_out,
                              (const uint8_t *)w + (size_t)o * w_row_bytes, w_row_bytes, ptr);
    } else {
        for (int64_t o = 0; o < n_out; o++) {
            k->dot_rows[type](n, (int)nr, s, (const uint8_t *)w + (size_t)o * w_row_bytes, ptr);
            for (int64_t r = 0; r < nr; r++) out[r * n_out + o] = s[r];
        }
    }
    free(ptr); free(s); free(packed);
    return ds4_ok(err);
}

/* The portable loop of forward/gdn.c delta_row (the reference the
 * kernels mirror), written out here so a test can hold them side by side. */
int ds4_gdn_rows(int isa, int kernel, float *S, int64_t nr, const float *k, const float *q,
                 int64_t dk, float decay, const float *v, float beta, float *out,
                 ds4_error *err) {
    const ds4_kernel_set *ks;
    int rc;
    if ((rc = get_set(isa, &ks, err))) return rc;
    if (nr < 0 || dk <= 0)
        return ds4_fail(err, DS4_ERR_ARG, "bad GDN shape (%lld rows of %lld)", (long long)nr,
                        (long long)dk);
    if (kernel) {
        if (!ks->gdn_rows)
            return ds4_fail(err, DS4_ERR_UNSUPPORTED, "ISA %s has no GDN rows kernel",
                            ds4_isa_name(isa));
        ks->gdn_rows(S, nr, k, q, dk, decay, v, beta, out);
        return ds4_ok(err);
    }
    const ds4_vec_dot_fn dot = ks->vec_dot_f32[DS4_TYPE_F32];
    for (int64_t m = 0; m < nr; m++) {
        float *Sm = S + m * dk;
        for (int64_t i = 0; i < dk; i++) Sm[i] *= decay;
        float u = 0.0f;
        dot(dk, &u, Sm, k);
        const float dm = (v[m] - u) * beta;
        for (int64_t i = 0; i < dk; i++) Sm[i] += k[i] * dm;
        if (out) {
            out[m] = 0.0f;
            dot(dk, &out[m], Sm, q);
        }
    }
    return ds4_ok(err);
}

int ds4_silu_row(int isa, float *y, const float *x, const float *m, int64_t n,
                 int *vectorised, ds4_error *err) {
    const ds4_kernel_set *ks;
    int rc;
    if ((rc = get_set(isa, &ks, err))) return rc;
    if (n < 0) return ds4_fail(err, DS4_ERR_ARG, "negative row length %lld", (long long)n);
    *vectorised = ks->silu_mul != NULL;
    if (ks->silu_mul) {
        ks->silu_mul(y, x, m, n);
        return ds4_ok(err);
    }
    for (int64_t i = 0; i < n; i++) {
        const float s = x[i] / (1.0f + expf(-x[i]));
        y[i] = m ? s * m[i] : s;
    }
    return ds4_ok(err);
}
