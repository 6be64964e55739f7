#include "weight_sync/ipc_mappings.h"

namespace rlmesh::weight_sync::internal {

IpcMappings::Key IpcMappings::KeyOf(int64_t pid, const cudaIpcMemHandle_t& handle) {
  return {pid, std::string(reinterpret_cast<const char*>(&handle), sizeof(handle))};
}

absl::StatusOr<void*> IpcMappings::Open(int64_t pid, const cudaIpcMemHandle_t& handle) {
  const Key key = KeyOf(pid, handle);
  if (auto it = mapped_.find(key); it != mapped_.end()) return it->second;
  absl::StatusOr<void*> base = open_(handle);
  if (!base.ok()) return base.status();
  mapped_.emplace(key, *base);
  return *base;
}

void IpcMappings::Retain(const std::set<Key>& keep) {
  for (auto it = mapped_.begin(); it != mapped_.end();) {
    if (keep.count(it->first) != 0) {
      ++it;
      continue;
    }
    close_(it->second);
    it = mapped_.erase(it);
  }
}

}  // namespace rlmesh::weight_sync::internal
