/*
 * kernels_api.c — the public, argument-checked entry points over the kernel
 * sets (ds4_dequantize_row, ds4_quantize_row, ds4_vec_dot, type info).
 */
#include "quants.h"
#include "../error.h"

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
