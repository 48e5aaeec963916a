// The few-row product over a weight packed in panels: x·Wᵀ (+ b) with W [N, K] stored as [N/32][K][32] (panel
// p holds outputs [32p, 32p + 32), one 32-float row per k; `pack_panels` in cpu_kernels.cpp builds it). Written
// once over a vector type `Vec` and included by cpu_kernels.cpp once per instruction set, like rows_product.h;
// `Vec` provides: type, lanes, zero(), load(p), store(p, v), broadcast(s), fma(a, b, acc) (a·b + acc), add(a, b).
//
// Why panels: each k step loads one row of the panel (32 outputs) and broadcasts one input value per row, so
// a block of MR input rows does MR·32 multiply-adds per 32 weights read, with the sums as plain vector lanes.
// The row-major product (rows_product.h) keeps a lanes-wide partial sum per output instead, so its input rows
// must be reloaded for every 4 outputs; past ~8 rows it was compute-bound at a quarter of the CPU's peak.
//
// The k axis is cut into blocks of KC: each block is summed from zero in ascending k, then added to the
// output's running total (kept in `park` between blocks). All the input rows' blocks run over a block of the
// panel while it is in L1, so the panel is read from memory once and its stream never pauses.
//
// Bit-identical rows: each output is summed in the same order (blocks of KC, ascending k inside each, blocks
// added in ascending order, then the bias) whatever the number of rows M and however they are grouped, so
// row m of an M-row product equals the one-row product of row m (for one instruction set).

// The panels hold float32 or float16 weights (`W` = float or uint16_t, the float16 bits): float16 panels stream
// half the bytes and are widened exactly as loaded, so they give the sums float32 panels of the same values give.

constexpr int PANEL = 32;    // outputs per panel
constexpr int64_t KC = 32;   // the k block: 4 KB of a panel
constexpr int AHEAD = 2048;  // bytes of the panel prefetched ahead of the k step

static inline typename Vec::type load_weights(const float* p) { return Vec::load(p); }
static inline typename Vec::type load_weights(const uint16_t* p) { return Vec::load_half(p); }

// Rows [0, MR) of x (row stride K) against panel k block [k0, k1): their sums for the block, added to `park`
// ([MR][32] floats) unless `first`. `prefetch` for the first row group of a block, which meets its bytes first.
template <int MR, typename W>
static inline void panel_block(const W* w, const float* x, float* park, int64_t k0, int64_t k1, int64_t K,
                 bool first, bool prefetch) {
  constexpr int V = PANEL / Vec::lanes;
  typename Vec::type acc[MR][V];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < V; ++v) acc[m][v] = Vec::zero();
  for (int64_t k = k0; k < k1; ++k) {
    const W* row = w + k * PANEL;
    if (prefetch)
      for (int line = 0; line < PANEL * static_cast<int>(sizeof(W)); line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(row) + AHEAD + line, _MM_HINT_T0);
    typename Vec::type wv[V];
    for (int v = 0; v < V; ++v) wv[v] = load_weights(row + v * Vec::lanes);
    for (int m = 0; m < MR; ++m) {
      const typename Vec::type xb = Vec::broadcast(x[m * K + k]);
      for (int v = 0; v < V; ++v) acc[m][v] = Vec::fma(wv[v], xb, acc[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int v = 0; v < V; ++v) {
      float* total = park + m * PANEL + v * Vec::lanes;
      Vec::store(total, first ? acc[m][v] : Vec::add(Vec::load(total), acc[m][v]));
    }
  }
}

// The `left` (<= MR) rows from x on, in one block.
template <int MR, typename W>
static inline void panel_rest(const W* w, const float* x, float* park, int64_t left, int64_t k0, int64_t k1,
                int64_t K, bool first, bool prefetch) {
  if (left == MR) {
    panel_block<MR>(w, x, park, k0, k1, K, first, prefetch);
  } else if constexpr (MR > 1) {
    panel_rest<MR - 1>(w, x, park, left, k0, k1, K, first, prefetch);
  }
}

// y [M, N] = x [M, K] · Wᵀ (+ bias [N]) over panels [ceil(N/32)][K][32] (outputs past N are padding): the panels
// split between the threads, the rows in about equal groups of at most MR.
template <int MR, typename W>
static void panel_product(const W* panels, const float* X, const float* bias, float* Y, int64_t M, int64_t K,
                   int64_t N) {
  const int64_t groups = (M + MR - 1) / MR, per = (M + groups - 1) / groups;
  const int64_t count = (N + PANEL - 1) / PANEL;
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> park(M * PANEL);
    for (int64_t p = begin; p < end; ++p) {
      const W* w = panels + p * K * PANEL;
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t k1 = std::min(K, k0 + KC);
        for (int64_t m0 = 0; m0 < M; m0 += per)
          panel_rest<MR>(w, X + m0 * K, park.data() + m0 * PANEL, std::min(per, M - m0), k0, k1, K, k0 == 0, m0 == 0);
      }
      const int64_t n0 = p * PANEL, width = std::min<int64_t>(PANEL, N - n0);
      for (int64_t m = 0; m < M; ++m) {
        const float* sums = park.data() + m * PANEL;
        float* out = Y + m * N + n0;
        if (width < PANEL) {  // the last panel of an N that is not a multiple of 32
          for (int64_t j = 0; j < width; ++j) out[j] = bias != nullptr ? sums[j] + bias[n0 + j] : sums[j];
          continue;
        }
        for (int v = 0; v < PANEL / Vec::lanes; ++v) {
          const typename Vec::type total = Vec::load(sums + v * Vec::lanes);
          Vec::store(out + v * Vec::lanes, bias != nullptr ? Vec::add(total, Vec::load(bias + n0 + v * Vec::lanes)) : total);
        }
      }
    }
  });
}
