/*
 * test_gpu_q4_64a.h — suite q4_64a: the Q4_64A matvec (gpu/kernels/
 * quant_q4_64a.h), included by test_gpu_emul.c (its check/launch helpers,
 * its rng and the scalar kernel set).
 *
 * References: the C core's own scalar kernels (csrc/quants/scalar.c):
 * dot_q4_64a_q8_0 (vec_dot[Q4_64A]) and deq_q4_64a (to_float[Q4_64A]), and
 * the exact value in double from a decoder written here from the format
 * (ds4-notes §2: code j in byte j/2, even j in the low nibble). Checks:
 *   - every value within the reordering bound of the CPU's dot and within
 *     the GPU's own bound of the exact value (docs/gpu.md §4 "Q4_64A
 *     matvec"), on odd shapes: 1, 3, 17, 37 blocks per row (phase and step
 *     tails), 1/5/17 output rows (a SIMD-group's second row missing), and
 *     extreme blocks: zero scale, all codes 15, large negative bias, a
 *     negative scale, all-zero blocks; activations from the CPU's Q8_0
 *     quantizer, raw int8 codes including -128, an all-zero block (d = 0);
 *   - widths 2..16 (all three variants) bit-identical per row to width 1,
 *     threadgroups of 1..4 SIMD-groups, both schedules;
 *   - one-hot activations pick the CPU's dequantized weight bit for bit
 *     (every one of the 64 positions: the nibble order itself);
 *   - the prefill GEMM (gemm_q4_64a) bit-identical to the width-1 matvec
 *     for every value, on tile, round and weight-row tails (q4a_gemm);
 *   - shape refusals (a grid one threadgroup short, n_in not a multiple of
 *     64, a width too large for its variant) raise K_ERR_SHAPE.
 * The planted fault PLANT_Q4_64A_NIBBLE_SWAP (odd and even codes read from
 * each other's nibble) must turn the suite red (tests/test_gpu_emul.py).
 */

/* Weight rows of nb Q4_64A blocks: random codes and bf16 (truncated, as
 * ds4's quantizer stores them) scale and bias, with extreme blocks mixed
 * in by position. */
static void q4a_fill_weights(uint8_t *w, uint32_t n_out, uint32_t nb) {
    for (uint32_t o = 0; o < n_out; o++)
        for (uint32_t ib = 0; ib < nb; ib++) {
            uint8_t *b = w + (o * nb + ib) * 36;
            for (int j = 0; j < 32; j++) b[j] = (uint8_t)rnd();
            float sc = frand(0.001f, 0.05f), bi = -frand(0.0f, 0.4f);
            switch ((o * 7 + ib * 3) % 9) {
            case 4: sc = 0.0f; break;                            /* zero scale: all weights = bias */
            case 5: memset(b, 0xFF, 32); break;                  /* max nibbles: every code 15 */
            case 6: bi = -frand(1.0f, 4.0f), sc = 0.4f; break;   /* large negative bias */
            case 7: sc = -frand(0.001f, 0.05f); break;           /* the format allows a negative scale */
            case 8: memset(b, 0, 32), bi = 0.0f; break;          /* all-zero block */
            default: break;
            }
            const uint16_t s16 = ds4_f32_to_bf16_trunc(sc), b16 = ds4_f32_to_bf16_trunc(bi);
            memcpy(b + 32, &s16, 2);
            memcpy(b + 34, &b16, 2);
        }
}

/* R activation rows of n_in values as Q8_0: most from the CPU's quantizer;
 * row 1 raw codes (every int8 value possible, -128 included) with a
 * random fp16 d; row 2's block 1 (or 0) all zero (d = 0). */
static void q4a_fill_acts(uint8_t *xq, uint32_t R, uint32_t n_in) {
    const uint32_t nbx = n_in / 32;
    float *xf = malloc(sizeof(float) * n_in);
    for (uint32_t r = 0; r < R; r++) {
        for (uint32_t i = 0; i < n_in; i++) xf[i] = frand(-4, 4);
        if (r == 2)
            for (uint32_t i = 0; i < 32; i++) xf[(nbx > 1 ? 32 : 0) + i] = 0.0f;
        scalar.from_float[DS4_TYPE_Q8_0](xf, xq + (size_t)r * nbx * 34, n_in);
        if (r == 1)
            for (uint32_t ib = 0; ib < nbx; ib++) {
                uint8_t *a = xq + (size_t)(r * nbx + ib) * 34;
                const uint16_t d = ds4_f32_to_fp16(frand(0.001f, 0.05f));
                memcpy(a, &d, 2);
                for (int j = 0; j < 32; j++) a[2 + j] = (uint8_t)rnd();
            }
    }
    free(xf);
}

/* The exact dot of one weight row and one activation row in double (each
 * product exact: 8 + 4 + 11 + 8 mantissa bits), and S = the sum over
 * blocks and 8-code lanes t of |scale d sqa_t| + |bias d sa_t|, the terms
 * both bounds are stated over (docs/gpu.md §4). Codes decoded here from the
 * format, not by the CPU's helper. */
static double q4a_exact(const uint8_t *w, const uint8_t *x, uint32_t nb, double *S) {
    double v = 0, s = 0;
    for (uint32_t ib = 0; ib < nb; ib++) {
        const uint8_t *b = w + ib * 36;
        uint16_t s16, b16;
        memcpy(&s16, b + 32, 2);
        memcpy(&b16, b + 34, 2);
        const double sc = ds4_bf16_to_f32(s16), bi = ds4_bf16_to_f32(b16);
        for (uint32_t t = 0; t < 8; t++) {
            const uint8_t *a = x + (2 * ib + t / 4) * 34;
            uint16_t d16;
            memcpy(&d16, a, 2);
            const double d = ds4_fp16_to_f32(d16);
            long sqa = 0, sa = 0;
            for (uint32_t k = 0; k < 8; k++) {
                const uint32_t j = 8 * t + k; /* code j of the block */
                const int code = (b[j / 2] >> (j % 2 ? 4 : 0)) & 0xF;
                const int q = (int8_t)a[2 + j % 32];
                sqa += code * q, sa += q;
            }
            v += sc * d * (double)sqa + bi * d * (double)sa;
            s += fabs(sc * d * (double)sqa) + fabs(bi * d * (double)sa);
        }
    }
    *S = s;
    return v;
}

static int q4a_launch(const uint8_t *w, const uint8_t *xq, float *y, uint32_t n_in, uint32_t n_out, uint32_t width,
                      uint32_t y_stride, uint32_t nsg, int schedule) {
    const uint32_t id = (uint32_t)K_MATVEC_Q4_64A_KERNEL(width);
    k_matvec_q4_64a_params p = {K_TAG(id), n_in, n_out, width, y_stride};
    k_binding b[] = {K_BIND(matvec_q4_64a, status, status, 8), K_BIND(matvec_q4_64a, p, &p, sizeof p),
                     K_BIND(matvec_q4_64a, w, w, n_out * (n_in / 64) * 36),
                     K_BIND(matvec_q4_64a, xq, xq, width * (n_in / 32) * 34),
                     K_BIND(matvec_q4_64a, y, y, sizeof(float) * ((width - 1) * y_stride + n_out))};
    return launch((int)id, K_MATVEC_Q4_64A_GROUPS(width, n_out, nsg), 1, 1, 32 * nsg, b, 5, schedule,
                  "matvec_q4_64a");
}

/* One-hot activations: row r has the single code 1 (d = 1.0) at position
 * k = 16 q + r of its row, so y[r][o] = code_k * scale + bias of row o,
 * the very operations of the CPU's deq_q4_64a: bit for bit. */
static void q4a_one_hot(void) {
    const uint32_t n_in = 64, n_out = 9, nb = 1, W = 16;
    uint8_t *w = malloc(n_out * 36), *xq = calloc(W * 2, 34);
    float *y = malloc(sizeof(float) * W * n_out), *deq = malloc(sizeof(float) * n_out * n_in);
    q4a_fill_weights(w, n_out, nb);
    for (uint32_t o = 0; o < n_out; o++) scalar.to_float[DS4_TYPE_Q4_64A](w + o * 36, deq + o * n_in, n_in);
    int ok = 1;
    for (uint32_t q = 0; q < 4 && ok; q++) {
        memset(xq, 0, W * 2 * 34);
        for (uint32_t r = 0; r < W; r++) {
            const uint32_t k = 16 * q + r;
            uint8_t *a = xq + (r * 2 + k / 32) * 34;
            const uint16_t one = ds4_f32_to_fp16(1.0f);
            memcpy(a, &one, 2);
            a[2 + k % 32] = 1; /* the row's other block stays all zero (d = 0) */
        }
        fill_nan(y, W * n_out);
        if (q4a_launch(w, xq, y, n_in, n_out, W, n_out, 2, (int)(q & 1))) return;
        for (uint32_t r = 0; r < W; r++)
            for (uint32_t o = 0; o < n_out; o++) {
                const float want = deq[o * n_in + 16 * q + r];
                if (memcmp(&y[r * n_out + o], &want, 4)) {
                    fprintf(stderr, "  one-hot position %u row %u: gpu %.9g, deq_q4_64a %.9g\n", 16 * q + r, o,
                            y[r * n_out + o], want);
                    ok = 0;
                }
            }
    }
    check(ok, "one-hot activations at all 64 positions pick the CPU's dequantized weight (deq_q4_64a) bit "
          "for bit");
    free(w), free(xq), free(y), free(deq);
}

/* The prefill GEMM (gemm_q4_64a) against the width-1 matvec, every value
 * bit for bit: rows past a tile (K_GEMM_TR 16: 17 and 35 rows), weight rows
 * past a SIMD-group's K_GEMM_TOS and a threadgroup's (n_out 5 and 23),
 * blocks past a 4-block round (1, 3, 17, 37 per row), the extreme weight
 * blocks and activation rows of q4a_fill_*, a y row gap; then a grid one
 * threadgroup short in x must raise K_ERR_SHAPE. */
static void q4a_gemm(void) {
    static const uint32_t shapes[][3] = {{1, 5, 17}, {3, 23, 35}, {17, 5, 35}, {37, 23, 17}}; /* nb, n_out, rows */
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const uint32_t nb = shapes[c][0], n_out = shapes[c][1], R = shapes[c][2], n_in = 64 * nb, nbx = 2 * nb;
        const uint32_t ys = n_out + (uint32_t)(c & 1) * 3;
        uint8_t *w = malloc(n_out * nb * 36), *xq = malloc(R * nbx * 34);
        float *yg = malloc(sizeof(float) * R * ys), *y1 = malloc(sizeof(float) * n_out);
        q4a_fill_weights(w, n_out, nb);
        q4a_fill_acts(xq, R, n_in);
        fill_nan(yg, R * ys);
        k_gemm_q4_64a_params p = {K_TAG_OF(gemm_q4_64a), n_in, n_out, R, ys};
        k_binding b[] = {K_BIND(gemm_q4_64a, status, status, 8), K_BIND(gemm_q4_64a, p, &p, sizeof p),
                         K_BIND(gemm_q4_64a, w, w, n_out * nb * 36), K_BIND(gemm_q4_64a, xq, xq, R * nbx * 34),
                         K_BIND(gemm_q4_64a, y, yg, sizeof(float) * ((R - 1) * ys + n_out))};
        int ok = !launch(K_ID_gemm_q4_64a, K_GEMM_GROUPS_X(R), K_GEMM_GROUPS_Y(n_out), 1, K_GEMM_TG, b, 5, (int)(c & 1),
                         "gemm_q4_64a");
        for (uint32_t r = 0; r < R && ok; r++) {
            fill_nan(y1, n_out);
            ok &= !q4a_launch(w, xq + r * nbx * 34, y1, n_in, n_out, 1, n_out, 2, 0);
            ok &= !memcmp(y1, yg + r * ys, sizeof(float) * n_out);
            for (uint32_t o = n_out; o < ys; o++) ok &= isnan(yg[r * ys + o]); /* the row gap untouched */
        }
        check(ok, "gemm n_in=%u n_out=%u rows=%u y_stride=%u: every value bit-identical to the width-1 matvec",
              n_in, n_out, R, ys);
        free(w), free(xq), free(yg), free(y1);
    }
    {
        const uint32_t n_in = 128, n_out = 5, R = 20;
        uint8_t *w = calloc(n_out * 2, 36), *xq = calloc(R * 4, 34);
        float *y = calloc(R * n_out, sizeof(float));
        k_gemm_q4_64a_params p = {K_TAG_OF(gemm_q4_64a), n_in, n_out, R, n_out};
        k_binding b[] = {K_BIND(gemm_q4_64a, status, status, 8), K_BIND(gemm_q4_64a, p, &p, sizeof p),
                         K_BIND(gemm_q4_64a, w, w, n_out * 2 * 36), K_BIND(gemm_q4_64a, xq, xq, R * 4 * 34),
                         K_BIND(gemm_q4_64a, y, y, sizeof(float) * R * n_out)};
        const uint32_t grid[3] = {K_GEMM_GROUPS_X(R) - 1, K_GEMM_GROUPS_Y(n_out), 1};
        emul_options opt = {0, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(K_ID_gemm_q4_64a, grid, K_GEMM_TG, b, 5, &opt, err, sizeof err);
        check(rc == 0 && (status[0] & K_ERR_SHAPE), "gemm: a grid one threadgroup short of %u rows raises K_ERR_SHAPE",
              R);
        free(w), free(xq), free(y);
    }
}

/* A launch the kernel must refuse with K_ERR_SHAPE (the host check passes). */
static void q4a_refused(uint32_t n_in, uint32_t n_out, uint32_t width, uint32_t id, uint32_t groups, const char *what) {
    const uint32_t nbx = (n_in + 31) / 32, nbw = (n_in + 63) / 64;
    uint8_t *w = calloc(n_out * nbw + 1, 36), *xq = calloc(width * nbx + 1, 34);
    float *y = calloc(width * n_out, sizeof(float));
    k_matvec_q4_64a_params p = {K_TAG(id), n_in, n_out, width, n_out};
    k_binding b[] = {K_BIND(matvec_q4_64a, status, status, 8), K_BIND(matvec_q4_64a, p, &p, sizeof p),
                     K_BIND(matvec_q4_64a, w, w, (n_out * nbw + 1) * 36),
                     K_BIND(matvec_q4_64a, xq, xq, (width * nbx + 1) * 34),
                     K_BIND(matvec_q4_64a, y, y, sizeof(float) * width * n_out)};
    const uint32_t grid[3] = {groups, 1, 1};
    emul_options opt = {0, 0};
    char err[600];
    status[0] = status[1] = 0;
    const int rc = emul_launch((int)id, grid, 64, b, 5, &opt, err, sizeof err);
    check(rc == 0 && (status[0] & K_ERR_SHAPE), "%s: refused with K_ERR_SHAPE", what);
    free(w), free(xq), free(y);
}

static void suite_q4_64a(void) {
    const uint32_t nbs[] = {1, 3, 17, 37}; /* blocks per row: phase and step tails */
    const uint32_t n_outs[] = {1, 5, 17};
    const uint32_t R = K_MATVEC_MAX_ROWS;
    for (size_t ii = 0; ii < sizeof nbs / 4; ii++)
        for (size_t io = 0; io < sizeof n_outs / 4; io++) {
            const uint32_t nb = nbs[ii], n_in = 64 * nb, n_out = n_outs[io], nbx = 2 * nb;
            uint8_t *w = malloc(n_out * nb * 36), *xq = malloc(R * nbx * 34);
            q4a_fill_weights(w, n_out, nb);
            q4a_fill_acts(xq, R, n_in);
            float *y1 = malloc(sizeof(float) * R * n_out), *yw = malloc(sizeof(float) * R * n_out);
            int ok = 1, inv = 1;
            double worst_cpu = 0, worst_exact = 0;
            /* width 1 for each activation row, then the verify widths: all
             * on the short rows, 2/4/5/16 (every variant) on the rest */
            for (uint32_t width = 1; width <= R; width++) {
                if (ii + io > 1 && width != 1 && width != 2 && width != 4 && width != 5 && width != 16) continue;
                const uint32_t reps = width == 1 ? R : 1;
                for (uint32_t rep = 0; rep < reps; rep++) {
                    float *y = width == 1 ? y1 + rep * n_out : yw;
                    const uint8_t *xa = width == 1 ? xq + rep * nbx * 34 : xq;
                    fill_nan(y, width == 1 ? n_out : R * n_out);
                    /* threadgroups of 1..4 SIMD-groups: a row's bits must not depend on it */
                    const uint32_t nsg = 1 + (width + rep) % 4;
                    if (q4a_launch(w, xa, y, n_in, n_out, width, n_out, nsg, (int)((width + rep) & 1))) goto next;
                }
                if (width == 1) {
                    /* Tolerance (docs/gpu.md §4 "Q4_64A matvec"): the CPU's
                     * scalar dot is within (2nb + 2)u S of the exact value
                     * (3 roundings per half's term, 2nb - 1 serial adds), the
                     * GPU within (ceil(nb/4) + 8)u S (3 per lane term, at
                     * most ceil(nb/4) accumulations per lane, 5 butterfly
                     * levels); second-order terms are below the 1e-4 slack. */
                    const double k_gpu = (nb + 3) / 4 + 8, k_cpu = 2.0 * nb + 2;
                    for (uint32_t r = 0; r < R; r++)
                        for (uint32_t o = 0; o < n_out; o++) {
                            float ref;
                            double S;
                            scalar.vec_dot[DS4_TYPE_Q4_64A](n_in, &ref, w + o * nb * 36, xq + r * nbx * 34);
                            const double exact = q4a_exact(w + o * nb * 36, xq + r * nbx * 34, nb, &S);
                            const double got = y1[r * n_out + o];
                            const double tol_cpu = (k_gpu + k_cpu) * U * S * 1.0001 + 1e-37;
                            const double tol_exact = k_gpu * U * S * 1.0001 + 1e-37;
                            const double e_cpu = fabs(got - ref), e_exact = fabs(got - exact);
                            if (!(e_cpu <= tol_cpu) || !(e_exact <= tol_exact)) {
                                if (ok)
                                    fprintf(stderr, "  row %u out %u: gpu %.9g cpu %.9g exact %.9g (S %.3g)\n", r, o,
                                            got, ref, exact, S);
                                ok = 0;
                            }
                            if (e_cpu / tol_cpu > worst_cpu) worst_cpu = e_cpu / tol_cpu;
                            if (e_exact / tol_exact > worst_exact) worst_exact = e_exact / tol_exact;
                        }
                } else if (memcmp(yw, y1, sizeof(float) * width * n_out)) {
                    inv = 0;
                }
            }
            check(ok && inv, "n_in=%u n_out=%u: within the bound of the CPU's dot (worst %.3f of it) and of the "
                  "exact value (worst %.3f); widths 2..16 bit-identical to width 1 per row", n_in, n_out, worst_cpu,
                  worst_exact);
        next:
            free(w), free(xq), free(y1), free(yw);
        }
    /* a row gap in y (y_stride > n_out) stays unwritten */
    {
        const uint32_t n_in = 192, n_out = 5, nb = 3, W = 7, ys = n_out + 3;
        uint8_t *w = malloc(n_out * nb * 36), *xq = malloc(W * 2 * nb * 34);
        q4a_fill_weights(w, n_out, nb);
        q4a_fill_acts(xq, W, n_in);
        float *y = malloc(sizeof(float) * W * ys);
        fill_nan(y, W * ys);
        int ok = !q4a_launch(w, xq, y, n_in, n_out, W, ys, 3, 0);
        for (uint32_t r = 0; r < W && ok; r++)
            for (uint32_t o = 0; o < ys; o++) ok &= (o < n_out) == !isnan(y[r * ys + o]);
        check(ok, "width %u with y_stride %u: every output written, the row gaps untouched", W, ys);
        free(w), free(xq), free(y);
    }
    q4a_one_hot();
    q4a_gemm();
    q4a_refused(128, 9, 1, K_ID_matvec_q4_64a1, K_MATVEC_Q4_64A_GROUPS(1, 9, 2) - 1,
                "a grid one threadgroup short of n_out=9");
    q4a_refused(96, 3, 1, K_ID_matvec_q4_64a1, 2, "n_in=96 (not a multiple of 64)");
    q4a_refused(64, 3, 2, K_ID_matvec_q4_64a1, 2, "width 2 on the width-1 variant");
    q4a_refused(64, 3, 5, K_ID_matvec_q4_64a4, 2, "width 5 on the width-4 variant");
}
