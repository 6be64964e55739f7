#pragma once

// A role's side of the coordinator's registry: Register once the role's
// server is up, then Heartbeat every interval the coordinator asks for, and
// Register again when the coordinator says it does not know the role (it
// restarted). Every call has a deadline; failures are retried and logged,
// never fatal to the role.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc_client.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

struct RegistrationOptions {
  // host:port of the coordinator. Required.
  std::string coordinator;
  // Token the coordinator's RPCs need (empty = none).
  std::string auth_token;
  // What is registered (name, role, address, host, pid, capabilities).
  RoleInfo role;
  // Deadline of each Register/Heartbeat call. Default 5 s.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Wait between failed Register attempts. Default 1 s.
  absl::Duration retry_period = absl::Seconds(1);

  absl::Status Validate() const;
};

// The address other hosts reach this role at, for a server bound to
// `bind`:`port`: `advertise_address` if set (a port is appended when it has
// none); else the IPv4 address of `advertise_interface` if set; else `bind`
// when it is not a wildcard; else the local address this host uses to reach
// `coordinator` (no packet is sent); else the hostname.
absl::StatusOr<std::string> AdvertisedAddress(const std::string& advertise_address,
                                              const std::string& advertise_interface, const std::string& bind,
                                              int port, const std::string& coordinator);

// The IPv4 address of a network interface ("eth0"), NOT_FOUND if it has none.
absl::StatusOr<std::string> InterfaceAddress(const std::string& interface);

// Runs the register/heartbeat loop on a thread of its own until destroyed.
// Not copyable; the destructor stops the thread within one rpc_timeout.
class Registration {
 public:
  static absl::StatusOr<std::unique_ptr<Registration>> Start(RegistrationOptions options);
  ~Registration();

 private:
  explicit Registration(RegistrationOptions options, RpcClient client)
      : options_(std::move(options)), client_(std::move(client)) {}
  void Loop();
  // Sleeps `d` unless stopping; returns false when stopping.
  bool Sleep(absl::Duration d);

  // Constant after construction.
  const RegistrationOptions options_;
  const RpcClient client_;
  // Guarded by mu_.
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Loop thread only.
  std::thread thread_;
};

}  // namespace rlmesh
