// The CUDA_IPC receiver's segment bookkeeping, with the CUDA calls replaced
// by counters: a segment is mapped once however many buckets lie in it, is
// unmapped once neither slot needs it, and a failed open keeps nothing.
#include "weight_sync/ipc_mappings.h"

#include <cstring>
#include <map>

#include "absl/status/status.h"
#include "catch2/catch.hpp"

namespace rlmesh::weight_sync::internal {
namespace {

cudaIpcMemHandle_t Handle(char id) {
  cudaIpcMemHandle_t h;
  std::memset(&h, 0, sizeof(h));
  h.reserved[0] = id;
  return h;
}

// Fake cudaIpcOpenMemHandle / cudaIpcCloseMemHandle: each handle maps at
// its own address; counts the calls and the mappings open now.
struct FakeCuda {
  std::map<char, int> opens;
  std::map<void*, int> open_now;
  int closes = 0;
  bool fail = false;
  char base[256];

  IpcMappings Make() {
    return IpcMappings(
        [this](const cudaIpcMemHandle_t& h) -> absl::StatusOr<void*> {
          if (fail) return absl::UnavailableError("cudaIpcOpenMemHandle: invalid argument");
          ++opens[h.reserved[0]];
          void* p = base + static_cast<unsigned char>(h.reserved[0]);
          ++open_now[p];
          return p;
        },
        [this](void* p) {
          ++closes;
          if (--open_now[p] == 0) open_now.erase(p);
        });
  }
};

TEST_CASE("A segment holding several buckets is mapped once and shared by them") {
  FakeCuda cuda;
  {
    IpcMappings m = cuda.Make();
    auto a = m.Open(7, Handle(1));
    auto b = m.Open(7, Handle(1));
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(*a == *b);
    CHECK(cuda.opens[1] == 1);
    CHECK(m.size() == 1);
    // Another segment, and the same handle bytes from another publisher.
    auto c = m.Open(7, Handle(2));
    auto d = m.Open(8, Handle(1));
    REQUIRE(c.ok());
    REQUIRE(d.ok());
    CHECK(*c != *a);
    CHECK(m.size() == 3);
    CHECK(cuda.opens[1] == 2);
  }
  // The destructor unmaps everything, each mapping once.
  CHECK(cuda.open_now.empty());
  CHECK(cuda.closes == 3);
}

TEST_CASE("Retain unmaps exactly the segments no kept bucket lies in") {
  FakeCuda cuda;
  IpcMappings m = cuda.Make();
  REQUIRE(m.Open(7, Handle(1)).ok());
  REQUIRE(m.Open(7, Handle(2)).ok());
  REQUIRE(m.Open(7, Handle(3)).ok());
  m.Retain({IpcMappings::KeyOf(7, Handle(1)), IpcMappings::KeyOf(7, Handle(3))});
  CHECK(m.size() == 2);
  CHECK(cuda.closes == 1);
  CHECK(cuda.open_now.count(cuda.base + 2) == 0);
  // Kept segments are not mapped again; a dropped one is.
  REQUIRE(m.Open(7, Handle(1)).ok());
  REQUIRE(m.Open(7, Handle(2)).ok());
  CHECK(cuda.opens[1] == 1);
  CHECK(cuda.opens[2] == 2);
  m.CloseAll();
  CHECK(m.size() == 0);
  CHECK(cuda.open_now.empty());
}

TEST_CASE("A failed open keeps nothing and is retried by the next Open") {
  FakeCuda cuda;
  IpcMappings m = cuda.Make();
  cuda.fail = true;
  auto a = m.Open(7, Handle(1));
  CHECK(a.status().code() == absl::StatusCode::kUnavailable);
  CHECK(m.size() == 0);
  cuda.fail = false;
  CHECK(m.Open(7, Handle(1)).ok());
  CHECK(m.size() == 1);
  m.CloseAll();
  CHECK(cuda.closes == 1);
}

}  // namespace
}  // namespace rlmesh::weight_sync::internal
