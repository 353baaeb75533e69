// Host check of the fused kernel's one order of a row's squares
// (ffi/kernels/square_tree.cuh): every cut the planner can make (units of 2,
// 4 or 8 elements, segments of a power-of-two number of units or the whole
// row, rounds of a power-of-two number of units, blocks of any multiple of 32
// threads, 512 where a round takes several passes, 1 to 64 segments) computed
// the way the kernels compute it (a thread's unit node, a warp's butterfly, a
// pass's butterfly over its warps, the block's tree over its passes pair by
// pair as they come, the tree
// over the row's segments) must give the bits
// of the tree over the row's elements; finite sums must be within 2e-6 of a
// double sum. The same cuts with a float sum in the cut's order (a thread's
// running sum, as a JAXLL_NORM_FLOAT_SUM build adds) must give other bits for
// some rows, or this check could not tell an order that follows the cut.
// Built and run by tests/test_square_tree_cpu.py; prints
// "mismatches=N float_sum_rows_differing=M".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/square_tree.cuh"

using jaxll::tree_add;

namespace {

std::mt19937 rng(1);

struct Cut {
  int elems;        // E: elements of a unit
  int64_t span;     // units of a segment
  int64_t chunk;    // units of a round
  int threads;      // of a block
};

// A warp's butterfly over 32 lanes, as warp_node does it (lanes l and l ^ m).
float butterfly(std::vector<float> v) {
  for (int m = 1; m < 32; m *= 2) {
    std::vector<float> next(32);
    for (int l = 0; l < 32; ++l) next[l] = tree_add(v[l], v[l ^ m]);
    v = next;
  }
  for (int l = 1; l < 32; ++l) {
    if (std::memcmp(&v[l], &v[0], 4) != 0 && !(std::isnan(v[l]) && std::isnan(v[0]))) {
      std::printf("lanes disagree\n");
    }
  }
  return v[0];
}

// The passes' nodes folded as RowSquares folds them: a binary counter of
// pending nodes by level as the passes come, then the pending nodes from the
// smallest level up.
float passes_tree(const std::vector<float>& passes) {
  float pending[32];
  for (size_t p = 0; p < passes.size(); ++p) {
    float v = passes[p];
    int l = 0;
    for (size_t k = p; k & 1; k >>= 1, ++l) v = tree_add(pending[l], v);
    pending[l] = v;
  }
  bool have = false;
  float v = 0.f;
  for (int l = 0; (passes.size() >> l) != 0; ++l) {
    if ((passes.size() >> l) & 1) {
      v = have ? tree_add(pending[l], v) : pending[l];
      have = true;
    }
  }
  return v;
}

// The row's sum of squares as the kernels compute it on cut `c`; float_sum:
// as a JAXLL_NORM_FLOAT_SUM build adds them instead.
float kernel_sum(const std::vector<float>& sq, const Cut& c, bool float_sum) {
  const int64_t units = static_cast<int64_t>(sq.size()) / c.elems;
  const int64_t segments = (units + c.span - 1) / c.span;
  auto unit = [&](int64_t u) {
    float v[8];
    for (int e = 0; e < c.elems; ++e) v[e] = sq[u * c.elems + e];
    switch (c.elems) {
      case 2: { float w[2] = {v[0], v[1]}; return jaxll::unit_node<2>(w); }
      case 4: { float w[4] = {v[0], v[1], v[2], v[3]}; return jaxll::unit_node<4>(w); }
      default: return jaxll::unit_node<8>(v);
    }
  };
  std::vector<float> seg_nodes;
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t u0 = s * c.span, len = std::min(units - u0, c.span);
    std::vector<float> passes;
    std::vector<float> run(c.threads, 0.f);
    for (int64_t r0 = 0; r0 < len; r0 += c.chunk) {
      const int64_t rlen = std::min(len - r0, c.chunk);
      for (int64_t b = 0; b < rlen; b += c.threads) {
        const int64_t plen = std::min<int64_t>(rlen - b, c.threads);
        std::vector<float> warps(32, 0.f);
        for (int w = 0; w < c.threads / 32; ++w) {
          std::vector<float> lanes(32, 0.f);
          for (int l = 0; l < 32; ++l) {
            const int64_t i = 32 * w + l;
            if (i < plen) lanes[l] = unit(u0 + r0 + b + i);
            run[32 * w + l] = tree_add(run[32 * w + l], lanes[l]);
          }
          const float g = butterfly(lanes);
          if (32 * w < plen) warps[w] = g;
        }
        passes.push_back(butterfly(warps));
      }
    }
    if (float_sum) {
      std::vector<float> warps(32, 0.f);
      for (int w = 0; w < c.threads / 32; ++w)
        warps[w] = butterfly(std::vector<float>(run.begin() + 32 * w, run.begin() + 32 * w + 32));
      seg_nodes.push_back(butterfly(warps));
    } else {
      seg_nodes.push_back(passes.size() == 1 ? passes[0] : passes_tree(passes));
    }
  }
  // the row's segments: lane l holds segments l (2l and 2l + 1 past 32)
  const int per = segments > 32 ? 2 : 1;
  std::vector<float> lanes(32, 0.f);
  for (int l = 0; l < 32; ++l) {
    for (int q = 0; q < per; ++q) {
      const int64_t j = l * per + q;
      if (j < segments) lanes[l] = q == 0 ? seg_nodes[j] : tree_add(lanes[l], seg_nodes[j]);
    }
  }
  return butterfly(lanes);
}

int64_t pow2_at_most(int64_t v) {
  int64_t p = 1;
  while (2 * p <= v) p *= 2;
  return p;
}

// A cut the planner could make for a row of `units` units of `elems` elements.
Cut random_cut(int64_t units, int elems) {
  Cut c;
  c.elems = elems;
  const int64_t s = 1 + rng() % 64;
  c.span = (units + s - 1) / s;
  if (c.span < units) {
    int64_t p = 1;
    while (p < c.span) p *= 2;
    c.span = p;
  }
  if ((units + c.span - 1) / c.span > 64) c.span = units;  // (at most 64 segments)
  const int64_t region = 16 * (1 + rng() % 80);  // (units of a 128-byte multiple)
  c.chunk = std::min(c.span, region);
  if (c.chunk < c.span) c.chunk = pow2_at_most(c.chunk);
  // (the planner's threads: 32 * ceil(min(chunk, 512) / 32), plus a warp or not, at most
  // 512; a round of more units than threads therefore has 512)
  const int64_t work = std::min<int64_t>(c.chunk, 512);
  c.threads = static_cast<int>(std::min<int64_t>(512, (work + 31) / 32 * 32 + 32 * (rng() % 2)));
  return c;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

bool same(float a, float b) { return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b)); }

}  // namespace

int main() {
  int mismatches = 0, float_differs = 0;
  std::normal_distribution<float> normal(0.f, 1.f);
  const int hiddens[] = {8, 12, 96, 128, 1000, 1024, 4096, 5120, 7168, 8192, 16384};
  for (int trial = 0; trial < 240; ++trial) {
    const int hidden = hiddens[trial % 11];
    const int elems = 2 << (rng() % 3);  // 2, 4, 8
    if (hidden % elems) continue;
    std::vector<float> sq(hidden);
    const int kind = trial % 8;
    for (int i = 0; i < hidden; ++i) {
      float h = normal(rng) * std::ldexp(1.f, static_cast<int>(rng() % (kind == 0 ? 60 : 8)) - 4);
      if (kind == 1 && rng() % 7 == 0) h = 0.f;
      sq[i] = h * h;
    }
    if (kind == 2) sq[rng() % hidden] = INFINITY;
    if (kind == 3) sq[rng() % hidden] = NAN;
    std::vector<float> padded = sq;
    const float want = jaxll::tree_of(padded.data(), hidden);
    double exact = 0;
    for (float v : sq) exact += v;
    if (std::isfinite(exact) && exact > 0 && std::fabs(want - exact) / exact > 2e-6) ++mismatches;
    if (kind == 2 && !std::isinf(want)) ++mismatches;
    if (kind == 3 && !std::isnan(want)) ++mismatches;
    const int64_t units = hidden / elems;
    bool differs = false;
    for (int k = 0; k < 12; ++k) {
      const Cut c = random_cut(units, elems);
      const Cut whole{elems, units, units, 512};
      if (!same(kernel_sum(sq, c, false), want)) {
        ++mismatches;
        std::printf("mismatch: hidden %d, E %d, span %lld, chunk %lld, threads %d\n", hidden,
                    elems, static_cast<long long>(c.span), static_cast<long long>(c.chunk),
                    c.threads);
      }
      if (!same(kernel_sum(sq, c, true), kernel_sum(sq, whole, true))) differs = true;
    }
    float_differs += differs ? 1 : 0;
  }
  std::printf("mismatches=%d float_sum_rows_differing=%d\n", mismatches, float_differs);
  return mismatches == 0 && float_differs > 0 ? 0 : 1;
}
