/* The element-wise work of an engine step, between its matrix products, over all the step's rows
 * at once: RMSNorm (with the residual add before it), RoPE and the K/V store into the paged pool,
 * SiLU(gate) * up. Built with native_gemv.c and called by reference/native_batch.py, which says
 * when and why. The products stay torch's (oneDNN); each function here replaces the handful of
 * torch operators the model runs for the same step, each a pass over the rows, with one pass.
 *
 * Rows are independent: the threads split them, when there are enough to be worth waking the
 * threads for (a decode step's 16 rows are not). */
#include <math.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("associative-math", "no-signed-zeros", "no-trapping-math")
#endif

#include "native_math.h"   /* after the pragma: its functions inline into loops compiled under it */

enum { N_HEADS, N_KV_HEADS, HEAD_DIM, N_SHAPE };

#define PARALLEL_FLOATS 65536   /* below this many floats of work, one thread does it all */

/* For each of n rows of d floats: x += add (the residual stream, in place; skipped where add is
 * NULL), then out = x * rsqrt(mean(x^2) + eps) * weight, as `RMSNorm.forward` computes it. */
void batch_rms_norm(float *x, const float *add, const float *weight, float *out, long n, long d,
                    float eps, int threads)
{
    #pragma omp parallel for num_threads(threads) if (n * d >= PARALLEL_FLOATS)
    for (long r = 0; r < n; r++) {
        float *row = x + r * d, *normed = out + r * d;
        if (add != NULL)
            for (long j = 0; j < d; j++)
                row[j] += add[r * d + j];
        float scale = 1.0f / sqrtf(dot(row, row, d) / d + eps);
        for (long j = 0; j < d; j++)
            normed[j] = row[j] * scale * weight[j];
    }
}

/* out[r][j] = silu(g) * u for g = gate_up[r][j], u = gate_up[r][d_ff + j] (n rows of [gate; up]). */
void batch_silu_mul(const float *gate_up, float *out, long n, long d_ff, int threads)
{
    #pragma omp parallel for num_threads(threads) if (n * d_ff >= PARALLEL_FLOATS)
    for (long r = 0; r < n; r++) {
        const float *gate = gate_up + 2 * r * d_ff, *up = gate + d_ff;
        for (long j = 0; j < d_ff; j++)
            out[r * d_ff + j] = silu(gate[j]) * up[j];
    }
}

/* For each of n rows of the QKV product qkv [n][n_heads + 2 n_kv][hd]: rotate its query and key
 * heads in place by the turns of its position (pairs (a, b) times (cos, sin) as (a + ib)(c + is),
 * as `rotate_complex_` does; turns [positions][hd / 2][2]), then, where slots[r] >= 0, copy its
 * key and value heads into slot slots[r] of one layer of the pool (k, v [slots][n_kv][hd]). */
void batch_rope_store(float *qkv, const long *positions, const float *turns, const long *slots,
                      float *k, float *v, long n, const long *shape, int threads)
{
    long n_heads = shape[N_HEADS], n_kv = shape[N_KV_HEADS], hd = shape[HEAD_DIM];
    long width = (n_heads + 2 * n_kv) * hd, kv = n_kv * hd;
    #pragma omp parallel for num_threads(threads) if (n * width >= PARALLEL_FLOATS)
    for (long r = 0; r < n; r++) {
        float *row = qkv + r * width;
        const float *turn = turns + positions[r] * hd;
        for (long h = 0; h < n_heads + n_kv; h++)
            for (long i = 0; i < hd / 2; i++) {
                float a = row[h * hd + 2 * i], b = row[h * hd + 2 * i + 1];
                float c = turn[2 * i], s = turn[2 * i + 1];
                row[h * hd + 2 * i] = a * c - b * s;
                row[h * hd + 2 * i + 1] = b * c + a * s;
            }
        if (slots[r] >= 0) {
            memcpy(k + slots[r] * kv, row + n_heads * hd, kv * sizeof(float));
            memcpy(v + slots[r] * kv, row + (n_heads + n_kv) * hd, kv * sizeof(float));
        }
    }
}
