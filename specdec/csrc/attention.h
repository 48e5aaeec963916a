// One query's attention over its allowed cache slots (cache_attention in cpu_kernels.cpp), written once over a
// vector type `Vec` and included once per instruction set, like the products. Besides the products' needs,
// `Vec` provides: mul, sub, max, hmax(v) (the largest lane), round(v) (to nearest), pow2(n) (2^n for integral
// n in [-126, 127]), zero_below(x, bound, v) (v, 0 where x < bound), transpose_sum(v[lanes]) (lane j: the
// sum of v[j]'s lanes, by one tree for every j) and keep_first(v, count, fill) (lanes from `count` on: fill).
//
// The scalar loop this replaces spent its time on one horizontal sum per score, one libm exp per score and one
// load-add-store of the output per value row. Here `lanes` scores are summed together (a transpose-sum tree),
// the exps are vectorized, and the output stays in registers.
//
// Still one query alone: each score is its dot product summed the same way (one accumulator in ascending d,
// then the same transpose-sum tree whatever the score's place in its block), the exps and their total depend
// only on the query's scores in slot order, and the weighted values are summed in slot order (even and odd
// slots apart, then added). A query's output is a function of the query and its allowed slots alone, so a
// verified position gets the bits of a one-token step at that position.

// e^x for x <= 0, 0 below -87 (the softmax's exps, x = score - max): n = round(x·log2 e), r = x - n·ln 2 (ln 2
// split in two for precision), e^r (|r| <= ln2/2) by its Taylor polynomial to r^7 (truncation below 1e-8
// relative), times 2^n. Each lane's result depends on its own x alone.
static inline typename Vec::type exp_nonpositive(typename Vec::type x) {
  using T = typename Vec::type;
  const T t = Vec::max(x, Vec::broadcast(-87.0f));
  const T n = Vec::round(Vec::mul(t, Vec::broadcast(1.44269504f)));
  T r = Vec::fma(n, Vec::broadcast(-0.693359375f), t);
  r = Vec::fma(n, Vec::broadcast(2.12194440e-4f), r);
  T p = Vec::broadcast(1.0f / 5040);
  for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = Vec::fma(p, r, Vec::broadcast(c));
  return Vec::zero_below(x, -87.0f, Vec::mul(p, Vec::pow2(n)));
}

// Scores, softmax and weighted values of `query` [V·lanes floats] over the n slots `slot` (ascending, padded
// with the first slot up to a whole number of blocks), keys/values [S, V·lanes] row-major; `score` holds
// n rounded up to lanes floats. Writes the output row y [V·lanes].
template <int V>
static void attend(const float* query, const float* keys, const float* values, const int64_t* slot, int64_t n,
                   float scale, float* score, float* y) {
  using T = typename Vec::type;
  constexpr int L = Vec::lanes;
  constexpr int64_t D = static_cast<int64_t>(V) * L;
  T q[V];
  for (int v = 0; v < V; ++v) q[v] = Vec::load(query + v * L);
  const T scaled = Vec::broadcast(scale);
  T top = Vec::broadcast(-INFINITY);
  for (int64_t i0 = 0; i0 < n; i0 += L) {
    T acc[L];
#pragma GCC unroll 16
    for (int j = 0; j < L; ++j) {
      const float* key = keys + slot[i0 + j] * D;
      T a = Vec::zero();
      for (int v = 0; v < V; ++v) a = Vec::fma(q[v], Vec::load(key + v * L), a);
      acc[j] = a;
    }
    const T s = Vec::keep_first(Vec::mul(Vec::transpose_sum(acc), scaled), static_cast<int>(std::min<int64_t>(L, n - i0)),
                                -INFINITY);
    Vec::store(score + i0, s);
    top = Vec::max(top, s);
  }
  const T most = Vec::broadcast(Vec::hmax(top));
  T total = Vec::zero();
  for (int64_t i0 = 0; i0 < n; i0 += L) {  // past n: exp(-inf) = 0
    const T p = exp_nonpositive(Vec::sub(Vec::load(score + i0), most));
    Vec::store(score + i0, p);
    total = Vec::add(total, p);
  }
  T even[V], odd[V];
  for (int v = 0; v < V; ++v) even[v] = odd[v] = Vec::zero();
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    const T pe = Vec::broadcast(score[i]), po = Vec::broadcast(score[i + 1]);
    const float* ve = values + slot[i] * D;
    const float* vo = values + slot[i + 1] * D;
    for (int v = 0; v < V; ++v) {
      even[v] = Vec::fma(pe, Vec::load(ve + v * L), even[v]);
      odd[v] = Vec::fma(po, Vec::load(vo + v * L), odd[v]);
    }
  }
  if (i < n) {
    const T pe = Vec::broadcast(score[i]);
    for (int v = 0; v < V; ++v) even[v] = Vec::fma(pe, Vec::load(values + slot[i] * D + v * L), even[v]);
  }
  const T inv = Vec::broadcast(1.0f / Vec::sum(total));
  for (int v = 0; v < V; ++v) Vec::store(y + v * L, Vec::mul(Vec::add(even[v], odd[v]), inv));
}

// attend<D / lanes> where D is one of the widths compiled here (D = lanes·{1, 2, 4, 8, 16}); false otherwise.
static bool attend_any(int64_t D, const float* query, const float* keys, const float* values, const int64_t* slot,
                       int64_t n, float scale, float* score, float* y) {
  switch (D == 0 || D % Vec::lanes != 0 ? 0 : D / Vec::lanes) {
    case 1: attend<1>(query, keys, values, slot, n, scale, score, y); return true;
    case 2: attend<2>(query, keys, values, slot, n, scale, score, y); return true;
    case 4: attend<4>(query, keys, values, slot, n, scale, score, y); return true;
    case 8: attend<8>(query, keys, values, slot, n, scale, score, y); return true;
    case 16: attend<16>(query, keys, values, slot, n, scale, score, y); return true;
    default: return false;
  }
}
