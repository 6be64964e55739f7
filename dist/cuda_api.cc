#include "dist/cuda_api.h"

#include <dlfcn.h>

#include <memory>

#include "absl/strings/str_cat.h"

namespace rlmesh::dist {
namespace {

// dlopen of the first name that opens; the first failure's reason is kept
// for the message (it names the library the user most likely expects).
absl::StatusOr<void*> OpenFirst(const std::vector<std::string>& names, std::string* opened) {
  if (names.empty()) return absl::InvalidArgumentError("library names: empty");
  std::string first_error;
  for (const std::string& name : names) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) {
      *opened = name;
      return h;
    }
    const char* e = dlerror();
    if (first_error.empty()) first_error = e != nullptr ? e : "unknown error";
  }
  return absl::FailedPreconditionError(absl::StrCat(names[0], " not found (dlopen: ", first_error, ")"));
}

// Resolves `name` into `*fn`; false (and `*missing` = name) when absent.
template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* fn, std::string* missing) {
  dlerror();
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    if (missing->empty()) *missing = name;
    return false;
  }
  *fn = reinterpret_cast<Fn>(sym);
  return true;
}

}  // namespace

std::string CudaRuntimeApi::Error(const char* call, cudaError_t e) const {
  const char* text = GetErrorString != nullptr ? GetErrorString(e) : nullptr;
  return absl::StrCat(call, ": ", text != nullptr ? text : "unknown error", " (cudaError ", static_cast<int>(e), ")");
}

std::string NcclApi::Error(const char* call, ncclResult_t r, ncclComm_t comm) const {
  const char* text = GetErrorString != nullptr ? GetErrorString(r) : nullptr;
  const char* last = GetLastError != nullptr ? GetLastError(comm) : nullptr;
  std::string out = absl::StrCat(call, ": ", text != nullptr ? text : "unknown error");
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&out, " (", last, ")");
  return out;
}

std::vector<std::string> DefaultCudaRuntimeNames() {
  return {"libcudart.so.13", "libcudart.so", "/usr/local/cuda/lib64/libcudart.so.13"};
}

std::vector<std::string> DefaultNcclNames() {
  return {"libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2"};
}

absl::StatusOr<const CudaRuntimeApi*> OpenCudaRuntime(const std::vector<std::string>& names) {
  auto api = std::make_unique<CudaRuntimeApi>();
  auto lib = OpenFirst(names, &api->library);
  if (!lib.ok()) return lib.status();
  std::string missing;
  // The unsuffixed names are the default-stream (not per-thread) variants,
  // which is what the backends' explicit streams need.
  Resolve(*lib, "cudaGetDeviceCount", &api->GetDeviceCount, &missing);
  Resolve(*lib, "cudaSetDevice", &api->SetDevice, &missing);
  Resolve(*lib, "cudaDeviceGetPCIBusId", &api->DeviceGetPCIBusId, &missing);
  Resolve(*lib, "cudaDeviceGetByPCIBusId", &api->DeviceGetByPCIBusId, &missing);
  Resolve(*lib, "cudaMalloc", &api->Malloc, &missing);
  Resolve(*lib, "cudaFree", &api->Free, &missing);
  Resolve(*lib, "cudaMemcpyAsync", &api->MemcpyAsync, &missing);
  Resolve(*lib, "cudaStreamCreateWithFlags", &api->StreamCreateWithFlags, &missing);
  Resolve(*lib, "cudaStreamDestroy", &api->StreamDestroy, &missing);
  Resolve(*lib, "cudaStreamQuery", &api->StreamQuery, &missing);
  Resolve(*lib, "cudaIpcGetMemHandle", &api->IpcGetMemHandle, &missing);
  Resolve(*lib, "cudaIpcOpenMemHandle", &api->IpcOpenMemHandle, &missing);
  Resolve(*lib, "cudaIpcCloseMemHandle", &api->IpcCloseMemHandle, &missing);
  Resolve(*lib, "cudaGetLastError", &api->GetLastError, &missing);
  Resolve(*lib, "cudaGetErrorString", &api->GetErrorString, &missing);
  if (!missing.empty()) {
    dlclose(*lib);
    return absl::FailedPreconditionError(absl::StrCat(api->library, ": symbol ", missing, " missing"));
  }
  return api.release();  // lives for the process, like the library
}

absl::StatusOr<const NcclApi*> OpenNccl(const std::vector<std::string>& names) {
  auto api = std::make_unique<NcclApi>();
  auto lib = OpenFirst(names, &api->library);
  if (!lib.ok()) return lib.status();
  std::string missing;
  Resolve(*lib, "ncclGetVersion", &api->GetVersion, &missing);
  Resolve(*lib, "ncclGetUniqueId", &api->GetUniqueId, &missing);
  Resolve(*lib, "ncclCommInitRankConfig", &api->CommInitRankConfig, &missing);
  Resolve(*lib, "ncclCommGetAsyncError", &api->CommGetAsyncError, &missing);
  Resolve(*lib, "ncclCommAbort", &api->CommAbort, &missing);
  Resolve(*lib, "ncclBroadcast", &api->Broadcast, &missing);
  Resolve(*lib, "ncclGetErrorString", &api->GetErrorString, &missing);
  Resolve(*lib, "ncclGetLastError", &api->GetLastError, &missing);
  if (!missing.empty()) {
    dlclose(*lib);
    return absl::FailedPreconditionError(absl::StrCat(api->library, ": symbol ", missing, " missing"));
  }
  if (api->GetVersion(&api->version) != ncclSuccess) api->version = 0;
  // ncclConfig_t grew over releases; NCCL accepts an older struct from a
  // newer library but not the reverse, so refuse a library older than the
  // headers compiled in.
  if (api->version < NCCL_VERSION_CODE) {
    dlclose(*lib);
    return absl::FailedPreconditionError(absl::StrCat(api->library, " is NCCL ", api->version,
                                                      ", older than the headers this was built with (",
                                                      NCCL_VERSION_CODE, ")"));
  }
  return api.release();
}

absl::StatusOr<const CudaRuntimeApi*> LoadCudaRuntime() {
  static const auto* loaded = new absl::StatusOr<const CudaRuntimeApi*>(OpenCudaRuntime(DefaultCudaRuntimeNames()));
  return *loaded;
}

absl::StatusOr<const NcclApi*> LoadNccl() {
  static const auto* loaded = new absl::StatusOr<const NcclApi*>(OpenNccl(DefaultNcclNames()));
  return *loaded;
}

absl::StatusOr<int> CudaDeviceCount() {
  auto api = LoadCudaRuntime();
  if (!api.ok()) return api.status();
  int n = 0;
  const cudaError_t e = (*api)->GetDeviceCount(&n);
  if (e != cudaSuccess) {
    (*api)->GetLastError();  // clear the sticky-free error so later calls start clean
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device (", (*api)->Error("cudaGetDeviceCount", e), ")"));
  }
  if (n <= 0) return absl::FailedPreconditionError("no CUDA device (cudaGetDeviceCount: 0 devices)");
  return n;
}

}  // namespace rlmesh::dist
