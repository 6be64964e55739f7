// The replay store on a filesystem that fills up: a real tmpfs, mounted in a
// mount namespace of this test process (root only) so that nothing outside
// it sees the mount. Puts fail with RESOURCE_EXHAUSTED naming the disk and
// the store's folder, nothing acknowledged is lost, and once the tmpfs is
// grown (space returns) the same open store takes writes again. Run where
// mount namespaces cannot be made, it FAILS unless
// RLMESH_DISK_FULL_TEST=skip, which prints why and passes nothing else.
#include <filesystem>
#include <iostream>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "common/testing/tmpfs.h"
#include "replay_buffer/store.h"
#include "replay_buffer/testing/store_testing.h"

namespace rlmesh {
namespace {

using replay_testing::MakeGroup;
using replay_testing::OpenStore;
using replay_testing::Q;
using replay_testing::Req;

// A group of 8 samples with 8 KiB of response text each (~64 KiB).
TrajectoryGroup Big(int k) {
  TrajectoryGroup g = MakeGroup("e", k, absl::StrCat("g", k), {0, 1, 0, 1, 0, 1, 0, 1});
  for (auto& t : *g.mutable_samples()) t.set_response_text(std::string(8 << 10, static_cast<char>('a' + k % 26)));
  return g;
}

std::set<std::string> StoredGroupIds(ReplayStore& store) {
  std::set<std::string> out;
  QueryRequest q = Q("e", 10000);
  for (;;) {
    auto r = store.Query(q);
    REQUIRE(r.ok());
    for (const auto& t : r->trajectories()) out.insert(t.group_id());
    if (r->next_page_token().empty()) return out;
    q.set_page_token(r->next_page_token());
  }
}

TEST_CASE("a full disk: puts fail by name, acknowledged groups stay, writes resume when space returns") {
  testing::TempDir dir;
  const std::string mnt = dir.File("mnt");
  std::filesystem::create_directories(mnt);
  const std::string why = testing::MountPrivateTmpfs(mnt, "6m");
  if (!why.empty()) {
    if (testing::SkipDiskFullTest("disk_full_test", why)) return;
    FAIL("cannot make the small filesystem this test needs (" << why
                                                              << "); run as root, or set RLMESH_DISK_FULL_TEST=skip");
  }
  const std::string db = mnt + "/db";
  ReplayStoreOptions options;
  options.db_path = db;
  options.block_cache_bytes = 1 << 20;
  auto store = OpenStore(db, options);

  std::set<std::string> acked;
  absl::Status full;
  int k = 0;
  for (; k < 400 && full.ok(); ++k) {
    auto r = store->PutGroups(Req({Big(k)}));
    if (r.ok()) {
      acked.insert(absl::StrCat("g", k));
    } else {
      full = r.status();
    }
  }
  INFO(full.ToString());
  REQUIRE(!full.ok());
  CHECK(acked.size() >= 10);
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK(full.message().find("disk full") != absl::string_view::npos);
  CHECK(full.message().find(db) != absl::string_view::npos);
  // Still full: the next put fails the same way, and reads still work.
  auto again = store->PutGroups(Req({Big(k)}));
  CHECK(again.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(StoredGroupIds(*store) == acked);

  // Space returns: the same open store writes again, within RocksDB's
  // recovery poll: every 5 s it checks for free space above its reserve
  // (64 MiB, the write buffer here).
  REQUIRE(testing::ResizeTmpfs(mnt, "256m").empty());
  const absl::Time grown = absl::Now();
  absl::StatusOr<PutGroupsResponse> after = absl::UnknownError("not tried");
  while (absl::Now() < grown + absl::Seconds(60)) {
    after = store->PutGroups(Req({Big(1000)}));
    if (after.ok()) break;
    INFO(after.status().ToString());
    REQUIRE(after.status().code() == absl::StatusCode::kResourceExhausted);
    absl::SleepFor(absl::Milliseconds(200));
  }
  INFO(after.status().ToString());
  REQUIRE(after.ok());
  CHECK(after->written() == 1);
  std::cout << "disk_full_test: writes resumed " << absl::ToDoubleSeconds(absl::Now() - grown)
            << " s after the tmpfs grew" << std::endl;
  acked.insert("g1000");
  CHECK(StoredGroupIds(*store) == acked);

  // And a reopen (a restart) finds every acknowledged group.
  store.reset();
  store = OpenStore(db, options);
  CHECK(StoredGroupIds(*store) == acked);
}

}  // namespace
}  // namespace rlmesh
