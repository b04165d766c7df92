/* One decode step of the Llama model (reference/model.py) for one sequence and one new token, in
 * a single OpenMP region: the same arithmetic as `Llama.forward` on a contiguous KV cache, with
 * the hundreds of small torch operators between the matrix products (norms, RoPE, the cache writes,
 * attention, SiLU, residual adds) replaced by loops the threads run between barriers. Built with
 * native_gemv.c (`gemv_packed` streams each weight matrix, packed in panels of 8 rows) and called
 * by reference/native_step.py, which packs the weights and says when and why.
 *
 * Every thread runs the whole step. A matrix product is split by the weight's panels: thread t
 * reads the t-th of n runs of them (`gemv_packed`) and needs the rows of the input they multiply,
 * which it computes itself, whole, into buffers of its own (the RMSNorm, SwiGLU's silu(gate) * up,
 * attention's merged output: a few thousand floats, so computing all of them costs less than
 * sharing them would, a barrier); its partial product goes to a buffer of its own. After the one
 * barrier per product, each thread adds up all the partials: into the residual stream, of which
 * every thread keeps its own copy, or into the next input. Consecutive
 * products alternate between two partial buffers, so a thread that runs ahead never overwrites
 * partials another thread is still reading. Attention is split over key positions (flash
 * decoding): each thread computes a softmax over its own positions with its own running max and
 * sum, and the per-thread results are merged exactly after a barrier (the online-softmax
 * rescaling of chapters 06-07). The last thread, whose positions include the new one, writes the
 * new key and value into the cache: no thread reads a position another writes. Five barriers
 * per layer. */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("associative-math", "no-signed-zeros", "no-trapping-math")
#endif

#include "native_math.h"   /* after the pragma: its functions inline into loops compiled under it */

void gemv_packed(const float *x, const float *packed, float *partial, long n_in, long n_out);
long packed_width(long n_out);

enum { D_MODEL, N_LAYERS, N_HEADS, N_KV_HEADS, HEAD_DIM, D_FF, VOCAB, MAX_LEN, N_SHAPE };
enum { ATTN_NORM, QKV, O_PROJ, MLP_NORM, GATE_UP, DOWN, PER_LAYER };

static void barrier(void)
{
#ifdef _OPENMP
    #pragma omp barrier
#endif
}

/* This thread's number and the region's thread count (0 and 1 without OpenMP). */
static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static int thread_count(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* Floats of one thread's partial product: the widest output of any product (QKV, gate/up, head),
 * padded as the packed matrices are. */
static long widest_output(const long *shape)
{
    long qkv_out = (shape[N_HEADS] + 2 * shape[N_KV_HEADS]) * shape[HEAD_DIM];
    long widest = shape[VOCAB] > 2 * shape[D_FF] ? shape[VOCAB] : 2 * shape[D_FF];
    return packed_width(widest > qkv_out ? widest : qkv_out);
}

/* sum[j] (+)= partials[0][j] + ... + partials[n - 1][j] for j in [j0, j1); partials `ld` floats apart. */
static void add_partials(const float *partials, long ld, int n, long j0, long j1, float *sum,
                         int accumulate)
{
    if (!accumulate)
        memset(sum + j0, 0, (j1 - j0) * sizeof(float));
    for (int k = 0; k < n; k++)
        for (long j = j0; j < j1; j++)
            sum[j] += partials[k * ld + j];
}

/* out[:d] = x[:d] * rsqrt(mean(x^2) + eps) * weight[:d]. */
static void rms_norm(const float *x, const float *weight, float *out, long d, float eps)
{
    float scale = 1.0f / sqrtf(dot(x, x, d) / d + eps);
    for (long j = 0; j < d; j++)
        out[j] = x[j] * scale * weight[j];
}

/* hidden[:d_ff] = silu(gate) * up, where [gate | up] [2 d_ff] is the sum of n partials `ld` floats
 * apart; silu(g) = g / (1 + e^-g), from e^-|g| <= 1 as native_batch.c computes it. */
static void swiglu_partials(const float *partials, long ld, int n, long d_ff, float *hidden)
{
    for (long j = 0; j < d_ff; j++) {
        float gate = 0.0f, up = 0.0f;
        for (int k = 0; k < n; k++) {
            gate += partials[k * ld + j];
            up += partials[k * ld + d_ff + j];
        }
        float e = exp_nonpositive(-fabsf(gate));
        hidden[j] = gate * (gate >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e)) * up;
    }
}

/* Rotate adjacent pairs (a, b) of each of `heads` heads of x [heads, hd] by turns [hd / 2][2]
 * (cos, sin): (a + ib)(c + is), as `rotate_complex_` does. */
static void rotate(float *x, long heads, long hd, const float *turns)
{
    for (long h = 0; h < heads; h++)
        for (long i = 0; i < hd / 2; i++) {
            float a = x[h * hd + 2 * i], b = x[h * hd + 2 * i + 1];
            float c = turns[2 * i], s = turns[2 * i + 1];
            x[h * hd + 2 * i] = a * c - b * s;
            x[h * hd + 2 * i + 1] = b * c + a * s;
        }
}

/* This thread's part of attention: query heads q [n_heads, hd] over key positions [s0, s1) of
 * one layer's k, v [n_kv_heads, max_len, hd] (head h reads K/V head h / group). Per head: the
 * largest score top[h], sum[h] = sum of exp(score - top[h]) and out[h] = the same weights times V,
 * unnormalised (top = -inf, sum = 0, out = 0 over no positions). scores: [n_heads, max_len]. */
static void attend_positions(const long *shape, const float *q, const float *k, const float *v,
                             long s0, long s1, float *scores, float *top, float *sum, float *out)
{
    long hd = shape[HEAD_DIM], max_len = shape[MAX_LEN], n_heads = shape[N_HEADS];
    long group = n_heads / shape[N_KV_HEADS];
    float scale = 1.0f / sqrtf((float)hd);
    memset(out, 0, n_heads * hd * sizeof(float));
    for (long h = 0; h < n_heads; h++) {
        const float *qh = q + h * hd, *kh = k + (h / group) * max_len * hd;
        const float *vh = v + (h / group) * max_len * hd;
        float *row = scores + h * max_len, best = -INFINITY, total = 0.0f;
        for (long s = s0; s < s1; s++) {
            row[s] = dot(qh, kh + s * hd, hd) * scale;
            best = row[s] > best ? row[s] : best;
        }
        for (long s = s0; s < s1; s++) {
            float p = exp_nonpositive(row[s] - best);
            total += p;
            for (long j = 0; j < hd; j++)
                out[h * hd + j] += p * vh[s * hd + j];
        }
        top[h] = best;
        sum[h] = total;
    }
}

/* att [n_heads * hd], attention's output merged from the n threads' parts (top, sum
 * [n][n_heads], out [n][n_heads * hd]): each part rescaled to the head's overall max. */
static void merge_attention(long n_heads, long hd, int n, const float *top, const float *sum,
                            const float *out, float *att)
{
    for (long h = 0; h < n_heads; h++) {
        float best = -INFINITY, weight = 0.0f, scale[n];
        for (int k = 0; k < n; k++)
            best = top[k * n_heads + h] > best ? top[k * n_heads + h] : best;
        for (int k = 0; k < n; k++) {
            scale[k] = sum[k * n_heads + h] > 0.0f ? exp_nonpositive(top[k * n_heads + h] - best)
                                                   : 0.0f;
            weight += scale[k] * sum[k * n_heads + h];
        }
        for (long j = h * hd; j < (h + 1) * hd; j++) {
            float value = 0.0f;
            for (int k = 0; k < n; k++)
                value += scale[k] * out[(long)k * n_heads * hd + j];
            att[j] = value / weight;
        }
    }
}

/* Floats of `work` that decode_step (and stream_step) need for these sizes and threads. */
long step_work_floats(const long *shape, int threads)
{
    long d = shape[D_MODEL], hd = shape[HEAD_DIM], n_heads = shape[N_HEADS];
    long qkv_out = (n_heads + 2 * shape[N_KV_HEADS]) * hd;
    long inputs = d > n_heads * hd ? d : n_heads * hd;
    return n_heads * shape[MAX_LEN]
           + threads * (d + qkv_out + inputs + shape[D_FF] + 2 * widest_output(shape) + n_heads * hd
                        + 2 * n_heads);
}

/* logits[:vocab] for `token` at position `pos`, writing its keys and values at `pos` of every
 * layer of k_cache, v_cache [n_layers, n_kv_heads, max_len, hd] (positions < pos already hold
 * the prefix). shape: the N_SHAPE sizes above. embed: [d_model, vocab], the embedding stored
 * input-major (its column `token` is the token's vector); head: the same matrix packed (the tied
 * LM head). layers: PER_LAYER pointers per layer, the norms' weights [d] and the products' packed
 * weights (native_gemv.c) of [in, out] = QKV [d, (n_heads + 2 n_kv) hd], O [n_heads hd, d],
 * gate/up [d, 2 d_ff], down [d_ff, d]. turns: [hd / 2][2] (cos, sin) for `pos`. work:
 * `step_work_floats(shape, threads)` floats. */
void decode_step(const long *shape, long token, long pos, const float *embed, const float *head,
                 const float *const *layers, const float *final_norm, const float *turns,
                 float *k_cache, float *v_cache, float eps, float *work, float *logits,
                 int threads)
{
    long d = shape[D_MODEL], hd = shape[HEAD_DIM], n_heads = shape[N_HEADS];
    long n_kv = shape[N_KV_HEADS], d_ff = shape[D_FF], vocab = shape[VOCAB];
    long max_len = shape[MAX_LEN], qkv_out = (n_heads + 2 * n_kv) * hd, layer_size = n_kv * max_len * hd;
    long widest = widest_output(shape), inputs = d > n_heads * hd ? d : n_heads * hd;
    /* Shared, each thread writing only its own positions: */
    float *scores = work;
    /* One per thread: */
    float *streams = scores + n_heads * max_len, *qkvs = streams + threads * d;
    float *ins = qkvs + threads * qkv_out, *hiddens = ins + threads * inputs;
    float *partials = hiddens + threads * d_ff;            /* [2][threads][widest] */
    float *att_out = partials + 2 * threads * widest;       /* [threads][n_heads * hd] */
    float *att_top = att_out + threads * n_heads * hd, *att_sum = att_top + threads * n_heads;

    #pragma omp parallel num_threads(threads)
    {
        int t = thread_id(), n = thread_count();
        float *x = streams + t * d, *qkv = qkvs + t * qkv_out, *in = ins + t * inputs;
        float *hidden = hiddens + t * d_ff;
        float *even = partials, *odd = partials + n * widest;   /* alternate between products */
        long s0 = (pos + 1) * t / n, s1 = (pos + 1) * (t + 1) / n;
        for (long j = 0; j < d; j++)
            x[j] = embed[j * vocab + token];
        for (long layer = 0; layer < shape[N_LAYERS]; layer++) {
            const float *const *w = layers + layer * PER_LAYER;
            float *k = k_cache + layer * layer_size, *v = v_cache + layer * layer_size;

            rms_norm(x, w[ATTN_NORM], in, d, eps);
            gemv_packed(in, w[QKV], even + t * widest, d, qkv_out);
            barrier();
            add_partials(even, widest, n, 0, qkv_out, qkv, 0);
            rotate(qkv, n_heads + n_kv, hd, turns);
            if (t == n - 1)
                for (long g = 0; g < n_kv; g++) {
                    memcpy(k + (g * max_len + pos) * hd, qkv + (n_heads + g) * hd, hd * sizeof(float));
                    memcpy(v + (g * max_len + pos) * hd, qkv + (n_heads + n_kv + g) * hd, hd * sizeof(float));
                }
            attend_positions(shape, qkv, k, v, s0, s1, scores, att_top + t * n_heads,
                             att_sum + t * n_heads, att_out + t * n_heads * hd);
            barrier();
            merge_attention(n_heads, hd, n, att_top, att_sum, att_out, in);
            gemv_packed(in, w[O_PROJ], odd + t * widest, n_heads * hd, d);
            barrier();
            add_partials(odd, widest, n, 0, d, x, 1);

            rms_norm(x, w[MLP_NORM], in, d, eps);
            gemv_packed(in, w[GATE_UP], even + t * widest, d, 2 * d_ff);
            barrier();
            swiglu_partials(even, widest, n, d_ff, hidden);
            gemv_packed(hidden, w[DOWN], odd + t * widest, d_ff, d);
            barrier();
            add_partials(odd, widest, n, 0, d, x, 1);
        }
        rms_norm(x, final_norm, in, d, eps);
        gemv_packed(in, head, even + t * widest, d, vocab);
        barrier();
        long per = ((vocab + n - 1) / n + 15) / 16 * 16;      /* 64-byte aligned column ranges */
        long c0 = t * per < vocab ? t * per : vocab, c1 = c0 + per < vocab ? c0 + per : vocab;
        add_partials(even, widest, n, c0, c1, logits, 0);
    }
}

/* The floor of `decode_step`: the same reads of every weight matrix and of the cached K/V at
 * positions [0, pos], split over the threads in the same region with the same barriers, and
 * nothing else (no norms, RoPE, softmax merge, SiLU, residual sums: inputs are zeros, outputs
 * dropped). `Llama.forward`'s step can be no faster on the same machine; the difference is what
 * the step spends besides reading. Arguments as for decode_step. */
void stream_step(const long *shape, long pos, const float *head, const float *const *layers,
                 const float *k_cache, const float *v_cache, float *work, int threads)
{
    long d = shape[D_MODEL], hd = shape[HEAD_DIM], n_heads = shape[N_HEADS];
    long n_kv = shape[N_KV_HEADS], d_ff = shape[D_FF], vocab = shape[VOCAB];
    long max_len = shape[MAX_LEN], qkv_out = (n_heads + 2 * n_kv) * hd, layer_size = n_kv * max_len * hd;
    long widest = widest_output(shape);
    float *inputs = work, *scores = inputs + d_ff + d;
    float *partials = scores + n_heads * max_len, *att_out = partials + threads * widest;
    float *att_top = att_out + threads * n_heads * hd, *att_sum = att_top + threads * n_heads;
    memset(inputs, 0, (d_ff + d) * sizeof(float));

    #pragma omp parallel num_threads(threads)
    {
        int t = thread_id(), n = thread_count();
        float *mine = partials + t * widest;
        long s0 = (pos + 1) * t / n, s1 = (pos + 1) * (t + 1) / n;
        for (long layer = 0; layer < shape[N_LAYERS]; layer++) {
            const float *const *w = layers + layer * PER_LAYER;
            gemv_packed(inputs, w[QKV], mine, d, qkv_out);
            barrier();
            attend_positions(shape, inputs, k_cache + layer * layer_size, v_cache + layer * layer_size,
                             s0, s1, scores, att_top + t * n_heads, att_sum + t * n_heads,
                             att_out + t * n_heads * hd);
            barrier();
            gemv_packed(inputs, w[O_PROJ], mine, n_heads * hd, d);
            barrier();
            gemv_packed(inputs, w[GATE_UP], mine, d, 2 * d_ff);
            barrier();
            gemv_packed(inputs, w[DOWN], mine, d_ff, d);
            barrier();
        }
        gemv_packed(inputs, head, mine, d, vocab);
    }
}
