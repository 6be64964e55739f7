#include <set>

#include "weight_sync/internal.h"

namespace rlmesh::weight_sync {

using internal::AlignUp;
using internal::DtypeFromName;
using internal::SlotBytes;

absl::StatusOr<std::string> DtypeName(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return std::string("f32");
    case at::kBFloat16: return std::string("bf16");
    case at::kHalf: return std::string("f16");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype: unsupported ", c10::toString(t.scalar_type()), " (f32, bf16, f16)"));
  }
}

absl::StatusOr<WeightLayout> BuildLayout(const NamedTensors& tensors, int64_t version, int64_t bucket_bytes) {
  if (tensors.empty()) return absl::InvalidArgumentError("tensors: must not be empty");
  if (bucket_bytes <= 0) return absl::InvalidArgumentError("bucket_bytes: must be > 0");
  WeightLayout layout;
  layout.set_version(version);
  std::set<std::string> seen;
  int64_t used = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    if (name.empty()) return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "].name: must not be empty"));
    if (!seen.insert(name).second) return absl::InvalidArgumentError(absl::StrCat("tensors: duplicate name ", name));
    if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat("tensors[", name, "]: undefined tensor"));
    auto dtype = DtypeName(t);
    if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("tensors[", name, "].", dtype.status().message()));
    const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
    int64_t offset = AlignUp(used);
    if (layout.bucket_bytes_size() == 0 || (used > 0 && offset + nbytes > bucket_bytes)) {
      if (layout.bucket_bytes_size() > 0) layout.set_bucket_bytes(layout.bucket_bytes_size() - 1, used);
      layout.add_bucket_bytes(0);
      offset = 0;
    }
    TensorSlot* slot = layout.add_tensors();
    slot->set_name(name);
    for (int64_t d : t.sizes()) slot->add_shape(d);
    slot->set_dtype(*dtype);
    slot->set_byte_offset(offset);
    slot->set_bucket(layout.bucket_bytes_size() - 1);
    used = offset + nbytes;
  }
  layout.set_bucket_bytes(layout.bucket_bytes_size() - 1, used);
  return layout;
}

absl::Status ValidateLayout(const WeightLayout& layout) {
  std::set<std::string> seen;
  for (int i = 0; i < layout.bucket_bytes_size(); ++i) {
    if (layout.bucket_bytes(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("layout.bucket_bytes[", i, "]: negative"));
    }
  }
  for (const TensorSlot& slot : layout.tensors()) {
    auto dtype = DtypeFromName(slot.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("layout.tensors[", slot.name(), "].", dtype.status().message()));
    }
    if (!seen.insert(slot.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("layout.tensors: duplicate name ", slot.name()));
    }
    for (int64_t d : slot.shape()) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("layout.tensors[", slot.name(), "].shape: negative"));
    }
    if (slot.bucket() < 0 || slot.bucket() >= layout.bucket_bytes_size()) {
      return absl::InvalidArgumentError(absl::StrCat("layout.tensors[", slot.name(), "].bucket: ", slot.bucket(),
                                                     " outside [0, ", layout.bucket_bytes_size(), ")"));
    }
    const int64_t end = slot.byte_offset() + SlotBytes(slot, *dtype);
    if (slot.byte_offset() < 0 || end > layout.bucket_bytes(slot.bucket())) {
      return absl::InvalidArgumentError(absl::StrCat("layout.tensors[", slot.name(), "]: bytes [", slot.byte_offset(),
                                                     ", ", end, ") outside bucket ", slot.bucket(), " of ",
                                                     layout.bucket_bytes(slot.bucket()), " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::weight_sync
