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
// Thread-safety: the Load* functions are safe for concurrent use; the tables
// they return are immutable and live until the process exits.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlmesh::dist {

struct CudaRuntimeApi {
  // The library that was opened (the name or path dlopen succeeded with).
  std::string library;
  cudaError_t (*GetDeviceCount)(int*);
  cudaError_t (*SetDevice)(int);
  cudaError_t (*DeviceGetPCIBusId)(char*, int, int);
  cudaError_t (*DeviceGetByPCIBusId)(int*, const char*);
  cudaError_t (*Malloc)(void**, size_t);
  cudaError_t (*Free)(void*);
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t);
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned int);
  cudaError_t (*StreamDestroy)(cudaStream_t);
  cudaError_t (*StreamQuery)(cudaStream_t);
  cudaError_t (*IpcGetMemHandle)(cudaIpcMemHandle_t*, void*);
  cudaError_t (*IpcOpenMemHandle)(void**, cudaIpcMemHandle_t, unsigned int);
  cudaError_t (*IpcCloseMemHandle)(void*);
  cudaError_t (*GetLastError)();
  const char* (*GetErrorString)(cudaError_t);

  // "<name of the call>: <CUDA's text> (cudaError <code>)".
  std::string Error(const char* call, cudaError_t e) const;
};

struct NcclApi {
  std::string library;
  int version = 0;  // ncclGetVersion, e.g. 22809
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

// Library names tried in order by the cached loaders below.
std::vector<std::string> DefaultCudaRuntimeNames();  // libcudart.so.13, libcudart.so, /usr/local/cuda/lib64/...
std::vector<std::string> DefaultNcclNames();         // libnccl.so.2, libnccl.so, /usr/local/cuda/lib64/...

// Opens the first of `names` that dlopen accepts and resolves every entry.
// FAILED_PRECONDITION "<names[0]> not found (dlopen: <reason>)" when none
// opens, "<library>: symbol <name> missing" when one lacks an entry. Each
// call opens anew (tests); the backends use the cached Load* below.
absl::StatusOr<const CudaRuntimeApi*> OpenCudaRuntime(const std::vector<std::string>& names);
absl::StatusOr<const NcclApi*> OpenNccl(const std::vector<std::string>& names);

// The process-wide tables, loaded by the first call (its result, error
// included, is kept).
absl::StatusOr<const CudaRuntimeApi*> LoadCudaRuntime();
absl::StatusOr<const NcclApi*> LoadNccl();

// The number of CUDA devices this process sees (>= 1), or
// FAILED_PRECONDITION naming what is missing: "libcudart.so.13 not found
// (...)" or "no CUDA device (cudaGetDeviceCount: ...)".
absl::StatusOr<int> CudaDeviceCount();

}  // namespace rlmesh::dist
