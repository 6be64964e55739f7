// safetensors files (every checkpoint, HF model folder and optimizer state
// the engine loads): any bytes open as a validated file or give an error,
// never a crash, an out-of-bounds read or a huge allocation; a file that
// opens reads every tensor back with exactly the bytes its header claims.
#include <cstdint>
#include <cstdlib>

#include "actor/safetensors.h"
#include "fuzz/input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = rlmesh::fuzz::WriteInputFile(data, size, ".safetensors");
  auto file = rlmesh::actor::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  for (const auto& e : (*file)->entries()) {
    auto t = (*file)->Read(e.name);
    if (!t.ok()) continue;
    const uint64_t bytes = static_cast<uint64_t>(t->numel()) * t->element_size();
    if (bytes != e.end - e.begin) std::abort();
  }
  return 0;
}
