#pragma once
// rlmesh shim: see learner/gloo_shim/README.md. The interface that
// ProcessGroupGloo.hpp's inline GlooStore overrides (without
// GLOO_STORE_HAS_STORE_V2); rlmesh code never instantiates it.
#include <chrono>
#include <string>
#include <vector>

namespace gloo {
namespace rendezvous {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};

}  // namespace rendezvous
}  // namespace gloo
