/* Math shared by the native sources (reference/cpu/native_step.c, native_gemv.c,
 * native_attention.c, native_batch.c). Include it after a source's GCC optimize pragma, so that
 * these functions inline into loops compiled under it. */
#ifndef NATIVE_MATH_H
#define NATIVE_MATH_H

#include <math.h>
#include <string.h>

/* 16 floats, one AVX-512 register (two or four without AVX-512): sums written as vectors, so that
 * the compiler keeps them in registers (an array of floats it may leave in memory). Loads and
 * stores through memcpy: any alignment. */
typedef float lanes16 __attribute__((vector_size(64)));

static inline lanes16 load16(const float *p)
{
    lanes16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store16(float *p, lanes16 v)
{
    memcpy(p, &v, sizeof v);
}

/* e^x for x <= 0, within ~2 ulp of expf (Cephes' expf: x = n ln 2 + r, |r| <= ln 2 / 2, a degree-6
 * polynomial for e^r, then 2^n put into the exponent bits). Branch-free, so the loop over a run's
 * scores is vectorised (a call to expf per score cost about a third of the kernel's time).
 * x below -87 gives e^-87 (~1.6e-38) instead of less: a weight that small adds nothing. */
static inline float exp_nonpositive(float x)
{
    x = x < -87.0f ? -87.0f : x;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int bits = ((int)n + 127) << 23;          /* 2^n as a float's bits */
    float two_to_n;
    memcpy(&two_to_n, &bits, sizeof two_to_n);
    return p * two_to_n;
}

/* silu(g) = g / (1 + e^-g), computed from e^-|g| <= 1 so that nothing overflows (branch-free
 * after if-conversion, so loops over it are vectorised). */
static inline float silu(float g)
{
    float e = exp_nonpositive(-fabsf(g));
    return g * (g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e));
}

/* a[:n] . b[:n]. The compiler may reorder the sum (the including file's GCC pragma, clang's here),
 * so it keeps 16 running sums in a vector register and adds them pairwise at the end: in order,
 * the additions form one chain of dependent instructions (GCC's OpenMP simd reduction still added
 * its 16 lanes one by one). */
static inline float dot(const float *a, const float *b, long n)
{
#if defined(__clang__)
#pragma clang fp reassociate(on)
#endif
    float total = 0.0f;
    for (long i = 0; i < n; i++)
        total += a[i] * b[i];
    return total;
}

#endif
