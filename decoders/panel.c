/* y = x W^T + b for a few rows of x, over W packed in panels of 16 columns (decoders/panel.py).
 *
 * wp[p][k][j] = W[p*16 + j][k]: a panel is K x 16 floats, contiguous, and the panels follow each
 * other, so the weights stream from memory once, front to back, whatever the number of rows.
 * Every output is one chain of fused multiply-adds over k = 0, 1, ..., K-1 (then + bias), the
 * same chain whether it is computed alone or beside 1 to 5 other rows: a row's result never
 * depends on the rows batched with it. The inner loops over the 16 columns are what the compiler
 * vectorizes; nothing reassociates the sums over k (no -ffast-math).
 */
#include <stddef.h>

#define NB 16
/* ONE_PANEL: one row streams one panel at a time, prefetching PF floats ahead (where a panel's 16
 * columns are one 512-bit register), or two panels at once (with 256-bit registers, where one
 * panel is two FMA chains, latency-bound). Either way every output is the same chain of FMAs.
 * Both are measured on a 2-core AMD EPYC, one thread, all of smollm2's products:
 * - Zen 5 (AVX-512): one row 15.6 ms one panel at a time 4 KiB ahead, against 21.5 ms two panels
 *   at once 512 bytes ahead (35 against 25 GB/s); five rows 16.5 ms 4 KiB ahead against 21.1 ms
 *   1 KiB ahead;
 * - Zen 2 (AVX2): two panels at once for one row, 128-256 floats ahead for more rows, were best. */
#ifndef ONE_PANEL
#ifdef __AVX512F__
#define ONE_PANEL 1
#else
#define ONE_PANEL 0
#endif
#endif
#ifndef PF
#if ONE_PANEL
#define PF 1024
#else
#define PF 256
#endif
#endif
/* PF_ROWS: the distance for 2 to 6 rows. With AVX-512, 12 KiB ahead: a K+1 = 5 block over all of
 * smollm2's layers, interleaved in one process with the one-token step, 25 times each, cost 1.18
 * and 1.19 steps at 4 KiB, 1.15 at 8 KiB, 1.13 and 1.14 at 12 KiB, 1.14 at 16 KiB (Zen 5). */
#ifndef PF_ROWS
#if ONE_PANEL
#define PF_ROWS 3072
#else
#define PF_ROWS PF
#endif
#endif

#define TILE(R)                                                                                   \
  static void tile##R(const float *restrict x, long K, const float *restrict w,                  \
                      float *restrict y, long ldy, const float *restrict b, int n) {            \
    float acc[R][NB];                                                                           \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                         \
        _Pragma("GCC unroll 16") for (int j = 0; j < NB; j++) acc[r][j] = 0.f;                  \
    for (long k = 0; k < K; k++) {                                                              \
      const float *restrict wk = w + k * NB;                                                    \
      if (R > 1) __builtin_prefetch(wk + PF_ROWS); else if (ONE_PANEL) __builtin_prefetch(wk + PF); \
      _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                     \
        const float xv = x[r * K + k];                                                          \
        _Pragma("GCC unroll 16") for (int j = 0; j < NB; j++)                                   \
            acc[r][j] = __builtin_fmaf(xv, wk[j], acc[r][j]);                                   \
      }                                                                                         \
    }                                                                                           \
    for (int r = 0; r < R; r++)                                                                 \
      for (int j = 0; j < n; j++) y[r * ldy + j] = b ? acc[r][j] + b[j] : acc[r][j];            \
  }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)

/* One row over two panels at once: four independent chains and two streams in flight, which
 * one row alone over one panel (two chains, FMA latency-bound) does not reach. */
static void tile1x2(const float *restrict x, long K, const float *restrict w, float *restrict y,
                    const float *restrict b, int n) {
  float a0[NB], a1[NB];
  _Pragma("GCC unroll 16") for (int j = 0; j < NB; j++) { a0[j] = 0.f; a1[j] = 0.f; }
  const float *restrict w1 = w + K * NB;
  for (long k = 0; k < K; k++) {
    const float xv = x[k];
    __builtin_prefetch(w + k * NB + 128);
    __builtin_prefetch(w1 + k * NB + 128);
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; j++) a0[j] = __builtin_fmaf(xv, w[k * NB + j], a0[j]);
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; j++) a1[j] = __builtin_fmaf(xv, w1[k * NB + j], a1[j]);
  }
  for (int j = 0; j < NB; j++) y[j] = b ? a0[j] + b[j] : a0[j];
  for (int j = 0; j < n; j++) y[NB + j] = b ? a1[j] + b[NB + j] : a1[j];
}

static void rows(const float *x, long M, long K, const float *w, float *y, long N, const float *b, int n) {
  for (long m = 0; m < M; m += 6) {
    long R = M - m < 6 ? M - m : 6;
    const float *xm = x + m * K;
    float *ym = y + m * N;
    switch (R) {
      case 1: tile1(xm, K, w, ym, N, b, n); break;
      case 2: tile2(xm, K, w, ym, N, b, n); break;
      case 3: tile3(xm, K, w, ym, N, b, n); break;
      case 4: tile4(xm, K, w, ym, N, b, n); break;
      case 5: tile5(xm, K, w, ym, N, b, n); break;
      default: tile6(xm, K, w, ym, N, b, n); break;
    }
  }
}

/* x (M, K) and y (M, N) row-major; wp (ceil(N/16), K, 16); b (N) or NULL. */
void panel_linear(const float *x, long M, long K, const float *wp, long N, const float *b, float *y,
                  int threads) {
  long P = (N + NB - 1) / NB;
  if (M == 1 && !ONE_PANEL) {
    long pairs = P / 2;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && pairs > 1)
    for (long q = 0; q < pairs; q++) {
      long p = 2 * q;
      long left = N - (p + 1) * NB;
      tile1x2(x, K, wp + p * K * NB, y + p * NB, b ? b + p * NB : NULL, (int)(left < NB ? left : NB));
    }
    if (P % 2) {
      long p = P - 1;
      tile1(x, K, wp + p * K * NB, y + p * NB, N, b ? b + p * NB : NULL, (int)(N - p * NB));
    }
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && P > 1)
  for (long p = 0; p < P; p++) {
    long left = N - p * NB;
    rows(x, M, K, wp + p * K * NB, y + p * NB, N, b ? b + p * NB : NULL, (int)(left < NB ? left : NB));
  }
}
