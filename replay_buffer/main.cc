// replay_buffer: the durable trajectory store (RocksDB) behind the
// ReplayBuffer RPC.
#include <cstdio>

#include "absl/flags/flag.h"
#include "common/log.h"
#include "common/server_flags.h"
#include "replay_buffer/service.h"
#include "replay_buffer/store.h"

ABSL_FLAG(std::string, db_path, "", "RocksDB directory of the store (created if missing). Required.");
ABSL_FLAG(double, ack_timeout_seconds, 60.0,
          "Unacknowledged FIFO samples (require_ack) are redelivered after this long.");
ABSL_FLAG(int64_t, max_group_bytes, 32 << 20, "Largest group PutGroups accepts, bytes.");
ABSL_FLAG(int, writer_threads, 16, "Threads running PutGroups/AckSample/Trim.");

int main(int argc, char** argv) {
  rlmesh::InitServerProcess(argc, argv, "replay_buffer",
                            "replay_buffer --port=0 --port_file=PATH --db_path=DIR");
  if (absl::GetFlag(FLAGS_db_path).empty()) {
    std::fprintf(stderr, "replay_buffer: --db_path is required\n");
    return 2;
  }
  auto options = rlmesh::ServerOptionsFromFlags("replay_buffer");
  if (!options.ok()) {
    std::fprintf(stderr, "replay_buffer: %s\n", options.status().ToString().c_str());
    return 2;
  }
  rlmesh::ReplayStoreOptions store_options;
  store_options.db_path = absl::GetFlag(FLAGS_db_path);
  store_options.ack_timeout = absl::Seconds(absl::GetFlag(FLAGS_ack_timeout_seconds));
  store_options.max_group_bytes = absl::GetFlag(FLAGS_max_group_bytes);
  rlmesh::ReplayServiceOptions service_options;
  service_options.writer_threads = absl::GetFlag(FLAGS_writer_threads);
  for (absl::Status s : {store_options.Validate(), service_options.Validate()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "replay_buffer: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  auto store = rlmesh::ReplayStore::Open(store_options);
  if (!store.ok()) {
    std::fprintf(stderr, "replay_buffer: %s\n", store.status().ToString().c_str());
    return 1;
  }
  rlmesh::RpcServer server(*options);
  rlmesh::ReplayBufferService service(store->get(), &server.auth(), service_options);
  server.AddService(&service);
  return rlmesh::ServeUntilSignal(server);
}
