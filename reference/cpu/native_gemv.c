/* The products of a pass over one sequence's new positions (native_step.c: a decode step of one
 * row, or T rows: drafts to verify, a prompt's chunk), on the weights reference/cpu/
 * native_step.py packs for them: panels (`gemm_panels`) for the products split by input rows,
 * strips (`gemm_strips`) for those whose outputs a thread computes whole. Built and called
 * through reference/cpu/native_gemv.py. The threads are OpenMP's: linked against the OpenMP
 * runtime torch already loaded, they are torch's own pool.
 *
 * The weights are what a pass reads from memory, so each block of them is read once for all of
 * its rows, while every row's running sums stay in registers: rows taken one at a time would
 * stream the matrix once per row. Below the machine's ridge point (a few rows) a pass then costs
 * about what one row's costs; above it, the multiply-adds. */
#include <string.h>

#include "native_math.h"   /* lanes16: a row's sums of 16 columns in one vector register */

#define MAX_ROWS 16    /* rows a product takes (native_step.py's MAX_ROWS) */
/* Rows whose sums a product keeps in registers at once: more go in blocks of rows, each block
 * reading the weights again, from L2 (a strip or a panel is tens of KB). */
#ifdef __AVX512F__
#define BLOCK_ROWS 8   /* a strip's 32 sums of 8 rows: 16 of the 32 registers */
#define EACH_ROW_COUNT(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#else
#define BLOCK_ROWS 2   /* AVX2's 16 registers of 8 floats: a strip's sums of 2 rows fill 8 */
#define EACH_ROW_COUNT(CASE) CASE(1) CASE(2)
#endif
/* EACH_ROW_COUNT(CASE): CASE(R) for R = 1 .. BLOCK_ROWS, the row counts a product's inner loop is
 * compiled for (a constant R unrolls the loops over rows and keeps the sums in registers). */

/* The panel layout (reference/cpu/native_step.py packs it): w [n_in, n_out] as
 * [ceil(n_in / 32)][ceil(n_out / 16)][32][16], zeros past n_in or n_out. A panel (32 rows of w)
 * is one contiguous run of memory in which each 32 x 16 block is read whole, in order: one stream
 * per thread, where reading 32 rows of an [in, out] matrix side by side would be 32 streams. A
 * block's 16 sums of each row stay in registers over its 32 rows and go to memory once: with
 * blocks of 8 rows (each row's sums stored and loaded again every 8 x 16 weights) a pass of 8 rows
 * read its panels at under half the bandwidth of a pass of one row (one thread, 141 MB of
 * panels); with blocks of 32 rows at about 85% of it, and a pass of one row 10% faster. */
#define PANEL_ROWS 32
#define PANEL_COLS 16

/* Floats of a partial product of a packed matrix with n_out columns (its padded width). */
long packed_width(long n_out)
{
    return (n_out + PANEL_COLS - 1) / PANEL_COLS * PANEL_COLS;
}

/* y[t * ldy :][:16] += x[t * ldx :][:n] @ block[:n][:16] for the R rows t of a pass, n <= 32:
 * R running sums of 16 (one row: two, even and odd weight rows, so that one multiply-add need
 * not wait for the one before). Inlined with R a constant (`panel_rows`): the loops over rows
 * unroll and the sums stay in registers. */
static inline __attribute__((always_inline)) void panel_block(const float *x, long ldx,
        const float *block, long n, float *y, long ldy, int R)
{
    lanes16 sums[BLOCK_ROWS], odd = {0};
    for (int t = 0; t < R; t++)
        sums[t] = load16(y + t * ldy);
    long r = 0;
    if (R == 1)
        for (; r + 1 < n; r += 2) {
            sums[0] += x[r] * load16(block + r * PANEL_COLS);
            odd += x[r + 1] * load16(block + (r + 1) * PANEL_COLS);
        }
    for (; r < n; r++) {
        lanes16 w = load16(block + r * PANEL_COLS);
        for (int t = 0; t < R; t++)
            sums[t] += x[t * ldx + r] * w;
    }
    for (int t = 0; t < R; t++)
        store16(y + t * ldy, R == 1 ? sums[t] + odd : sums[t]);
}

/* y[t * ldy :][:16 chunks] += x[t * ldx :][:n] @ one panel [chunks][32][16] (its first n rows)
 * for the rows t < rows <= BLOCK_ROWS, each count of rows compiled on its own. */
static void panel_rows(const float *x, long ldx, long rows, const float *panel, long n, float *y,
                       long ldy, long chunks)
{
    for (long c = 0; c < chunks; c++) {
        const float *block = panel + c * PANEL_ROWS * PANEL_COLS;
        float *out = y + c * PANEL_COLS;
        switch (rows) {
#define PANEL_CASE(R) case R: panel_block(x, ldx, block, n, out, ldy, R); break;
        EACH_ROW_COUNT(PANEL_CASE)
#undef PANEL_CASE
        }
    }
}

/* partial[t * ldp :][:packed_width(n_out)] = x[t * ldx :][:n_in] @ the panels [p0, p1) of a packed
 * matrix (the rows [32 p0, 32 p1) of w), for the rows t < rows (<= MAX_ROWS): one contiguous
 * stream, each panel read once from memory. Rows go in blocks of at most BLOCK_ROWS, split
 * evenly, each block over the whole panel (16 rows at once, all their sums in registers, were
 * 45% slower: one thread, interleaved runs). The product is the sum of such partials over panel
 * ranges that cover the matrix. */
void gemm_panels(const float *x, long ldx, long rows, const float *packed, float *partial, long ldp,
                 long n_in, long n_out, long p0, long p1)
{
    long width = packed_width(n_out);
    for (long t = 0; t < rows; t++)
        memset(partial + t * ldp, 0, width * sizeof(float));
    long blocks = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
    for (long p = p0; p < p1; p++) {
        long n = n_in - p * PANEL_ROWS < PANEL_ROWS ? n_in - p * PANEL_ROWS : PANEL_ROWS;
        for (long b = 0; b < blocks; b++) {
            long t0 = rows * b / blocks, t1 = rows * (b + 1) / blocks;
            panel_rows(x + t0 * ldx + p * PANEL_ROWS, ldx, t1 - t0, packed + p * PANEL_ROWS * width, n,
                       partial + t0 * ldp, ldp, width / PANEL_COLS);
        }
    }
}

/* The strip layout, for the products a thread computes whole columns of (native_step.c): w
 * [n_in, n_out] as [strips][n_in][32], strip g holding 32 columns of w (which ones is the packer's
 * choice: native_step.py), zeros for columns past the edge. A strip is one contiguous run; the
 * 32 sums of each row stay in registers over all n_in rows of the strip, so y is written once,
 * whole: no partials to add across threads, and the same sums at any thread count. */
#define STRIP_COLS 32

/* sums[t][:32] = x[t * ldx + i] * strip[i][:32] summed over i < n, for the R rows t of a block:
 * 2 R vectors of sums in registers while the n rows of the strip go by once. Inlined with R a
 * constant (`strip_block`), so the loops over rows unroll. */
static inline __attribute__((always_inline)) void strip_rows(const float *x, long ldx,
        const float *strip, long n, float (*sums)[STRIP_COLS], int R)
{
    lanes16 low[BLOCK_ROWS] = {{0}}, high[BLOCK_ROWS] = {{0}};
    for (long i = 0; i < n; i++) {
        lanes16 w_low = load16(strip + i * STRIP_COLS), w_high = load16(strip + i * STRIP_COLS + 16);
        for (int t = 0; t < R; t++) {
            float xt = x[t * ldx + i];
            low[t] += xt * w_low;
            high[t] += xt * w_high;
        }
    }
    for (int t = 0; t < R; t++) {
        store16(sums[t], low[t]);
        store16(sums[t] + 16, high[t]);
    }
}

/* `strip_rows` for 1 <= rows <= BLOCK_ROWS, each count compiled on its own. */
static void strip_block(const float *x, long ldx, const float *strip, long n, float (*sums)[STRIP_COLS],
                        long rows)
{
    switch (rows) {
#define STRIP_CASE(R) case R: strip_rows(x, ldx, strip, n, sums, R); break;
    EACH_ROW_COUNT(STRIP_CASE)
#undef STRIP_CASE
    }
}

/* y[t * ldy + 32 g + k] = x[t * ldx :][:n_in] @ strips[g][:, k] for the rows t < rows (<=
 * MAX_ROWS), the strips g in [first, last), k < 32 and 32 g + k < n_out, each strip read once
 * from memory. Rows go in blocks of at most BLOCK_ROWS, split evenly (10 rows: 5 and 5), each
 * block over the whole strip: after the first, the strip (n_in x 128 bytes) is in L2. (Blocks
 * taking turns over chunks of 64 strip rows, in L1, were 30% slower for 16 rows: one thread,
 * interleaved runs.) */
void gemm_strips(const float *x, long ldx, long rows, const float *strips, float *y, long ldy,
                 long n_in, long n_out, long first, long last)
{
    long blocks = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
    for (long g = first; g < last; g++) {
        const float *strip = strips + g * n_in * STRIP_COLS;
        float sums[MAX_ROWS][STRIP_COLS];
        for (long b = 0; b < blocks; b++) {
            long t0 = rows * b / blocks, t1 = rows * (b + 1) / blocks;
            strip_block(x + t0 * ldx, ldx, strip, n_in, sums + t0, t1 - t0);
        }
        long cols = n_out - g * STRIP_COLS < STRIP_COLS ? n_out - g * STRIP_COLS : STRIP_COLS;
        for (long t = 0; t < rows; t++)
            memcpy(y + t * ldy + g * STRIP_COLS, sums[t], cols * sizeof(float));
    }
}
