/* ------------------------------------------------------------ mma -- */
/* suite mma: the int8 tensor-core GEMMs (gpu/kernels/gemm_mma.h) against
 * the dp4a GEMM (gemm.h) on every value and against the width-1 matvec on
 * three rows (first, middle, last) of every shape, bit for bit (the
 * promise: the same float terms in the same order; no tolerance). Shapes:
 * Q8_0 n_in 32 / 96 / 1056 / 2080 (chains with no block, one block, and
 * blocks wrapping the 32 chains up to three times); Q4_K / Q5_K / Q6_K
 * n_in 256 (one super-block: three of the four phases empty), 1280, 2304;
 * weight rows 5, 37, 70 (not multiples of the 16-row SIMD-group tile nor
 * the 64-row threadgroup: SIMD-groups wholly and partly past n_out);
 * activation rows 17, 45, 130 (not multiples of the 8-row MMA tile nor
 * the 32-row threadgroup tile); y with a row gap that must stay
 * unwritten. The K-quant weights are random bytes with finite scales; the
 * activations come from the CPU's quantizers; two more Q4_K / Q5_K cases
 * have bsums that are not the sums of their codes (gemm_kq_mma takes the
 * min term from the bsums, as the matvec and the dp4a GEMM do).
 * Also: a grid one threadgroup short in either dimension or a wrong
 * threadgroup size raises K_ERR_SHAPE. Planted fault: PLANT_MMA_FRAGMENT_SWAP
 * (A fragment registers of rows g and g + 8 swapped: Q8_0's k 16..31,
 * the K-quants' low runs) must turn this suite red. */
#ifdef K_HAS_MMA
static void mma_case(int type, uint32_t n_in, uint32_t n_out, uint32_t n_rows, int foreign_bsums) {
    const int q8 = type == DS4_TYPE_Q8_0;
    const uint32_t bk = q8 ? 32 : 256, nb = n_in / bk, ys = n_out + 3;
    const size_t bs = q8 ? 34 : type == DS4_TYPE_Q4_K ? 144 : type == DS4_TYPE_Q5_K ? 176 : 210, xbs = q8 ? 34 : 292;
    const char *tn = q8 ? "Q8_0" : type == DS4_TYPE_Q4_K ? "Q4_K" : type == DS4_TYPE_Q5_K ? "Q5_K" : "Q6_K";
    uint8_t *w = malloc(n_out * nb * bs), *xq = malloc(n_rows * nb * xbs);
    float *xf = malloc(sizeof(float) * n_rows * n_in);
    for (uint32_t i = 0; i < n_rows * n_in; i++) xf[i] = frand(-3, 3);
    if (q8) {
        float *wf = malloc(sizeof(float) * n_out * n_in);
        for (uint32_t i = 0; i < n_out * n_in; i++) wf[i] = frand(-1, 1);
        quantize_rows(wf, w, n_out, n_in);
        q8_rows_to_device_inplace(w, n_out, n_in); /* every kernel here reads the device layout */
        quantize_rows(xf, xq, n_rows, n_in);
        free(wf);
    } else {
        for (size_t i = 0; i < n_out * nb * bs; i++) w[i] = (uint8_t)rnd();
        for (uint32_t blk = 0; blk < n_out * nb; blk++) { /* finite scales */
            uint16_t *dd = (uint16_t *)(w + blk * bs + (type == DS4_TYPE_Q6_K ? 208 : 0));
            dd[0] = ds4_f32_to_fp16(frand(0.001f, 0.03f));
            if (type != DS4_TYPE_Q6_K) dd[1] = ds4_f32_to_fp16(frand(0.0f, 0.02f));
        }
        for (uint32_t r = 0; r < n_rows; r++)
            scalar.from_float[DS4_TYPE_Q8_K](xf + r * n_in, xq + r * nb * 292, n_in);
        if (foreign_bsums) /* bsums that are not the sums of the codes: the GEMMs read them as the matvec does */
            for (uint32_t blk = 0; blk < n_rows * nb; blk++)
                for (int i = 0; i < 16; i++) {
                    int16_t b;
                    memcpy(&b, xq + blk * 292 + 260 + 2 * i, 2);
                    b = (int16_t)(b + 7 * i - 50);
                    memcpy(xq + blk * 292 + 260 + 2 * i, &b, 2);
                }
    }
    const size_t ny = (size_t)(n_rows - 1) * ys + n_out;
    float *yd = malloc(sizeof(float) * ny), *ym = malloc(sizeof(float) * ny), *y1 = malloc(sizeof(float) * n_out);
    fill_nan(yd, ny), fill_nan(ym, ny);
    const size_t wb = n_out * nb * bs, xb = n_rows * nb * xbs, yb = sizeof(float) * ny;
    int ok;
    if (q8) { /* the dp4a GEMM, then the MMA GEMM */
        k_gemm_q8_0_params p = {K_TAG_OF(gemm_q8_0), n_in, n_out, n_rows, ys};
        k_binding b[] = {K_BIND(gemm_q8_0, status, status, 8), K_BIND(gemm_q8_0, p, &p, sizeof p),
                         K_BIND(gemm_q8_0, w, w, wb), K_BIND(gemm_q8_0, xq, xq, xb), K_BIND(gemm_q8_0, y, yd, yb)};
        ok = !launch(K_ID_gemm_q8_0, K_GEMM_GROUPS_X(n_rows), K_GEMM_GROUPS_Y(n_out), 1, K_GEMM_TG, b, 5, 0, "gemm_q8_0");
        k_gemm_q8_0_mma_params pm = {K_TAG_OF(gemm_q8_0_mma), n_in, n_out, n_rows, ys};
        k_binding bm[] = {K_BIND(gemm_q8_0_mma, status, status, 8), K_BIND(gemm_q8_0_mma, p, &pm, sizeof pm),
                          K_BIND(gemm_q8_0_mma, w, w, wb), K_BIND(gemm_q8_0_mma, xq, xq, xb),
                          K_BIND(gemm_q8_0_mma, y, ym, yb)};
        ok = ok && !launch(K_ID_gemm_q8_0_mma, K_MMA_GROUPS_X(n_rows), K_MMA_GROUPS_Y(n_out), 1, K_MMA_TG, bm, 5,
                           (int)(n_rows & 1), "gemm_q8_0_mma");
    } else {
        k_gemm_kq_params p = {K_TAG_OF(gemm_kq), (uint32_t)type, n_in, n_out, n_rows, ys};
        k_binding b[] = {K_BIND(gemm_kq, status, status, 8), K_BIND(gemm_kq, p, &p, sizeof p),
                         K_BIND(gemm_kq, w, w, wb), K_BIND(gemm_kq, xq, xq, xb), K_BIND(gemm_kq, y, yd, yb)};
        ok = !launch(K_ID_gemm_kq, K_GEMM_GROUPS_X(n_rows), K_GEMM_GROUPS_Y(n_out), 1, K_GEMM_TG, b, 5, 0, "gemm_kq");
        k_gemm_kq_mma_params pm = {K_TAG_OF(gemm_kq_mma), (uint32_t)type, n_in, n_out, n_rows, ys};
        k_binding bm[] = {K_BIND(gemm_kq_mma, status, status, 8), K_BIND(gemm_kq_mma, p, &pm, sizeof pm),
                          K_BIND(gemm_kq_mma, w, w, wb), K_BIND(gemm_kq_mma, xq, xq, xb), K_BIND(gemm_kq_mma, y, ym, yb)};
        ok = ok && !launch(K_ID_gemm_kq_mma, K_MMA_KQ_GROUPS_X(n_rows), K_MMA_KQ_GROUPS_Y(n_out), 1, K_MMA_KQ_TG, bm, 5,
                           (int)(n_rows & 1), "gemm_kq_mma");
    }
    if (ok) {
        size_t bad = ny, nan_out = 0;
        for (size_t i = 0; i < ny && bad == ny; i++)
            if (memcmp(&yd[i], &ym[i], 4)) bad = i;
        for (uint32_t r = 0; r < n_rows; r++) /* a value left unwritten would compare equal: NaN in both */
            for (uint32_t o = 0; o < n_out; o++) nan_out += ym[(size_t)r * ys + o] != ym[(size_t)r * ys + o];
        if (bad < ny)
            fprintf(stderr, "  first difference: row %zu out %zu: mma %.9g dp4a %.9g\n", bad / ys, bad % ys, ym[bad],
                    yd[bad]);
        check(bad == ny && nan_out == 0, "%s n_in=%u n_out=%u rows=%u%s: every value bit-identical to the dp4a GEMM, "
              "all written, the row gaps unwritten (%zu NaN outputs)", tn, n_in, n_out, n_rows,
              foreign_bsums ? " (bsums not the codes' sums)" : "", nan_out);
    }
    /* the width-1 matvec on the first, a middle and the last row */
    const uint32_t rows3[3] = {0, n_rows / 2, n_rows - 1};
    for (int k = 0; k < 3 && ok; k++) {
        const uint32_t r = rows3[k];
        fill_nan(y1, n_out);
        if (q8) {
            k_matvec_q8_0_params p = {K_TAG_OF(matvec_q8_0), n_in, n_out, 1, n_out};
            k_binding b[] = {K_BIND(matvec_q8_0, status, status, 8), K_BIND(matvec_q8_0, p, &p, sizeof p),
                             K_BIND(matvec_q8_0, w, w, wb), K_BIND(matvec_q8_0, xq, x_row_alone(xq + r * nb * xbs, nb * xbs), nb * xbs),
                             K_BIND(matvec_q8_0, y, y1, sizeof(float) * n_out)};
            ok = !launch(K_ID_matvec_q8_0, K_MATVEC_GROUPS(n_out, 4), 1, 1, 128, b, 5, 0, "matvec_q8_0");
        } else {
            k_matvec_kq_params p = {K_TAG_OF(matvec_kq1), (uint32_t)type, n_in, n_out, 1, n_out};
            k_binding b[] = {K_BIND(matvec_kq, status, status, 8), K_BIND(matvec_kq, p, &p, sizeof p),
                             K_BIND(matvec_kq, w, w, wb), K_BIND(matvec_kq, xq, xq + r * nb * xbs, nb * xbs),
                             K_BIND(matvec_kq, y, y1, sizeof(float) * n_out)};
            ok = !launch(K_ID_matvec_kq1, K_MATVEC_KQ_GROUPS(1, n_out, 4), 1, 1, 128, b, 5, 0, "matvec_kq1");
        }
        if (ok)
            check(!memcmp(y1, ym + (size_t)r * ys, sizeof(float) * n_out),
                  "%s n_in=%u n_out=%u rows=%u: row %u bit-identical to the width-1 matvec", tn, n_in, n_out, n_rows, r);
    }
    free(w), free(xq), free(xf), free(yd), free(ym), free(y1);
}

static void suite_mma(void) {
    const uint32_t shapes[][2] = {{5, 17}, {37, 45}, {70, 130}}; /* n_out, rows */
    const uint32_t q8_ins[] = {32, 96, 1056, 2080, 1280}; /* 1280: 16-aligned rows */
    for (size_t ii = 0; ii < 5; ii++)
        for (size_t s = 0; s < 3; s++) {
            if (ii >= 2 && s == 2) continue; /* the widest shape on the short rows only (emulator time) */
            mma_case(DS4_TYPE_Q8_0, q8_ins[ii], shapes[s][0], shapes[s][1], 0);
        }
    const int types[] = {DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K};
    const uint32_t kq_ins[] = {256, 1280, 2304};
    for (int it = 0; it < 3; it++)
        for (size_t ii = 0; ii < 3; ii++)
            for (size_t s = 0; s < 3; s++) {
                if (ii >= 1 && s == 2) continue;
                mma_case(types[it], kq_ins[ii], shapes[s][0], shapes[s][1], 0);
            }
    mma_case(DS4_TYPE_Q4_K, 1280, 37, 45, 1);
    mma_case(DS4_TYPE_Q5_K, 2304, 70, 33, 1);
    /* a grid one threadgroup short (either dimension) and a wrong
     * threadgroup size raise K_ERR_SHAPE (or are refused at launch on
     * CUDA, above the kernel's __launch_bounds__) */
    for (int q = 0; q < 2; q++) { /* each kernel with its own tile */
        const uint32_t NSG = q ? K_MMA_NSG : K_MMA_KQ_NSG, TR = q ? K_MMA_TR : K_MMA_KQ_TR, TG = 32 * NSG;
        const uint32_t n_in = 256, n_out = 16 * NSG + 6, rows = TR + 1, nb = 1; /* 2 x 2 threadgroups */
        const uint32_t gx = (rows + TR - 1) / TR, gy = (n_out + 16 * NSG - 1) / (16 * NSG);
        uint8_t *w = calloc(n_out * nb, 8 * 34), *xq = calloc(rows * nb, 292); /* large enough for either type */
        float *y = malloc(sizeof(float) * rows * n_out);
        const uint32_t cases[][3] = {{gx - 1, gy, TG}, {gx, gy - 1, TG}, {gx, gy, TG + 32}};
        for (int k = 0; k < 3; k++) {
            k_gemm_kq_mma_params p = {K_TAG_OF(gemm_kq_mma), K_TYPE_Q4_K, n_in, n_out, rows, n_out};
            k_gemm_q8_0_mma_params p8 = {K_TAG_OF(gemm_q8_0_mma), n_in, n_out, rows, n_out};
            k_binding b[] = {K_BIND(gemm_kq_mma, status, status, 8),
                             q ? K_BIND(gemm_q8_0_mma, p, &p8, sizeof p8) : K_BIND(gemm_kq_mma, p, &p, sizeof p),
                             K_BIND(gemm_kq_mma, w, w, n_out * nb * (q ? 8 * 34 : 144)),
                             K_BIND(gemm_kq_mma, xq, xq, rows * nb * (q ? 8 * 34 : 292)),
                             K_BIND(gemm_kq_mma, y, y, sizeof(float) * rows * n_out)};
            const uint32_t grid[3] = {cases[k][0], cases[k][1], 1};
            emul_options opt = {0, 0};
            char err[600];
            status[0] = status[1] = 0;
            const int rc = emul_launch(q ? K_ID_gemm_q8_0_mma : K_ID_gemm_kq_mma, grid, cases[k][2], b, 5, &opt, err,
                                       sizeof err);
            check((rc == 0 && (status[0] & K_ERR_SHAPE)) || REFUSED_AT_LAUNCH(rc, cases[k][2], TG),
                  "%s grid %ux%u tg %u for n_out=%u rows=%u: refused with K_ERR_SHAPE",
                  q ? "gemm_q8_0_mma" : "gemm_kq_mma", cases[k][0], cases[k][1], cases[k][2], n_out, rows);
        }
        free(w), free(xq), free(y);
    }
}
#else
static void suite_mma(void) { check(0, "this build has no MMA kernels (K_HAS_MMA unset)"); }
#endif
