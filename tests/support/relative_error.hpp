#pragma once
// The equivalence bound's measure, shared by every suite that compares trained parameters.
#include <algorithm>
#include <cmath>
#include <vector>

namespace test {

// Largest per-parameter relative error ||a - b|| / max(||b||, tiny).
inline double max_relative_error(const std::vector<std::vector<float>>& a,
                                 const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double diff = 0, norm = 0;
    for (std::size_t k = 0; k < a[i].size(); ++k) {
      diff += std::pow(static_cast<double>(a[i][k]) - b[i][k], 2);
      norm += std::pow(static_cast<double>(b[i][k]), 2);
    }
    worst = std::max(worst, std::sqrt(diff) / std::max(std::sqrt(norm), 1e-12));
  }
  return worst;
}

}  // namespace test
