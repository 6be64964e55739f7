#include "weight_sync/weight_sync.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/process_memory.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "dist/cuda_api.h"
#include "dist/gloo.h"
#include "dist/store.h"
#include "weight_sync/testing/weight_sync_testing.h"

namespace rlmesh::weight_sync {
namespace {

using dist::CudaDeviceCount;
using dist::OpenCudaRuntime;
using dist::OpenNccl;

TEST_CASE("BuildLayout packs in order, aligns and splits buckets") {
  auto tensors = MakeTensors(1);
  auto layout = BuildLayout(tensors, 3, 1 << 20);
  REQUIRE(layout.ok());
  CHECK(layout->version() == 3);
  REQUIRE(layout->tensors_size() == 6);
  // embed (8 KiB) + q_proj (2 KiB) + norm share bucket 0; big opens bucket 1
  // alone; lm_head + scalar go to bucket 2.
  CHECK(layout->tensors(0).bucket() == 0);
  CHECK(layout->tensors(1).bucket() == 0);
  CHECK(layout->tensors(1).byte_offset() == 64 * 32 * 4);
  CHECK(layout->tensors(2).bucket() == 0);
  CHECK(layout->tensors(3).bucket() == 1);
  CHECK(layout->tensors(3).byte_offset() == 0);
  CHECK(layout->tensors(4).bucket() == 2);
  CHECK(layout->bucket_bytes_size() == 3);
  CHECK(layout->bucket_bytes(1) == 300 * 1024 * 4);
  CHECK(layout->tensors(1).dtype() == "bf16");
  CHECK(layout->tensors(2).dtype() == "f16");
  for (const auto& s : layout->tensors()) CHECK(s.byte_offset() % kSlotAlignment == 0);
  CHECK(ValidateLayout(*layout).ok());

  // A slot that overruns its bucket is caught by the receiving side's check.
  WeightLayout bad = *layout;
  bad.mutable_tensors(0)->set_byte_offset(layout->bucket_bytes(0));
  auto s = ValidateLayout(bad);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "model.embed_tokens.weight"));
  bad = *layout;
  bad.mutable_tensors(2)->set_dtype("f64");
  CHECK(absl::StrContains(ValidateLayout(bad).message(), "dtype"));
}

TEST_CASE("BuildLayout rejects bad tensors naming the field") {
  CHECK(BuildLayout({}, 1, 1024).status().code() == absl::StatusCode::kInvalidArgument);
  NamedTensors dup = {{"a", at::zeros({2})}, {"a", at::zeros({2})}};
  CHECK(absl::StrContains(BuildLayout(dup, 1, 1024).status().message(), "duplicate name a"));
  NamedTensors ints = {{"ids", at::zeros({2}, at::kLong)}};
  auto s = BuildLayout(ints, 1, 1024).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "tensors[ids].dtype"));
}

TEST_CASE("SHM publish/receive round trip is bit-exact; old versions are removed") {
  testing::TempDir dir;
  auto spec = ShmSpec(dir);
  auto pub = CreateWeightPublisher(spec);
  auto recv = CreateWeightReceiver(spec);
  REQUIRE(pub.ok());
  REQUIRE(recv.ok());
  CHECK((*pub)->backend() == WEIGHT_SYNC_SHM);

  for (int version = 1; version <= 3; ++version) {
    auto tensors = MakeTensors(version);
    auto layout = (*pub)->Publish(tensors, version);
    REQUIRE(layout.ok());
    WeightLayout received;
    auto got = (*recv)->Receive(*layout, &received);
    REQUIRE(got.ok());
    CHECK(received.SerializeAsString() == layout->SerializeAsString());
    ExpectBitExact(tensors, *got);
    // Receiving by version alone works too (the layout comes from the manifest).
    WeightLayout by_version;
    by_version.set_version(version);
    auto again = (*recv)->Receive(by_version);
    REQUIRE(again.ok());
    ExpectBitExact(tensors, *again);
  }
  // Versions 2 and 3 stay readable; 1 (whose slot 3 reused) is gone.
  CHECK(access(dir.File("w-v1.layout").c_str(), F_OK) != 0);
  CHECK(access(dir.File("w-v2.layout").c_str(), F_OK) == 0);
  CHECK(access(dir.File("w-v3.layout").c_str(), F_OK) == 0);
  CHECK(access(dir.File("w-slot1.bucket2").c_str(), F_OK) == 0);
  WeightLayout v1;
  v1.set_version(1);
  auto gone = CreateWeightReceiver([&] {
    auto s = spec;
    s.set_timeout_ms(50);
    return s;
  }());
  REQUIRE(gone.ok());
  CHECK((*gone)->Receive(v1).status().code() == absl::StatusCode::kDeadlineExceeded);

  // Version must move forward.
  auto stale = (*pub)->Publish(MakeTensors(9), 3);
  CHECK(stale.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(stale.status().message(), "version"));

  pub->reset();  // the publisher removes what it wrote
  CHECK(access(dir.File("w-v3.layout").c_str(), F_OK) != 0);
  CHECK(access(dir.File("w-slot1.bucket0").c_str(), F_OK) != 0);
  CHECK(access(dir.File("w-seq").c_str(), F_OK) != 0);
}

TEST_CASE("SHM receiver checks the layout against the files") {
  testing::TempDir dir;
  auto spec = ShmSpec(dir);
  auto pub = CreateWeightPublisher(spec);
  auto recv = CreateWeightReceiver(spec);
  REQUIRE(pub.ok());
  REQUIRE(recv.ok());
  auto layout = (*pub)->Publish(MakeTensors(1), 1);
  REQUIRE(layout.ok());

  // The caller expected another shape: refused, nothing returned.
  WeightLayout other = *layout;
  other.mutable_tensors(0)->set_shape(0, 65);
  CHECK((*recv)->Receive(other).status().code() == absl::StatusCode::kInvalidArgument);

  // A truncated bucket file is detected by size.
  REQUIRE(truncate(dir.File("w-slot1.bucket1").c_str(), 100) == 0);
  auto s = (*recv)->Receive(*layout).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "bucket_bytes"));

  // A version nobody publishes times out within the spec's deadline.
  spec.set_timeout_ms(200);
  auto late = CreateWeightReceiver(spec);
  REQUIRE(late.ok());
  WeightLayout v7;
  v7.set_version(7);
  const absl::Time start = absl::Now();
  CHECK((*late)->Receive(v7).status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - start < absl::Seconds(2));
}

TEST_CASE("SHM ReceiveInto reuses caller buffers; a reader overtaken by the publisher gets ABORTED") {
  testing::TempDir dir;
  auto spec = ShmSpec(dir);
  auto pub = CreateWeightPublisher(spec);
  auto recv = CreateWeightReceiver(spec);
  REQUIRE(pub.ok());
  REQUIRE(recv.ok());
  auto first = MakeTensors(1);
  auto layout = (*pub)->Publish(first, 1);
  REQUIRE(layout.ok());
  auto buffers = (*recv)->Receive(*layout);
  REQUIRE(buffers.ok());
  std::reverse(buffers->begin(), buffers->end());  // matched by name, not order
  void* before = (*buffers)[0].second.data_ptr();
  for (int v = 2; v <= 3; ++v) {
    auto tensors = MakeTensors(v);
    REQUIRE((*pub)->Publish(tensors, v).ok());
    WeightLayout want;
    want.set_version(v);
    REQUIRE((*recv)->ReceiveInto(want, *buffers).ok());
    NamedTensors in_order(buffers->rbegin(), buffers->rend());
    ExpectBitExact(tensors, in_order);
  }
  CHECK((*buffers)[0].second.data_ptr() == before);  // written in place

  // Wrong destinations are refused naming the tensor.
  NamedTensors short_list(buffers->begin() + 1, buffers->end());
  WeightLayout v3;
  v3.set_version(3);
  auto s = (*recv)->ReceiveInto(v3, short_list);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), (*buffers)[0].first));

  // A reader that found version 3's manifest but reads after the publisher
  // reused slot 1 for version 5: refused, not torn.
  std::string manifest3;
  {
    FILE* f = fopen(dir.File("w-v3.layout").c_str(), "rb");
    REQUIRE(f != nullptr);
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    manifest3.assign(buf, n);
  }
  REQUIRE((*pub)->Publish(MakeTensors(4), 4).ok());
  REQUIRE((*pub)->Publish(MakeTensors(5), 5).ok());
  {
    FILE* f = fopen(dir.File("w-v3.layout").c_str(), "wb");
    REQUIRE(f != nullptr);
    fwrite(manifest3.data(), 1, manifest3.size(), f);
    fclose(f);
  }
  auto torn = (*recv)->Receive(v3);
  CHECK(torn.status().code() == absl::StatusCode::kAborted);
}

TEST_CASE("SHM receiver waits for a version published after it asked") {
  testing::TempDir dir;
  auto spec = ShmSpec(dir);
  auto pub = CreateWeightPublisher(spec);
  auto recv = CreateWeightReceiver(spec);
  REQUIRE(pub.ok());
  REQUIRE(recv.ok());
  auto tensors = MakeTensors(5);
  absl::StatusOr<NamedTensors> got;
  absl::Notification asking;
  std::thread t([&] {
    WeightLayout want;
    want.set_version(1);
    asking.Notify();
    got = (*recv)->Receive(want);
  });
  // The receiver asks right after `asking`, so Publish almost always finds
  // it polling for version 1's manifest. (Published first, the version is
  // read at once: neither order can fail the test.)
  REQUIRE(asking.WaitForNotificationWithTimeout(absl::Seconds(10)));
  REQUIRE((*pub)->Publish(tensors, 1).ok());
  t.join();
  REQUIRE(got.ok());
  ExpectBitExact(tensors, *got);
}

// A bf16 rollout gets bf16 from fp32 masters: the publisher casts, the
// buckets carry half the bytes, and what arrives is the cast bit for bit.
TEST_CASE("spec.dtype: the publisher sends every floating tensor as that type") {
  testing::TempDir dir;
  WeightSyncSpec spec = ShmSpec(dir);
  spec.set_dtype("bf16");
  auto pub = CreateWeightPublisher(spec);
  auto recv = CreateWeightReceiver(spec);
  REQUIRE(pub.ok());
  REQUIRE(recv.ok());
  const NamedTensors tensors = MakeTensors(5);
  auto layout = (*pub)->Publish(tensors, 1);
  REQUIRE(layout.ok());
  for (const TensorSlot& slot : layout->tensors()) CHECK(slot.dtype() == "bf16");
  auto got = (*recv)->Receive(*layout);
  REQUIRE(got.ok());
  auto want = CastForSync(tensors, "bf16");
  REQUIRE(want.ok());
  ExpectBitExact(*want, *got);
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO(tensors[i].first);
    CHECK((*got)[i].second.scalar_type() == at::kBFloat16);
    CHECK(at::equal((*got)[i].second, tensors[i].second.to(at::kBFloat16)));
  }
  auto full = BuildLayout(tensors, 1, int64_t{64} << 20);
  REQUIRE(full.ok());
  int64_t sent = 0, whole = 0;
  for (int64_t b : layout->bucket_bytes()) sent += b;
  for (int64_t b : full->bucket_bytes()) whole += b;
  CHECK(sent < whole * 0.6);  // the f32 tensors dominate: about half

  // Unchanged without a dtype; an unknown one is refused by name.
  auto same = CastForSync(tensors, "");
  REQUIRE(same.ok());
  CHECK((*same)[0].second.is_same(tensors[0].second));
  spec.set_dtype("f64");
  CHECK(absl::StrContains(CreateWeightPublisher(spec).status().message(), "spec.dtype: unknown \"f64\""));
}

TEST_CASE("IN_PROCESS round trip") {
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_IN_PROCESS);
  spec.set_group_name("ws-test-inproc");
  spec.set_timeout_ms(1000);
  auto pub = CreateWeightPublisher(spec);
  auto recv = CreateWeightReceiver(spec);
  REQUIRE(pub.ok());
  REQUIRE(recv.ok());
  auto tensors = MakeTensors(2);
  auto layout = (*pub)->Publish(tensors, 4);
  REQUIRE(layout.ok());
  auto got = (*recv)->Receive(*layout);
  REQUIRE(got.ok());
  ExpectBitExact(tensors, *got);
}

TEST_CASE("GLOO broadcast between threads: two receivers get the same bits; wrong version is refused") {
  auto store = WeightSyncStore::Host("127.0.0.1", 0, 3, 10000);
  REQUIRE(store.ok());
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_GLOO);
  spec.set_store_host("127.0.0.1");
  spec.set_store_port((*store)->port());
  spec.set_world_size(3);
  spec.set_group_name("ws-test-gloo");
  spec.set_timeout_ms(10000);
  spec.set_bucket_mb(1);

  auto v1 = MakeTensors(11);
  auto v2 = MakeTensors(12);
  absl::StatusOr<NamedTensors> got[2][2];
  std::vector<std::thread> threads;
  for (int r = 1; r <= 2; ++r) {
    threads.emplace_back([&, r] {
      WeightSyncSpec s = spec;
      s.set_rank(r);
      auto recv = CreateWeightReceiver(s);
      if (!recv.ok()) {
        got[r - 1][0] = recv.status();
        return;
      }
      WeightLayout want;
      want.set_version(1);
      got[r - 1][0] = (*recv)->Receive(want);
      // Rank 2 expects the wrong version in round two: it must still drain
      // the round (the group stays usable) and report the mismatch.
      want.set_version(r == 1 ? 2 : 5);
      got[r - 1][1] = (*recv)->Receive(want);
    });
  }
  WeightSyncSpec s0 = spec;
  s0.set_rank(0);
  auto pub = CreateWeightPublisher(s0);
  REQUIRE(pub.ok());
  auto l1 = (*pub)->Publish(v1, 1);
  auto l2 = (*pub)->Publish(v2, 2);
  for (auto& t : threads) t.join();
  REQUIRE(l1.ok());
  REQUIRE(l2.ok());
  REQUIRE(got[0][0].ok());
  REQUIRE(got[1][0].ok());
  ExpectBitExact(v1, *got[0][0]);
  ExpectBitExact(v1, *got[1][0]);
  REQUIRE(got[0][1].ok());
  ExpectBitExact(v2, *got[0][1]);
  CHECK(got[1][1].status().code() == absl::StatusCode::kFailedPrecondition);
}

WeightSyncSpec GlooSpec(int port, int world_size, const std::string& group) {
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_GLOO);
  spec.set_store_host("127.0.0.1");
  spec.set_store_port(port);
  spec.set_world_size(world_size);
  spec.set_group_name(group);
  spec.set_timeout_ms(20000);
  spec.set_bucket_mb(1);
  return spec;
}

WeightSyncSpec WithRank(WeightSyncSpec spec, int rank) {
  spec.set_rank(rank);
  return spec;
}

// 48 tensors of 1 MiB: 48 buckets of 1 MiB.
NamedTensors MakePolicy(int seed) {
  at::manual_seed(seed);
  NamedTensors out;
  for (int i = 0; i < 48; ++i) out.emplace_back(absl::StrCat("layers.", i, ".weight"), at::randn({256, 1024}));
  return out;
}

TEST_CASE("GLOO goes bucket by bucket through two buffers: 48 MiB cross with a few MiB of extra memory") {
  auto store = WeightSyncStore::Host("127.0.0.1", 0, 2, 20000);
  REQUIRE(store.ok());
  const WeightSyncSpec spec = GlooSpec((*store)->port(), 2, "ws-test-gloo-pipeline");
  const NamedTensors v1 = MakePolicy(1);
  const NamedTensors v2 = MakePolicy(2);
  // The rollout worker's way: the first round allocates its tensors, later
  // rounds unpack straight into them.
  NamedTensors buffers;
  absl::Status received[2];
  absl::Notification round_one_done;
  std::thread receiver([&] {
    auto recv = CreateWeightReceiver(WithRank(spec, 1));
    if (!recv.ok()) {
      received[0] = recv.status();
      round_one_done.Notify();
      return;
    }
    WeightLayout want;
    want.set_version(1);
    auto got = (*recv)->Receive(want);
    received[0] = got.status();
    if (got.ok()) buffers = *std::move(got);
    round_one_done.Notify();
    if (!got.ok()) return;
    want.set_version(2);
    received[1] = (*recv)->ReceiveInto(want, buffers);
  });
  auto pub = CreateWeightPublisher(WithRank(spec, 0));
  REQUIRE(pub.ok());
  auto l1 = (*pub)->Publish(v1, 1);
  REQUIRE(l1.ok());
  CHECK(l1->bucket_bytes_size() == 48);
  // Round two, both sides in this process: the peak resident set may grow
  // by the two sides' buffers (2 + 2 MiB) and Gloo's own, not by a copy of
  // the policy (48 MiB of buckets on each side). The peak is reset once the
  // receiver holds round one's tensors, so that round one's allocations are
  // not counted and everything round two allocates is, on either side.
  REQUIRE(round_one_done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  REQUIRE(bench::ResetPeakRss());
  const double before = bench::RssBytes();
  auto l2 = (*pub)->Publish(v2, 2);
  receiver.join();
  const double grown = bench::PeakRssBytes() - before;
  REQUIRE(l2.ok());
  REQUIRE(received[0].ok());
  REQUIRE(received[1].ok());
  ExpectBitExact(v2, buffers);
  INFO("peak grew by " << grown / (1 << 20) << " MiB");
  CHECK(grown < 16.0 * (1 << 20));
}

TEST_CASE("GLOO ReceiveInto with a wrong destination drains the round and stays usable") {
  auto store = WeightSyncStore::Host("127.0.0.1", 0, 2, 20000);
  REQUIRE(store.ok());
  const WeightSyncSpec spec = GlooSpec((*store)->port(), 2, "ws-test-gloo-dest");
  const NamedTensors v1 = MakeTensors(21);
  const NamedTensors v2 = MakeTensors(22);
  absl::Status first;
  absl::StatusOr<NamedTensors> second;
  std::thread receiver([&] {
    auto recv = CreateWeightReceiver(WithRank(spec, 1));
    if (!recv.ok()) {
      first = recv.status();
      return;
    }
    NamedTensors wrong;
    for (const auto& [name, t] : v1) wrong.emplace_back(name, at::empty(t.sizes(), t.options()));
    wrong[0].second = at::empty({64, 32}, at::kDouble);  // the dtype is wrong
    WeightLayout want;
    want.set_version(1);
    first = (*recv)->ReceiveInto(want, wrong);
    want.set_version(2);
    second = (*recv)->Receive(want);
  });
  auto pub = CreateWeightPublisher(WithRank(spec, 0));
  REQUIRE(pub.ok());
  REQUIRE((*pub)->Publish(v1, 1).ok());
  REQUIRE((*pub)->Publish(v2, 2).ok());
  receiver.join();
  CHECK(first.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(first.message(), "destinations[model.embed_tokens.weight]"));
  REQUIRE(second.ok());
  ExpectBitExact(v2, *second);
}

TEST_CASE("A GLOO receiver refuses a corrupt layout by name: a missing bucket is drained, a huge one ends the group") {
  auto store = WeightSyncStore::Host("127.0.0.1", 0, 2, 20000);
  REQUIRE(store.ok());
  const WeightSyncSpec spec = GlooSpec((*store)->port(), 2, "ws-test-gloo-rogue");
  absl::Status first, third, after;
  absl::StatusOr<NamedTensors> second;
  std::thread receiver([&] {
    auto recv = CreateWeightReceiver(WithRank(spec, 1));
    if (!recv.ok()) {
      first = recv.status();
      return;
    }
    WeightLayout want;
    want.set_version(1);
    first = (*recv)->Receive(want).status();
    want.set_version(2);
    second = (*recv)->Receive(want);
    want.set_version(3);
    third = (*recv)->Receive(want).status();
    want.set_version(4);
    after = (*recv)->Receive(want).status();
  });
  // Rank 0 is a bare Gloo group on the wire format (header {version, layout
  // bytes}, the layout, then each bucket), so it can send a layout no
  // publisher would build.
  auto client = dist::MakeTcpStore("127.0.0.1", (*store)->port(), /*is_server=*/false, 2, 20000);
  REQUIRE(client.ok());
  dist::GlooGroupOptions opts;
  opts.timeout_ms = 20000;
  auto group = dist::CreateGlooGroup(dist::WithPrefix(*client, "weight_sync/ws-test-gloo-rogue"), 0, 2, opts);
  REQUIRE(group.ok());
  auto send = [&](void* data, int64_t bytes) {
    std::vector<at::Tensor> v{at::from_blob(data, {bytes}, at::TensorOptions().dtype(at::kByte))};
    (*group)->broadcast(v)->wait();
  };
  auto send_round = [&](const WeightLayout& layout, const NamedTensors& tensors) {
    std::string bytes = layout.SerializeAsString();
    int64_t header[2] = {layout.version(), static_cast<int64_t>(bytes.size())};
    send(header, sizeof(header));
    send(bytes.data(), static_cast<int64_t>(bytes.size()));
    std::vector<std::vector<char>> buckets;
    for (int64_t b : layout.bucket_bytes()) buckets.emplace_back(static_cast<size_t>(b), 0);
    for (int i = 0; i < layout.tensors_size() && !tensors.empty(); ++i) {
      const TensorSlot& slot = layout.tensors(i);
      at::Tensor t = tensors[i].second.contiguous();
      std::memcpy(buckets[slot.bucket()].data() + slot.byte_offset(), t.data_ptr(), t.nbytes());
    }
    for (auto& b : buckets) send(b.data(), static_cast<int64_t>(b.size()));
  };
  auto bad = BuildLayout(MakeTensors(1), 1, 1 << 20);
  REQUIRE(bad.ok());
  bad->mutable_tensors(0)->set_bucket(bad->bucket_bytes_size() + 4);  // past the last bucket
  send_round(*bad, {});
  const NamedTensors v2 = MakeTensors(2);
  auto good = BuildLayout(v2, 2, 1 << 20);
  REQUIRE(good.ok());
  send_round(*good, v2);
  // A bucket of a petabyte: the receiver cannot hold it, says so, and is
  // done with the group (it can no longer follow the wire); no bucket is sent.
  WeightLayout huge = *good;
  huge.set_version(3);
  huge.set_bucket_bytes(0, int64_t{1} << 50);
  {
    std::string bytes = huge.SerializeAsString();
    int64_t header[2] = {3, static_cast<int64_t>(bytes.size())};
    send(header, sizeof(header));
    send(bytes.data(), static_cast<int64_t>(bytes.size()));
  }
  receiver.join();
  CHECK(third.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(third.message(), "out of memory"));
  CHECK(after.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(first.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(first.message(), absl::StrCat("layout.tensors[model.embed_tokens.weight].bucket: ",
                                                         bad->bucket_bytes_size() + 4, " outside")));
  REQUIRE(second.ok());
  ExpectBitExact(v2, *second);
}

TEST_CASE("GLOO publisher with no receivers fails within the timeout") {
  auto store = WeightSyncStore::Host("127.0.0.1", 0, 2, 5000);
  REQUIRE(store.ok());
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_GLOO);
  spec.set_store_host("127.0.0.1");
  spec.set_store_port((*store)->port());
  spec.set_world_size(2);
  spec.set_rank(0);
  spec.set_group_name("ws-test-lonely");
  spec.set_timeout_ms(500);
  auto pub = CreateWeightPublisher(spec);
  REQUIRE(pub.ok());
  const absl::Time start = absl::Now();
  auto s = (*pub)->Publish(MakeTensors(1), 1).status();
  CHECK_FALSE(s.ok());
  CHECK(absl::Now() - start < absl::Seconds(10));
  // The object is unusable afterwards and says so.
  CHECK((*pub)->Publish(MakeTensors(1), 2).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("Specs are validated") {
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_GLOO);
  spec.set_store_host("10.0.0.1");
  spec.set_store_port(1234);
  spec.set_world_size(2);
  spec.set_rank(5);
  CHECK(absl::StrContains(CreateWeightReceiver(spec).status().message(), "spec.rank"));
  spec.set_rank(0);
  CHECK(absl::StrContains(CreateWeightReceiver(spec).status().message(), "spec.rank"));
  spec.set_store_port(0);
  CHECK(absl::StrContains(CreateWeightPublisher(spec).status().message(), "spec.store_port"));

  // Timeouts: [0, an hour]; beyond that a receive could hold the worker's
  // load turn for ages and the store's deadline arithmetic overflows.
  WeightSyncSpec shm;
  shm.set_backend(WEIGHT_SYNC_SHM);
  shm.set_timeout_ms(kMaxWeightSyncTimeoutMs + 1);
  CHECK(absl::StrContains(ValidateSpec(shm).message(), "spec.timeout_ms"));
  shm.set_timeout_ms(std::numeric_limits<int64_t>::max());
  CHECK(ValidateSpec(shm).code() == absl::StatusCode::kInvalidArgument);
  shm.set_timeout_ms(kMaxWeightSyncTimeoutMs);
  CHECK(ValidateSpec(shm).ok());

  WeightSyncSpec autos;
  CHECK(ResolveBackend(autos) == WEIGHT_SYNC_SHM);
  autos.set_store_host("10.1.2.3");
  CHECK(ResolveBackend(autos) == WEIGHT_SYNC_GLOO);

  // NCCL rendezvous through the store like GLOO: the spec is checked first.
  WeightSyncSpec nccl;
  nccl.set_backend(WEIGHT_SYNC_NCCL);
  auto s = CreateWeightReceiver(nccl).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "spec.store_host"));
  nccl.set_store_host("127.0.0.1");
  nccl.set_store_port(1234);
  nccl.set_world_size(2);
  nccl.set_rank(1);
  CHECK(absl::StrContains(CreateWeightPublisher(nccl).status().message(), "spec.rank"));
}

TEST_CASE("A missing CUDA or NCCL library is FAILED_PRECONDITION naming it") {
  auto nccl = OpenNccl({"libnccl-rlmesh-missing.so.2"});
  CHECK(nccl.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(nccl.status().message(), "libnccl-rlmesh-missing.so.2 not found (dlopen: "));
  auto cuda = OpenCudaRuntime({"libcudart-rlmesh-missing.so.13", "libcudart-rlmesh-missing.so"});
  CHECK(cuda.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(cuda.status().message(), "libcudart-rlmesh-missing.so.13 not found"));
}

TEST_CASE("NCCL and CUDA_IPC without a GPU refuse to start, naming what is missing") {
  auto devices = CudaDeviceCount();
  if (devices.ok()) {
    WARN("CUDA devices present: " << *devices << "; the round-trip tests below run instead");
    return;
  }
  INFO(devices.status().message());
  CHECK(devices.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(NamesWhatIsMissing(devices.status()));

  testing::TempDir dir;
  const auto ipc = IpcSpec(dir);
  for (const absl::Status& s : {CreateWeightPublisher(ipc).status(), CreateWeightReceiver(ipc).status()}) {
    std::printf("CUDA_IPC here: %s\n", s.ToString().c_str());
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StartsWith(s.message(), "CUDA_IPC backend: "));
    CHECK(NamesWhatIsMissing(s));
  }
  // No store is contacted: the check comes before any rendezvous.
  for (const absl::Status& s : {CreateWeightPublisher(NcclSpec(1, 0)).status(),
                                CreateWeightReceiver(NcclSpec(1, 1)).status()}) {
    std::printf("NCCL here: %s\n", s.ToString().c_str());
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StartsWith(s.message(), "NCCL backend: "));
    CHECK(NamesWhatIsMissing(s));
  }
  // Nothing was left behind under the prefix.
  CHECK(access(dir.File("w-ipc-seq").c_str(), F_OK) != 0);
}

// NCCL and CUDA IPC run on the device the process names, never on one its
// rank picks (rank r on GPU r % count put a colocated worker of GPU 0 on
// GPU r).
TEST_CASE("CudaDeviceOf is the process's own device, refused by name when it has none") {
  WeightSyncSpec spec = NcclSpec(1, 3);
  spec.set_device("cuda:1");
  auto on = CudaDeviceOf(spec, 4);
  REQUIRE(on.ok());
  CHECK(*on == 1);  // not 3 % 4
  spec.set_device("cuda");
  CHECK(*CudaDeviceOf(spec, 4) == 0);
  for (const auto& [device, count, says] :
       std::vector<std::tuple<std::string, int, std::string>>{
           {"", 4, "weight sync rank 3 spec.device: WEIGHT_SYNC_NCCL moves weights between GPUs, but this process's "
                   "are on the CPU (no device given)"},
           {"cpu", 4, "are on cpu"},
           {"cuda:2", 2, "weight sync rank 3 spec.device: cuda:2 but this process sees 2 CUDA device(s)"},
           {"gpu0", 4, "\"gpu0\" is not cpu, cuda or cuda:<index>"}}) {
    INFO(device);
    spec.set_device(device);
    auto s = CudaDeviceOf(spec, count).status();
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(s.message()).find(says) != std::string::npos);
  }
}

}  // namespace
}  // namespace rlmesh::weight_sync
