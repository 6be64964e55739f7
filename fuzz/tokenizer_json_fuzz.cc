// A tokenizer.json; when it loads, encoding and decoding text with it.
#include <cstdint>
#include <string>

#include "actor/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tok = rlmesh::actor::BpeTokenizer::FromJson(std::string(reinterpret_cast<const char*>(data), size));
  if (tok.ok()) {
    const std::vector<int> ids = (*tok)->Encode("Hello, world! 12+34= \xc3\xa9\xe4\xb8\xad <|im_end|>");
    (void)(*tok)->Decode(ids);
    (void)(*tok)->Decode({0, 1, 2, -1, 1 << 30});
  }
  return 0;
}
