#include "dist/store.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace rlmesh::dist {

absl::StatusOr<c10::intrusive_ptr<c10d::TCPStore>> MakeTcpStore(const std::string& host,
                                                                 int port, bool is_server,
                                                                 int world_size,
                                                                 int64_t timeout_ms) {
  if (port < 0 || port > 65535 || (!is_server && port == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("port: invalid ", port));
  }
  if (world_size < 1) return absl::InvalidArgumentError("world_size: must be >= 1");
  if (timeout_ms <= 0) return absl::InvalidArgumentError("timeout_ms: must be > 0");
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(port);
    opts.isServer = is_server;
    opts.numWorkers = world_size;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    store = c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("tcp store ", host, ":", port, (is_server ? " (server)" : ""), ": ",
                     e.what()));
  }
  return store;
}

c10::intrusive_ptr<c10d::Store> WithPrefix(c10::intrusive_ptr<c10d::Store> store, const std::string& prefix) {
  if (prefix.empty()) return store;
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> MakeFileStore(const std::string& path,
                                                              int world_size) {
  if (path.empty()) return absl::InvalidArgumentError("path: must not be empty");
  if (world_size < 1) return absl::InvalidArgumentError("world_size: must be >= 1");
  try {
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::FileStore>(path, world_size));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("file store ", path, ": ", e.what()));
  }
}

}  // namespace rlmesh::dist
