#pragma once

// Writes TensorBoard event files (TFRecord framing of tensorflow.Event
// protos with scalar summaries) without TensorFlow: the few fields needed are
// encoded by hand. `tensorboard --logdir` and its EventAccumulator read them.

#include <cstdint>
#include <fstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlmesh {

// Not thread-safe.
class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<unix seconds>.<host>.rlmesh.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(const std::string& dir);
  // Appends one scalar; flushes so a running TensorBoard sees it.
  absl::Status AddScalar(absl::string_view tag, int64_t step, double value, double wall_time);
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::ofstream out) : path_(std::move(path)), out_(std::move(out)) {}
  absl::Status WriteRecord(const std::string& data);
  std::string path_;
  std::ofstream out_;
};

// CRC-32C (Castagnoli), as TFRecord uses. Exposed for tests.
uint32_t Crc32c(absl::string_view data);

}  // namespace rlmesh
