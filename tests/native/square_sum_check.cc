// Host check of SquareSum (ffi/kernels/square_sum.cuh): the same values added
// in any order and grouping, and merged in any order or as a warp merges them
// (every part raised to the common top, then the bins added), give the same
// bits; finite sums are within 2e-7 of a double sum; inf and NaN propagate.
// Built and run by tests/test_square_sum_cpu.py; prints "mismatches=N".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/square_sum.cuh"

using jaxll::SquareSum;

namespace {

std::mt19937 rng(1);

// The values split into random runs (added four at a time where they can be),
// the runs' sums merged in a random order, or as a warp merges them.
float grouped_sum(const std::vector<float>& w, int groups) {
  std::vector<SquareSum> parts;
  size_t i = 0;
  while (i < w.size()) {
    const size_t end = std::min(w.size(), i + 1 + rng() % (w.size() / groups + 1));
    SquareSum s = SquareSum::empty();
    size_t k = i;
    for (; k + 4 <= end; k += 4) {
      const float four[4] = {w[k], w[k + 1], w[k + 2], w[k + 3]};
      s.add_all<4>(four);
    }
    for (; k < end; ++k) s.add(w[k]);
    parts.push_back(s);
    i = end;
  }
  std::shuffle(parts.begin(), parts.end(), rng);
  if (rng() % 2) {
    int32_t top = SquareSum::kEmpty;
    for (const SquareSum& p : parts) top = std::max(top, p.top);
    SquareSum out{top, {0, 0, 0}};
    if (top < SquareSum::kInf && top != SquareSum::kEmpty) {
      for (SquareSum p : parts) {
        p.raise(top);
        for (int b = 0; b < 3; ++b) out.bin[b] += p.bin[b];
      }
    }
    return out.to_float();
  }
  while (parts.size() > 1) {
    const size_t a = rng() % parts.size(), b = rng() % parts.size();
    if (a == b) continue;
    parts[a].merge(parts[b]);
    parts.erase(parts.begin() + b);
  }
  return parts[0].to_float();
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

int main() {
  int mismatches = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9000);
    const int kind = trial % 6;
    std::normal_distribution<float> normal(0.f, kind == 0 ? 1e-3f : kind == 2 ? 1e3f : 1.f);
    std::vector<float> v(n);
    for (float& x : v) {
      float h = normal(rng);
      if (kind == 3) h = std::ldexp(h, static_cast<int>(rng() % 120) - 60);
      if (kind == 4) h = std::ldexp(h, static_cast<int>(rng() % 250) - 125);
      if (kind == 5 && rng() % 50 == 0) h = 0.f;
      x = h * h;
    }
    if (trial == 7) v[3] = INFINITY;
    if (trial == 13) v[3] = INFINITY, v[5] = NAN;
    const float ref = grouped_sum(v, 1);
    for (int r = 0; r < 5; ++r) {
      std::vector<float> w = v;
      std::shuffle(w.begin(), w.end(), rng);
      if (bits(grouped_sum(w, 1 + static_cast<int>(rng() % 64))) != bits(ref)) ++mismatches;
    }
    double exact = 0;
    for (float x : v) exact += x;
    if (std::isfinite(ref) && exact > 0 && std::fabs(ref - exact) / exact > 2e-7) ++mismatches;
    if (trial == 7 && !std::isinf(ref)) ++mismatches;
    if (trial == 13 && !std::isnan(ref)) ++mismatches;
  }
  std::printf("mismatches=%d\n", mismatches);
  return mismatches != 0;
}
