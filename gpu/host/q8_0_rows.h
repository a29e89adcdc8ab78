/*
 * q8_0_rows.h — Q8_0 weight rows from the file's layout to the GPU's
 * (gpu/kernels/quant_q8_0.h "Q8_0 WEIGHTS ON THE DEVICE"): each row's nb =
 * n_in / 32 blocks of (fp16 d, 32 int8 codes) become the row's 32 nb codes
 * followed by its nb scales. The same 34 nb bytes per row, so a matrix, a
 * run of matrices concatenated by rows or an expert tensor keeps its size
 * and offsets; only the bytes inside each row move. Used by every host that
 * hands Q8_0 weights to the shared kernels: the runner at upload
 * (gpu/host/runner.c) and the kernel tests and benches.
 */
#ifndef K_Q8_0_ROWS_H
#define K_Q8_0_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* n_rows rows of n_in values (n_in a multiple of 32) from src (the file's
 * blocks) to dst (the device layout); dst and src must not overlap. */
static inline void k_q8_0_rows_to_device(uint8_t *dst, const uint8_t *src, size_t n_rows, size_t n_in) {
    const size_t nb = n_in / 32, rb = 34 * nb;
    for (size_t r = 0; r < n_rows; r++) {
        const uint8_t *s = src + r * rb;
        uint8_t *codes = dst + r * rb, *scales = codes + 32 * nb;
        for (size_t b = 0; b < nb; b++) {
            memcpy(scales + 2 * b, s + 34 * b, 2);
            memcpy(codes + 32 * b, s + 34 * b + 2, 32);
        }
    }
}

#endif
