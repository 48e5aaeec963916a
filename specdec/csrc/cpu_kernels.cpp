// specdec's CPU kernels for the few rows of a decode or verification step, float32: the product x·Wᵀ (+ b)
// (AVX2 + FMA, or AVX-512 where the CPU has it), and the small ops between the products, fused (AVX2).
//
// Why: a decode step reads every weight once and does two FLOPs per weight read, so it is bound by
// memory bandwidth; oneDNN's and MKL's kernels read a SmolLM2-135M step's 538 MB at ~2/3 of what a plain
// read of the same bytes reaches on a 2-core x86 CPU. Two products stream W once at close to the plain read's
// speed, rows bit-identical whatever their number: over a row-major W (rows_product.h: each row reused from
// L1 by every input row) and over W packed in panels of 32 outputs (panel_product.h: what the compact forward
// uses, 1.3-1.5x faster at 8-32 rows).
// Built on first use by specdec/models/cpu_kernels.py (torch.utils.cpp_extension). The headers' functions are
// `static`: with default visibility in a shared library every call goes through the PLT and none is inlined.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace

namespace avx2 {

struct Vec {
  using type = __m256;
  static constexpr int lanes = 8;
  static type zero() { return _mm256_setzero_ps(); }
  static type load(const float* p) { return _mm256_loadu_ps(p); }
  static type load_half(const uint16_t* p) {  // 8 float16 values, widened exactly (F16C)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Outputs [first, first + 8) of a row of 4-bit codes (output j's in byte j % 16, high nibble from 16 on).
  static type nibbles(const uint8_t* row, int first) {
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + first % 16)));
    return _mm256_cvtepi32_ps(first >= 16 ? _mm256_srli_epi32(bytes, 4) : _mm256_and_si256(bytes, _mm256_set1_epi32(15)));
  }
  static type bytes(const int8_t* p) {  // 8 signed 8-bit codes
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* p, type v) { _mm256_storeu_ps(p, v); }
  static type broadcast(float s) { return _mm256_set1_ps(s); }
  static type fma(type a, type b, type acc) { return _mm256_fmadd_ps(a, b, acc); }
  static type add(type a, type b) { return _mm256_add_ps(a, b); }
  static float sum(type v) { return hsum(v); }
  static type mul(type a, type b) { return _mm256_mul_ps(a, b); }
  static type sub(type a, type b) { return _mm256_sub_ps(a, b); }
  static type max(type a, type b) { return _mm256_max_ps(a, b); }
  static float hmax(type v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  static type round(type v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static type pow2(type n) {  // 2^n for integral n in [-126, 127]: n + 127 in the exponent bits
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static type zero_below(type x, float bound, type v) {
    return _mm256_and_ps(v, _mm256_cmp_ps(x, _mm256_set1_ps(bound), _CMP_GE_OQ));
  }
  // Lane j: the sum of v[j]'s lanes, by the same tree for every j (halves, then pairs, then neighbours).
  static type transpose_sum(const type* v) {
    // Level 3 leaves lane 4h + e holding input 2e + h: input i is fed v[(i % 2)·4 + i / 2].
    constexpr int in[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    __m256 w[4], x[2];
    for (int i = 0; i < 4; ++i) {
      const __m256 a = v[in[2 * i]], b = v[in[2 * i + 1]];
      w[i] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    }
    for (int i = 0; i < 2; ++i)
      x[i] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * i], w[2 * i + 1], 0x44), _mm256_shuffle_ps(w[2 * i], w[2 * i + 1], 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(x[0], x[1], 0x88), _mm256_shuffle_ps(x[0], x[1], 0xDD));
  }
  static type keep_first(type v, int count, float fill) {
    const __m256 keep = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps(static_cast<float>(count)),
                                      _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), v, keep);
  }
};

#include "rows_product.h"
#include "panel_product.h"
#include "attention.h"

}  // namespace avx2

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {

struct Vec {
  using type = __m512;
  static constexpr int lanes = 16;
  static type zero() { return _mm512_setzero_ps(); }
  static type load(const float* p) { return _mm512_loadu_ps(p); }
  static type load_half(const uint16_t* p) {  // 16 float16 values, widened exactly
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // Outputs [first, first + 16) of a row of 4-bit codes (output j's in byte j % 16, high nibble from 16 on).
  static type nibbles(const uint8_t* row, int first) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + first % 16)));
    return _mm512_cvtepi32_ps(first >= 16 ? _mm512_srli_epi32(bytes, 4) : _mm512_and_si512(bytes, _mm512_set1_epi32(15)));
  }
  static type bytes(const int8_t* p) {  // 16 signed 8-bit codes
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* p, type v) { _mm512_storeu_ps(p, v); }
  static type broadcast(float s) { return _mm512_set1_ps(s); }
  static type fma(type a, type b, type acc) { return _mm512_fmadd_ps(a, b, acc); }
  static type add(type a, type b) { return _mm512_add_ps(a, b); }
  static float sum(type v) { return _mm512_reduce_add_ps(v); }
  static type mul(type a, type b) { return _mm512_mul_ps(a, b); }
  static type sub(type a, type b) { return _mm512_sub_ps(a, b); }
  static type max(type a, type b) { return _mm512_max_ps(a, b); }
  static float hmax(type v) { return _mm512_reduce_max_ps(v); }
  static type round(type v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static type pow2(type n) {  // 2^n for integral n in [-126, 127]: n + 127 in the exponent bits
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static type zero_below(type x, float bound, type v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(bound), _CMP_GE_OQ), v);
  }
  // Lane j: the sum of v[j]'s lanes, by the same tree for every j (quarters, then pairs, then neighbours).
  static type transpose_sum(const type* v) {
    // Level 4 leaves lane 4q + e holding input 4e + q: input i is fed v[(i % 4)·4 + i / 4].
    constexpr int in[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; ++i) {
      const __m512 a = v[in[2 * i]], b = v[in[2 * i + 1]];
      w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
    for (int i = 0; i < 4; ++i)
      x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i)
      y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44), _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
  }
  static type keep_first(type v, int count, float fill) {
    return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << count) - 1), _mm512_set1_ps(fill), v);
  }
};

#include "rows_product.h"
#include "panel_product.h"
#include "attention.h"

}  // namespace avx512
#pragma GCC pop_options

namespace {

// AVX-512 where the CPU has it (twice the lanes and registers: measured 1.2-1.5x at 8-32 rows on a Skylake
// Xeon); settable for tests and comparisons.
bool use_avx512 = [] {
  __builtin_cpu_init();  // this runs among the library's static initialisers
  return __builtin_cpu_supports("avx512f") != 0;
}();

}  // namespace

// The instruction set of the products and the attention: "avx512" or "avx2"; `isa` ("avx512", "avx2")
// chooses it first.
std::string product_isa(const std::string& isa) {
  if (isa == "avx2") use_avx512 = false;
  if (isa == "avx512") {
    TORCH_CHECK(__builtin_cpu_supports("avx512f"), "product_isa: this CPU has no AVX-512");
    use_avx512 = true;
  }
  return use_avx512 ? "avx512" : "avx2";
}

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
  if (use_avx512) {
    avx512::product<6>(weight.data_ptr<float>(), X.data_ptr<float>(), b, y.data_ptr<float>(), M, K, N);
  } else {
    avx2::product<3>(weight.data_ptr<float>(), X.data_ptr<float>(), b, y.data_ptr<float>(), M, K, N);
  }
  return y;
}

// y [M, N] = x [M, K] · Wᵀ (+ bias [N]) with W packed in panels (see panel_product.h): float32 or float16 values
// [ceil(N/32), K, 32] (float16: half the bytes to stream, widened exactly, so the same sums as float32 panels of
// the same values), or codes [ceil(N/32), K/32, bytes a block]: uint8 4-bit codes with a scale and an offset
// (Codes4, 768 bytes a block) or int8 8-bit codes with a scale (Codes8, 1152), the same sums again.
torch::Tensor panel_linear(const torch::Tensor& x, const torch::Tensor& panels, const c10::optional<torch::Tensor>& bias,
                           int64_t n) {
  const auto kind = panels.scalar_type();
  const bool codes = kind == at::kByte || kind == at::kChar;
  const int64_t block = kind == at::kByte ? avx2::Codes4::BLOCK : avx2::Codes8::BLOCK;
  TORCH_CHECK(x.dim() == 2 && panels.dim() == 3 && panels.size(0) == (n + avx2::PANEL - 1) / avx2::PANEL &&
                  (codes ? x.size(1) % avx2::KC == 0 && panels.size(1) == x.size(1) / avx2::KC && panels.size(2) == block
                         : panels.size(1) == x.size(1) && panels.size(2) == avx2::PANEL),
              "panel_linear: x [M, K] and panels [ceil(", n, "/32), K, 32] (values) or [ceil(", n, "/32), K/32, ",
              "768 (uint8) or 1152 (int8)] (codes) expected, got ", x.sizes(), " and ", panels.sizes(), " ", kind);
  TORCH_CHECK(x.scalar_type() == at::kFloat && (codes || kind == at::kFloat || kind == at::kHalf) &&
                  x.device().is_cpu() && panels.device().is_cpu() && panels.is_contiguous(),
              "panel_linear: float32 CPU x and float32, float16, uint8 or int8 CPU panels, contiguous");
  const auto X = x.contiguous();
  const int64_t M = X.size(0), K = X.size(1);
  const float* b = nullptr;
  torch::Tensor B;
  if (bias.has_value() && bias->defined()) {
    B = bias->contiguous();
    TORCH_CHECK(B.scalar_type() == at::kFloat && B.numel() == n, "panel_linear: bias [", n, "] float32 expected");
    b = B.data_ptr<float>();
  }
  auto y = torch::empty({M, n}, X.options());
  if (M == 0) return y;
  const float* x_data = X.data_ptr<float>();
  float* y_data = y.data_ptr<float>();
  if (kind == at::kByte) {
    const auto* w = panels.data_ptr<uint8_t>();
    if (use_avx512) {
      avx512::panel_product<12, avx512::Codes4>(w, x_data, b, y_data, M, K, n);
    } else {
      avx2::panel_product<3, avx2::Codes4>(w, x_data, b, y_data, M, K, n);
    }
  } else if (kind == at::kChar) {
    const auto* w = panels.data_ptr<int8_t>();
    if (use_avx512) {
      avx512::panel_product<12, avx512::Codes8>(w, x_data, b, y_data, M, K, n);
    } else {
      avx2::panel_product<3, avx2::Codes8>(w, x_data, b, y_data, M, K, n);
    }
  } else if (kind == at::kHalf) {
    const auto* w = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::Half>());
    if (use_avx512) {
      avx512::panel_product<12, avx512::Values<uint16_t>>(w, x_data, b, y_data, M, K, n);
    } else {
      avx2::panel_product<3, avx2::Values<uint16_t>>(w, x_data, b, y_data, M, K, n);
    }
  } else if (use_avx512) {
    avx512::panel_product<12, avx512::Values<float>>(panels.data_ptr<float>(), x_data, b, y_data, M, K, n);
  } else {
    avx2::panel_product<3, avx2::Values<float>>(panels.data_ptr<float>(), x_data, b, y_data, M, K, n);
  }
  return y;
}

// ---- the small ops between the products, fused: one pass over a row instead of 4-6 torch ops ----

namespace {

// Σ x² over a row of H floats: 8-lane accumulator in ascending order, then the fixed horizontal sum and tail.
inline float sum_squares(const float* x, int64_t H) {
  __m256 acc = _mm256_setzero_ps();
  const int64_t body = H - H % 8;
  for (int64_t i = 0; i < body; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float s = hsum(acc);
  for (int64_t i = body; i < H; ++i) s += x[i] * x[i];
  return s;
}

inline void scale_row(const float* x, const float* weight, float r, float* y, int64_t H) {
  const __m256 rv = _mm256_set1_ps(r);
  const int64_t body = H - H % 8;
  for (int64_t i = 0; i < body; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
  for (int64_t i = body; i < H; ++i) y[i] = weight[i] * (x[i] * r);
}

}  // namespace

// RMSNorm of each row of x [M, H] (Llama's: weight · x / sqrt(mean(x²) + eps)); with `delta`, the residual
// update first: x += delta in place (the stream after the sublayer), then the norm of the new x.
torch::Tensor rms_norm(torch::Tensor& x, const c10::optional<torch::Tensor>& delta, const torch::Tensor& weight,
                       double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "rms_norm: contiguous float32 [M, H]");
  const int64_t M = x.size(0), H = x.size(1);
  TORCH_CHECK(weight.numel() == H && weight.is_contiguous() && weight.scalar_type() == at::kFloat, "rms_norm: weight [H]");
  torch::Tensor d;
  if (delta.has_value() && delta->defined()) {
    d = delta->contiguous();
    TORCH_CHECK(d.sizes() == x.sizes() && d.scalar_type() == at::kFloat, "rms_norm: delta like x");
  }
  auto y = torch::empty_like(x);
  float* xp = x.data_ptr<float>();
  const float* dp = d.defined() ? d.data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    float* row = xp + m * H;
    if (dp != nullptr) {
      const float* dr = dp + m * H;
      for (int64_t i = 0; i < H; ++i) row[i] += dr[i];
    }
    const float r = 1.0f / std::sqrt(sum_squares(row, H) / static_cast<float>(H) + static_cast<float>(eps));
    scale_row(row, wp, r, yp + m * H, H);
  }
  return y;
}

// silu(a) · u = a · σ(a) · u for one row of I values, σ(a) = 1 / (1 + e^-|a|) for a >= 0 and e^-|a| / (1 + e^-|a|)
// below: one exp of a non-positive number per value (attention.h's, 8 at a time), never an overflow. Values
// past the last multiple of 8 take libm's exp; each value's bits depend on its place in the row and its inputs.
inline void silu_mul_row(const float* gate, const float* up, float* y, int64_t I) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  const int64_t body = I - I % 8;
  for (int64_t i = 0; i < body; i += 8) {
    const __m256 a = _mm256_loadu_ps(gate + i);
    const __m256 e = avx2::exp_nonpositive(_mm256_or_ps(a, sign));  // e^-|a|
    const __m256 sigmoid = _mm256_div_ps(_mm256_blendv_ps(one, e, a), _mm256_add_ps(one, e));  // e where a < 0
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(a, sigmoid), _mm256_loadu_ps(up + i)));
  }
  for (int64_t i = body; i < I; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// silu(gate) · up for a stacked [M, 2I] gate|up product -> [M, I].
torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.scalar_type() == at::kFloat &&
                  gate_up.size(1) % 2 == 0, "silu_mul: contiguous float32 [M, 2I]");
  const int64_t M = gate_up.size(0), I = gate_up.size(1) / 2;
  auto y = torch::empty({M, I}, gate_up.options());
  const float* g = gate_up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, M, M * I >= 16384 ? 1 : M, [&](int64_t begin, int64_t end) {  // a prefill: rows in parallel
    for (int64_t m = begin; m < end; ++m) silu_mul_row(g + m * 2 * I, g + m * 2 * I + I, yp + m * I, I);
  });
  return y;
}

// Rotary embedding of the q and k heads of a stacked q|k|v product [M, (Hq + 2 Hkv) · D] with cos/sin [M, D]
// (rotate_half convention) -> q [M, Hq, D], k [M, Hkv, D], v [M, Hkv, D], each contiguous.
std::vector<torch::Tensor> rope_qkv(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                                    int64_t hq, int64_t hkv) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && qkv.scalar_type() == at::kFloat, "rope_qkv: contiguous float32 [M, W]");
  const int64_t M = qkv.size(0), D = cos.size(-1), half = D / 2, W = qkv.size(1);
  TORCH_CHECK(W == (hq + 2 * hkv) * D && D % 2 == 0, "rope_qkv: width ", W, " != (", hq, " + 2·", hkv, ")·", D);
  const auto C = cos.reshape({M, D}).contiguous(), S = sin.reshape({M, D}).contiguous();
  auto q = torch::empty({M, hq, D}, qkv.options()), k = torch::empty({M, hkv, D}, qkv.options());
  auto v = qkv.narrow(1, (hq + hkv) * D, hkv * D).reshape({M, hkv, D}).contiguous();
  const float* src = qkv.data_ptr<float>();
  const float* cp = C.data_ptr<float>();
  const float* sp = S.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kp = k.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* c = cp + m * D;
    const float* s = sp + m * D;
    for (int64_t h = 0; h < hq + hkv; ++h) {
      const float* in = src + m * W + h * D;
      float* out = h < hq ? qp + (m * hq + h) * D : kp + (m * hkv + h - hq) * D;
      int64_t i = 0;
      for (; i + 8 <= half; i += 8) {  // 8 pairs at a time: the same products and sums, no fused multiply-adds
        const __m256 a = _mm256_loadu_ps(in + i), b = _mm256_loadu_ps(in + i + half);
        _mm256_storeu_ps(out + i, _mm256_sub_ps(_mm256_mul_ps(a, _mm256_loadu_ps(c + i)),
                                                _mm256_mul_ps(b, _mm256_loadu_ps(s + i))));
        _mm256_storeu_ps(out + i + half, _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(c + i + half)),
                                                       _mm256_mul_ps(a, _mm256_loadu_ps(s + i + half))));
      }
      for (; i < half; ++i) {
        out[i] = in[i] * c[i] - in[i + half] * s[i];
        out[i + half] = in[i + half] * c[i + half] + in[i] * s[i + half];
      }
    }
  }
  return {q, k, v};
}

// ---- attention of a decode or verification step over the per-row static cache (specdec/cache.py) ----

namespace {

// q·k over D floats: 8-lane accumulator in ascending order, then the fixed horizontal sum and tail.
inline float dot(const float* a, const float* b, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  const int64_t body = D - D % 8;
  for (int64_t i = 0; i < body; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum(acc);
  for (int64_t i = body; i < D; ++i) s += a[i] * b[i];
  return s;
}

// y += p·v over D floats.
inline void axpy(float p, const float* v, float* y, int64_t D) {
  const __m256 pv = _mm256_set1_ps(p);
  const int64_t body = D - D % 8;
  for (int64_t i = 0; i < body; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(y + i)));
  for (int64_t i = body; i < D; ++i) y[i] += p * v[i];
}

}  // namespace

// One step's attention with its cache writes: the T new tokens of each of B rows (q [B·T, Hq, D], k and v
// [B·T, Hkv, D], e.g. from rope_qkv) are written at slots lengths[b] + t of keys/values [B, Hkv, S, D]
// (uncommitted, as KVCache.write), then each query attends, with softmax(q·kᵀ / sqrt(D)), to the slots
// KVCache.attention_mask allows: its row's committed slots from pad[b] on, the new tokens tree_mask [T, T]
// allows (causal when undefined), and itself. Returns [B·T, Hq·D], each token's heads side by side. With
// `recent` = R > 0, tree_mask is [T, R + T] and decides the row's last R committed slots too (column j < R:
// slot lengths[b] - R + j; an EAGLE tree's drafted entries, of which each new token sees its ancestors).
//
// Each query is computed as if alone, over its allowed slots in ascending order (scores, their max, the exps
// and their sum, the weighted values; attention.h for head widths of 1, 2, 4, 8 or 16 vectors, a scalar loop
// for others): its output does not depend on the other queries of the step, so a verified position gets the
// bits that a one-token step at that position gets. The queries that read one (row, KV head) share the
// reads of its committed slots' keys and values (attention.h's attend_many).
torch::Tensor cache_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              torch::Tensor& keys, torch::Tensor& values, const torch::Tensor& lengths,
                              const torch::Tensor& pad, const c10::optional<torch::Tensor>& tree_mask,
                              int64_t recent) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && q.is_contiguous() && k.is_contiguous() &&
                  v.is_contiguous() && q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat,
              "cache_attention: contiguous float32 q [B·T, Hq, D], k and v [B·T, Hkv, D]");
  TORCH_CHECK(keys.dim() == 4 && keys.sizes() == values.sizes() && keys.is_contiguous() && values.is_contiguous() &&
                  keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat,
              "cache_attention: contiguous float32 keys and values [B, Hkv, S, D]");
  const int64_t B = keys.size(0), Hkv = keys.size(1), S = keys.size(2), D = keys.size(3);
  const int64_t M = q.size(0), Hq = q.size(1), T = M / B;
  TORCH_CHECK(M == B * T && k.size(0) == M && k.size(1) == Hkv && k.size(2) == D && q.size(2) == D && Hq % Hkv == 0,
              "cache_attention: q ", q.sizes(), ", k ", k.sizes(), " do not fit keys ", keys.sizes());
  const auto L = lengths.to(at::kLong).contiguous(), P = pad.to(at::kLong).contiguous();
  TORCH_CHECK(L.numel() == B && P.numel() == B, "cache_attention: lengths and pad [B] expected");
  const int64_t* len = L.data_ptr<int64_t>();
  const int64_t* pd = P.data_ptr<int64_t>();
  TORCH_CHECK(recent >= 0, "cache_attention: recent must be >= 0, got ", recent);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(0 <= pd[b] && recent <= len[b] && len[b] + T <= S, "cache_attention: row ", b, " has ", len[b],
                " slots committed (", recent, " of them masked) and ", T, " new tokens, beyond the cache's ", S);
  torch::Tensor tm;
  const bool* tree = nullptr;
  const int64_t columns = recent + T;
  if (tree_mask.has_value() && tree_mask->defined()) {
    tm = tree_mask->to(at::kBool).contiguous();
    TORCH_CHECK(tm.dim() == 2 && tm.size(0) == T && tm.size(1) == columns, "cache_attention: tree_mask [T, ", columns,
                "] expected (", recent, " recent slots + ", T, " new tokens), got ", tm.sizes());
    tree = tm.data_ptr<bool>();
  }
  TORCH_CHECK(recent == 0 || tree != nullptr, "cache_attention: recent slots need a tree_mask saying who sees them");
  float* kc = keys.data_ptr<float>();
  float* vc = values.data_ptr<float>();
  const float* kn = k.data_ptr<float>();
  const float* vn = v.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t dst = ((b * Hkv + h) * S + len[b] + t) * D, src = ((b * T + t) * Hkv + h) * D;
        std::copy(kn + src, kn + src + D, kc + dst);
        std::copy(vn + src, vn + src + D, vc + dst);
      }
  auto out = torch::empty({M, Hq * D}, q.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // A task: some of the queries that read one (row, KV head): its step's tokens × the query heads sharing the KV
  // head, split in pieces so that the threads have a few tasks each.
  const int64_t group = Hq / Hkv, queries = T * group, span = *std::max_element(len, len + B) + T;
  const int64_t pieces = std::min(queries, (2 * at::get_num_threads() + B * Hkv - 1) / (B * Hkv));
  const int64_t chunk = (queries + pieces - 1) / pieces;
  constexpr int64_t block = 16;  // the vector paths' score blocks: slots padded to a multiple of this
  const int64_t stride = span + block;
  at::parallel_for(0, B * Hkv * pieces, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> score(chunk * stride), acc(chunk * (2 * D + 1));
    std::vector<int64_t> slot(chunk * stride), n(chunk);
    std::vector<const float*> query(chunk);
    std::vector<float*> y(chunk);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (Hkv * pieces), kvh = task / pieces % Hkv, first = task % pieces * chunk;
      const int64_t count = std::min(chunk, queries - first);
      if (count <= 0) continue;
      // committed slots from the pad on, but the recent ones: seen by all
      const int64_t shared = std::max<int64_t>(0, len[b] - recent - pd[b]);
      const float* kb = kc + (b * Hkv + kvh) * S * D;
      const float* vb = vc + (b * Hkv + kvh) * S * D;
      for (int64_t c = 0; c < count; ++c) {
        const int64_t t = (first + c) / group, h = kvh * group + (first + c) % group, m = b * T + t;
        query[c] = qp + (m * Hq + h) * D;
        y[c] = op + (m * Hq + h) * D;
        // Its slots: the shared ones (attend_many reads the first query's list for their whole blocks), then
        // the recent and new ones it sees (a prefill may write over padding: only the token itself from
        // before the pad).
        int64_t* list = slot.data() + c * stride;
        for (int64_t i = c == 0 ? 0 : shared / block * block; i < shared; ++i) list[i] = pd[b] + i;
        int64_t k = shared;
        for (int64_t rel = -recent; rel < T; ++rel) {
          const int64_t s = len[b] + rel;
          if (rel == t || (s >= pd[b] && (tree != nullptr ? tree[t * columns + recent + rel] : rel < t))) list[k++] = s;
        }
        std::fill(list + k, list + k + block, list[k - 1]);
        n[c] = k;
      }
      if (use_avx512 ? avx512::attend_many_any(D, count, query.data(), y.data(), kb, vb, slot.data(), n.data(), stride,
                                               shared, scale, score.data(), acc.data())
                     : avx2::attend_many_any(D, count, query.data(), y.data(), kb, vb, slot.data(), n.data(), stride,
                                             shared, scale, score.data(), acc.data()))
        continue;
      for (int64_t c = 0; c < count; ++c) {  // other head widths: each query alone
        const int64_t* list = slot.data() + c * stride;
        const auto slot_of = [&](int64_t i) { return i < shared ? slot[i] : list[i]; };  // shared: the first list's
        float* s = score.data() + c * stride;
        for (int64_t i = 0; i < n[c]; ++i) s[i] = dot(query[c], kb + slot_of(i) * D, D) * scale;
        float top = s[0];
        for (int64_t i = 1; i < n[c]; ++i) top = std::max(top, s[i]);
        float total = 0.0f;
        for (int64_t i = 0; i < n[c]; ++i) total += (s[i] = std::exp(s[i] - top));
        std::fill(y[c], y[c] + D, 0.0f);
        for (int64_t i = 0; i < n[c]; ++i) axpy(s[i], vb + slot_of(i) * D, y[c], D);
        const float inv = 1.0f / total;
        for (int64_t i = 0; i < D; ++i) y[c][i] *= inv;
      }
    }
  });
  return out;
}

// The k largest log-softmax values of each row of logits [R, V] and their indices, largest first (equal values:
// the smaller index first): log_softmax(-1).topk(k) in three passes over a row (its max, its sum of exps
// with attention.h's exp, 8 at a time, then the top k, 8 values compared with the k-th best at a time; a
// value enters only above it). torch's topk over an 8192-token draft vocabulary costs ~40-70 us a row here.
std::vector<torch::Tensor> top_log_softmax(const torch::Tensor& logits, int64_t k) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.scalar_type() == at::kFloat,
              "top_log_softmax: contiguous float32 [R, V]");
  const int64_t R = logits.size(0), V = logits.size(1);
  TORCH_CHECK(k >= 1 && k <= V, "top_log_softmax: k must lie in [1, V]");
  auto values = torch::empty({R, k}, logits.options());
  auto indices = torch::empty({R, k}, logits.options().dtype(at::kLong));
  const int64_t body = V - V % 8;
  for (int64_t r = 0; r < R; ++r) {
    const float* x = logits.data_ptr<float>() + r * V;
    float* top = values.data_ptr<float>() + r * k;
    int64_t* at = indices.data_ptr<int64_t>() + r * k;
    __m256 most8 = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < body; i += 8) most8 = _mm256_max_ps(most8, _mm256_loadu_ps(x + i));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, most8);
    float most = -INFINITY;
    for (const float v : lanes) most = std::max(most, v);
    for (int64_t i = body; i < V; ++i) most = std::max(most, x[i]);
    __m256 total8 = _mm256_setzero_ps();
    const __m256 shift = _mm256_set1_ps(most);
    for (int64_t i = 0; i < body; i += 8)
      total8 = _mm256_add_ps(total8, avx2::exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift)));
    float total = hsum(total8);
    for (int64_t i = body; i < V; ++i) total += std::exp(x[i] - most);
    const float offset = most + std::log(total);
    int64_t filled = 0;
    auto offer = [&](int64_t i) {  // x[i] above the k-th best (or fewer than k so far): insert it in order
      const float v = x[i];
      int64_t j = filled < k ? filled++ : k - 1;
      while (j > 0 && top[j - 1] < v) {
        top[j] = top[j - 1];
        at[j] = at[j - 1];
        --j;
      }
      top[j] = v;
      at[j] = i;
    };
    int64_t i = 0;
    for (; i < std::min(k, V); ++i) offer(i);
    for (; i < body && i % 8; ++i) if (x[i] > top[k - 1]) offer(i);
    for (; i < body; i += 8) {
      int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(top[k - 1]), _CMP_GT_OQ));
      while (mask) {
        const int lane = __builtin_ctz(mask);
        mask &= mask - 1;
        if (x[i + lane] > top[k - 1]) offer(i + lane);  // the bar may have risen within these 8
      }
    }
    for (; i < V; ++i) if (x[i] > top[k - 1]) offer(i);
    for (int64_t j = 0; j < k; ++j) top[j] -= offset;
  }
  return {values, indices};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("few_rows_linear", &few_rows_linear, "x·Wᵀ (+ b) for a few float32 rows (AVX2 + FMA or AVX-512)");
  m.def("panel_linear", &panel_linear, "x·Wᵀ (+ bias) with W packed in panels [ceil(n/32), K, 32]", py::arg("x"),
        py::arg("panels"), py::arg("bias"), py::arg("n"));
  m.def("product_isa", &product_isa, "the products' and attention's instruction set (\"avx512\" or \"avx2\"), chosen first if given",
        py::arg("isa") = "");
  m.def("rms_norm", &rms_norm, "RMSNorm of each row, after an optional in-place residual update");
  m.def("silu_mul", &silu_mul, "silu(gate)·up of a stacked gate|up product");
  m.def("cache_attention", &cache_attention, "a step's cache writes and attention over the per-row static cache",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("keys"), py::arg("values"), py::arg("lengths"),
        py::arg("pad"), py::arg("tree_mask"), py::arg("recent") = 0);
  m.def("rope_qkv", &rope_qkv, "rotary embedding of q and k from a stacked q|k|v product");
  m.def("top_log_softmax", &top_log_softmax, "the k largest log-softmax values of each row and their indices",
        py::arg("logits"), py::arg("k"));
}
