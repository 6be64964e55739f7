#include "coordinator/pass_at_k.h"

namespace rlmesh {

double PassAtK(int n, int c, int k) {
  // C(n-c, k) / C(n, k) = prod_{i=n-c+1..n} (1 - k / i), which never forms
  // the (huge) binomials; 0 when n-c < k (every draw of k holds a right one).
  double none = n - c < k ? 0.0 : 1.0;
  for (int i = n - c + 1; i <= n && none > 0; ++i) none *= 1.0 - static_cast<double>(k) / i;
  return 1.0 - none;
}

double MeanPassAtK(const std::vector<int>& right, int n, int k) {
  if (right.empty()) return 0;
  double sum = 0;
  for (int c : right) sum += PassAtK(n, c, k);
  return sum / right.size();
}

}  // namespace rlmesh
