/*
 * bind.h — the host side of the argument tables (kernels/table.h), shared by
 * every host: the Objective-C one (metal/), the CUDA one (cuda/) and the
 * emulator (gpu/emul/). A host describes a launch as a list of bindings
 * (slot, pointer, bytes) made with K_BIND(kernel, name, ...), which spells the
 * slot through the table's name, and calls k_check_bindings() before
 * encoding it: a slot bound twice or never, a buffer smaller than the table
 * says these params need, or a params struct of the wrong size refuses the
 * launch with a message naming the kernel, slot and argument.
 */
#ifndef K_BIND_H
#define K_BIND_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/table.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int slot;
    void *ptr;     /* host pointer (emulator, tests) or a backend's buffer handle */
    size_t bytes;
} k_binding;

#define K_BIND(K, name, ptr_, bytes_) ((k_binding){K_ARG_##K##_##name, (void *)(ptr_), (size_t)(bytes_)})

typedef struct {
    int slot;
    const char *name;
    int kind;        /* K_STATUS, K_PARAMS, K_IN, K_OUT */
    size_t elem;     /* bytes of one element (of the struct, for K_PARAMS) */
} k_arg_desc;

typedef struct {
    int id;
    const char *name;   /* "rmsnorm": the kernel function is k_<name> */
    int n_args;
    const k_arg_desc *args;
    /* Elements argument `slot` needs for these params (table.h's expression). */
    uint64_t (*min_elems)(const void *params, int slot);
} k_kernel_desc;

/* The descriptor of kernel `id` (K_ID_*), NULL if unknown. */
const k_kernel_desc *k_kernel_desc_of(int id);
/* Every table's slots are 0, 1, 2, ... in order, slot 0 the status, slot 1
 * the params: 0 if so, else -1 with the first violation in err. */
int k_check_tables(char *err, size_t cap);
/* 0 when bindings b[0..nb) bind every slot of d exactly once with enough
 * bytes for the params (found at the K_PARAMS slot, which must hold exactly
 * one params struct); else -1 and err says what is wrong. */
int k_check_bindings(const k_kernel_desc *d, const k_binding *b, int nb, char *err, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
