/*
 * bind.c — descriptors generated from kernels/table.h and the binding check
 * every host runs before a launch (bind.h).
 */
#include "bind.h"

#include <stdio.h>
#include <string.h>

#define DESC_ITEM_(K, slot, name, T, kind, n) {slot, #name, kind, sizeof(T)},
#define MIN_CASE_(K, slot, name, T, kind, n) \
    case slot: return (uint64_t)(n);
#define DESC_KERNEL_(id, K)                                                   \
    static const k_arg_desc args_##K[] = {K_ARGS_##K(DESC_ITEM_, K)};         \
    static uint64_t min_##K(const void *pp, int slot) {                       \
        k_##K##_params p;                                                     \
        memcpy(&p, pp, sizeof p);                                             \
        switch (slot) { K_ARGS_##K(MIN_CASE_, K) }                            \
        return UINT64_MAX;                                                    \
    }
K_KERNEL_LIST(DESC_KERNEL_)

#define DESC_ENTRY_(id, K) {id, #K, (int)(sizeof args_##K / sizeof args_##K[0]), args_##K, min_##K},
static const k_kernel_desc descs[] = {K_KERNEL_LIST(DESC_ENTRY_)};

const k_kernel_desc *k_kernel_desc_of(int id) {
    for (size_t i = 0; i < sizeof descs / sizeof descs[0]; i++)
        if (descs[i].id == id) return &descs[i];
    return NULL;
}

int k_check_tables(char *err, size_t cap) {
    for (size_t i = 0; i < sizeof descs / sizeof descs[0]; i++) {
        const k_kernel_desc *d = &descs[i];
        for (int s = 0; s < d->n_args; s++) {
            const int want = s == 0 ? K_STATUS : s == 1 ? K_PARAMS : -1;
            if (d->args[s].slot != s || (want >= 0 && d->args[s].kind != want) ||
                (s > 1 && (d->args[s].kind == K_STATUS || d->args[s].kind == K_PARAMS))) {
                snprintf(err, cap, "kernel %s: table row %d (%s) has slot %d / kind %d; rows must be "
                         "slots 0, 1, 2, ... with the status at 0 and the params at 1",
                         d->name, s, d->args[s].name, d->args[s].slot, d->args[s].kind);
                return -1;
            }
        }
    }
    return 0;
}

int k_check_bindings(const k_kernel_desc *d, const k_binding *b, int nb, char *err, size_t cap) {
    const k_binding *by_slot[32] = {0};
    if (d->n_args > 32) {
        snprintf(err, cap, "kernel %s: %d arguments, more than 32", d->name, d->n_args);
        return -1;
    }
    for (int i = 0; i < nb; i++) {
        if (b[i].slot < 0 || b[i].slot >= d->n_args) {
            snprintf(err, cap, "kernel %s: binding %d names slot %d, the kernel has slots 0..%d",
                     d->name, i, b[i].slot, d->n_args - 1);
            return -1;
        }
        if (by_slot[b[i].slot]) {
            snprintf(err, cap, "kernel %s: slot %d (%s) bound twice", d->name, b[i].slot,
                     d->args[b[i].slot].name);
            return -1;
        }
        if (!b[i].ptr) {
            snprintf(err, cap, "kernel %s: slot %d (%s) bound to NULL", d->name, b[i].slot,
                     d->args[b[i].slot].name);
            return -1;
        }
        by_slot[b[i].slot] = &b[i];
    }
    for (int s = 0; s < d->n_args; s++)
        if (!by_slot[s]) {
            snprintf(err, cap, "kernel %s: slot %d (%s) not bound", d->name, s, d->args[s].name);
            return -1;
        }
    const k_binding *pb = by_slot[K_ARG_rmsnorm_p]; /* slot 1 in every table */
    if (pb->bytes != d->args[1].elem) {
        snprintf(err, cap, "kernel %s: slot 1 (params) holds %zu bytes, the params struct is %zu "
                 "(a buffer bound at the params slot?)", d->name, pb->bytes, d->args[1].elem);
        return -1;
    }
    uint32_t tag;
    memcpy(&tag, pb->ptr, sizeof tag);
    if (tag != K_TAG(d->id)) {
        snprintf(err, cap, "kernel %s: params tag 0x%08x is not the kernel's 0x%08x (params of "
                 "another kernel?)", d->name, tag, K_TAG(d->id));
        return -1;
    }
    for (int s = 0; s < d->n_args; s++) {
        if (s == 1) continue;
        /* The expressions are evaluated in 32-bit unsigned arithmetic like
         * the kernels' own indexing; a zero count wraps to a huge need and
         * is refused here as too small a buffer. */
        const uint64_t need = d->min_elems(pb->ptr, s);
        if ((uint64_t)by_slot[s]->bytes < need * d->args[s].elem) {
            snprintf(err, cap, "kernel %s: slot %d (%s) holds %zu bytes, these params need %llu",
                     d->name, s, d->args[s].name, by_slot[s]->bytes,
                     (unsigned long long)(need * d->args[s].elem));
            return -1;
        }
    }
    return 0;
}
