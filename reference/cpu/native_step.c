/* One decode step of the Llama model (reference/model.py) for one sequence and one new token, in
 * a single OpenMP region: the same arithmetic as `Llama.forward` on a contiguous KV cache, with
 * the hundreds of small torch operators between the matrix products (norms, RoPE, the cache writes,
 * attention, SiLU, residual adds) replaced by loops the threads run between barriers. Built with
 * native_gemv.c (the packed GEMVs) and called by reference/native_step.py, which packs the weights
 * and says when and why.
 *
 * Every thread runs the whole step, and each product is split so that a thread streams one
 * contiguous run of its weight:
 *  - QKV, gate/up and the LM head by columns (`gemv_strips`): thread t computes whole outputs, the
 *    t-th run of the matrix's strips of 32 columns. Its QKV columns it rotates (RoPE) and writes
 *    to the cache itself; gate/up is packed so that a strip holds 16 gate columns and the 16 up
 *    columns they pair with, so the thread computes silu(gate) * up for 16 hidden units a strip
 *    with nothing from another thread.
 *  - the output and down projections by input rows (`gemv_panels`): a thread needs only the rows
 *    of the input its panels multiply and writes a partial product; after a barrier every thread
 *    adds all partials into the residual stream, of which it keeps its own copy. The down
 *    projection's rows are the hidden units the thread computed itself, so gate/up and down run
 *    back to back, with no barrier between them.
 * Attention is split over key positions (flash decoding): each thread computes a softmax over its
 * own positions with its own running max and sum, and the per-thread results are merged exactly
 * after a barrier (the online-softmax rescaling of chapters 06-07). Four barriers per layer: after
 * QKV, after attention, after the output projection, after down. Inputs that every thread needs
 * whole (the RMSNorms, the merged attention output: a few thousand floats) each thread computes
 * itself: that costs less than sharing them would, a barrier. */
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
void gemv_panels(const float *x, const float *packed, float *partial, long n_in, long n_out,
                 long p0, long p1);
void gemv_strips(const float *x, const float *strips, float *y, long n_in, long n_out, long first,
                 long last);
long packed_width(long n_out);

#define STRIP_COLS 32   /* columns of a strip (native_gemv.c) */

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

/* hidden[16 g + k] = silu(gate) * up for the strips g in [first, last) of gate/up, whose products
 * gate_up holds: [gate | up] for hidden units 16 g ... 16 g + 15 at gate_up[32 g ...]. */
static void swiglu_strips(const float *gate_up, long first, long last, float *hidden)
{
    for (long g = first; g < last; g++)
        for (int k = 0; k < STRIP_COLS / 2; k++)
            hidden[g * STRIP_COLS / 2 + k] = silu(gate_up[g * STRIP_COLS + k])
                                             * gate_up[g * STRIP_COLS + STRIP_COLS / 2 + k];
}

/* Rotate the adjacent pairs (a, b) among the columns [c0, c1) (c0 even) of x, whose first
 * `rotated` columns are heads of hd, by turns [hd / 2][2] (cos, sin): (a + ib)(c + is), as
 * `rotate_complex_` does; the columns from `rotated` on are left. */
static void rotate_columns(float *x, long c0, long c1, long rotated, long hd, const float *turns)
{
    for (long c = c0; c + 1 < c1 && c < rotated; c += 2) {
        float a = x[c], b = x[c + 1], cosine = turns[c % hd], sine = turns[c % hd + 1];
        x[c] = a * cosine - b * sine;
        x[c + 1] = b * cosine + a * sine;
    }
}

/* Ask for the keys and values at positions [s0, s1) of every KV head of one layer's k, v
 * [n_kv, max_len, hd]. They come from memory (a step streams 0.5 GB of weights through the
 * caches); read as attention reads them, a run of one head at a time, most of their misses come
 * one after another. Asked for all at once, the misses overlap: at the start of attention (a
 * step 0.8% faster, paired C calls on a quiet host), and for the next layer before the down
 * projection streams (another 0.4%). */
static void prefetch_positions(const float *k, const float *v, long n_kv, long max_len, long hd,
                               long s0, long s1)
{
    for (long g = 0; g < n_kv; g++)
        for (long s = s0; s < s1; s++)
            for (long j = 0; j < hd; j += 16) {   /* 16 floats: a 64-byte line */
                __builtin_prefetch(k + (g * max_len + s) * hd + j);
                __builtin_prefetch(v + (g * max_len + s) * hd + j);
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
    prefetch_positions(k, v, shape[N_KV_HEADS], max_len, hd, s0, s1);
    for (long h = 0; h < n_heads; h++) {
        const float *qh = q + h * hd, *kh = k + (h / group) * max_len * hd;
        const float *vh = v + (h / group) * max_len * hd;
        float *row = scores + h * max_len, best = -INFINITY, total = 0.0f;
        for (long s = s0; s < s1; s++) {
            row[s] = dot(qh, kh + s * hd, hd) * scale;
            best = row[s] > best ? row[s] : best;
        }
        for (long s = s0; s < s1; s++) {   /* apart from the sums below, so that it is vectorised */
            row[s] = exp_nonpositive(row[s] - best);
            total += row[s];
        }
        for (long s = s0; s < s1; s++)
            for (long j = 0; j < hd; j++)
                out[h * hd + j] += row[s] * vh[s * hd + j];
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

/* Strips of each product split by columns: QKV and the head 32 columns a strip, gate/up 16 hidden
 * units (their gate and up columns). */
static long strips(long columns, long per_strip)
{
    return (columns + per_strip - 1) / per_strip;
}

/* What thread t of n reads of a step at position pos, the same in decode_step and stream_step:
 * its runs of the QKV, gate/up and head strips, of the down projection's panels (the rows of its
 * own hidden units) and of the key positions [0, pos]. */
typedef struct {
    long qkv0, qkv1, gate_up0, gate_up1, head0, head1, down0, down1, s0, s1;
} ThreadShare;

static ThreadShare thread_share(const long *shape, long pos, int t, int n)
{
    long qkv_out = (shape[N_HEADS] + 2 * shape[N_KV_HEADS]) * shape[HEAD_DIM];
    long gate_up = strips(shape[D_FF], STRIP_COLS / 2), down_panels = (shape[D_FF] + 7) / 8;
    ThreadShare at;
    at.qkv0 = strips(qkv_out, STRIP_COLS) * t / n;
    at.qkv1 = strips(qkv_out, STRIP_COLS) * (t + 1) / n;
    at.gate_up0 = gate_up * t / n;
    at.gate_up1 = gate_up * (t + 1) / n;
    at.head0 = strips(shape[VOCAB], STRIP_COLS) * t / n;
    at.head1 = strips(shape[VOCAB], STRIP_COLS) * (t + 1) / n;
    at.down0 = 2 * at.gate_up0 < down_panels ? 2 * at.gate_up0 : down_panels;   /* 8 rows a panel */
    at.down1 = 2 * at.gate_up1 < down_panels ? 2 * at.gate_up1 : down_panels;
    at.s0 = (pos + 1) * t / n;
    at.s1 = (pos + 1) * (t + 1) / n;
    return at;
}

/* The work buffer of decode_step and stream_step, in floats from its start: shared buffers, each
 * thread writing only its own part of them, then buffers of which each thread has its own. */
typedef struct {
    long scores, qkv, gate_up, hidden, sink;     /* shared */
    long streams, ins, partials, att_out, att_top, att_sum, end;   /* [threads][...] each */
    long inputs;                                 /* floats of each thread's `ins` */
} WorkLayout;

static WorkLayout work_layout(const long *shape, int threads)
{
    long d = shape[D_MODEL], hd = shape[HEAD_DIM], n_heads = shape[N_HEADS];
    long qkv_out = (n_heads + 2 * shape[N_KV_HEADS]) * hd, d_ff = shape[D_FF];
    long inputs = d > n_heads * hd ? d : n_heads * hd;
    inputs = inputs > d_ff ? inputs : d_ff;
    long qkv_strips = strips(qkv_out, STRIP_COLS), gate_up_strips = strips(d_ff, STRIP_COLS / 2);
    long head_strips = strips(shape[VOCAB], STRIP_COLS);
    long widest = head_strips > qkv_strips ? head_strips : qkv_strips;   /* what the floor drops */
    widest = widest > gate_up_strips ? widest : gate_up_strips;
    WorkLayout w;
    w.inputs = inputs;
    w.scores = 0;
    w.qkv = w.scores + n_heads * shape[MAX_LEN];
    w.gate_up = w.qkv + qkv_strips * STRIP_COLS;
    w.hidden = w.gate_up + gate_up_strips * STRIP_COLS;
    w.sink = w.hidden + gate_up_strips * STRIP_COLS / 2;
    w.streams = w.sink + widest * STRIP_COLS;
    w.ins = w.streams + threads * d;
    w.partials = w.ins + threads * inputs;
    w.att_out = w.partials + 2 * threads * packed_width(d);
    w.att_top = w.att_out + threads * n_heads * hd;
    w.att_sum = w.att_top + threads * n_heads;
    w.end = w.att_sum + threads * n_heads;
    return w;
}

/* Floats of `work` that decode_step (and stream_step) need for these sizes and threads. */
long step_work_floats(const long *shape, int threads)
{
    return work_layout(shape, threads).end;
}

/* logits[:vocab] for the token *token_id at position `pos` (returns 0; -1, with nothing read or
 * written, for a token outside [0, vocab)), writing its keys and values at `pos` of every
 * layer of k_cache, v_cache [n_layers, n_kv_heads, max_len, hd] (positions < pos already hold
 * the prefix). shape: the N_SHAPE sizes above. embed: [vocab, d_model], the embedding (its
 * row `token` is the token's vector); head: the same matrix in strips (the
 * tied LM head). layers: PER_LAYER pointers per layer: the norms' weights [d], QKV [d, (n_heads +
 * 2 n_kv) hd] and gate/up [d, 2 d_ff] in strips, O [n_heads hd, d] and down [d_ff, d] in panels
 * (native_gemv.c). turns: [hd / 2][2] (cos, sin) for `pos`. work: `step_work_floats(shape,
 * threads)` floats. */
long decode_step(const long *shape, const long *token_id, long pos, const float *embed, const float *head,
                 const float *const *layers, const float *final_norm, const float *turns,
                 float *k_cache, float *v_cache, float eps, float *work, float *logits,
                 int threads)
{
    long d = shape[D_MODEL], hd = shape[HEAD_DIM], n_heads = shape[N_HEADS];
    long n_kv = shape[N_KV_HEADS], d_ff = shape[D_FF], vocab = shape[VOCAB];
    long max_len = shape[MAX_LEN], qkv_out = (n_heads + 2 * n_kv) * hd, layer_size = n_kv * max_len * hd;
    long width = packed_width(d), token = *token_id;
    if (token < 0 || token >= vocab)
        return -1;
    WorkLayout at = work_layout(shape, threads);
    float *scores = work + at.scores, *qkv = work + at.qkv, *gate_up = work + at.gate_up;
    float *hidden = work + at.hidden;

    #pragma omp parallel num_threads(threads)
    {
        int t = thread_id(), n = thread_count();
        float *x = work + at.streams + t * d, *in = work + at.ins + t * at.inputs;
        float *o_partials = work + at.partials, *down_partials = o_partials + n * width;
        ThreadShare my = thread_share(shape, pos, t, n);
        long c0 = my.qkv0 * STRIP_COLS, c1 = my.qkv1 * STRIP_COLS < qkv_out ? my.qkv1 * STRIP_COLS : qkv_out;
        for (long j = 0; j < d; j++)
            x[j] = embed[token * d + j];
        for (long layer = 0; layer < shape[N_LAYERS]; layer++) {
            const float *const *w = layers + layer * PER_LAYER;
            float *k = k_cache + layer * layer_size, *v = v_cache + layer * layer_size;

            rms_norm(x, w[ATTN_NORM], in, d, eps);
            gemv_strips(in, w[QKV], qkv, d, qkv_out, my.qkv0, my.qkv1);
            rotate_columns(qkv, c0, c1, (n_heads + n_kv) * hd, hd, turns);
            for (long c = c0 > n_heads * hd ? c0 : n_heads * hd; c < c1; c++) {   /* K and V at pos */
                long kv = c - n_heads * hd, cache = kv < n_kv * hd ? 0 : 1;
                long g = kv / hd % n_kv, j = kv % hd;
                (cache ? v : k)[(g * max_len + pos) * hd + j] = qkv[c];
            }
            barrier();
            attend_positions(shape, qkv, k, v, my.s0, my.s1, scores, work + at.att_top + t * n_heads,
                             work + at.att_sum + t * n_heads, work + at.att_out + t * n_heads * hd);
            barrier();
            merge_attention(n_heads, hd, n, work + at.att_top, work + at.att_sum, work + at.att_out, in);
            gemv_packed(in, w[O_PROJ], o_partials + t * width, n_heads * hd, d);
            barrier();
            add_partials(o_partials, width, n, 0, d, x, 1);

            rms_norm(x, w[MLP_NORM], in, d, eps);
            gemv_strips(in, w[GATE_UP], gate_up, d, at.hidden - at.gate_up, my.gate_up0, my.gate_up1);
            swiglu_strips(gate_up, my.gate_up0, my.gate_up1, hidden);
            if (layer + 1 < shape[N_LAYERS])   /* the next layer's keys and values this thread reads */
                prefetch_positions(k + layer_size, v + layer_size, n_kv, max_len, hd, my.s0,
                                   my.s1 < pos ? my.s1 : pos);
            gemv_panels(hidden, w[DOWN], down_partials + t * width, d_ff, d, my.down0, my.down1);
            barrier();
            add_partials(down_partials, width, n, 0, d, x, 1);
        }
        rms_norm(x, final_norm, in, d, eps);
        gemv_strips(in, head, logits, d, vocab, my.head0, my.head1);
    }
    return 0;
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
    long width = packed_width(d);
    WorkLayout at = work_layout(shape, threads);
    float *inputs = work + at.ins, *sink = work + at.sink, *scores = work + at.scores;
    memset(inputs, 0, (at.partials - at.ins) * sizeof(float));

    #pragma omp parallel num_threads(threads)
    {
        int t = thread_id(), n = thread_count();
        float *mine = work + at.partials + t * width;
        ThreadShare my = thread_share(shape, pos, t, n);
        for (long layer = 0; layer < shape[N_LAYERS]; layer++) {
            const float *const *w = layers + layer * PER_LAYER;
            gemv_strips(inputs, w[QKV], sink, d, qkv_out, my.qkv0, my.qkv1);
            barrier();
            attend_positions(shape, inputs, k_cache + layer * layer_size, v_cache + layer * layer_size,
                             my.s0, my.s1, scores, work + at.att_top + t * n_heads, work + at.att_sum + t * n_heads,
                             work + at.att_out + t * n_heads * hd);
            barrier();
            gemv_packed(inputs, w[O_PROJ], mine, n_heads * hd, d);
            barrier();
            gemv_strips(inputs, w[GATE_UP], sink, d, at.streams - at.sink, my.gate_up0, my.gate_up1);
            gemv_panels(inputs, w[DOWN], mine, d_ff, d, my.down0, my.down1);
            barrier();
        }
        gemv_strips(inputs, head, sink, d, vocab, my.head0, my.head1);
    }
}
