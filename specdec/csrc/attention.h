// A step's attention over its allowed cache slots (cache_attention in cpu_kernels.cpp), written once over a
// vector type `Vec` and included once per instruction set, like the products. Besides the products' needs,
// `Vec` provides: mul, sub, max, hmax(v) (the largest lane), round(v) (to nearest), pow2(n) (2^n for integral
// n in [-126, 127]), zero_below(x, bound, v) (v, 0 where x < bound), transpose_sum(v[lanes]) (lane j: the
// sum of v[j]'s lanes, by one tree for every j) and keep_first(v, count, fill) (lanes from `count` on: fill).
//
// The scalar loop this replaces spent its time on one horizontal sum per score, one libm exp per score and one
// load-add-store of the output per value row. Here `lanes` scores are summed together (a transpose-sum tree),
// the exps are vectorized, and the output stays in registers. The queries that read the same cache row (a
// step's tokens and the query heads of one KV head) read its committed slots' keys and values together.
//
// Still each query as if alone: each score is its dot product summed the same way (one accumulator in
// ascending d, then the same transpose-sum tree whatever the score's place in its block), the exps and their
// total depend only on the query's scores in slot order, and the weighted values are summed in slot order
// (even and odd slots apart, then added). A query's output is a function of the query and its allowed slots
// alone, so a verified position gets the bits of a one-token step at that position.

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

// One block of `lanes` scores, q·k·scale, of the slots slot[0..lanes) (those from `keep` on: -inf). A score's
// bits depend on its query and key alone (one accumulator in ascending d, then one tree for every lane).
template <int V>
static inline void score_block(const float* query, const float* keys, const int64_t* slot, int keep,
                               typename Vec::type scaled, float* out) {
  using T = typename Vec::type;
  constexpr int L = Vec::lanes;
  constexpr int64_t D = static_cast<int64_t>(V) * L;
  T q[V];
  for (int v = 0; v < V; ++v) q[v] = Vec::load(query + v * L);
  T acc[L];
#pragma GCC unroll 16
  for (int j = 0; j < L; ++j) {
    const float* key = keys + slot[j] * D;
    T a = Vec::zero();
    for (int v = 0; v < V; ++v) a = Vec::fma(q[v], Vec::load(key + v * L), a);
    acc[j] = a;
  }
  Vec::store(out, Vec::keep_first(Vec::mul(Vec::transpose_sum(acc), scaled), keep, -INFINITY));
}

// even/odd (V vectors each) += p[i]·values[slot[i]] for the even and the odd i of the pairs in [i0, i1).
template <int V>
static inline void add_pairs(typename Vec::type* even, typename Vec::type* odd, const float* p, const int64_t* slot,
                             const float* values, int64_t i0, int64_t i1) {
  using T = typename Vec::type;
  constexpr int L = Vec::lanes;
  constexpr int64_t D = static_cast<int64_t>(V) * L;
  for (int64_t i = i0; i + 1 < i1; i += 2) {
    const T pe = Vec::broadcast(p[i]), po = Vec::broadcast(p[i + 1]);
    const float* ve = values + slot[i] * D;
    const float* vo = values + slot[i + 1] * D;
    for (int v = 0; v < V; ++v) {
      even[v] = Vec::fma(pe, Vec::load(ve + v * L), even[v]);
      odd[v] = Vec::fma(po, Vec::load(vo + v * L), odd[v]);
    }
  }
}

// The queries of a step that read one (row, KV head) of the cache: `count` queries, query c at query[c]
// [V·lanes floats], over its n[c] slots at slot + c·stride (ascending, padded past n[c] with one of its slots
// up to a whole number of 16-slot blocks). Every query's first `shared` slots are the same (the row's
// committed slots, which all its step's tokens see) and are read from query 0's list: the other lists need
// entries only from `shared` rounded down to 16 on. Writes each query's output row y[c] [V·lanes]. Scratch:
// score [count·stride] and acc [count·(2·V·lanes + 1)] floats.
//
// The shared slots' keys and values are read once for all the queries, a block at a time (a block stays in
// L1 while every query uses it), instead of once per query from L2. Each query's arithmetic is the same as
// if it were alone: its scores block by block at the same places, the max, exps and their total over its
// own scores, and its weighted values summed in slot order, even and odd slots apart.
template <int V>
static void attend_many(int64_t count, const float* const* query, float* const* y, const float* keys,
                        const float* values, const int64_t* slot, const int64_t* n, int64_t stride, int64_t shared,
                        float scale, float* score, float* acc) {
  using T = typename Vec::type;
  constexpr int L = Vec::lanes;
  constexpr int64_t D = static_cast<int64_t>(V) * L;
  const T scaled = Vec::broadcast(scale);
  const int64_t whole = shared / L * L;  // the shared slots' whole blocks: scored for all queries at once
  for (int64_t i0 = 0; i0 < whole; i0 += L)
    for (int64_t c = 0; c < count; ++c) score_block<V>(query[c], keys, slot + i0, L, scaled, score + c * stride + i0);
  for (int64_t c = 0; c < count; ++c) {
    float* s = score + c * stride;
    for (int64_t i0 = whole; i0 < n[c]; i0 += L)
      score_block<V>(query[c], keys, slot + c * stride + i0, static_cast<int>(std::min<int64_t>(L, n[c] - i0)), scaled,
                     s + i0);
    T top = Vec::broadcast(-INFINITY);
    for (int64_t i0 = 0; i0 < n[c]; i0 += L) top = Vec::max(top, Vec::load(s + i0));
    const T most = Vec::broadcast(Vec::hmax(top));
    T total = Vec::zero();
    for (int64_t i0 = 0; i0 < n[c]; i0 += L) {  // past n: exp(-inf) = 0
      const T p = exp_nonpositive(Vec::sub(Vec::load(s + i0), most));
      Vec::store(s + i0, p);
      total = Vec::add(total, p);
    }
    acc[count * 2 * D + c] = Vec::sum(total);
  }
  std::fill(acc, acc + count * 2 * D, 0.0f);
  const int64_t paired = shared / 2 * 2;  // the shared slots' pairs: summed for all queries, 16 slots at a time
  for (int64_t i0 = 0; i0 < paired; i0 += 16) {
    const int64_t i1 = std::min<int64_t>(i0 + 16, paired);
    for (int64_t c = 0; c < count; ++c) {
      const float* p = score + c * stride;
      float* a = acc + c * 2 * D;
      T even[V], odd[V];
      for (int v = 0; v < V; ++v) even[v] = Vec::load(a + v * L), odd[v] = Vec::load(a + D + v * L);
      add_pairs<V>(even, odd, p, slot, values, i0, i1);
      for (int v = 0; v < V; ++v) Vec::store(a + v * L, even[v]), Vec::store(a + D + v * L, odd[v]);
    }
  }
  for (int64_t c = 0; c < count; ++c) {  // each query's own slots after the shared pairs
    const float* p = score + c * stride;
    const int64_t* at = slot + c * stride;
    const float* a = acc + c * 2 * D;
    const float sum = acc[count * 2 * D + c];
    T even[V], odd[V];
    for (int v = 0; v < V; ++v) even[v] = Vec::load(a + v * L), odd[v] = Vec::load(a + D + v * L);
    add_pairs<V>(even, odd, p, at, values, paired, n[c]);
    if ((n[c] - paired) % 2 == 1) {  // the last slot, unpaired: with the even ones
      const int64_t i = n[c] - 1;
      const T pe = Vec::broadcast(p[i]);
      for (int v = 0; v < V; ++v) even[v] = Vec::fma(pe, Vec::load(values + at[i] * D + v * L), even[v]);
    }
    const T inv = Vec::broadcast(1.0f / sum);
    for (int v = 0; v < V; ++v) Vec::store(y[c] + v * L, Vec::mul(Vec::add(even[v], odd[v]), inv));
  }
}

// attend_many<D / lanes> where D is one of the widths compiled here (D = lanes·{1, 2, 4, 8, 16}); false otherwise.
static bool attend_many_any(int64_t D, int64_t count, const float* const* query, float* const* y, const float* keys,
                            const float* values, const int64_t* slot, const int64_t* n, int64_t stride, int64_t shared,
                            float scale, float* score, float* acc) {
  switch (D == 0 || D % Vec::lanes != 0 ? 0 : D / Vec::lanes) {
#define SPECDEC_ATTEND(V) \
  case V: attend_many<V>(count, query, y, keys, values, slot, n, stride, shared, scale, score, acc); return true;
    SPECDEC_ATTEND(1) SPECDEC_ATTEND(2) SPECDEC_ATTEND(4) SPECDEC_ATTEND(8) SPECDEC_ATTEND(16)
#undef SPECDEC_ATTEND
    default: return false;
  }
}
