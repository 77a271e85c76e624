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
#include <cmath>

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
void columns(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += NB) {
    const float* wn = w + n * K;
    int64_t m = 0;
    for (; m + GROUP <= M; m += GROUP) pass<GROUP>(x + m * K, wn, y + m * N, N, K, n, m == 0);
    switch (M - m) {
      case 1: pass<1>(x + m * K, wn, y + m * N, N, K, n, m == 0); break;
      case 2: pass<2>(x + m * K, wn, y + m * N, N, K, n, m == 0); break;
      case 3: pass<3>(x + m * K, wn, y + m * N, N, K, n, m == 0); break;
      default: break;
    }
  }
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

void q8_block(const float* x, const int8_t* q, const float* scale, const float* bias, const float* slack,
              const float* l1, float* u, int64_t M, int64_t N, int64_t K, int64_t n) {
  // K is a multiple of 16 (checked); rows eight at a time
  __m512 acc[NB][8];
  for (int64_t m0 = 0; m0 < M; m0 += 8) {
    const int64_t G = std::min<int64_t>(8, M - m0);
    for (int b = 0; b < NB; ++b)
      for (int m = 0; m < 8; ++m) acc[b][m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      __m512 wv[NB];
      for (int b = 0; b < NB; ++b) wv[b] = q8(q + (n + b) * K + k);
      if (m0 == 0)
        for (int b = 0; b < NB; ++b) _mm_prefetch(reinterpret_cast<const char*>(q + (n + NB + b) * K + k), _MM_HINT_T0);
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
  auto x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  auto y = torch::empty({M, N}, x.options());
  const bool has_bias = bias.has_value() && bias->defined();
  auto b = has_bias ? bias->to(torch::kFloat).contiguous() : torch::Tensor();
  const float* xp = x2.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float *sp = scale.data_ptr<float>(), *bp = has_bias ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N / NB, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) q8_block(xp, qp, sp, bp, nullptr, nullptr, yp, M, N, K, i * NB);
  });
  auto shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q8_linear", &q8_linear, "float32 x @ (scale * q).T (+ bias) for int8 rows q");
  m.def("q8_upper", &q8_upper, "upper bounds on x @ w.T from int8 rows");
  m.def("rows_linear", &rows_linear, "float32 x @ w.T (+ bias) for a few rows; rows independent");
}
