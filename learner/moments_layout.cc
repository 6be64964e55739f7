#include "learner/moments_layout.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "actor/safetensors.h"
#include "common/status_macros.h"
#include "learner/expert_parallel.h"
#include "parallel/tensor_parallel.h"

namespace rlmesh::learner {

using parallel::TensorParallelSplitDim;

namespace {

int64_t NumelOf(const ParameterShapes& shapes) {
  int64_t n = 0;
  for (const auto& [name, shape] : shapes) n += c10::multiply_integers(shape);
  return n;
}

// `name` from `file`, which must be one-dimensional with `numel` elements.
absl::StatusOr<at::Tensor> ReadFlat(const actor::SafetensorsFile& file, const std::string& name, int64_t numel) {
  RLMESH_ASSIGN_OR_RETURN(at::Tensor t, file.Read(name));
  if (t.dim() != 1 || t.numel() != numel) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", name, " has shape ", c10::str(t.sizes()),
                                                   ", the layout expects [", numel, "]"));
  }
  return t;
}

// `whole(m_name)` and `whole(v_name)`, LibTorch's errors as INTERNAL.
absl::StatusOr<std::pair<at::Tensor, at::Tensor>> BothMoments(
    const std::function<absl::StatusOr<at::Tensor>(const std::string&)>& whole, const std::string& m_name,
    const std::string& v_name, const std::string& dir) {
  try {
    RLMESH_ASSIGN_OR_RETURN(at::Tensor m, whole(m_name));
    RLMESH_ASSIGN_OR_RETURN(at::Tensor v, whole(v_name));
    return std::make_pair(m, v);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(dir, ": gathering ", m_name, " and ", v_name, ": ",
                                            e.what_without_backtrace()));
  }
}

// Expert parallelism's per-rank files (moments_layout.h).
absl::StatusOr<std::pair<at::Tensor, at::Tensor>> ReadExpertParallel(const std::string& dir,
                                                                     const MomentsLayout& layout,
                                                                     const std::string& m_name,
                                                                     const std::string& v_name,
                                                                     const ParameterShapes& shapes) {
  const int ep = layout.ep;
  if (layout.zero1 || layout.tp != 1 || layout.world_size < ep || layout.world_size % ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": trainer_state says ep ", ep, " with world_size ",
                                                   layout.world_size, ", tp ", layout.tp, " and zero1 ",
                                                   layout.zero1, ", which no layout has"));
  }
  int64_t experts = 0;
  for (const auto& [name, shape] : shapes) experts = std::max<int64_t>(experts, ExpertOf(name) + 1);
  if (experts == 0 || experts % ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": ", experts, " experts per MoE layer cannot be split over ep=", ep));
  }
  // Each rank's parameters (indices into `shapes`) in its file's order. With
  // several expert-parallel groups, the first group's files hold them all
  // (the others' are alike).
  std::vector<std::vector<size_t>> order(ep);
  for (int r = 0; r < ep; ++r) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (ExpertOf(shapes[i].first) < 0) order[r].push_back(i);
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      const int e = ExpertOf(shapes[i].first);
      if (e >= 0 && e / (experts / ep) == r) order[r].push_back(i);
    }
  }
  std::vector<std::unique_ptr<actor::SafetensorsFile>> files(ep);
  for (int r = 0; r < ep; ++r) {
    RLMESH_ASSIGN_OR_RETURN(files[r],
                            actor::SafetensorsFile::Open(absl::StrFormat("%s/optimizer-rank-%d.safetensors", dir, r)));
  }
  auto whole = [&](const std::string& name) -> absl::StatusOr<at::Tensor> {
    std::vector<at::Tensor> parts(shapes.size());
    for (int r = 0; r < ep; ++r) {
      int64_t numel = 0;
      for (size_t i : order[r]) numel += c10::multiply_integers(shapes[i].second);
      RLMESH_ASSIGN_OR_RETURN(at::Tensor flat, ReadFlat(*files[r], name, numel));
      int64_t offset = 0;
      for (size_t i : order[r]) {
        const int64_t n = c10::multiply_integers(shapes[i].second);
        // The replicated parameters (stepped alike on every rank): rank 0's.
        if (!parts[i].defined()) parts[i] = flat.narrow(0, offset, n);
        offset += n;
      }
    }
    return at::cat(parts);
  };
  return BothMoments(whole, m_name, v_name, dir);
}

}  // namespace

absl::StatusOr<std::pair<at::Tensor, at::Tensor>> ReadWholeMoments(const std::string& dir,
                                                                   const MomentsLayout& layout,
                                                                   const std::string& prefix,
                                                                   const ParameterShapes& shapes) {
  const std::string m_name = prefix + ".exp_avg", v_name = prefix + ".exp_avg_sq";
  const int64_t total = NumelOf(shapes);
  if (layout.ep > 1) return ReadExpertParallel(dir, layout, m_name, v_name, shapes);
  if (!layout.zero1) {
    const std::string path = dir + "/optimizer.safetensors";
    RLMESH_ASSIGN_OR_RETURN(auto file, actor::SafetensorsFile::Open(path));
    RLMESH_ASSIGN_OR_RETURN(at::Tensor m, ReadFlat(*file, m_name, total));
    RLMESH_ASSIGN_OR_RETURN(at::Tensor v, ReadFlat(*file, v_name, total));
    return std::make_pair(m, v);
  }
  const int W = layout.world_size, T = layout.tp;
  if (W < 1 || T < 1 || W % T != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": trainer_state says world_size ", W, " and tp ", T, ", which no layout has"));
  }
  const int D = W / T;
  // One TP rank's slices: a split parameter's dimension is 1/T of the whole.
  ParameterShapes slice = shapes;
  std::vector<int> split(shapes.size(), -1);
  for (size_t i = 0; i < slice.size(); ++i) {
    if (T == 1) break;
    split[i] = TensorParallelSplitDim(slice[i].first);
    if (split[i] < 0) continue;
    int64_t& extent = slice[i].second.at(split[i]);
    if (extent % T != 0) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": parameter ", slice[i].first, " (", extent,
                                                     " along dimension ", split[i], ") cannot be split over tp=", T));
    }
    extent /= T;
  }
  const int64_t slice_numel = NumelOf(slice);
  const int64_t share = (slice_numel + D - 1) / D;  // DataParallel's ZeRO-1 share.

  std::vector<std::unique_ptr<actor::SafetensorsFile>> files(W);
  for (int r = 0; r < W; ++r) {
    RLMESH_ASSIGN_OR_RETURN(files[r],
                            actor::SafetensorsFile::Open(absl::StrFormat("%s/optimizer-rank-%d.safetensors", dir, r)));
  }
  auto whole = [&](const std::string& name) -> absl::StatusOr<at::Tensor> {
    // slices[t][i]: parameter i's moments on TP rank t.
    std::vector<std::vector<at::Tensor>> slices(T);
    for (int t = 0; t < T; ++t) {
      std::vector<at::Tensor> shares;
      for (int d = 0; d < D; ++d) {
        RLMESH_ASSIGN_OR_RETURN(at::Tensor s, ReadFlat(*files[d * T + t], name, share));
        shares.push_back(s);
      }
      const at::Tensor flat = at::cat(shares).narrow(0, 0, slice_numel);
      int64_t offset = 0;
      for (const auto& [pname, shape] : slice) {
        const int64_t n = c10::multiply_integers(shape);
        slices[t].push_back(flat.narrow(0, offset, n).view(shape));
        offset += n;
      }
    }
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (split[i] < 0) {
        // Replicated (every TP rank stepped the same gradient): rank 0's.
        parts.push_back(slices[0][i].reshape(-1));
        continue;
      }
      std::vector<at::Tensor> side;
      for (int t = 0; t < T; ++t) side.push_back(slices[t][i]);
      parts.push_back(at::cat(side, split[i]).reshape(-1));
    }
    return at::cat(parts);
  };
  return BothMoments(whole, m_name, v_name, dir);
}

absl::StatusOr<MomentsRangeReader> OpenMomentsRanges(const std::string& dir, const MomentsLayout& layout,
                                                     const std::string& prefix, const ParameterShapes& shapes) {
  if (layout.zero1 || layout.ep > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": the moments are in per-rank files (zero1 or ep > 1), not ranges of one flat tensor"));
  }
  const std::string path = dir + "/optimizer.safetensors";
  RLMESH_ASSIGN_OR_RETURN(std::shared_ptr<actor::SafetensorsFile> file, actor::SafetensorsFile::Open(path));
  const int64_t total = NumelOf(shapes);
  const std::string names[2] = {prefix + ".exp_avg", prefix + ".exp_avg_sq"};
  for (const std::string& name : names) {
    const actor::SafetensorsEntry* e = file->Find(name);
    if (e == nullptr) return absl::NotFoundError(absl::StrCat(path, ": no tensor \"", name, "\""));
    if (e->dtype != "F32" || e->shape.size() != 1 || e->shape[0] != total) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", name, " is ", e->dtype, " of shape [",
                                                     absl::StrJoin(e->shape, ", "), "], the layout expects F32 [",
                                                     total, "]"));
    }
  }
  return MomentsRangeReader([file, m = names[0], v = names[1]](int k, int64_t begin, int64_t count) {
    return file->ReadFlatRange(k == 0 ? m : v, begin, count);
  });
}

}  // namespace rlmesh::learner
