#pragma once

// c10d stores: the rendezvous of every process group (learner data
// parallelism, weight-sync groups). A TCPStore is hosted by one process and
// reached over TCP by the others; a FileStore needs a file system every
// rank sees (one host, or a shared mount).

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace rlmesh::dist {

// A TCPStore. The server (rank 0) binds `port` on `host` (0 = a free port;
// read it back with getPort()) and does not wait for workers; clients
// connect to host:port. timeout_ms bounds connects and waits.
absl::StatusOr<c10::intrusive_ptr<c10d::TCPStore>> MakeTcpStore(const std::string& host,
                                                                 int port, bool is_server,
                                                                 int world_size,
                                                                 int64_t timeout_ms);

// `store` with every key under `prefix` (c10d's PrefixStore), so that
// several groups rendezvous in one store; `store` itself when prefix is
// empty.
c10::intrusive_ptr<c10d::Store> WithPrefix(c10::intrusive_ptr<c10d::Store> store, const std::string& prefix);

// A FileStore at `path` (a shared file system path, e.g. in TEST_TMPDIR).
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> MakeFileStore(const std::string& path,
                                                              int world_size);

}  // namespace rlmesh::dist
