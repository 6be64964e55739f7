#pragma once

// The safetensors file format (Hugging Face): an 8-byte little-endian header
// length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then the
// raw little-endian tensor bytes. Every malformed input is an error that
// names the tensor or the byte offset; nothing here crashes on a bad file.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlmesh::actor {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;  // empty = scalar
  uint64_t begin = 0;          // byte offsets relative to the data section
  uint64_t end = 0;
};

// A parsed, validated safetensors file, memory-mapped. Read-only; safe for
// concurrent use.
class SafetensorsFile {
 public:
  // Validates the whole header (JSON, dtypes, shapes vs. byte counts, offsets
  // within the file) before returning.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Entries in file order of their data.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A CPU tensor holding a copy of the named tensor's bytes, in its stored
  // dtype. NOT_FOUND names the tensor.
  absl::StatusOr<at::Tensor> Read(const std::string& name) const;
  // Elements [begin, begin + count) of the named tensor laid flat, as a 1-D
  // CPU tensor in its stored dtype: only those bytes are copied (and paged
  // in), for a reader that needs a part of a large tensor (a ZeRO-3 rank's
  // share of a checkpoint's moments). NOT_FOUND names the tensor;
  // OUT_OF_RANGE when the range does not lie within it.
  absl::StatusOr<at::Tensor> ReadFlatRange(const std::string& name, int64_t begin, int64_t count) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any device/layout; stored in their own dtype, which must be
// one safetensors names) atomically, as common/atomic_file.h does (temp file
// in the same folder, fsync, rename, fsync the folder). Names must be unique.
// SafetensorsWriter below, with every tensor at hand.
absl::Status WriteSafetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// A tensor a SafetensorsWriter will write: its name, stored dtype and shape.
struct SafetensorsSpec {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;  // empty = scalar
};

// A safetensors file written as its tensors arrive, so that a caller never
// holds more than the part it appends: a checkpoint streamed from a model
// gathered one unit at a time (learner/fully_sharded.h) holds one unit. The
// header is written first, from the specs; the data then comes in the specs'
// order, each tensor whole (AppendTensor) or in consecutive flat parts
// (AppendPart), converted to the spec's dtype. The file appears atomically
// at Commit, as WriteSafetensors's (and is byte-identical to what
// WriteSafetensors writes for the same tensors); an error or a destruction
// before Commit leaves nothing at `path`.
//
// Not thread-safe.
class SafetensorsWriter {
 public:
  // INVALID_ARGUMENT naming a reserved, repeated or misshapen tensor or a
  // dtype safetensors has no name for; INTERNAL when the file cannot be
  // created.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Open(
      const std::string& path, std::vector<SafetensorsSpec> specs,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next tensor whole: INVALID_ARGUMENT unless it is `name`, nothing of
  // it was appended yet and `t` has its shape.
  absl::Status AppendTensor(const std::string& name, const at::Tensor& t);
  // The next t.numel() elements (row-major) of the tensors, in spec order; a
  // part may end one tensor and begin the next. INVALID_ARGUMENT when it runs
  // past the last tensor.
  absl::Status AppendPart(const at::Tensor& t);
  // FAILED_PRECONDITION naming the first tensor not written whole; else the
  // file is made durable and renamed into place. Any error, here or in an
  // append, finishes the writer (later calls fail; no file appears).
  absl::Status Commit();

  const std::string& path() const;

 private:
  struct State;
  explicit SafetensorsWriter(std::unique_ptr<State> state);
  absl::Status Fail(absl::Status s);
  std::unique_ptr<State> state_;
};

// "F32" <-> at::kFloat etc.; INVALID_ARGUMENT for others.
absl::StatusOr<c10::ScalarType> SafetensorsDtype(const std::string& name);
absl::StatusOr<std::string> SafetensorsDtypeName(c10::ScalarType t);
// "fp32"/"float32"/"f32", "bf16"/"bfloat16", "fp16"/"float16"/"half".
absl::StatusOr<c10::ScalarType> ParseDtype(const std::string& name);

}  // namespace rlmesh::actor
