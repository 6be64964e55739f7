#pragma once
// Metric values computed where the tensors are and read back together: one
// device-to-host copy per loss call instead of a synchronising .item() per
// metric (on a GPU each .item() waits for everything queued before it).
//
// The values are the ones the host arithmetic gave: sums, counts and their
// quotient are taken in double on the device, which IEEE makes identical.
//
// Not thread-safe; one per computation.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

namespace rlmesh::learner {

class DeviceMetrics {
 public:
  // `value`: a tensor of one element (any dtype, any device); no grad kept.
  void Add(const std::string& name, const at::Tensor& value);
  // The mean of `x` over the positions where `on` is true; `empty` when none.
  void AddMaskedMean(const std::string& name, const at::Tensor& x, const at::Tensor& on, double empty = 0.0);
  // Writes every value added into `out` with one copy to the host (none
  // when nothing was added), and forgets them.
  void ReadInto(std::map<std::string, double>* out);
  // Copies to the host so far (what the tests count).
  int reads() const { return reads_; }

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> values_;
  int reads_ = 0;
};

}  // namespace rlmesh::learner
