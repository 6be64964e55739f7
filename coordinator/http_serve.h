#pragma once

// Binding a cpp-httplib server and serving it from a thread of its own: the
// one way the coordinator's HTTP endpoints (Prometheus, dashboard) start.

#include <httplib.h>

#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace rlmesh {

// Binds `server` to host:port (0 = a free port), starts `*thread` serving it
// and returns the bound port; UNAVAILABLE naming `what` when it cannot bind.
// The caller stops the server and joins the thread.
inline absl::StatusOr<int> BindAndServe(httplib::Server& server, const std::string& host, int port,
                                        const std::string& what, std::thread* thread) {
  int bound = 0;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound <= 0) return absl::UnavailableError(absl::StrCat(what, " cannot listen on ", host, ":", port));
  *thread = std::thread([&server] { server.listen_after_bind(); });
  return bound;
}

}  // namespace rlmesh
