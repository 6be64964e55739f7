#include "actor/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace rlmesh::actor {
namespace {

using nlohmann::json;

// Largest header the format allows (the reference implementation caps it at
// 100 MB); beyond that a length is treated as corrupt.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

int64_t ElementSize(c10::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

}  // namespace

absl::StatusOr<c10::ScalarType> SafetensorsDtype(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> kTypes = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  auto it = kTypes.find(name);
  if (it == kTypes.end()) return absl::InvalidArgumentError(absl::StrCat("unsupported dtype \"", name, "\""));
  return it->second;
}

absl::StatusOr<std::string> SafetensorsDtypeName(c10::ScalarType t) {
  switch (t) {
    case at::kDouble: return std::string("F64");
    case at::kFloat: return std::string("F32");
    case at::kHalf: return std::string("F16");
    case at::kBFloat16: return std::string("BF16");
    case at::kLong: return std::string("I64");
    case at::kInt: return std::string("I32");
    case at::kShort: return std::string("I16");
    case at::kChar: return std::string("I8");
    case at::kByte: return std::string("U8");
    case at::kBool: return std::string("BOOL");
    default: return absl::InvalidArgumentError(absl::StrCat("dtype ", c10::toString(t), " has no safetensors name"));
  }
}

absl::StatusOr<c10::ScalarType> ParseDtype(const std::string& name) {
  if (name == "fp32" || name == "float32" || name == "f32" || name == "float") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "f16" || name == "half") return at::kHalf;
  return absl::InvalidArgumentError(absl::StrCat("dtype: expected fp32, bf16 or fp16, got \"", name, "\""));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": file is ", f->size_, " bytes, shorter than the 8-byte header length at byte 0"));
  }
  void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap ", path, ": ", std::strerror(errno)));
  f->map_ = static_cast<const uint8_t*>(m);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f->map_[i];
  if (n > kMaxHeaderBytes || n > f->size_ - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", n, " (bytes 0-7) runs beyond the file size ",
                                            f->size_, " (truncated or not a safetensors file)"));
  }
  f->data_start_ = 8 + n;
  json header;
  try {
    header = json::parse(f->map_ + 8, f->map_ + 8 + n);
  } catch (const json::parse_error& e) {
    return absl::DataLossError(
        absl::StrCat(path, ": corrupt header JSON at byte ", 8 + e.byte - (e.byte > 0 ? 1 : 0), ": ", e.what()));
  } catch (const json::exception& e) {
    // Not only syntax: a number too large for a double ("55e555555551") is
    // out_of_range, which escaped here once (fuzz/corpus/safetensors).
    return absl::DataLossError(absl::StrCat(path, ": corrupt header JSON: ", e.what()));
  }
  if (!header.is_object()) return absl::DataLossError(absl::StrCat(path, ": header JSON at byte 8 is not an object"));
  const uint64_t data_size = f->size_ - f->data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (it->is_object()) {
        for (auto m2 = it->begin(); m2 != it->end(); ++m2) {
          if (m2->is_string()) f->metadata_[m2.key()] = m2->get<std::string>();
        }
      }
      continue;
    }
    auto bad = [&](const std::string& why) {
      return absl::DataLossError(absl::StrCat(path, ": tensor \"", name, "\": ", why));
    };
    const json& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets")) {
      return bad("header entry needs dtype, shape and data_offsets");
    }
    SafetensorsEntry entry;
    entry.name = name;
    if (!e["dtype"].is_string()) return bad("dtype is not a string");
    entry.dtype = e["dtype"].get<std::string>();
    auto st_type = SafetensorsDtype(entry.dtype);
    if (!st_type.ok()) return bad(std::string(st_type.status().message()));
    if (!e["shape"].is_array()) return bad("shape is not a list");
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) return bad("shape has a negative or non-integer dimension");
      uint64_t dim = d.get<uint64_t>();
      if (dim > 0 && numel > (uint64_t{1} << 62) / dim) return bad("shape overflows");
      numel *= dim;
      entry.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad("data_offsets must be two non-negative integers");
    }
    entry.begin = off[0].get<uint64_t>();
    entry.end = off[1].get<uint64_t>();
    if (entry.end < entry.begin) return bad(absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "] end before they begin"));
    const uint64_t want = numel * static_cast<uint64_t>(ElementSize(*st_type));
    if (entry.end - entry.begin != want) {
      return bad(absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "] hold ", entry.end - entry.begin,
                              " bytes but shape needs ", want));
    }
    if (entry.end > data_size) {
      return bad(absl::StrCat("data ends at byte ", f->data_start_ + entry.end, " beyond the file size ", f->size_,
                              " (truncated)"));
    }
    f->entries_.push_back(std::move(entry));
  }
  std::sort(f->entries_.begin(), f->entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < f->entries_.size(); ++i) {
    if (i > 0 && f->entries_[i].begin < f->entries_[i - 1].end) {
      return absl::DataLossError(absl::StrCat(path, ": tensor \"", f->entries_[i].name, "\" overlaps tensor \"",
                                              f->entries_[i - 1].name, "\" at byte ", f->data_start_ + f->entries_[i].begin));
    }
    f->by_name_[f->entries_[i].name] = i;
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

absl::StatusOr<at::Tensor> SafetensorsFile::Read(const std::string& name) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no tensor \"", name, "\""));
  auto type = SafetensorsDtype(e->dtype);
  if (!type.ok()) return type.status();
  at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(*type));
  if (e->end > e->begin) std::memcpy(t.data_ptr(), map_ + data_start_ + e->begin, e->end - e->begin);
  return t;
}

absl::StatusOr<at::Tensor> SafetensorsFile::ReadFlatRange(const std::string& name, int64_t begin,
                                                          int64_t count) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no tensor \"", name, "\""));
  auto type = SafetensorsDtype(e->dtype);
  if (!type.ok()) return type.status();
  int64_t numel = 1;
  for (int64_t d : e->shape) numel *= d;
  if (begin < 0 || count < 0 || begin > numel || count > numel - begin) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": elements [", begin, ", ", begin + count, ") of \"", name,
                                              "\" lie outside its ", numel));
  }
  at::Tensor t = at::empty({count}, at::TensorOptions().dtype(*type));
  const uint64_t size = c10::elementSize(*type);
  if (count > 0) std::memcpy(t.data_ptr(), map_ + data_start_ + e->begin + begin * size, count * size);
  return t;
}

struct SafetensorsWriter::State {
  explicit State(const std::string& path) : file(path) {}
  AtomicFileWriter file;
  std::vector<SafetensorsSpec> specs;
  std::vector<int64_t> numel;
  std::map<std::string, size_t> index;
  size_t current = 0;       // the tensor being written
  int64_t written = 0;      // its elements written so far
  absl::Status finished;    // set by an error: the writer is done
  bool committed = false;
};

SafetensorsWriter::SafetensorsWriter(std::unique_ptr<State> state) : state_(std::move(state)) {}
SafetensorsWriter::~SafetensorsWriter() = default;  // AtomicFileWriter drops an uncommitted temp file

const std::string& SafetensorsWriter::path() const { return state_->file.path(); }

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Open(
    const std::string& path, std::vector<SafetensorsSpec> specs, const std::map<std::string, std::string>& metadata) {
  auto state = std::make_unique<State>(path);
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsSpec& spec : specs) {
    const std::string& name = spec.name;
    if (name.empty() || name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("tensor name \"", name, "\" is reserved"));
    }
    if (header.contains(name)) return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" appears twice"));
    auto dtype = SafetensorsDtypeName(spec.dtype);
    if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\": ", dtype.status().message()));
    int64_t n = 1;
    for (int64_t d : spec.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\": negative dimension ", d));
      n *= d;
    }
    const uint64_t bytes = static_cast<uint64_t>(n) * ElementSize(spec.dtype);
    header[name] = {{"dtype", *dtype}, {"shape", spec.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    state->index[name] = state->numel.size();
    state->numel.push_back(n);
  }
  state->specs = std::move(specs);
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // data section 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xff);
  RLMESH_RETURN_IF_ERROR(state->file.Open());
  RLMESH_RETURN_IF_ERROR(state->file.Append(len, 8));
  RLMESH_RETURN_IF_ERROR(state->file.Append(h.data(), h.size()));
  // Zero-sized tensors at the front are complete already.
  while (state->current < state->numel.size() && state->numel[state->current] == 0) ++state->current;
  return std::unique_ptr<SafetensorsWriter>(new SafetensorsWriter(std::move(state)));
}

absl::Status SafetensorsWriter::Fail(absl::Status s) {
  if (state_->finished.ok()) state_->finished = s;
  return s;
}

absl::Status SafetensorsWriter::AppendTensor(const std::string& name, const at::Tensor& t) {
  State& st = *state_;
  if (!st.finished.ok() || st.committed) return absl::FailedPreconditionError("SafetensorsWriter: finished");
  auto it = st.index.find(name);
  // A zero-sized tensor has no bytes: the cursor passes it by itself.
  const bool empty = it != st.index.end() && st.numel[it->second] == 0;
  if (it == st.index.end() || (!empty && (it->second != st.current || st.written != 0))) {
    const std::string expected = st.current < st.specs.size() ? st.specs[st.current].name : "(none: all written)";
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(path(), ": tensor \"", name, "\" out of order; the next is \"", expected, "\"")));
  }
  const SafetensorsSpec& spec = st.specs[it->second];
  if (!t.defined() || t.sizes().vec() != spec.shape) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(path(), ": tensor \"", name, "\": expected shape ", c10::str(at::IntArrayRef(spec.shape)),
                     ", got ", t.defined() ? c10::str(t.sizes()) : "none")));
  }
  if (empty) return absl::OkStatus();
  return AppendPart(t);
}

absl::Status SafetensorsWriter::AppendPart(const at::Tensor& t) {
  State& st = *state_;
  if (!st.finished.ok() || st.committed) return absl::FailedPreconditionError("SafetensorsWriter: finished");
  if (!t.defined()) return Fail(absl::InvalidArgumentError(absl::StrCat(path(), ": undefined part")));
  try {
    at::Tensor flat = t.detach().reshape({-1});
    int64_t at_elem = 0;
    while (at_elem < flat.numel()) {
      if (st.current >= st.specs.size()) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat(path(), ": ", flat.numel() - at_elem, " elements past the last tensor")));
      }
      const int64_t n = std::min(flat.numel() - at_elem, st.numel[st.current] - st.written);
      at::Tensor piece =
          flat.narrow(0, at_elem, n).to(at::TensorOptions().device(at::kCPU).dtype(st.specs[st.current].dtype))
              .contiguous();
      absl::Status s = st.file.Append(piece.data_ptr(), static_cast<size_t>(n) * piece.element_size());
      if (!s.ok()) return Fail(s);
      at_elem += n;
      st.written += n;
      while (st.current < st.specs.size() && st.written == st.numel[st.current]) {
        ++st.current;
        st.written = 0;
      }
    }
  } catch (const c10::Error& e) {
    return Fail(absl::InternalError(absl::StrCat(path(), ": ", e.what_without_backtrace())));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Commit() {
  State& st = *state_;
  if (!st.finished.ok() || st.committed) return absl::FailedPreconditionError("SafetensorsWriter: finished");
  if (st.current < st.specs.size()) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(path(), ": tensor \"", st.specs[st.current].name,
                                                           "\" has ", st.written, " of its ",
                                                           st.numel[st.current], " elements")));
  }
  st.committed = true;
  return st.file.Commit();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" is undefined"));
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  RLMESH_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Open(path, std::move(specs), metadata));
  for (const auto& [name, t] : tensors) RLMESH_RETURN_IF_ERROR(writer->AppendTensor(name, t));
  return writer->Commit();
}

}  // namespace rlmesh::actor
