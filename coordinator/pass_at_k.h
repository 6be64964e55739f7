#pragma once

// The unbiased pass@k estimator (Chen et al. 2021): from n samples of a
// prompt of which c are right, the chance that at least one of k drawn
// without replacement is right, 1 - C(n-c, k) / C(n, k). Pure functions.

#include <vector>

namespace rlmesh {

// REQUIRES: 0 <= c <= n, 1 <= k <= n.
double PassAtK(int n, int c, int k);

// PassAtK averaged over prompts; `right[p]` is the number of the n samples
// of prompt p that are right. 0 when there are no prompts.
double MeanPassAtK(const std::vector<int>& right, int n, int k);

}  // namespace rlmesh
