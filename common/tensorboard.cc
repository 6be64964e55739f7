#include "common/tensorboard.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace rlmesh {
namespace {

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(std::string* out, int field, int wire_type) { PutVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type); }

void PutFixed64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

void PutFixed32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

void PutBytes(std::string* out, int field, absl::string_view bytes) {
  PutTag(out, field, 2);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3;
//         Summary summary = 5; }
// Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
std::string EventHeader(double wall_time, int64_t step) {
  std::string e;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, 8);
  PutTag(&e, 1, 1);
  PutFixed64(&e, bits);
  PutTag(&e, 2, 0);
  PutVarint(&e, static_cast<uint64_t>(step));
  return e;
}

uint32_t MaskedCrc(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  static const auto* table = [] {
    auto* t = new uint32_t[256];
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xffffffffu;
  for (unsigned char ch : data) crc = table[(crc ^ ch) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const std::string path =
      absl::StrCat(dir, "/events.out.tfevents.", absl::ToUnixSeconds(absl::Now()), ".", host, ".rlmesh");
  std::ofstream out(path, std::ios::binary | std::ios::app);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(path, std::move(out)));
  std::string first = EventHeader(absl::ToUnixMicros(absl::Now()) / 1e6, 0);
  PutBytes(&first, 3, "brain.Event:2");
  if (absl::Status s = w->WriteRecord(first); !s.ok()) return s;
  return w;
}

absl::Status TensorBoardWriter::AddScalar(absl::string_view tag, int64_t step, double value, double wall_time) {
  std::string v;
  PutBytes(&v, 1, tag);
  const float f = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  PutTag(&v, 2, 5);
  PutFixed32(&v, bits);
  std::string summary;
  PutBytes(&summary, 1, v);
  std::string event = EventHeader(wall_time, step);
  PutBytes(&event, 5, summary);
  return WriteRecord(event);
}

absl::Status TensorBoardWriter::WriteRecord(const std::string& data) {
  std::string header;
  PutFixed64(&header, data.size());
  std::string frame = header;
  PutFixed32(&frame, MaskedCrc(header));
  frame += data;
  PutFixed32(&frame, MaskedCrc(data));
  out_.write(frame.data(), static_cast<std::streamsize>(frame.size()));
  out_.flush();
  if (!out_) return absl::DataLossError(absl::StrCat("write failed: ", path_));
  return absl::OkStatus();
}

}  // namespace rlmesh
