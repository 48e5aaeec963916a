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

// The panels hold float32 or float16 weights (`Values`, `W` = float or uint16_t, the float16 bits), or codes with
// per-block scales (`Codes4`, `Codes8`: a dequantised GGUF model's weights, 0.75 or 1.125 bytes each): every form
// is widened to the exact float32 values before the same multiply-adds, so each gives the sums float32 panels of
// the same values give, with a quarter to a half of the bytes to stream.

constexpr int PANEL = 32;    // outputs per panel
constexpr int64_t KC = 32;   // the k block: 4 KB of a panel
constexpr int AHEAD = 2048;  // bytes of the panel prefetched ahead of the k step

static inline typename Vec::type load_weights(const float* p) { return Vec::load(p); }
static inline typename Vec::type load_weights(const uint16_t* p) { return Vec::load_half(p); }

// Where a panel's weights come from. `Source::panel(panels, p, K)` is panel p; its `block(k0)` is the view of
// k block [k0, k0 + KC) the block loop reads: `load(k, v)` the weights of row k, lanes [v·lanes, (v+1)·lanes),
// and `prefetch(k)` ahead of row k. Every source gives the float32 value of each weight exactly, so the sums
// are the same whatever the source of the same values.

// Values as they are: float32, or float16 widened exactly (`W` = float or uint16_t), [K][32] a panel.
template <typename W>
struct Values {
  static constexpr bool coded = false;
  const W* w;
  static Values panel(const W* panels, int64_t p, int64_t K) { return {panels + p * K * PANEL}; }
  Values block(int64_t) const { return *this; }
  void prefetch(int64_t k) const {
    const char* row = reinterpret_cast<const char*>(w + k * PANEL);
    for (int line = 0; line < PANEL * static_cast<int>(sizeof(W)); line += 64)
      _mm_prefetch(row + AHEAD + line, _MM_HINT_T0);
  }
  typename Vec::type load(int64_t k, int v) const { return load_weights(w + k * PANEL + v * Vec::lanes); }
};

// A coded block's rows [k0, k0 + rows) as float32 values into out [rows][32], prefetching the block ahead.
template <typename View>
static inline void widen_rows(const View& view, int64_t k0, float* out, int64_t rows) {
  for (int64_t k = k0; k < k0 + rows; ++k) {
    view.prefetch(k);
    for (int v = 0; v < PANEL / Vec::lanes; ++v) Vec::store(out + (k - k0) * PANEL + v * Vec::lanes, view.load(k, v));
  }
}

// The `bytes` of a coded block from `start` on, AHEAD bytes ahead.
static inline void prefetch_block(const void* start, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(start) + AHEAD + line, _MM_HINT_T0);
}

// A block widened from codes (k rows from k0, in L1), read by every row group when there are several: the codes
// are widened once per block, not once per group of MR input rows (at 16 rows, two groups, that took ~30% more
// time than float32 panels). One group reads the codes directly (widening through memory cost 1 row ~1.6x).
struct Widened {
  const float* values;
  int64_t k0;
  Widened block(int64_t) const { return *this; }
  void prefetch(int64_t) const {}
  typename Vec::type load(int64_t k, int v) const { return Vec::load(values + (k - k0) * PANEL + v * Vec::lanes); }
};

// Weights that are 4-bit codes in blocks of 32 along k (a GGUF Q4_1 or Q4_K model, dequantised): weight = scale ·
// code + offset, one scale and one offset per output and block. A panel is K/32 blocks of scale [32] and offset
// [32] (float32) and codes [32 k][16 bytes] (byte j: output j's code in the low nibble, output j + 16's in the
// high), 0.75 bytes a weight. scale · code is exact (a float16 value, or Q4_K's d · sc, times a code), so one FMA
// rounds as the dequantiser's multiply then add did (`pack_codes` checks both on every weight).
struct Codes4 {
  static constexpr bool coded = true;
  static constexpr int64_t BLOCK = 2 * PANEL * 4 + KC * PANEL / 2;  // bytes of a block: 768
  const uint8_t* w;
  static Codes4 panel(const uint8_t* panels, int64_t p, int64_t K) { return {panels + p * (K / KC) * BLOCK}; }
  struct View {
    const float* scale;
    const float* offset;
    const uint8_t* codes;  // of row k0
    int64_t k0;
    void prefetch(int64_t k) const {
      if (k == k0) prefetch_block(scale, BLOCK);  // the whole block, at its first row
    }
    typename Vec::type load(int64_t k, int v) const {
      const typename Vec::type code = Vec::nibbles(codes + (k - k0) * (PANEL / 2), v * Vec::lanes);
      return Vec::fma(Vec::load(scale + v * Vec::lanes), code, Vec::load(offset + v * Vec::lanes));
    }
    void widen(float* out, int64_t rows) const { widen_rows(*this, k0, out, rows); }
  };
  View block(int64_t k0) const {
    const uint8_t* start = w + (k0 / KC) * BLOCK;
    const float* scale = reinterpret_cast<const float*>(start);
    return {scale, scale + PANEL, start + 2 * PANEL * 4, k0};
  }
};

// Weights that are signed 8-bit codes in blocks of 32 along k (GGUF Q8_0 or Q5_0, dequantised): weight = scale ·
// code. A panel is K/32 blocks of scale [32] (float32) and codes [32 k][32] (int8), 1.125 bytes a weight; one
// product rounds as the dequantiser's did (`pack_codes` checks every weight).
struct Codes8 {
  static constexpr bool coded = true;
  static constexpr int64_t BLOCK = PANEL * 4 + KC * PANEL;  // bytes of a block: 1152
  const int8_t* w;
  static Codes8 panel(const int8_t* panels, int64_t p, int64_t K) { return {panels + p * (K / KC) * BLOCK}; }
  struct View {
    const float* scale;
    const int8_t* codes;  // of row k0
    int64_t k0;
    void prefetch(int64_t k) const {
      if (k == k0) prefetch_block(scale, BLOCK);  // the whole block, at its first row
    }
    typename Vec::type load(int64_t k, int v) const {
      return Vec::mul(Vec::load(scale + v * Vec::lanes), Vec::bytes(codes + (k - k0) * PANEL + v * Vec::lanes));
    }
    void widen(float* out, int64_t rows) const { widen_rows(*this, k0, out, rows); }
  };
  View block(int64_t k0) const {
    const int8_t* start = w + (k0 / KC) * BLOCK;
    return {reinterpret_cast<const float*>(start), start + PANEL * 4, k0};
  }
};

// Rows [0, MR) of x (row stride K) against panel k block [k0, k1): their sums for the block, added to `park`
// ([MR][32] floats) unless `first`. `prefetch` for the first row group of a block, which meets its bytes first.
template <int MR, typename Source>
static inline void panel_block(const Source& source, const float* x, float* park, int64_t k0, int64_t k1, int64_t K,
                               bool first, bool prefetch) {
  constexpr int V = PANEL / Vec::lanes;
  typename Vec::type acc[MR][V];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < V; ++v) acc[m][v] = Vec::zero();
  const auto block = source.block(k0);
  for (int64_t k = k0; k < k1; ++k) {
    if (prefetch) block.prefetch(k);
    typename Vec::type wv[V];
    for (int v = 0; v < V; ++v) wv[v] = block.load(k, v);
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
template <int MR, typename Source>
static inline void panel_rest(const Source& w, const float* x, float* park, int64_t left, int64_t k0, int64_t k1,
                int64_t K, bool first, bool prefetch) {
  if (left == MR) {
    panel_block<MR>(w, x, park, k0, k1, K, first, prefetch);
  } else if constexpr (MR > 1) {
    panel_rest<MR - 1>(w, x, park, left, k0, k1, K, first, prefetch);
  }
}

// y [M, N] = x [M, K] · Wᵀ (+ bias [N]) over panels [ceil(N/32)][K][32] (outputs past N are padding): the panels
// split between the threads, the rows in about equal groups of at most MR.
template <int MR, typename Source, typename W>
static void panel_product(const W* panels, const float* X, const float* bias, float* Y, int64_t M, int64_t K,
                   int64_t N) {
  const int64_t groups = (M + MR - 1) / MR, per = (M + groups - 1) / groups;
  const int64_t count = (N + PANEL - 1) / PANEL;
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> park(M * PANEL);
    for (int64_t p = begin; p < end; ++p) {
      const Source w = Source::panel(panels, p, K);
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t k1 = std::min(K, k0 + KC);
        if constexpr (Source::coded) {
          if (groups == 1) {  // one row group: the codes widened in registers as they are read
            panel_rest<MR>(w, X, park.data(), M, k0, k1, K, k0 == 0, true);
            continue;
          }
          alignas(64) float values[KC * PANEL];
          w.block(k0).widen(values, k1 - k0);
          const Widened block{values, k0};
          for (int64_t m0 = 0; m0 < M; m0 += per)
            panel_rest<MR>(block, X + m0 * K, park.data() + m0 * PANEL, std::min(per, M - m0), k0, k1, K, k0 == 0, false);
        } else {
          for (int64_t m0 = 0; m0 < M; m0 += per)
            panel_rest<MR>(w, X + m0 * K, park.data() + m0 * PANEL, std::min(per, M - m0), k0, k1, K, k0 == 0, m0 == 0);
        }
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
