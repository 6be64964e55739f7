#pragma once

// The few CUDA runtime and NCCL entry points the GPU weight-sync backends
// use, resolved at run time with dlopen/dlsym. Nothing links against
// libcudart or libnccl, so every binary still starts (and every other
// backend works) on a machine without a GPU, a driver or the libraries; only
// the GPU backends report what is missing.
//
// The headers come from the CUDA toolkit (@cuda//:cuda_headers) for the
// types; the functions are called only through these tables.
//
// Which libraries: LibTorch's own. The process-wide loaders first load
// LibTorch's CUDA backend (dist/cuda_backend.h), whose libtorch_cuda.so
// brings in libcudart and libnccl from the nvidia wheels beside torch; a
// dlopen of the same soname then gets that very library, so the backends
// and ProcessGroupNCCL share one NCCL and one CUDA runtime. The wheels'
// folders and the CUDA toolkit follow as further candidates.
//
// Thread-safety: the Load* functions and LibraryLoader are safe for
// concurrent use; the tables they return are immutable and live until the
// process exits.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace rlmesh::dist {

struct CudaRuntimeApi {
  // The library that was opened (the name or path dlopen succeeded with).
  std::string library;
  cudaError_t (*GetDeviceCount)(int*);
  cudaError_t (*SetDevice)(int);
  cudaError_t (*DeviceGetPCIBusId)(char*, int, int);
  cudaError_t (*DeviceGetByPCIBusId)(int*, const char*);
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t);
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned int);
  cudaError_t (*StreamDestroy)(cudaStream_t);
  cudaError_t (*StreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned int);
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned int);
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
  cudaError_t (*EventQuery)(cudaEvent_t);
  cudaError_t (*EventDestroy)(cudaEvent_t);
  cudaError_t (*IpcGetMemHandle)(cudaIpcMemHandle_t*, void*);
  cudaError_t (*IpcOpenMemHandle)(void**, cudaIpcMemHandle_t, unsigned int);
  cudaError_t (*IpcCloseMemHandle)(void*);
  cudaError_t (*GetLastError)();
  const char* (*GetErrorString)(cudaError_t);

  // "<name of the call>: <CUDA's text> (cudaError <code>)".
  std::string Error(const char* call, cudaError_t e) const;
};

struct NcclApi {
  // The library that was opened (the name or path dlopen succeeded with).
  std::string library;
  int version = 0;  // ncclGetVersion, e.g. 22809; kMinNcclVersion or newer
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  const char* (*GetErrorString)(ncclResult_t);
  const char* (*GetLastError)(ncclComm_t);

  // "<call>: <NCCL's text> (<last error detail>)".
  std::string Error(const char* call, ncclResult_t r, ncclComm_t comm) const;
};

// The oldest NCCL accepted: 2.14.0, the first with ncclCommInitRankConfig
// and ncclConfig_t. weight_sync/nccl_group.cc sets only the config's
// `blocking` (a non-blocking communicator, polled with
// ncclCommGetAsyncError), which 2.14 has; every other entry in NcclApi is
// older. The header the build uses may be newer: ncclCommInitRankConfig
// reads the config's `size` and copies only the part of the struct its own
// release knows (2.14 reads `blocking` alone), so an older library takes a
// config made with the newer NCCL_CONFIG_INITIALIZER.
inline constexpr int kMinNcclVersion = 21400;  // NCCL_VERSION(2, 14, 0)

// "2.28.9" for ncclGetVersion's 22809 (and "2.8.4" for the pre-2.9 code
// 2804); "unknown" for a code <= 0.
std::string NcclVersionString(int version);

// OK when `version` (ncclGetVersion's code) is kMinNcclVersion or newer;
// otherwise FAILED_PRECONDITION "<library> is NCCL <x.y.z>; rlmesh needs
// NCCL 2.14.0 or newer (ncclCommInitRankConfig)".
absl::Status CheckNcclVersion(absl::string_view library, int version);

// Where libcudart and libnccl are looked for, in order, given the folder of
// the loaded LibTorch (`torch_lib_dir`, e.g. ".../site-packages/torch/lib";
// "" when unknown):
//   1. the soname (libcudart.so.13, libnccl.so.2): the library LibTorch's
//      CUDA backend loaded when it is loaded, else what LD_LIBRARY_PATH, the
//      binary's RPATH and ld.so.cache give;
//   2. the nvidia wheels beside torch: <site-packages>/nvidia/cu13/lib and
//      nvidia/cuda_runtime/lib for libcudart, nvidia/nccl/lib for libnccl;
//   3. the unversioned name, then the CUDA toolkit's /usr/local/cuda/lib64.
std::vector<std::string> CudaRuntimeCandidates(absl::string_view torch_lib_dir);
std::vector<std::string> NcclCandidates(absl::string_view torch_lib_dir);

// Opens the first of `names` that dlopen accepts and resolves every entry.
// FAILED_PRECONDITION "<names[0]> not found (dlopen: <reason>; also tried
// <the others>)" when none opens, "<library>: symbol <name> missing" when one
// lacks an entry, CheckNcclVersion's error for an NCCL below the floor. Each
// call opens anew; the backends use the Load* functions below.
absl::StatusOr<const CudaRuntimeApi*> OpenCudaRuntime(const std::vector<std::string>& names);
absl::StatusOr<const NcclApi*> OpenNccl(const std::vector<std::string>& names);

// Opens a library table with `open(names())` until that succeeds, then
// keeps it for the process's life. A failure is not kept: the next Load()
// tries again, so a library that becomes loadable later (installed, or
// loaded by something else) is found. Safe for concurrent use; `open` runs
// in one thread at a time and never again once it has succeeded.
template <typename Api>
class LibraryLoader {
 public:
  using Names = std::function<std::vector<std::string>()>;
  using Open = std::function<absl::StatusOr<const Api*>(const std::vector<std::string>&)>;

  LibraryLoader(Names names, Open open) : names_(std::move(names)), open_(std::move(open)) {}
  LibraryLoader(const LibraryLoader&) = delete;
  LibraryLoader& operator=(const LibraryLoader&) = delete;

  absl::StatusOr<const Api*> Load() {
    if (const Api* api = loaded_.load(std::memory_order_acquire); api != nullptr) return api;
    absl::MutexLock lock(&mu_);
    if (const Api* api = loaded_.load(std::memory_order_relaxed); api != nullptr) return api;
    absl::StatusOr<const Api*> api = open_(names_());
    if (api.ok()) loaded_.store(*api, std::memory_order_release);
    return api;
  }

 private:
  // Constant after construction
  const Names names_;
  const Open open_;
  // Written once, under mu_; read without it.
  std::atomic<const Api*> loaded_{nullptr};
  // Held while a load is attempted.
  absl::Mutex mu_;
};

// The process-wide tables: LoadCudaBackend() (its failure only leaves
// LibTorch's libraries out), then Open*(…Candidates(LoadedTorchLibDir())),
// through a LibraryLoader (a success is kept, a failure retried by the next
// call). Loading the backend fixes the CUDA allocator's settings:
// dist::SetCudaMemoryFraction must come before.
absl::StatusOr<const CudaRuntimeApi*> LoadCudaRuntime();
absl::StatusOr<const NcclApi*> LoadNccl();

// The number of CUDA devices this process sees (>= 1), or
// FAILED_PRECONDITION naming what is missing: "libcudart.so.13 not found
// (...)" or "no CUDA device (cudaGetDeviceCount: ...)". Goes through
// LoadCudaRuntime (and so loads LibTorch's CUDA backend).
absl::StatusOr<int> CudaDeviceCount();

}  // namespace rlmesh::dist
