// y = x @ w.T (+ bias) in float32 for a few rows of x, reading the weights once (eagle2/rowkernel.py).
//
// Decoding and tree verification multiply a handful of rows by weights far larger than the caches, so
// the time is the weight stream. Each block of NB weight rows is loaded once from memory (prefetched one
// block ahead) and multiplied with every input row, GROUP rows at a time, while it sits in L1.
// Every output element is the same sum in the same order whatever the row count (sixteen lanes of fused
// multiply-adds over k, then one fixed lane reduction), so a row's result does not depend on which other
// rows share the call: a verified tree row gets bit for bit what a one-row decoding step would.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <vector>

namespace {

constexpr int NB = 4;     // weight rows per block
constexpr int GROUP = 4;  // input rows multiplied per pass over a block

template <int G>
inline void pass(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t n, bool prefetch) {
  __m512 acc[NB][G];
  for (int b = 0; b < NB; ++b)
    for (int m = 0; m < G; ++m) acc[b][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NB];
    for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_ps(w + b * K + k);
    if (prefetch)  // the next block, at the same offset: NB * K floats ahead
      for (int b = 0; b < NB; ++b) _mm_prefetch(reinterpret_cast<const char*>(w + (NB + b) * K + k), _MM_HINT_T0);
    for (int m = 0; m < G; ++m) {
      __m512 xv = _mm512_loadu_ps(x + m * K + k);
      for (int b = 0; b < NB; ++b) acc[b][m] = _mm512_fmadd_ps(wv[b], xv, acc[b][m]);
    }
  }
  if (k < K) {  // the last K % 16 columns, masked; zeros add nothing
    const __mmask16 mask = static_cast<__mmask16>((1u << (K - k)) - 1);
    __m512 wv[NB];
    for (int b = 0; b < NB; ++b) wv[b] = _mm512_maskz_loadu_ps(mask, w + b * K + k);
    for (int m = 0; m < G; ++m) {
      __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * K + k);
      for (int b = 0; b < NB; ++b) acc[b][m] = _mm512_fmadd_ps(wv[b], xv, acc[b][m]);
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int m = 0; m < G; ++m) y[m * N + n + b] = _mm512_reduce_add_ps(acc[b][m]);
}

// Output columns [n0, n1) (a multiple of NB) for all M rows.
// All M rows times the block of NB weight rows wn (output columns n..n+NB), GROUP rows a pass; `prefetch`: the
// first pass fetches the next block of weight rows.
void block_rows(const float* x, const float* wn, float* y, int64_t M, int64_t N, int64_t K, int64_t n, bool prefetch) {
  int64_t m = 0;
  for (; m + GROUP <= M; m += GROUP) pass<GROUP>(x + m * K, wn, y + m * N, N, K, n, prefetch && m == 0);
  switch (M - m) {
    case 1: pass<1>(x + m * K, wn, y + m * N, N, K, n, prefetch && m == 0); break;
    case 2: pass<2>(x + m * K, wn, y + m * N, N, K, n, prefetch && m == 0); break;
    case 3: pass<3>(x + m * K, wn, y + m * N, N, K, n, prefetch && m == 0); break;
    default: break;
  }
}

void columns(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += NB) block_rows(x, w + n * K, y, M, N, K, n, true);
}

// The last N % NB columns, one at a time (same per-element order as a full block).
void tail(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0) {
  for (int64_t n = n0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const float* wn = w + n * K;
      const float* xm = x + m * K;
      __m512 acc = _mm512_setzero_ps();
      int64_t k = 0;
      for (; k + 16 <= K; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(wn + k), _mm512_loadu_ps(xm + k), acc);
      if (k < K) {
        const __mmask16 mask = static_cast<__mmask16>((1u << (K - k)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, wn + k), _mm512_maskz_loadu_ps(mask, xm + k), acc);
      }
      y[m * N + n] = _mm512_reduce_add_ps(acc);
    }
}

void run(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K) {
  const int64_t blocks = N / NB;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) { columns(x, w, y, M, N, K, b0 * NB, b1 * NB); });
  tail(x, w, y, M, N, K, blocks * NB);
}


// x @ (scale * q).T for int8 rows q, sixteen lanes of float32 fused multiply-adds: a = scale_t * sum_i x_i q_ti.
// Without l1 the output is a (+ bias_t). With l1 (eagle2/argmax.py) it is an upper bound on x . w_t for rows
// w_t ~ scale_t * q_t: a + 2^-22 |a| + l1_m * slack_t, l1_m = sum_i |x_mi|; the caller's slack_t covers the
// rounding of q and of this sum.
inline __m512 q8(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))); }

// Blocks of weight rows fetched ahead of the one being multiplied, into L1, by the int8 rows and the four-bit
// codes: one block ahead arrives too late for a stream from memory (a one-row target forward took 30% longer
// without fetching the codes ahead at all, the int8 argmax 10% longer with one block ahead instead of two).
// Fetching past the end of a weight is harmless: a prefetch never faults.
constexpr int64_t AHEAD = 2;
// The target's four-bit codes are read once a forward and are far larger than the last-level cache: fetched as
// non-temporal, they pass through without pushing out what is read again soon (the draft head's weights, the
// argmax's bounds, the caches' keys and values). Off (ablate): fetched like everything else.
bool stream_codes = true;
inline void fetch_code(const void* p) {
  if (stream_codes)
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_NTA);
  else
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
}
bool prefetch_ahead = true;  // off (ablate): the int8 rows fetch one block ahead and the codes none

void q8_block(const float* x, const int8_t* q, const float* scale, const float* bias, const float* slack,
              const float* l1, float* u, int64_t M, int64_t N, int64_t K, int64_t n) {
  // K is a multiple of 16 (checked); rows eight at a time
  const int64_t ahead = prefetch_ahead ? AHEAD : 1;
  __m512 acc[NB][8];
  for (int64_t m0 = 0; m0 < M; m0 += 8) {
    const int64_t G = std::min<int64_t>(8, M - m0);
    for (int b = 0; b < NB; ++b)
      for (int m = 0; m < 8; ++m) acc[b][m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      __m512 wv[NB];
      for (int b = 0; b < NB; ++b) wv[b] = q8(q + (n + b) * K + k);
      if (m0 == 0)  // the block `ahead` blocks on, at the same offset
        for (int b = 0; b < NB; ++b) _mm_prefetch(reinterpret_cast<const char*>(q + (n + NB * ahead + b) * K + k), _MM_HINT_T0);
      for (int m = 0; m < G; ++m) {
        __m512 xv = _mm512_loadu_ps(x + (m0 + m) * K + k);
        for (int b = 0; b < NB; ++b) acc[b][m] = _mm512_fmadd_ps(wv[b], xv, acc[b][m]);
      }
    }
    for (int b = 0; b < NB; ++b)
      for (int m = 0; m < G; ++m) {
        const float a = scale[n + b] * _mm512_reduce_add_ps(acc[b][m]);
        u[(m0 + m) * N + n + b] = l1 == nullptr ? a + (bias == nullptr ? 0.0f : bias[n + b])
                                                : a + std::fabs(a) * 0x1p-22f + l1[m0 + m] * slack[n + b];
      }
  }
}

// The same upper bounds from integer sums (AVX512-VNNI, where the CPU has it: `int16_sums`). Each input row
// x_m is written as s_m z_m + e_m with z_m int16 (|z| <= zmax, chosen so that no int32 sum can overflow) and
// |e_mi| <= E_m; the sum z_m . q_t is then exact (sixteen int32 lanes of pairwise products, one instruction per
// 32 weights and row, against two conversions and one multiply-add per 16 in q8_block). So
// x_m . q_t = s_m (z_m . q_t) + e_m . q_t with |e_m . q_t| <= E_m |q_t|_1, and the bound becomes
// a + 2^-22 |a| + |x_m|_1 slack_t + scale_t E_m |q_t|_1, a = scale_t s_m (z_m . q_t), in double and rounded up
// to float32 (the slack's share for float32 rounding of the sum is no longer needed, and is kept: it only widens).
struct Int16Rows {
  std::vector<int16_t> z;     // (M, K)
  std::vector<double> s, e;   // (M): the scale and the bound on |e_mi|
};

Int16Rows int16_rows(const float* x, int64_t M, int64_t K) {
  Int16Rows r{std::vector<int16_t>(M * K), std::vector<double>(M), std::vector<double>(M)};
  // |q| <= 128 even for a row that holds -128 (ours stop at 127): no sum of K products can leave int32
  const double zmax = std::min<double>(16383, std::floor(2147483647.0 / (128.0 * static_cast<double>(K))));
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    double top = 0;
    bool finite = true;
    for (int64_t i = 0; i < K; ++i) {
      top = std::max(top, std::fabs(static_cast<double>(xm[i])));
      finite &= std::isfinite(xm[i]);
    }
    // a row with an inf or a NaN gives NaN outputs and bounds, as float32 sums would (a bound that is NaN
    // settles nothing: the full lm_head decides)
    const double s = !finite ? std::nan("") : top > 0 ? top / zmax : 1.0;
    double e = 0;
    for (int64_t i = 0; i < K; ++i) {
      const double z = std::max(-zmax, std::min(zmax, std::nearbyint(xm[i] / s)));
      r.z[m * K + i] = static_cast<int16_t>(z);
      e = std::max(e, std::fabs(xm[i] - s * z));
    }
    r.s[m] = s;
    r.e[m] = !finite ? s : e * (1 + 0x1p-40) + 0x1p-50 * top;  // the double rounding of s z and of the difference
  }
  return r;
}

constexpr int TILE = 16;  // tokens per pass of the int16 sums: one vector of bounds

// The full sums of sixteen vectors of int32 lanes, lane j holding vector j's (a reduction tree: 15 additions
// and 30 shuffles for sixteen tokens, against about ten instructions a token one by one).
__attribute__((target("avx512f,avx512bw")))
inline __m512i sum16(const __m512i* v) {
  __m512i r1[8], r2[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3)
    r1[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: that lane's sum of vectors 4i .. 4i+3
    r2[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(r1[2 * i], r1[2 * i + 1]), _mm512_unpackhi_epi64(r1[2 * i], r1[2 * i + 1]));
  const __m512i p = _mm512_add_epi32(_mm512_shuffle_i32x4(r2[0], r2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i32x4(r2[0], r2[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i r = _mm512_add_epi32(_mm512_shuffle_i32x4(r2[2], r2[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i32x4(r2[2], r2[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(p, r, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(p, r, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Eight of the bounds, in double: a + 2^-22 |a| + l1 slack + scale E |q|_1 (1 + 2^-20), a = scale s sums,
// rounded up to float32.
__attribute__((target("avx512f")))
inline __m256 bound8(__m256i sums, const float* scale, const float* slack, const float* l1q, double s, double e,
                     double l1) {
  const __m512d sc = _mm512_cvtps_pd(_mm256_loadu_ps(scale));
  const __m512d a = _mm512_mul_pd(_mm512_mul_pd(sc, _mm512_set1_pd(s)), _mm512_cvtepi32_pd(sums));
  __m512d b = _mm512_fmadd_pd(_mm512_abs_pd(a), _mm512_set1_pd(0x1p-22), a);
  b = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(slack)), _mm512_set1_pd(l1), b);
  b = _mm512_fmadd_pd(_mm512_mul_pd(sc, _mm512_cvtps_pd(_mm256_loadu_ps(l1q))), _mm512_set1_pd(e * (1 + 0x1p-20)), b);
  return _mm512_cvt_roundpd_ps(b, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
}

// Sums of G rows (at most 4) against NB int8 rows, exact in int32 lanes, into buf[m][b] (not yet reduced).
template <int G>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
inline void q8_sums16(const int16_t* z, const int8_t* q, __m512i* buf, int64_t K, int64_t ahead) {
  __m512i acc[NB][G];
  for (int b = 0; b < NB; ++b)
    for (int m = 0; m < G; ++m) acc[b][m] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 32) {
    __m512i wv[NB];
    for (int b = 0; b < NB; ++b)
      wv[b] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * K + k)));
    if (ahead > 0 && k % 64 == 0)
      for (int b = 0; b < NB; ++b) _mm_prefetch(reinterpret_cast<const char*>(q + (ahead + b) * K + k), _MM_HINT_T0);
    for (int m = 0; m < G; ++m) {
      const __m512i xv = _mm512_loadu_si512(z + m * K + k);
      for (int b = 0; b < NB; ++b) acc[b][m] = _mm512_dpwssd_epi32(acc[b][m], xv, wv[b]);
    }
  }
  for (int m = 0; m < G; ++m)
    for (int b = 0; b < NB; ++b) buf[m * TILE + b] = acc[b][m];
}

// The int32 lanes (M, TILE) of tokens n .. n + TILE - 1 into buf: NB tokens and up to four rows at a time in
// registers, as q8_block, the lanes kept until the tile's sixteen tokens can be reduced together (`sum16`).
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void tile_sums(const Int16Rows& x, const int8_t* q, int64_t M, int64_t K, int64_t n, std::vector<__m512i>& buf) {
  const int64_t ahead = (prefetch_ahead ? AHEAD : 1) * NB;  // in tokens, as q8_block fetches
  buf.resize(M * TILE);
  for (int64_t j = 0; j < TILE; j += NB) {
    const int8_t* qj = q + (n + j) * K;
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int16_t* z = x.z.data() + m0 * K;
      __m512i* bj = buf.data() + m0 * TILE + j;
      const int64_t a = m0 == 0 ? ahead : 0;
      switch (std::min<int64_t>(4, M - m0)) {
        case 1: q8_sums16<1>(z, qj, bj, K, a); break;
        case 2: q8_sums16<2>(z, qj, bj, K, a); break;
        case 3: q8_sums16<3>(z, qj, bj, K, a); break;
        default: q8_sums16<4>(z, qj, bj, K, a); break;
      }
    }
  }
}

// Bounds u (M, TILE) on x_m . w_t for tokens n .. n + TILE - 1 (see int16_rows).
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void q8_tile16(const Int16Rows& x, const int8_t* q, const float* scale, const float* slack, const float* l1q,
               const float* l1, float* u, int64_t M, int64_t K, int64_t n, std::vector<__m512i>& buf) {
  tile_sums(x, q, M, K, n, buf);
  for (int64_t m = 0; m < M; ++m) {
    const __m512i sums = sum16(buf.data() + m * TILE);
    _mm256_storeu_ps(u + m * TILE, bound8(_mm512_castsi512_si256(sums), scale + n, slack + n, l1q + n, x.s[m], x.e[m], l1[m]));
    _mm256_storeu_ps(u + m * TILE + 8, bound8(_mm512_extracti64x4_epi64(sums, 1), scale + n + 8, slack + n + 8,
                                              l1q + n + 8, x.s[m], x.e[m], l1[m]));
  }
}

// Outputs y (M, N) for columns n .. n + TILE - 1 of x @ (scale * q).T (+ bias) from the int16 rows of x: not
// the float32 sums of q8_block (x is rounded to 15 bits a row), so only for the draft head, which proposes.
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void q8_out16(const Int16Rows& x, const int8_t* q, const float* scale, const float* bias, float* y, int64_t M,
              int64_t N, int64_t K, int64_t n, std::vector<__m512i>& buf) {
  tile_sums(x, q, M, K, n, buf);
  const __m512 sc = _mm512_loadu_ps(scale + n), b = bias == nullptr ? _mm512_setzero_ps() : _mm512_loadu_ps(bias + n);
  for (int64_t m = 0; m < M; ++m) {
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(sum16(buf.data() + m * TILE)),
                                   _mm512_mul_ps(sc, _mm512_set1_ps(static_cast<float>(x.s[m]))));
    _mm512_storeu_ps(y + m * N + n, _mm512_add_ps(v, b));
  }
}

// Which of sixteen bounds exceed t (bit j for u[j]; NaN never does, as Top::offer would not take it).
__attribute__((target("avx512f")))
inline unsigned above16(const float* u, float t) {
  return _mm512_cmp_ps_mask(_mm512_loadu_ps(u), _mm512_set1_ps(t), _CMP_GT_OQ);
}

bool int16_on = true;  // off (ablate): q8_block's float32 sums (argmax bounds, draft head) even with VNNI

bool int16_sums(int64_t K) {
  static const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
  return int16_on && vnni && K % 32 == 0;  // and the caller's token count a multiple of TILE
}

// y (M, N) = x (M, K) times int8 rows with their scales (+ bias), the output columns split between threads.
void q8_run(const float* x, const int8_t* q, const float* scale, const float* bias, float* y, int64_t M, int64_t N,
            int64_t K) {
  if (int16_sums(K) && N % TILE == 0) {  // the draft head's layers and rows: int16 x int8 sums (q8_out16)
    const Int16Rows x16 = int16_rows(x, M, K);
    at::parallel_for(0, N / TILE, 4, [&](int64_t t0, int64_t t1) {
      std::vector<__m512i> buf;
      for (int64_t t = t0; t < t1; ++t) q8_out16(x16, q, scale, bias, y, M, N, K, t * TILE, buf);
    });
    return;
  }
  at::parallel_for(0, N / NB, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) q8_block(x, q, scale, bias, nullptr, nullptr, y, M, N, K, i * NB);
  });
}


// Four-bit weights that hold float32 values exactly (eagle2/cpu/q4.py): each block of 32 weights of a row is
// a table of sixteen float32 values t_j = (d * j) + m (a product and a sum, each rounded once: what a GGUF
// Q4_1 block dequantises to) and a four-bit index per weight; codes byte 16b + i holds weight 32b + i in its
// low nibble and weight 32b + 16 + i in its high one. A block of NB weight rows is expanded into float32 in
// L1 and then multiplied exactly as `columns` multiplies float32 rows, so every output is the row kernel's sum
// over the same float32 weights, bit for bit, at a fifth of the bytes read.
// The sixteen values (d * j) + m, j = 0..15: the product rounded, then the sum, as the weights were made. With
// explicit rounding, because the compiler contracts a plain product and sum into one fused multiply-add (one
// rounding), which gives other values wherever d * j is not exact in float32 (a d that is not half precision).
inline __m512 q4_table(float d, float m, __m512 iota) {
  constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return _mm512_add_round_ps(_mm512_mul_round_ps(_mm512_set1_ps(d), iota, nearest), _mm512_set1_ps(m), nearest);
}

inline void q4_row(const uint8_t* codes, const float* d, const float* m, float* out, int64_t K) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t b = 0; b < K / 32; ++b) {
    const __m512 table = q4_table(d[b], m[b], iota);
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * b)));
    _mm512_storeu_ps(out + 32 * b, _mm512_permutexvar_ps(idx, table));  // the low four bits index
    _mm512_storeu_ps(out + 32 * b + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), table));
  }
}

// The codes of one block of 32 float32 weights for a given d (m is the block's least weight): true when
// every weight is exactly (d * j) + m, j in 0..15, computed as the kernel computes it (two roundings, no fma).
inline bool q4_try(const float* w, float d, float m, uint8_t* j) {
  for (int i = 0; i < 32; ++i) {
    const double c = d > 0 ? std::nearbyint((double(w[i]) - double(m)) / double(d)) : 0.0;
    const float code = static_cast<float>(std::min(15.0, std::max(0.0, c)));
    volatile float product = d * code;  // rounded on its own, never fused with the sum
    if (product + m != w[i]) return false;
    j[i] = static_cast<uint8_t>(code);
  }
  return true;
}

inline float half_step(float h, int steps) {  // h (a half-precision value) moved `steps` half ulps
  uint16_t bits = c10::Half(h).x;  // rounded to nearest
  for (; steps > 0; --steps) bits = (bits & 0x8000) ? bits - 1 : bits + 1;
  for (; steps < 0; ++steps) bits = (bits & 0x8000) ? bits + 1 : (bits == 0 ? 0x8001 : bits - 1);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// G rows times W weight rows (output columns n..n+W), the weight rows expanded in registers, sixteen lanes at a
// time, straight into the fused multiply-adds (each lane sums the same k in the same order as `pass`, so neither W
// nor G changes a bit of any output). Up to GROUP rows take NB weight rows a pass; five to eight take two, so that
// every row's sums still fit in registers and the codes are expanded once for all of them.
template <int W, int G>
inline void q4_pass(const float* x, const uint8_t* codes, const float* d, const float* m, float* y, int64_t N,
                    int64_t K, int64_t n) {
  const int64_t ahead = prefetch_ahead ? AHEAD * NB : 0;  // weight rows: the NB-row block AHEAD blocks on
  const int64_t nb = K / 32, half = K / 2;
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[W][G];
  for (int b = 0; b < W; ++b)
    for (int r = 0; r < G; ++r) acc[b][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < nb; ++k) {
    if (ahead) {  // over the nb steps, every line of those rows' codes, d and m (contiguous, W rows each step)
      fetch_code(codes + (n + ahead) * half + 16 * k * W);
      fetch_code(d + (n + ahead) * nb + k * W);
      fetch_code(m + (n + ahead) * nb + k * W);
    }
    __m512 lo[W], hi[W];
    for (int b = 0; b < W; ++b) {
      const int64_t at = (n + b) * nb + k;
      const __m512 table = q4_table(d[at], m[at], iota);
      const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + (n + b) * half + 16 * k)));
      lo[b] = _mm512_permutexvar_ps(idx, table);
      hi[b] = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), table);
    }
    for (int r = 0; r < G; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * K + 32 * k);
      for (int b = 0; b < W; ++b) acc[b][r] = _mm512_fmadd_ps(lo[b], xv, acc[b][r]);
    }
    for (int r = 0; r < G; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * K + 32 * k + 16);
      for (int b = 0; b < W; ++b) acc[b][r] = _mm512_fmadd_ps(hi[b], xv, acc[b][r]);
    }
  }
  for (int b = 0; b < W; ++b)
    for (int r = 0; r < G; ++r) y[r * N + n + b] = _mm512_reduce_add_ps(acc[b][r]);
}

bool eight_rows = true;  // five to eight rows in registers (`q4_pass`); off: expanded into L1 as for more rows
inline bool in_registers(int64_t M) { return M <= GROUP || (M <= 8 && eight_rows); }  // else expanded into L1

template <int G>
inline void q4_pairs(const float* x, const uint8_t* codes, const float* d, const float* m, float* y, int64_t N,
                     int64_t K, int64_t n) {
  for (int b = 0; b < NB; b += 2) q4_pass<2, G>(x, codes, d, m, y, N, K, n + b);
}

void q4_columns(const float* x, const uint8_t* codes, const float* d, const float* m, float* y, int64_t M,
                int64_t N, int64_t K, int64_t n0, int64_t n1, float* w) {
  const int64_t nb = K / 32;
  if (M <= GROUP) {
    for (int64_t n = n0; n < n1; n += NB) switch (M) {
      case 1: q4_pass<NB, 1>(x, codes, d, m, y, N, K, n); break;
      case 2: q4_pass<NB, 2>(x, codes, d, m, y, N, K, n); break;
      case 3: q4_pass<NB, 3>(x, codes, d, m, y, N, K, n); break;
      default: q4_pass<NB, GROUP>(x, codes, d, m, y, N, K, n); break;
    }
    return;
  }
  if (in_registers(M)) {
    for (int64_t n = n0; n < n1; n += NB) switch (M) {
      case 5: q4_pairs<5>(x, codes, d, m, y, N, K, n); break;
      case 6: q4_pairs<6>(x, codes, d, m, y, N, K, n); break;
      case 7: q4_pairs<7>(x, codes, d, m, y, N, K, n); break;
      default: q4_pairs<8>(x, codes, d, m, y, N, K, n); break;
    }
    return;
  }
  for (int64_t n = n0; n < n1; n += NB) {
    for (int b = 0; b < NB; ++b) q4_row(codes + (n + b) * (K / 2), d + (n + b) * nb, m + (n + b) * nb, w + b * K, K);
    block_rows(x, w, y, M, N, K, n, false);
  }
}

// y (M, N) = x (M, K) times the weights four-bit codes stand for, the output columns split between threads.
void q4_run(const float* x, const uint8_t* codes, const float* d, const float* m, float* y, int64_t M, int64_t N,
            int64_t K) {
  if (M == 0) return;  // q4_columns' passes take at least one row
  at::parallel_for(0, N / NB, 16, [&](int64_t b0, int64_t b1) {
    std::vector<float> w(in_registers(M) ? 0 : NB * K);  // this thread's block, expanded
    q4_columns(x, codes, d, m, y, M, N, K, b0 * NB, b1 * NB, w.data());
  });
}


// ---- a whole Llama decoder layer for a few rows (eagle2/cpu/layer.py, `FusedLlamaLayer`) ----------------------
// transformers' layer is some forty PyTorch operations, each dispatched from Python; for one to 32 rows of a
// small model most of a forward is that dispatch. Here the layer's own operations run in one call: RMSNorm,
// q/k/v through the row kernel (float32 weights or their exact four-bit codes), rotary, the new keys and values
// written into the cache's spare room, attention over the cache with the tree mask, o_proj, the residual, RMSNorm,
// gate/up, SiLU, down, the residual. The linear layers are the row kernel's sums; the norms, the softmax and
// the attention sums are float32 in an order of their own (not PyTorch's), so results can differ from the stock
// layer in the last bits (README, guarantees).
struct Lin {
  const float* w = nullptr;        // float32 (N, K), or
  const uint8_t* codes = nullptr;  // four-bit codes with d and m (q4_row), or
  const int8_t* q8 = nullptr;      // int8 rows with a scale each (a draft head's: q8_block)
  const float* d = nullptr;        // d, or the int8 rows' scales
  const float* m = nullptr;
  int64_t N = 0, K = 0;
};

// (weight, codes, d, m): codes uint8 for four-bit codes, int8 for int8 rows (d their scales), empty for float32.
Lin lin_of(const torch::Tensor& w, const torch::Tensor& codes, const torch::Tensor& d, const torch::Tensor& m) {
  TORCH_CHECK(w.scalar_type() == torch::kFloat && w.dim() == 2 && w.is_contiguous(), "contiguous float32 weight");
  Lin L;
  L.N = w.size(0);
  L.K = w.size(1);
  L.w = w.data_ptr<float>();
  if (codes.numel() && codes.scalar_type() == torch::kByte) {
    TORCH_CHECK(codes.dim() == 2 && codes.size(0) == L.N && codes.size(1) * 2 == L.K && L.N % NB == 0 &&
                L.K % 32 == 0, "codes shape");
    TORCH_CHECK(d.numel() == L.N * (L.K / 32) && m.numel() == d.numel(), "one d and one m per block");
    TORCH_CHECK(codes.is_contiguous() && d.is_contiguous() && m.is_contiguous() && d.scalar_type() == torch::kFloat &&
                m.scalar_type() == torch::kFloat, "contiguous codes, float32 d and m");
    L.codes = codes.data_ptr<uint8_t>();
    L.d = d.data_ptr<float>();
    L.m = m.data_ptr<float>();
  } else if (codes.numel()) {
    TORCH_CHECK(codes.scalar_type() == torch::kChar && codes.sizes() == w.sizes() && L.N % NB == 0 && L.K % 16 == 0,
                "int8 rows shaped like the weight");
    TORCH_CHECK(d.scalar_type() == torch::kFloat && d.numel() == L.N, "a scale per int8 row");
    TORCH_CHECK(codes.is_contiguous() && d.is_contiguous(), "contiguous int8 rows and scales");
    L.q8 = codes.data_ptr<int8_t>();
    L.d = d.data_ptr<float>();
  }
  return L;
}

void lin_run(const float* x, const Lin& L, float* y, int64_t M) {
  if (L.q8 != nullptr) return q8_run(x, L.q8, L.d, nullptr, y, M, L.N, L.K);
  if (L.codes == nullptr) return run(x, L.w, y, M, L.N, L.K);
  q4_run(x, L.codes, L.d, L.m, y, M, L.N, L.K);
}

// sum_j a_j b_j: sixteen lanes of fused multiply-adds, then the lanes (D a multiple of 16), else in turn.
inline float dot_product(const float* a, const float* b, int64_t D) {
  if (D % 16) {
    float s = 0.0f;
    for (int64_t j = 0; j < D; ++j) s += a[j] * b[j];
    return s;
  }
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < D; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), acc);
  return _mm512_reduce_add_ps(acc);
}

// e^x, sixteen lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes' degree-6 polynomial (about 1 ulp),
// times 2^n by scalef (0 below e^-104, which float32 cannot hold anyway). The same bits for a value whichever
// row or lane it sits in, so rows stay independent of one another.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// ov (16 V floats) = sum_t (p_t * inv) vals_t over the rows with p_t != 0, the sums kept in registers.
template <int V>
inline void weighted_sum(const float* p, float inv, const float* vals, int64_t T, float* ov) {
  __m512 acc[V];
  for (int v = 0; v < V; ++v) acc[v] = _mm512_setzero_ps();
  for (int64_t t = 0; t < T; ++t)
    if (p[t] != 0.0f) {
      const __m512 w = _mm512_set1_ps(p[t] * inv);
      for (int v = 0; v < V; ++v) acc[v] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vals + t * 16 * V + 16 * v), acc[v]);
    }
  for (int v = 0; v < V; ++v) _mm512_storeu_ps(ov + 16 * v, acc[v]);
}

// y_j = g_j / (1 + e^-g_j) * u_j (SiLU of the gate times the up projection), sixteen lanes at a time.
void silu_mul(float* g, const float* u, int64_t n) {
  int64_t j = 0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(g + j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), v));
    _mm512_storeu_ps(g + j, _mm512_mul_ps(_mm512_div_ps(v, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + j)));
  }
  if (j < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(mask, g + j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), v));
    _mm512_mask_storeu_ps(g + j, mask, _mm512_mul_ps(_mm512_div_ps(v, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(mask, u + j)));
  }
}

void rms_norm(const float* x, const float* weight, float eps, float* out, int64_t M, int64_t H) {
  for (int64_t i = 0; i < M; ++i) {
    const float* r = x + i * H;
    const float ss = dot_product(r, r, H);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
    for (int64_t j = 0; j < H; ++j) out[i * H + j] = weight[j] * (r[j] * inv);
  }
}

// x * cos + rotate_half(x) * sin for every head of every row (x (M, heads * D), cos and sin (M, D)).
void rotary(float* x, const float* cos, const float* sin, int64_t M, int64_t heads, int64_t D) {
  const int64_t half = D / 2;
  std::vector<float> t(D);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (i * heads + h) * D;
      const float *c = cos + i * D, *s = sin + i * D;
      for (int64_t j = 0; j < half; ++j) t[j] = v[j] * c[j] - v[j + half] * s[j];
      for (int64_t j = half; j < D; ++j) t[j] = v[j] * c[j] + v[j - half] * s[j];
      std::copy(t.begin(), t.end(), v);
    }
}

}  // namespace

// One decoder layer over M rows of x (M, H); keys and values are written at positions [past, past + M) of
// kbuf/vbuf (kv_heads, room, D); mask (M, past + M), bool (true: attend) or additive float, or empty for causal.
// lins: for q, k, v, o, gate, up, down in turn, (float32 weight, codes, d, m) as `lin_of` reads them. An empty
// norm1: no input norm (an EAGLE draft head's layer).
torch::Tensor llama_layer(const torch::Tensor& x, const torch::Tensor& norm1, const torch::Tensor& norm2, double eps,
                          const std::vector<torch::Tensor>& lins, const torch::Tensor& cos, const torch::Tensor& sin,
                          const torch::Tensor& kbuf, const torch::Tensor& vbuf, int64_t past, const torch::Tensor& mask,
                          double scaling, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() == 2 && x.is_contiguous(), "x: contiguous float32 (M, H)");
  TORCH_CHECK(lins.size() == 28, "seven linear layers, four tensors each");
  TORCH_CHECK(kbuf.dim() == 3 && vbuf.dim() == 3, "key and value buffers (kv_heads, room, D)");
  const int64_t M = x.size(0), H = x.size(1), D = kbuf.size(2), room = kbuf.size(1), T = past + M;
  TORCH_CHECK(kbuf.is_contiguous() && vbuf.is_contiguous() && kbuf.sizes() == vbuf.sizes() && kbuf.size(0) == kv_heads,
              "key and value buffers (kv_heads, room, D)");
  TORCH_CHECK(past >= 0 && T <= room, "no room in the cache for ", M, " rows after ", past);
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == M * D && sin.numel() == M * D, "cos, sin");
  TORCH_CHECK(kv_heads > 0 && heads > 0 && heads % kv_heads == 0, "heads a positive multiple of kv_heads");
  for (const auto* norm : {&norm1, &norm2})
    TORCH_CHECK(norm->numel() == 0 || (norm->scalar_type() == torch::kFloat && norm->is_contiguous() &&
                                       norm->numel() == H), "norm weights: float32, one per feature");
  TORCH_CHECK(norm2.numel() == H, "a post-attention norm");
  const bool has_mask = mask.numel() > 0, bool_mask = has_mask && mask.scalar_type() == torch::kBool;
  TORCH_CHECK(!has_mask || (mask.is_contiguous() && mask.numel() == M * T &&
                            (bool_mask || mask.scalar_type() == torch::kFloat)), "mask (M, past + M), bool or float32");
  Lin L[7];
  for (int i = 0; i < 7; ++i) L[i] = lin_of(lins[4 * i], lins[4 * i + 1], lins[4 * i + 2], lins[4 * i + 3]);
  const int64_t I = L[4].N;
  TORCH_CHECK(L[0].N == heads * D && L[1].N == kv_heads * D && L[2].N == kv_heads * D && L[3].N == H && L[5].N == I &&
              L[6].N == H && L[0].K == H && L[1].K == H && L[2].K == H && L[3].K == heads * D && L[4].K == H &&
              L[5].K == H && L[6].K == I, "projection shapes");
  auto opts = x.options();
  auto h = torch::empty({M, H}, opts), q = torch::empty({M, heads * D}, opts), k = torch::empty({M, kv_heads * D}, opts),
       v = torch::empty({M, kv_heads * D}, opts), o = torch::empty({M, heads * D}, opts), out = torch::empty({M, H}, opts),
       g = torch::empty({M, I}, opts), u = torch::empty({M, I}, opts);
  float *xp = x.data_ptr<float>(), *hp = h.data_ptr<float>(), *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(),
        *vp = v.data_ptr<float>(), *op = o.data_ptr<float>(), *yp = out.data_ptr<float>(), *gp = g.data_ptr<float>(),
        *up = u.data_ptr<float>();
  float *kb = kbuf.data_ptr<float>(), *vb = vbuf.data_ptr<float>();
  if (norm1.numel())
    rms_norm(xp, norm1.data_ptr<float>(), static_cast<float>(eps), hp, M, H);
  else  // an EAGLE head's layer has no input norm
    std::copy(xp, xp + M * H, hp);
  lin_run(hp, L[0], qp, M);
  lin_run(hp, L[1], kp, M);
  lin_run(hp, L[2], vp, M);
  rotary(qp, cos.data_ptr<float>(), sin.data_ptr<float>(), M, heads, D);
  rotary(kp, cos.data_ptr<float>(), sin.data_ptr<float>(), M, kv_heads, D);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t c = 0; c < kv_heads; ++c) {
      std::copy(kp + (i * kv_heads + c) * D, kp + (i * kv_heads + c + 1) * D, kb + (c * room + past + i) * D);
      std::copy(vp + (i * kv_heads + c) * D, vp + (i * kv_heads + c + 1) * D, vb + (c * room + past + i) * D);
    }
  const float scale = static_cast<float>(scaling);
  const bool* mb = bool_mask ? mask.data_ptr<bool>() : nullptr;
  const float* mf = has_mask && !bool_mask ? mask.data_ptr<float>() : nullptr;
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, heads * M, 1, [&](int64_t a0, int64_t a1) {
    std::vector<float> p(T);
    for (int64_t a = a0; a < a1; ++a) {
      const int64_t hq = a / M, i = a % M, c = hq / group;
      const float* qv = qp + (i * heads + hq) * D;
      const float* keys = kb + c * room * D;
      const float* vals = vb + c * room * D;
      float best = -INFINITY;
      for (int64_t t = 0; t < T; ++t) {
        bool keep = mb ? mb[i * T + t] : (mf ? true : t <= past + i);
        float s = -INFINITY;
        if (keep) {
          const float dot = dot_product(qv, keys + t * D, D);
          s = dot * scale + (mf ? mf[i * T + t] : 0.0f);
        }
        p[t] = s;
        best = std::max(best, s);
      }
      float* ov = op + (i * heads + hq) * D;
      std::fill(ov, ov + D, 0.0f);
      if (best == -INFINITY) continue;  // nothing to attend to: zeros
      // e^(s - best), 0 where masked, sixteen at a time; summed in key order (a tree node's keys sit at other
      // positions than its path's do in one-row steps, so lanes would group them differently; zeros add nothing)
      const __m512 top = _mm512_set1_ps(best), none = _mm512_set1_ps(-INFINITY);
      for (int64_t t = 0; t < T; t += 16) {
        const __mmask16 in = T - t >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (T - t)) - 1);
        const __m512 s = _mm512_mask_loadu_ps(none, in, p.data() + t);
        const __mmask16 keep = _mm512_cmp_ps_mask(s, none, _CMP_NEQ_OQ);
        _mm512_mask_storeu_ps(p.data() + t, in, _mm512_maskz_mov_ps(keep, exp16(_mm512_sub_ps(s, top))));
      }
      float sum = 0.0f;
      for (int64_t t = 0; t < T; ++t) sum += p[t];
      const float inv = 1.0f / sum;
      if (D == 64)
        weighted_sum<4>(p.data(), inv, vals, T, ov);
      else if (D == 128)
        weighted_sum<8>(p.data(), inv, vals, T, ov);
      else
        for (int64_t t = 0; t < T; ++t)
          if (p[t] != 0.0f) {
            const float w = p[t] * inv;
            for (int64_t j = 0; j < D; ++j) ov[j] += w * vals[t * D + j];
          }
    }
  });
  lin_run(op, L[3], yp, M);
  for (int64_t j = 0; j < M * H; ++j) yp[j] += xp[j];   // x + attention
  rms_norm(yp, norm2.data_ptr<float>(), static_cast<float>(eps), hp, M, H);
  lin_run(hp, L[4], gp, M);
  lin_run(hp, L[5], up, M);
  silu_mul(gp, up, M * I);
  lin_run(gp, L[6], hp, M);
  for (int64_t j = 0; j < M * H; ++j) yp[j] += hp[j];   // + mlp
  return out;
}

namespace {

}  // namespace

// float32 x (any leading shape) times a float32 (N, K) weight.
torch::Tensor rows_linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat, "float32 only");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu() && w.dim() == 2 && w.is_contiguous(), "contiguous CPU weight");
  const int64_t K = w.size(1), N = w.size(0);
  TORCH_CHECK(x.size(-1) == K, "x has ", x.size(-1), " features, the weight ", K);
  auto x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  auto y = torch::empty({M, N}, x.options());
  run(x2.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), M, N, K);
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  auto shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

// Upper bounds (M, N) on x @ w.T from int8 rows q (N, K), their scales and slacks (N): see q8_block.
torch::Tensor q8_upper(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scale, const torch::Tensor& slack) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && q.scalar_type() == torch::kChar, "float32 x, int8 q");
  TORCH_CHECK(q.dim() == 2 && q.is_contiguous() && scale.is_contiguous() && slack.is_contiguous(), "contiguous");
  const int64_t K = q.size(1), N = q.size(0);
  TORCH_CHECK(K % 16 == 0 && N % NB == 0, "K a multiple of 16, N of ", NB);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be (M, K)");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat && slack.scalar_type() == torch::kFloat && scale.numel() == N &&
              slack.numel() == N, "a float32 scale and slack per int8 row");
  auto x2 = x.contiguous();
  const int64_t M = x2.size(0);
  auto l1 = x2.abs().sum(1).contiguous();                            // (M,)
  auto u = torch::empty({M, N}, x.options());
  const float* xp = x2.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float *sp = scale.data_ptr<float>(), *cp = slack.data_ptr<float>(), *lp = l1.data_ptr<float>();
  float* up = u.data_ptr<float>();
  at::parallel_for(0, N / NB, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) q8_block(xp, qp, sp, nullptr, cp, lp, up, M, N, K, b * NB);
  });
  return u;
}

// float32 x (any leading shape) times int8 rows q (N, K) with a scale each (N), plus an optional bias.
torch::Tensor q8_linear(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scale,
                        const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && q.scalar_type() == torch::kChar, "float32 x, int8 q");
  TORCH_CHECK(q.dim() == 2 && q.is_contiguous() && scale.is_contiguous(), "contiguous");
  const int64_t K = q.size(1), N = q.size(0);
  TORCH_CHECK(K % 16 == 0 && N % NB == 0, "K a multiple of 16, N of ", NB);
  TORCH_CHECK(x.size(-1) == K, "x has ", x.size(-1), " features, the weight ", K);
  TORCH_CHECK(scale.scalar_type() == torch::kFloat && scale.numel() == N, "a float32 scale per int8 row");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || bias->numel() == N, "a bias per output");
  auto x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  auto y = torch::empty({M, N}, x.options());
  auto b = has_bias ? bias->to(torch::kFloat).contiguous() : torch::Tensor();
  const float* xp = x2.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float *sp = scale.data_ptr<float>(), *bp = has_bias ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  q8_run(xp, qp, sp, bp, yp, M, N, K);
  auto shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

// float32 x (any leading shape) times four-bit weights (codes (N, K/2) uint8, d and m (N, K/32) float32; see
// q4_row), plus an optional bias: the row kernel's float32 result over the weights the codes stand for.
torch::Tensor q4_linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& d,
                        const torch::Tensor& m, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && codes.scalar_type() == torch::kByte, "float32 x, uint8 codes");
  TORCH_CHECK(d.scalar_type() == torch::kFloat && m.scalar_type() == torch::kFloat, "float32 d and m");
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && d.is_contiguous() && m.is_contiguous(), "contiguous");
  const int64_t N = codes.size(0), K = codes.size(1) * 2;
  TORCH_CHECK(K % 32 == 0 && N % NB == 0, "K a multiple of 32, N of ", NB);
  TORCH_CHECK(d.numel() == N * (K / 32) && m.numel() == N * (K / 32), "one d and one m per block of 32");
  TORCH_CHECK(x.size(-1) == K, "x has ", x.size(-1), " features, the weight ", K);
  auto x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  auto y = torch::empty({M, N}, x.options());
  const float *xp = x2.data_ptr<float>(), *dp = d.data_ptr<float>(), *mp = m.data_ptr<float>();
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  q4_run(xp, cp, dp, mp, yp, M, N, K);
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  auto shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

// GFLOP/s of fused multiply-adds alone on every thread of this process: twelve independent chains of sixteen lanes
// each, `rounds` times, so nothing waits on memory or on a chain's latency. The CPU's arithmetic peak, which the
// target's extra verified rows are measured against (python -m eagle2.tools.drafting).
double fma_peak(int64_t rounds) {
  const int64_t threads = at::get_num_threads();
  std::atomic<int64_t> sink{0};
  const auto t0 = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t a, int64_t b) {
    for (int64_t w = a; w < b; ++w) {
      const __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
      __m512 acc[12];
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
      for (int64_t k = 0; k < rounds; ++k)
        for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
      float total = 0.0f;
      for (int i = 0; i < 12; ++i) total += _mm512_reduce_add_ps(acc[i]);
      sink += total != 0.0f;  // an atomic write of the sums, so the chains are not optimised away
    }
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * 16 * 12 * static_cast<double>(rounds) * threads / s / 1e9;
}

// The four-bit codes of a float32 (N, K) weight (eagle2/cpu/q4.py), or an empty codes tensor when some block
// is not exactly sixteen values (d * j) + m: d tried as the span / 15 in half precision (as GGUF stores it),
// its half-precision neighbours and in float32, then the span / 14, 13, ... 1 the same way.
std::vector<torch::Tensor> q4_recode(const torch::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == torch::kFloat && weight.dim() == 2, "float32 (N, K)");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(K % 32 == 0, "K a multiple of 32");
  auto w = weight.contiguous();
  auto codes = torch::empty({N, K / 2}, torch::kByte);
  auto d = torch::empty({N, K / 32}, torch::kFloat), m = torch::empty({N, K / 32}, torch::kFloat);
  const float* wp = w.data_ptr<float>();
  uint8_t* cp = codes.data_ptr<uint8_t>();
  float *dp = d.data_ptr<float>(), *mp = m.data_ptr<float>();
  std::atomic<bool> all(true);
  at::parallel_for(0, N * (K / 32), 1024, [&](int64_t b0, int64_t b1) {
    uint8_t j[32];
    for (int64_t b = b0; b < b1 && all.load(std::memory_order_relaxed); ++b) {
      const float* x = wp + b * 32;
      float lo = x[0], hi = x[0];
      bool finite = true;
      for (int i = 0; i < 32; ++i) { lo = std::min(lo, x[i]); hi = std::max(hi, x[i]); finite &= std::isfinite(x[i]); }
      bool ok = false;
      float step = 0.0f;
      for (int top = 15; finite && !ok && top >= 1; --top) {  // the largest weight's code: 15 nearly always
        const float span = (hi - lo) / static_cast<float>(top);
        if (!std::isfinite(span)) break;
        const float tries[6] = {half_step(span, 0), half_step(span, 1), half_step(span, -1), span,
                                half_step(span, 2), half_step(span, -2)};
        for (float t : tries)
          if (q4_try(x, t, lo, j)) { ok = true; step = t; break; }
      }
      if (!ok) { all.store(false); break; }
      dp[b] = step;
      mp[b] = lo;
      for (int i = 0; i < 16; ++i) cp[b * 16 + i] = static_cast<uint8_t>(j[i] | (j[16 + i] << 4));
    }
  });
  if (!all.load()) return {torch::empty({0}, torch::kByte), d, m};
  return {codes, d, m};
}

// ---- the target's decoder layers in one call (eagle2/cpu/layer.py, `FusedStack`) ---------------------------------
// A forward of a few rows called each layer's kernel from Python, thirty times, with the arguments gathered
// again each time; the stack holds every layer's tensors and runs the layers one after another here, each
// exactly as `llama_layer` (so the same bits).
struct LlamaStack {
  std::vector<torch::Tensor> norm1, norm2;
  std::vector<std::vector<torch::Tensor>> lins;
  double eps, scaling;
  int64_t heads, kv_heads;

  // layers: per layer [input norm (empty: none), post-attention norm, then the 28 tensors llama_layer takes]
  LlamaStack(const std::vector<std::vector<torch::Tensor>>& layers, double eps, double scaling, int64_t heads,
             int64_t kv_heads) : eps(eps), scaling(scaling), heads(heads), kv_heads(kv_heads) {
    for (const auto& l : layers) {
      TORCH_CHECK(l.size() == 30, "two norms and 28 linear tensors per layer");
      norm1.push_back(l[0]);
      norm2.push_back(l[1]);
      lins.emplace_back(l.begin() + 2, l.end());
    }
  }

  // x (M, H) through every layer; kbufs/vbufs: each layer's cache buffers (kv_heads, room, D), `past` filled.
  torch::Tensor run(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin,
                    const std::vector<torch::Tensor>& kbufs, const std::vector<torch::Tensor>& vbufs, int64_t past,
                    const torch::Tensor& mask) const {
    TORCH_CHECK(kbufs.size() == lins.size() && vbufs.size() == lins.size(), "a key and a value buffer per layer");
    for (size_t i = 0; i < lins.size(); ++i)
      x = llama_layer(x, norm1[i], norm2[i], eps, lins[i], cos, sin, kbufs[i], vbufs[i], past, mask, scaling, heads,
                      kv_heads);
    return x;
  }
};

// ---- greedy tokens from int8 bounds, in one call (eagle2/cpu/argmax.py, `GreedyTokens`) ----------------------
// For each row x_m: the upper bounds u_t of q8_upper on x_m . w_t for every token t, kept as a running shortlist
// of the k + 1 highest instead of an (M, V) tensor; the shortlisted tokens' float32 logits computed exactly as
// the row kernel computes them (sixteen lanes of fused multiply-adds over k in order, then the lane sum: `pass`),
// so they are the lm_head's own values bit for bit; the best of them, ties to the lowest token id as
// torch.argmax breaks them; and whether it provably beats every token outside the shortlist.
namespace {

struct Top {  // the n highest (value, token) offered, value descending; ties keep the first offered
  std::vector<float> v;
  std::vector<int64_t> t;
  explicit Top(int64_t n) : v(n, -INFINITY), t(n, -1) {}
  inline void offer(float u, int64_t tok) {
    const int64_t n = static_cast<int64_t>(v.size());
    if (!(u > v[n - 1])) return;
    int64_t j = n - 1;
    for (; j > 0 && v[j - 1] < u; --j) { v[j] = v[j - 1]; t[j] = t[j - 1]; }
    v[j] = u;
    t[j] = tok;
  }
};

}  // namespace

// x (M, K) float32; q (V, K) int8 rows with scale and slack (V) as q8_upper reads them; w (V, K) the float32
// lm_head; k shortlisted tokens; `spread` bounds the float32 rounding of any logit per unit of |x_m|_2.
// -> (tokens (M,) int64, settled (M,) bool, the shortlist (M, k + 1) int64 and its bounds (M, k + 1) float32).
std::vector<torch::Tensor> q8_greedy(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scale,
                                     const torch::Tensor& slack, const torch::Tensor& w, int64_t k, double spread,
                                     const c10::optional<torch::Tensor>& l1q) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() == 2 && q.scalar_type() == torch::kChar && q.dim() == 2,
              "float32 x (M, K), int8 q (V, K)");
  TORCH_CHECK(w.scalar_type() == torch::kFloat && w.sizes() == q.sizes() && w.is_contiguous() && q.is_contiguous(),
              "float32 w shaped like q");
  TORCH_CHECK(scale.is_contiguous() && slack.is_contiguous() && scale.numel() == q.size(0) &&
              slack.numel() == q.size(0), "a scale and a slack per row");
  const int64_t V = q.size(0), K = q.size(1), M = x.size(0);
  TORCH_CHECK(x.size(1) == K && K % 16 == 0 && V % NB == 0 && k >= 1 && k < V, "shapes");
  auto xc = x.contiguous();
  auto l1 = xc.abs().sum(1).contiguous();                             // as q8_upper takes it
  const float *xp = xc.data_ptr<float>(), *lp = l1.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float *sp = scale.data_ptr<float>(), *cp = slack.data_ptr<float>(), *wp = w.data_ptr<float>();
  const bool ints = l1q.has_value() && l1q->defined() && int16_sums(K) && V % TILE == 0;
  TORCH_CHECK(!ints || (l1q->scalar_type() == torch::kFloat && l1q->is_contiguous() && l1q->numel() == V),
              "a float32 |q_t|_1 per row");
  const float* l1qp = ints ? l1q->data_ptr<float>() : nullptr;
  const Int16Rows x16 = ints ? int16_rows(xp, M, K) : Int16Rows{};
  const int64_t k1 = k + 1, per = ints ? TILE : NB, blocks = V / per;
  const int64_t chunks = std::min<int64_t>(blocks, std::max<int64_t>(1, at::get_num_threads()) * 8);
  std::vector<Top> tops(chunks * M, Top(k1));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> ub(M * per);
    std::vector<__m512i> lanes;
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = blocks * c / chunks; b < blocks * (c + 1) / chunks; ++b) {
        const int64_t n = b * per;  // the bounds for these tokens, every row
        if (ints) {
          q8_tile16(x16, qp, sp, cp, l1qp, lp, ub.data(), M, K, n, lanes);
          for (int64_t m = 0; m < M; ++m) {  // only the bounds above the row's current (k + 1)-th are offered
            Top& top = tops[c * M + m];
            for (unsigned mask = above16(ub.data() + m * per, top.v[k]); mask; mask &= mask - 1) {
              const int j = __builtin_ctz(mask);
              top.offer(ub[m * per + j], n + j);
            }
          }
          continue;
        }
        q8_block(xp, qp + n * K, sp + n, nullptr, cp + n, lp, ub.data(), M, NB, K, 0);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t j = 0; j < per; ++j) tops[c * M + m].offer(ub[m * per + j], n + j);
      }
  });
  auto tokens = torch::empty({M}, torch::kLong), settled = torch::empty({M}, torch::kBool);
  auto short_t = torch::empty({M, k1}, torch::kLong), short_u = torch::empty({M, k1}, torch::kFloat);
  int64_t *tp = tokens.data_ptr<int64_t>(), *stp = short_t.data_ptr<int64_t>();
  float* sup = short_u.data_ptr<float>();
  bool* okp = settled.data_ptr<bool>();
  for (int64_t m = 0; m < M; ++m) {
    Top all(k1);
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t j = 0; j < k1; ++j) all.offer(tops[c * M + m].v[j], tops[c * M + m].t[j]);
    std::copy(all.t.begin(), all.t.end(), stp + m * k1);
    std::copy(all.v.begin(), all.v.end(), sup + m * k1);
    // the shortlist's exact logits, as the row kernel sums them; the best, ties to the lowest token id
    float best = -INFINITY;
    int64_t tok = -1;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t t = all.t[j];
      if (t < 0) continue;
      const float v = dot_product(xp + m * K, wp + t * K, K);
      if (tok < 0 || v > best || (v == best && t < tok)) { best = v; tok = t; }
    }
    // no token outside the shortlist gets more than its bound plus the rounding from the float32 lm_head
    double norm = 0;
    for (int64_t i = 0; i < K; ++i) norm += static_cast<double>(xp[m * K + i]) * xp[m * K + i];
    const double outside = static_cast<double>(all.v[k]) + spread * std::sqrt(norm) * (1 + 0x1p-40);
    tp[m] = tok;
    okp[m] = tok >= 0 && static_cast<double>(best) > outside;
  }
  return {tokens, settled, short_t, short_u};
}

// ---- one level of an EAGLE-1/2 draft head in one call (eagle2/cpu/level.py, `FusedDraft`) --------------------
// A level is the head's forward over a few drafted nodes and its scores over the draft vocabulary: some fifteen
// PyTorch operations from Python (embedding, concatenation, fc, rotary, the fused layer, the lm_head rows,
// log-softmax, top-k), which cost more than their arithmetic on a CPU. Here they run in one call, through the
// same kernels the separate calls use (q8_run, llama_layer: the same bits for the features and the logits); the
// log-softmax and the top-k are this file's own (the draft only proposes: the target verifies every token).
struct DraftLevel {
  torch::Tensor embed, fc_q, fc_scale, fc_bias, norm2, cos_table, sin_table, lm_q, lm_scale;
  std::vector<torch::Tensor> lins;
  double eps, scaling;
  int64_t heads, kv_heads;

  DraftLevel(torch::Tensor embed, torch::Tensor fc_q, torch::Tensor fc_scale, torch::Tensor fc_bias,
             torch::Tensor norm2, double eps, std::vector<torch::Tensor> lins, double scaling, int64_t heads,
             int64_t kv_heads, torch::Tensor cos_table, torch::Tensor sin_table, torch::Tensor lm_q,
             torch::Tensor lm_scale)
      : embed(embed), fc_q(fc_q), fc_scale(fc_scale), fc_bias(fc_bias), norm2(norm2), cos_table(cos_table),
        sin_table(sin_table), lm_q(lm_q), lm_scale(lm_scale), lins(std::move(lins)), eps(eps), scaling(scaling),
        heads(heads), kv_heads(kv_heads) {
    const int64_t H = embed.size(1);
    TORCH_CHECK(embed.scalar_type() == torch::kFloat && embed.dim() == 2 && embed.is_contiguous(), "embedding");
    TORCH_CHECK(fc_q.scalar_type() == torch::kChar && fc_q.is_contiguous() && fc_q.size(0) == H &&
                fc_q.size(1) == 2 * H && fc_scale.numel() == H, "fc: int8 rows (H, 2H) with a scale each");
    TORCH_CHECK(fc_bias.numel() == 0 || (fc_bias.scalar_type() == torch::kFloat && fc_bias.numel() == H), "fc bias");
    TORCH_CHECK(lm_q.scalar_type() == torch::kChar && lm_q.is_contiguous() && lm_q.size(1) == H &&
                lm_scale.numel() == lm_q.size(0), "lm_head rows: int8 (n, H) with a scale each");
    TORCH_CHECK(cos_table.dim() == 2 && cos_table.sizes() == sin_table.sizes() && cos_table.is_contiguous() &&
                sin_table.is_contiguous(), "rotary tables (positions, D)");
  }

  // tokens (M,) int64 with features (M, H) at `positions` (M,) int64; the head cache's buffers (kv_heads, room, D)
  // hold `past` positions, of which the first `committed` are committed pairs every row sees; `visible` (M, past -
  // committed + M) bool says which of the step's drafted keys (and the rows themselves) each row sees, or is empty
  // for causal rows. Rows from `first` on are scored. -> (features (M, H), log-probs (S, n), top-k log-probs
  // (S, k), their columns (S, k) int64), S = M - first.
  std::vector<torch::Tensor> run(const torch::Tensor& tokens, const torch::Tensor& feats,
                                 const torch::Tensor& positions, const torch::Tensor& kbuf, const torch::Tensor& vbuf,
                                 int64_t past, int64_t committed, const torch::Tensor& visible, int64_t first,
                                 int64_t k) const {
    const int64_t M = tokens.numel(), H = embed.size(1), V = embed.size(0), D = cos_table.size(1);
    const int64_t P = cos_table.size(0), n = lm_q.size(0), T = past + M;
    TORCH_CHECK(tokens.scalar_type() == torch::kLong && positions.scalar_type() == torch::kLong &&
                positions.numel() == M && tokens.is_contiguous() && positions.is_contiguous(), "tokens, positions");
    TORCH_CHECK(feats.scalar_type() == torch::kFloat && feats.is_contiguous() && feats.numel() == M * H, "features");
    TORCH_CHECK(first >= 0 && first < M && k > 0 && k <= n, "scored rows and k");
    TORCH_CHECK(committed >= 0 && committed <= past, "committed within past");
    const bool causal = visible.numel() == 0;
    TORCH_CHECK(causal || (visible.scalar_type() == torch::kBool && visible.is_contiguous() &&
                           visible.numel() == M * (T - committed)), "visible (M, past - committed + M) bool");
    const int64_t* tp = tokens.data_ptr<int64_t>();
    const int64_t* pp = positions.data_ptr<int64_t>();
    auto opts = feats.options();
    // fc(concat(embedding, feature))
    auto xin = torch::empty({M, 2 * H}, opts);
    float* xi = xin.data_ptr<float>();
    const float *ep = embed.data_ptr<float>(), *fp = feats.data_ptr<float>();
    for (int64_t i = 0; i < M; ++i) {
      TORCH_CHECK(tp[i] >= 0 && tp[i] < V, "token id out of range");
      std::copy(ep + tp[i] * H, ep + (tp[i] + 1) * H, xi + i * 2 * H);
      std::copy(fp + i * H, fp + (i + 1) * H, xi + i * 2 * H + H);
    }
    auto x = torch::empty({M, H}, opts);
    q8_run(xi, fc_q.data_ptr<int8_t>(), fc_scale.data_ptr<float>(),
           fc_bias.numel() ? fc_bias.data_ptr<float>() : nullptr, x.data_ptr<float>(), M, H, 2 * H);
    // the rotary rows of these positions
    auto cos = torch::empty({M, D}, opts), sin = torch::empty({M, D}, opts);
    for (int64_t i = 0; i < M; ++i) {
      TORCH_CHECK(pp[i] >= 0 && pp[i] < P, "position beyond the rotary table");
      std::copy(cos_table.data_ptr<float>() + pp[i] * D, cos_table.data_ptr<float>() + (pp[i] + 1) * D,
                cos.data_ptr<float>() + i * D);
      std::copy(sin_table.data_ptr<float>() + pp[i] * D, sin_table.data_ptr<float>() + (pp[i] + 1) * D,
                sin.data_ptr<float>() + i * D);
    }
    torch::Tensor mask = torch::empty({0}, opts.dtype(torch::kBool));
    if (!causal) {  // committed pairs always, then what `visible` says
      mask = torch::ones({M, T}, opts.dtype(torch::kBool));
      bool* mp = mask.data_ptr<bool>();
      const bool* vp = visible.data_ptr<bool>();
      for (int64_t i = 0; i < M; ++i) std::copy(vp + i * (T - committed), vp + (i + 1) * (T - committed),
                                                mp + i * T + committed);
    }
    auto out = llama_layer(x, torch::empty({0}, opts), norm2, eps, lins, cos, sin, kbuf, vbuf, past, mask, scaling,
                           heads, kv_heads);
    // the scored rows through the lm_head rows, then log-softmax and top-k per row
    const int64_t S = M - first;
    auto logp = torch::empty({S, n}, opts);
    float* lp = logp.data_ptr<float>();
    q8_run(out.data_ptr<float>() + first * H, lm_q.data_ptr<int8_t>(), lm_scale.data_ptr<float>(), nullptr, lp, S,
           n, H);
    auto top_lp = torch::empty({S, k}, opts);
    auto top_ix = torch::empty({S, k}, opts.dtype(torch::kLong));
    for (int64_t r = 0; r < S; ++r) {
      float* row = lp + r * n;
      Top best(k);
      float hi = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        hi = std::max(hi, row[j]);
        best.offer(row[j], j);
      }
      __m512 acc = _mm512_setzero_ps();
      const __m512 top = _mm512_set1_ps(hi);
      int64_t j = 0;
      for (; j + 16 <= n; j += 16) acc = _mm512_add_ps(acc, exp16(_mm512_sub_ps(_mm512_loadu_ps(row + j), top)));
      float sum = _mm512_reduce_add_ps(acc);
      for (; j < n; ++j) sum += std::exp(row[j] - hi);
      const float lse = hi + std::log(sum);
      for (j = 0; j < n; ++j) row[j] -= lse;
      for (int64_t c = 0; c < k; ++c) {
        top_lp.data_ptr<float>()[r * k + c] = best.v[c] - lse;
        top_ix.data_ptr<int64_t>()[r * k + c] = best.t[c];
      }
    }
    return {out, logp, top_lp, top_ix};
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q8_linear", &q8_linear, "float32 x @ (scale * q).T (+ bias) for int8 rows q");
  m.def("q8_upper", &q8_upper, "upper bounds on x @ w.T from int8 rows");
  m.def("llama_layer", &llama_layer, "one Llama decoder layer over a few rows, the cache written in place");
  m.def("q4_linear", &q4_linear, "float32 x @ w.T (+ bias) for four-bit weights that hold w exactly");
  m.def("fma_peak", &fma_peak, "GFLOP/s of independent fused multiply-adds on every thread");
  m.def("q4_recode", &q4_recode, "four-bit codes that hold a float32 weight exactly, or empty codes");
  m.def("q8_greedy", &q8_greedy, "greedy tokens from int8 bounds, a shortlist and its exact logits",
        pybind11::arg("x"), pybind11::arg("q"), pybind11::arg("scale"), pybind11::arg("slack"), pybind11::arg("w"),
        pybind11::arg("k"), pybind11::arg("spread"), pybind11::arg("l1q") = pybind11::none());
  m.def("set_int16_sums", [](bool on) { int16_on = on; },
        "int8 rows times inputs rounded to int16, summed exactly where the CPU has AVX512-VNNI (the default: the "
        "argmax's bounds, the draft head) or float32 sums (for ablate)");
  m.def("int16_sums", [](int64_t K) { return int16_sums(K); }, "whether bounds over K features use int16 sums");
  pybind11::class_<LlamaStack>(m, "LlamaStack")
      .def(pybind11::init<const std::vector<std::vector<torch::Tensor>>&, double, double, int64_t, int64_t>())
      .def("run", &LlamaStack::run, "the layers one after another over a few rows, caches written in place");
  m.def("set_eight_rows", [](bool on) { eight_rows = on; },
        "five to eight rows of four-bit products in registers (the default) or expanded into L1 (for ablate)");
  m.def("set_stream_codes", [](bool on) { stream_codes = on; },
        "four-bit codes fetched ahead as non-temporal (the default) or as everything else (for ablate)");
  m.def("set_prefetch", [](bool on) { prefetch_ahead = on; },
        "int8 rows and four-bit codes fetched two blocks ahead (the default) or as before (for ablate)");
  pybind11::class_<DraftLevel>(m, "DraftLevel")
      .def(pybind11::init<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, double,
                          std::vector<torch::Tensor>, double, int64_t, int64_t, torch::Tensor, torch::Tensor,
                          torch::Tensor, torch::Tensor>())
      .def("run", &DraftLevel::run, "a draft head's level over a few nodes: features, log-probs and top-k");
  m.def("rows_linear", &rows_linear, "float32 x @ w.T (+ bias) for a few rows; rows independent");
}
