#pragma once

// A Fenwick (binary indexed) tree over an array of non-negative weights that
// grows at any position: prefix sums and "which element holds the r-th unit
// of weight" in O(log n), as weighted random sampling needs. Used by the
// replay store's sample index (sampler.h).
//
// Set() recomputes the nodes that cover the changed element from their
// children instead of adding a delta, so a node's value is always the sum of
// the current weights in one fixed order: setting a weight to zero leaves no
// floating-point residue behind. Insert() at position i rebuilds the nodes
// from i on: O((n - i) log n), cheap for the near-the-end inserts it serves.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlmesh::replay {

template <typename T>
class Fenwick {
 public:
  size_t size() const { return weight_.size(); }
  T weight(size_t i) const { return weight_[i]; }

  // Inserts `w` before element i (i == size() appends).
  void Insert(size_t i, T w) {
    weight_.insert(weight_.begin() + static_cast<std::ptrdiff_t>(i), w);
    tree_.resize(weight_.size() + 1);
    for (size_t j = i + 1; j < tree_.size(); ++j) Rebuild(j);
  }

  void Set(size_t i, T w) {
    weight_[i] = w;
    for (size_t j = i + 1; j < tree_.size(); j += j & (~j + 1)) Rebuild(j);
  }

  // Sum of the weights of elements [0, n).
  T Prefix(size_t n) const {
    T sum = 0;
    for (size_t j = n; j > 0; j -= j & (~j + 1)) sum += tree_[j];
    return sum;
  }
  T Total() const { return Prefix(size()); }

  // The element i with Prefix(i) <= r < Prefix(i + 1), for 0 <= r < Total().
  // With floating-point weights rounding can return size() for r just below
  // Total(); callers clamp.
  size_t Find(T r) const {
    size_t pos = 0;
    size_t step = 1;
    while (step * 2 <= size()) step *= 2;
    for (; step > 0; step /= 2) {
      if (pos + step <= size() && tree_[pos + step] <= r) {
        pos += step;
        r -= tree_[pos];
      }
    }
    return pos;
  }

 private:
  // tree_[j] = weight_[j - 1] + its children tree_[j - 1], tree_[j - 2],
  // tree_[j - 4], ... (the lowest set bit of j bounds them).
  void Rebuild(size_t j) {
    T sum = weight_[j - 1];
    const size_t low = j & (~j + 1);
    for (size_t k = 1; k < low; k *= 2) sum += tree_[j - k];
    tree_[j] = sum;
  }

  std::vector<T> weight_;
  std::vector<T> tree_{T(0)};  // 1-based; tree_[0] unused
};

}  // namespace rlmesh::replay
