#include "dist/device.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "common/device_spec.h"

namespace rlmesh::dist {

// gperftools' TCMalloc, where the process links it (the learner): its
// free pages go back with its own call, which glibc's malloc_trim cannot
// reach. Null otherwise.
extern "C" void MallocExtension_ReleaseFreeMemory() __attribute__((weak));

absl::StatusOr<int> TorchCudaDeviceCount() {
  absl::Status s = LoadCudaBackend();
  if (!s.ok()) return s;
  return static_cast<int>(torch::cuda::device_count());
}

absl::StatusOr<c10::Device> ParseDevice(absl::string_view spec, absl::string_view who) {
  absl::StatusOr<int> index = ParseDeviceSpec(spec, who);
  if (!index.ok()) return index.status();
  if (*index < 0) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(*index));
}

absl::StatusOr<c10::Device> ResolveDevice(absl::string_view spec, absl::string_view who) {
  absl::StatusOr<c10::Device> d = ParseDevice(spec, who);
  if (!d.ok() || d->is_cpu()) return d;
  const std::string named = absl::StrCat(who, "=", d->str());
  absl::StatusOr<int> count = TorchCudaDeviceCount();
  if (!count.ok()) return absl::FailedPreconditionError(absl::StrCat(named, ": ", count.status().message()));
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string env = visible == nullptr ? "unset" : absl::StrCat("\"", visible, "\"");
  if (*count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(named, ": no CUDA device visible (CUDA_VISIBLE_DEVICES ", env, "; no GPU or no driver)"));
  }
  if (d->index() >= *count) {
    return absl::FailedPreconditionError(absl::StrCat(named, ": only ", *count, " CUDA device(s) visible (",
                                                      "CUDA_VISIBLE_DEVICES ", env, ")"));
  }
  return d;
}

int64_t ProcessMemoryBytes(const c10::Device& device) {
  if (device.is_cuda()) {
    const auto stats = c10::getDeviceAllocator(c10::kCUDA)->getDeviceStats(device.index());
    return stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  }
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

void ReleaseCachedMemory(const c10::Device& device) {
  if (device.is_cuda()) {
    c10::getDeviceAllocator(c10::kCUDA)->emptyCache();
    return;
  }
  if (MallocExtension_ReleaseFreeMemory != nullptr) MallocExtension_ReleaseFreeMemory();
  malloc_trim(0);
}

absl::Status ExceptionStatus(const std::exception& e, absl::StatusCode otherwise, absl::string_view context) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = torch_error != nullptr ? torch_error->what_without_backtrace() : e.what();
  const bool oom = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                   what.find("can't allocate memory") != std::string::npos;
  if (oom) return absl::ResourceExhaustedError(absl::StrCat(context, ": out of memory: ", what));
  return absl::Status(otherwise, absl::StrCat(context, ": ", what));
}

absl::Status SetCudaMemoryFraction(double fraction, absl::string_view who) {
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", fraction, " is not in (0, 1]"));
  }
  if (CudaBackendRequested()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": the CUDA backend is already loaded; the memory fraction must be set before"));
  }
  const char* old = std::getenv("PYTORCH_ALLOC_CONF");
  std::string conf = absl::StrCat("per_process_memory_fraction:", fraction);
  if (old != nullptr && *old != '\0') conf = absl::StrCat(old, ",", conf);
  if (setenv("PYTORCH_ALLOC_CONF", conf.c_str(), 1) != 0) {
    return absl::InternalError(absl::StrCat(who, ": setenv(PYTORCH_ALLOC_CONF) failed"));
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::dist
