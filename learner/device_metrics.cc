#include "learner/device_metrics.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

namespace rlmesh::learner {

void DeviceMetrics::Add(const std::string& name, const at::Tensor& value) {
  names_.push_back(name);
  values_.push_back(value.detach().to(at::kDouble).reshape({}));
}

void DeviceMetrics::AddMaskedMean(const std::string& name, const at::Tensor& x, const at::Tensor& on,
                                  double empty) {
  const at::Tensor n = on.sum().to(at::kDouble);
  const at::Tensor sum = at::where(on, x.detach().to(at::kDouble), at::zeros({}, n.options())).sum();
  Add(name, at::where(n.gt(0), sum / n, at::full({}, empty, n.options())));
}

void DeviceMetrics::ReadInto(std::map<std::string, double>* out) {
  if (values_.empty()) return;
  const at::Tensor host = at::stack(values_).to(at::kCPU).contiguous();
  ++reads_;
  const double* v = host.data_ptr<double>();
  for (size_t i = 0; i < names_.size(); ++i) (*out)[names_[i]] = v[i];
  names_.clear();
  values_.clear();
}

}  // namespace rlmesh::learner
