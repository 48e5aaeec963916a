// y = x·Wᵀ (+ b) for the few rows of a CPU decode or verification step, float32, AVX2 + FMA.
//
// Why: a decode step reads every weight once and does two FLOPs per weight read, so it is bound by
// memory bandwidth; oneDNN's and MKL's kernels read a SmolLM2-135M step's 538 MB at ~2/3 of what a plain
// read of the same bytes reaches on a 2-core x86 CPU. This kernel streams W row by row (each row read
// from memory once, then reused from L1 by every input row) at close to the plain read's speed.
//
// Bit-identical rows: each output element is one dot product summed the same way (one 8-lane accumulator
// in ascending k, then a fixed horizontal sum, then the scalar tail, then the bias) whatever the number of
// rows M and whatever the blocking, so row m of an M-row product equals the one-row product of row m.
// Built on first use by specdec/models/cpu_kernels.py (torch.utils.cpp_extension).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Rows [n0, n0 + R) of W against input rows [m0, m0 + G): R·G accumulators, W read once per k step.
template <int R, int G>
void block(const float* W, const float* X, const float* bias, float* Y, int64_t n0, int64_t m0, int64_t K,
           int64_t N) {
  __m256 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
  const int64_t body = K - K % 8;
  for (int64_t k = 0; k < body; k += 8) {
    __m256 xv[G];
    for (int g = 0; g < G; ++g) xv[g] = _mm256_loadu_ps(X + (m0 + g) * K + k);
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_loadu_ps(W + (n0 + r) * K + k);
      for (int g = 0; g < G; ++g) acc[r][g] = _mm256_fmadd_ps(w, xv[g], acc[r][g]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) {
      float s = hsum(acc[r][g]);
      for (int64_t k = body; k < K; ++k) s += W[(n0 + r) * K + k] * X[(m0 + g) * K + k];
      if (bias != nullptr) s += bias[n0 + r];
      Y[(m0 + g) * N + n0 + r] = s;
    }
  }
}

// All M input rows against W rows [n0, n0 + R): groups of up to 3 input rows (4·3 accumulators, 3 inputs
// and one weight vector: the 16 AVX registers), the R weight rows staying in L1 between groups.
template <int R>
void rows(const float* W, const float* X, const float* bias, float* Y, int64_t n0, int64_t M, int64_t K,
          int64_t N) {
  int64_t m0 = 0;
  if (M == 1) {
    block<R, 1>(W, X, bias, Y, n0, 0, K, N);
    return;
  }
  for (; m0 + 3 <= M; m0 += 3) block<R, 3>(W, X, bias, Y, n0, m0, K, N);
  if (M - m0 == 2) block<R, 2>(W, X, bias, Y, n0, m0, K, N);
  if (M - m0 == 1) block<R, 1>(W, X, bias, Y, n0, m0, K, N);
}

}  // namespace

torch::Tensor few_rows_linear(const torch::Tensor& x, const torch::Tensor& weight,
                              const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "few_rows_linear: x [M, K] and weight [N, K] expected, got ", x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.device().is_cpu() &&
                  weight.device().is_cpu(),
              "few_rows_linear: float32 CPU tensors only");
  TORCH_CHECK(weight.is_contiguous(), "few_rows_linear: the weight must be contiguous");
  const auto X = x.contiguous();
  const int64_t M = X.size(0), K = X.size(1), N = weight.size(0);
  const float* b = nullptr;
  torch::Tensor B;
  if (bias.has_value() && bias->defined()) {
    B = bias->contiguous();
    TORCH_CHECK(B.scalar_type() == at::kFloat && B.numel() == N, "few_rows_linear: bias [N] float32 expected");
    b = B.data_ptr<float>();
  }
  auto y = torch::empty({M, N}, X.options());
  const float* w = weight.data_ptr<float>();
  const float* xp = X.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  constexpr int R = 4;
  const int64_t tiles = N / R;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) rows<R>(w, xp, b, yp, t * R, M, K, N);
  });
  for (int64_t n = tiles * R; n < N; ++n) rows<1>(w, xp, b, yp, n, M, K, N);
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("few_rows_linear", &few_rows_linear, "x·Wᵀ (+ b) for a few float32 rows (AVX2, FMA)");
}
