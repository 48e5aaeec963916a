// The few-row product x·Wᵀ (+ b), written once over a vector type `Vec` and included by cpu_kernels.cpp once
// per instruction set (AVX2 + FMA, and AVX-512 where the CPU has it), each inside its own namespace and
// target region. `Vec` provides: type, lanes, zero(), load(p), fma(a, b, acc) (a·b + acc), sum(v) (a fixed
// horizontal sum).
//
// Bit-identical rows: each output element is one dot product summed the same way (one `lanes`-wide
// accumulator in ascending k, then the fixed horizontal sum, then the scalar tail, then the bias) whatever
// the number of rows M and whatever the blocking, so row m of an M-row product equals the one-row product
// of row m (for one instruction set).

// Rows [n0, n0 + R) of W against input rows [m0, m0 + G): R·G accumulators, W read once per k step. With
// `prefetch` (the first input group of a tile), the next tile's rows are fetched into L1 meanwhile: the
// hardware prefetcher alone leaves the memory idle while a tile is reused by the later groups.
template <int R, int G>
static void block(const float* W, const float* X, const float* bias, float* Y, int64_t n0, int64_t m0, int64_t K,
           int64_t N, bool prefetch) {
  typename Vec::type acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = Vec::zero();
  const char* next = reinterpret_cast<const char*>(W + (n0 + R) * K);
  prefetch = prefetch && n0 + 2 * R <= N;
  const int64_t body = K - K % Vec::lanes;
  for (int64_t k = 0; k < body; k += Vec::lanes) {
    if (prefetch)  // the bytes of the next tile in step with this tile's: R·lanes floats per step
      for (int line = 0; line < R * Vec::lanes * 4; line += 64) _mm_prefetch(next + k * R * 4 + line, _MM_HINT_T0);
    typename Vec::type xv[G];
    for (int g = 0; g < G; ++g) xv[g] = Vec::load(X + (m0 + g) * K + k);
    for (int r = 0; r < R; ++r) {
      const typename Vec::type w = Vec::load(W + (n0 + r) * K + k);
      for (int g = 0; g < G; ++g) acc[r][g] = Vec::fma(w, xv[g], acc[r][g]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) {
      float s = Vec::sum(acc[r][g]);
      for (int64_t k = body; k < K; ++k) s += W[(n0 + r) * K + k] * X[(m0 + g) * K + k];
      if (bias != nullptr) s += bias[n0 + r];
      Y[(m0 + g) * N + n0 + r] = s;
    }
  }
}

// The last `left` (< G) input rows from m0 on, in one block.
template <int R, int G>
static void rest(const float* W, const float* X, const float* bias, float* Y, int64_t n0, int64_t m0, int64_t left,
          int64_t K, int64_t N, bool prefetch) {
  if (left == G) {
    block<R, G>(W, X, bias, Y, n0, m0, K, N, prefetch);
  } else if constexpr (G > 1) {
    rest<R, G - 1>(W, X, bias, Y, n0, m0, left, K, N, prefetch);
  }
}

// All M input rows against W rows [n0, n0 + R), in groups of G (the accumulators, inputs and one weight
// vector fill the vector registers), the R weight rows staying in L1 between groups.
template <int R, int G>
static void tile(const float* W, const float* X, const float* bias, float* Y, int64_t n0, int64_t M, int64_t K,
          int64_t N) {
  int64_t m0 = 0;
  for (; m0 + G <= M; m0 += G) block<R, G>(W, X, bias, Y, n0, m0, K, N, m0 == 0);
  if (m0 < M) rest<R, G - 1>(W, X, bias, Y, n0, m0, M - m0, K, N, m0 == 0);
}

// y [M, N] = x [M, K] · W [N, K]ᵀ (+ bias [N]), the tiles of R weight rows split between the threads.
template <int G>
static void product(const float* W, const float* X, const float* bias, float* Y, int64_t M, int64_t K, int64_t N) {
  constexpr int R = 4;
  const int64_t tiles = N / R;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) tile<R, G>(W, X, bias, Y, t * R, M, K, N);
  });
  for (int64_t n = tiles * R; n < N; ++n) tile<1, G>(W, X, bias, Y, n, M, K, N);
}
