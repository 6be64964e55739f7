#include "dist/cuda_api.h"

#include <dlfcn.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/cuda_backend.h"

namespace rlmesh::dist {
namespace {

// dlopen of the first name that opens; the first failure's reason is kept
// for the message (it names the library the user most likely expects), with
// the other places tried after it.
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
  std::string message = absl::StrCat(names[0], " not found (dlopen: ", first_error);
  if (names.size() > 1) {
    absl::StrAppend(&message, "; also tried ", absl::StrJoin(names.begin() + 1, names.end(), ", "));
  }
  return absl::FailedPreconditionError(absl::StrCat(message, ")"));
}

// <site-packages>/<sub>/<file> for a LibTorch in <site-packages>/torch/lib,
// appended to `out`; nothing when `torch_lib_dir` is not that deep.
void AddWheelCandidates(absl::string_view torch_lib_dir, const std::vector<const char*>& subs,
                        std::vector<std::string>* out) {
  std::string dir(torch_lib_dir);
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  for (int up = 0; up < 2; ++up) {  // lib/, then torch/
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || slash == 0) return;
    dir.resize(slash);
  }
  for (const char* sub : subs) out->push_back(absl::StrCat(dir, "/", sub));
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

std::string NcclVersionString(int version) {
  if (version <= 0) return "unknown";
  // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z
  // from 2.9.
  const int major_unit = version < 10000 ? 1000 : 10000;
  return absl::StrCat(version / major_unit, ".", (version % major_unit) / 100, ".", version % 100);
}

absl::Status CheckNcclVersion(absl::string_view library, int version) {
  if (version >= kMinNcclVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(library, " is NCCL ", NcclVersionString(version),
                                                    "; rlmesh needs NCCL ", NcclVersionString(kMinNcclVersion),
                                                    " or newer (ncclCommInitRankConfig)"));
}

std::vector<std::string> CudaRuntimeCandidates(absl::string_view torch_lib_dir) {
  std::vector<std::string> out = {"libcudart.so.13"};
  AddWheelCandidates(torch_lib_dir, {"nvidia/cu13/lib/libcudart.so.13", "nvidia/cuda_runtime/lib/libcudart.so.13"},
                     &out);
  out.push_back("libcudart.so");
  out.push_back("/usr/local/cuda/lib64/libcudart.so.13");
  return out;
}

std::vector<std::string> NcclCandidates(absl::string_view torch_lib_dir) {
  std::vector<std::string> out = {"libnccl.so.2"};
  AddWheelCandidates(torch_lib_dir, {"nvidia/nccl/lib/libnccl.so.2"}, &out);
  out.push_back("libnccl.so");
  out.push_back("/usr/local/cuda/lib64/libnccl.so.2");
  return out;
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
  Resolve(*lib, "cudaMemcpyAsync", &api->MemcpyAsync, &missing);
  Resolve(*lib, "cudaStreamCreateWithFlags", &api->StreamCreateWithFlags, &missing);
  Resolve(*lib, "cudaStreamDestroy", &api->StreamDestroy, &missing);
  Resolve(*lib, "cudaStreamWaitEvent", &api->StreamWaitEvent, &missing);
  Resolve(*lib, "cudaEventCreateWithFlags", &api->EventCreateWithFlags, &missing);
  Resolve(*lib, "cudaEventRecord", &api->EventRecord, &missing);
  Resolve(*lib, "cudaEventQuery", &api->EventQuery, &missing);
  Resolve(*lib, "cudaEventDestroy", &api->EventDestroy, &missing);
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
  if (absl::Status s = CheckNcclVersion(api->library, api->version); !s.ok()) {
    dlclose(*lib);
    return s;
  }
  return api.release();
}

namespace {

// LibTorch's CUDA backend first: once it is loaded, the sonames resolve to
// the libraries it loaded. Without it (a CPU wheel, a binary without
// LibTorch) the other candidates are still tried.
std::vector<std::string> ProcessCandidates(std::vector<std::string> (*candidates)(absl::string_view)) {
  LoadCudaBackend().IgnoreError();
  return candidates(LoadedTorchLibDir());
}

}  // namespace

absl::StatusOr<const CudaRuntimeApi*> LoadCudaRuntime() {
  static auto* loader = new LibraryLoader<CudaRuntimeApi>([] { return ProcessCandidates(CudaRuntimeCandidates); },
                                                          OpenCudaRuntime);
  return loader->Load();
}

absl::StatusOr<const NcclApi*> LoadNccl() {
  static auto* loader = new LibraryLoader<NcclApi>([] { return ProcessCandidates(NcclCandidates); }, OpenNccl);
  return loader->Load();
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
