/* Fused MoE SwiGLU experts for CPU inference in fp32: one task per piece of an expert's
 * group of sorted assignments, each on one thread with single-threaded BLAS products.
 *
 * Python side: codex_lab/nn/moe_native.py (and codex_lab/nn/native_build.py builds this
 * file with the system C compiler); the readable definition is dispatch_reference in
 * codex_lab/nn/moe_dispatch.py, and the tests hold this kernel equal to it.
 *
 * For assignment a (sorted by expert; rows piece_start[p] .. piece_start[p] + piece_rows[p]
 * - 1 of piece p belong to expert piece_expert[p]):
 *     ys[a] = w[a] * (silu(x[token[a]] Wg) * (x[token[a]] Wu)) Wd
 * with gate_up[e] = [Wg | Wu] (d, 2h) and down[e] = Wd (h, d), row-major. ys (A, d) is
 * written row by row (no two tasks write one row); the caller adds ys into y by token.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

void sgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k,
            const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
            const float *beta, float *c, const int *ldc);

/* exp(x) in a vectorisable form: x clamped to [-87, 88], x = k ln2 + f with |f| <= ln2/2,
 * exp(f) by its degree-6 Taylor polynomial (relative error below 2e-7), times 2^k */
static inline float exp_clamped(float x) {
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float kf = __builtin_roundf(xc * 1.44269504088896341f);
    float f = xc - kf * 0.693359375f + kf * 2.12194440e-4f;
    float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.6666667e-1f + f * (4.1666668e-2f + f * (8.3333338e-3f + f * 1.3888889e-3f)))));
    int32_t bits = ((int32_t)kf + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

/* C (r x n, leading dim ldc) = A (r x k, leading dim lda) B (k x n, leading dim ldb) */
static void mm(const float *a, const float *b, float *c, int r, int k, int n, int lda, int ldb, int ldc) {
    const float one = 1.0f, zero = 0.0f;
    sgemm_("N", "N", &n, &r, &k, &one, b, &ldb, a, &lda, &zero, c, &ldc);
}

/* Returns 0, or 1 when a thread's buffers could not be allocated. */
int moe_swiglu(const float *x, const int64_t *token, const float *w, const float *gate_up, const float *down,
               float *ys, int64_t d, int64_t h, const int64_t *piece_expert, const int64_t *piece_start,
               const int64_t *piece_rows, int64_t n_pieces, int64_t max_rows, int threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *xb = (float *)malloc(sizeof(float) * max_rows * d);
        float *gu = (float *)malloc(sizeof(float) * max_rows * 2 * h);
        if (!xb || !gu) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < n_pieces; p++) {
            if (failed) continue;
            int64_t e = piece_expert[p], a0 = piece_start[p], r = piece_rows[p];
            /* gather the piece's tokens */
            for (int64_t i = 0; i < r; i++) memcpy(xb + i * d, x + token[a0 + i] * d, sizeof(float) * d);
            /* [g | u] = x [Wg | Wu] */
            mm(xb, gate_up + e * d * 2 * h, gu, (int)r, (int)d, (int)(2 * h), (int)d, (int)(2 * h), (int)(2 * h));
            /* hidden = silu(g) * u = g / (1 + exp(-g)) * u, into the gate half */
            for (int64_t i = 0; i < r; i++) {
                float *g = gu + i * 2 * h, *u = g + h;
                for (int64_t c = 0; c < h; c++) g[c] = g[c] / (1.0f + exp_clamped(-g[c])) * u[c];
            }
            /* ys = hidden Wd (rows 2h apart in gu), then scaled by the routing weights */
            float *yp = ys + a0 * d;
            mm(gu, down + e * h * d, yp, (int)r, (int)h, (int)d, (int)(2 * h), (int)d, (int)d);
            for (int64_t i = 0; i < r; i++) {
                float wi = w[a0 + i];
                float *yr = yp + i * d;
                for (int64_t c = 0; c < d; c++) yr[c] *= wi;
            }
        }
        free(xb); free(gu);
    }
    return failed;
}
