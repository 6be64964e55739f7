// The CUDA runtime and NCCL loaders without a GPU: a stand-in libnccl
// (dist/testing/fake_nccl.cc) whose ncclGetVersion answers
// $RLMESH_FAKE_NCCL_VERSION, the candidate lists from a torch folder, and
// the process-wide loaders against the installed torch wheel. A binary of
// its own: the last case needs LibTorch's CUDA backend not yet loaded.
#include "dist/cuda_api.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "dist/cuda_backend.h"

namespace rlmesh::dist {
namespace {

namespace fs = std::filesystem;

std::string FakeNccl() { return rlmesh::testing::Runfile("dist/testing/libfake_nccl.so"); }

// Sets $RLMESH_FAKE_NCCL_VERSION for the scope.
class FakeNcclVersion {
 public:
  explicit FakeNcclVersion(int version) { setenv("RLMESH_FAKE_NCCL_VERSION", std::to_string(version).c_str(), 1); }
  ~FakeNcclVersion() { unsetenv("RLMESH_FAKE_NCCL_VERSION"); }
};

std::string RealPath(const std::string& p) {
  std::error_code ec;
  const fs::path r = fs::canonical(p, ec);
  return ec ? p : r.string();
}

TEST_CASE("NCCL's version floor is 2.14.0, whatever the headers the build used") {
  for (int ok : {kMinNcclVersion, 21403, 22700, NCCL_VERSION_CODE - 1, NCCL_VERSION_CODE, 22900, 30000}) {
    INFO(ok);
    CHECK(CheckNcclVersion("libnccl.so.2", ok).ok());
  }
  for (int old : {kMinNcclVersion - 1, 21304, 2804, 0, -1}) {
    INFO(old);
    const absl::Status s = CheckNcclVersion("/x/libnccl.so.2", old);
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(s.message(), "/x/libnccl.so.2 is NCCL "));
    CHECK(absl::StrContains(s.message(), "needs NCCL 2.14.0 or newer"));
  }
  CHECK(CheckNcclVersion("libnccl.so.2", 21304).message() ==
        "libnccl.so.2 is NCCL 2.13.4; rlmesh needs NCCL 2.14.0 or newer (ncclCommInitRankConfig)");
  CHECK(NcclVersionString(22809) == "2.28.9");
  CHECK(NcclVersionString(21400) == "2.14.0");
  CHECK(NcclVersionString(2804) == "2.8.4");
  CHECK(NcclVersionString(0) == "unknown");
  // The config nccl_group.cc passes comes from this header; the floor is
  // never above it.
  STATIC_REQUIRE(kMinNcclVersion <= NCCL_VERSION_CODE);
}

TEST_CASE("OpenNccl takes a library older than the headers down to the floor, and refuses one below") {
  rlmesh::testing::TempDir dir;
  const std::string lib = dir.File("libnccl.so.2");
  fs::copy_file(FakeNccl(), lib);
  {
    // A minor release behind the toolkit's header (22809), as a torch
    // wheel's NCCL may be.
    FakeNcclVersion v(22700);
    auto nccl = OpenNccl({lib});
    INFO(nccl.status().ToString());
    REQUIRE(nccl.ok());
    CHECK((*nccl)->version == 22700);
    CHECK((*nccl)->library == lib);
  }
  {
    FakeNcclVersion v(kMinNcclVersion);
    CHECK(OpenNccl({lib}).ok());
  }
  {
    FakeNcclVersion v(21304);
    auto nccl = OpenNccl({lib});
    CHECK(nccl.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(nccl.status().message() == lib + " is NCCL 2.13.4; rlmesh needs NCCL 2.14.0 or newer (ncclCommInitRankConfig)");
  }
  // Not an NCCL at all: the first entry it lacks is named.
  auto cuda = OpenCudaRuntime({lib});
  CHECK(cuda.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(cuda.status().message() == lib + ": symbol cudaGetDeviceCount missing");
}

TEST_CASE("A loader retries after a failure and keeps its first success") {
  rlmesh::testing::TempDir dir;
  const std::string lib = dir.File("nvidia/nccl/lib/libnccl.so.2");
  std::atomic<int> opens{0};
  LibraryLoader<NcclApi> loader([&] { return std::vector<std::string>{lib}; },
                                [&](const std::vector<std::string>& names) {
                                  ++opens;
                                  return OpenNccl(names);
                                });
  // Not there yet (another library, e.g. LibTorch's CUDA backend, would
  // bring it later).
  auto missing = loader.Load();
  CHECK(missing.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StartsWith(missing.status().message(), lib + " not found (dlopen: "));
  CHECK(loader.Load().status() == missing.status());  // tried again, same answer
  CHECK(opens == 2);

  // Below the floor is a failure too, and is not kept either.
  fs::create_directories(fs::path(lib).parent_path());
  fs::copy_file(FakeNccl(), lib);
  {
    FakeNcclVersion v(21304);
    CHECK(absl::StrContains(loader.Load().status().message(), "is NCCL 2.13.4"));
  }

  // Now it loads, from as many threads as ask at once.
  FakeNcclVersion v(22809);
  std::vector<absl::StatusOr<const NcclApi*>> got(8, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) threads.emplace_back([&, i] { got[i] = loader.Load(); });
  for (auto& t : threads) t.join();
  REQUIRE(got[0].ok());
  for (const auto& g : got) CHECK((g.ok() && *g == *got[0]));
  CHECK((*got[0])->library == lib);
  CHECK(opens == 4);  // the two misses, the old one, one success

  // Kept: the library going away changes nothing, nothing is opened again.
  fs::remove(lib);
  auto again = loader.Load();
  REQUIRE(again.ok());
  CHECK(*again == *got[0]);
  CHECK(opens == 4);
}

TEST_CASE("The candidates: the soname, then the nvidia wheels beside torch, then the toolkit") {
  const std::string torch_lib = "/venv/lib/python3.11/site-packages/torch/lib";
  const std::string site = "/venv/lib/python3.11/site-packages";
  CHECK(NcclCandidates(torch_lib) == std::vector<std::string>{"libnccl.so.2", site + "/nvidia/nccl/lib/libnccl.so.2",
                                                              "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2"});
  CHECK(CudaRuntimeCandidates(torch_lib + "/") ==
        std::vector<std::string>{"libcudart.so.13", site + "/nvidia/cu13/lib/libcudart.so.13",
                                 site + "/nvidia/cuda_runtime/lib/libcudart.so.13", "libcudart.so",
                                 "/usr/local/cuda/lib64/libcudart.so.13"});
  // No LibTorch loaded: no wheel folders.
  CHECK(NcclCandidates("") ==
        std::vector<std::string>{"libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2"});
  CHECK(CudaRuntimeCandidates("").size() == 3);
}

TEST_CASE("When no candidate opens, the message names the soname first, then the places tried") {
  // The process's own candidates with the sonames changed to ones that
  // exist nowhere.
  std::vector<std::string> names = NcclCandidates("/nowhere/site-packages/torch/lib");
  for (auto& n : names) n.replace(n.rfind("libnccl"), 7, "libnccl-rlmesh-missing");
  auto nccl = OpenNccl(names);
  CHECK(nccl.status().code() == absl::StatusCode::kFailedPrecondition);
  INFO(nccl.status().message());
  CHECK(absl::StartsWith(nccl.status().message(), "libnccl-rlmesh-missing.so.2 not found (dlopen: "));
  CHECK(absl::StrContains(nccl.status().message(),
                          "; also tried /nowhere/site-packages/nvidia/nccl/lib/libnccl-rlmesh-missing.so.2, "));
}

// Last: the process-wide loaders load LibTorch's CUDA backend, and with it
// the NCCL and CUDA runtime of the torch wheel, before they look.
TEST_CASE("LoadNccl and LoadCudaRuntime load LibTorch's CUDA backend first and take its libraries") {
  REQUIRE(dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD) == nullptr);  // nothing above loaded it
  const std::string cpu_dir = LoadedTorchLibDir();  // libtorch_cpu.so: this test links it
  REQUIRE_FALSE(cpu_dir.empty());

  const bool cuda_wheel = fs::exists(cpu_dir + "/libtorch_cuda.so");

  auto nccl = LoadNccl();
  INFO("LoadNccl: " << (nccl.ok() ? (*nccl)->library : nccl.status().ToString()));
  CHECK(CudaBackendRequested());
  if (!cuda_wheel) {
    WARN("a CPU build of torch in " << cpu_dir << ": no LibTorch libraries to share; skipped");
    return;
  }
  void* backend = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  REQUIRE(backend != nullptr);
  dlclose(backend);
  const std::string site = fs::path(cpu_dir).parent_path().parent_path().string();
  const std::string wheel_nccl = site + "/nvidia/nccl/lib/libnccl.so.2";
  if (fs::exists(wheel_nccl)) {
    REQUIRE(nccl.ok());
    Dl_info info;
    REQUIRE(dladdr(reinterpret_cast<void*>((*nccl)->GetVersion), &info) != 0);
    CHECK(RealPath(info.dli_fname) == RealPath(wheel_nccl));
  } else {
    WARN(wheel_nccl << " absent: which libnccl LibTorch uses is not checked");
  }
  auto cuda = LoadCudaRuntime();
  INFO("LoadCudaRuntime: " << (cuda.ok() ? (*cuda)->library : cuda.status().ToString()));
  for (const char* sub : {"/nvidia/cu13/lib/libcudart.so.13", "/nvidia/cuda_runtime/lib/libcudart.so.13"}) {
    if (!fs::exists(site + sub)) continue;
    REQUIRE(cuda.ok());
    Dl_info info;
    REQUIRE(dladdr(reinterpret_cast<void*>((*cuda)->GetDeviceCount), &info) != 0);
    CHECK(RealPath(info.dli_fname) == RealPath(site + sub));
    break;
  }
}

}  // namespace
}  // namespace rlmesh::dist
