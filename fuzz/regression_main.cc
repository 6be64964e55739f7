// The main of a fuzz target when it is built without libFuzzer (gcc, the
// default build): runs LLVMFuzzerTestOneInput on every file of the seed
// corpus given as arguments, then on deterministic mutations of each (bytes
// flipped, inserted, deleted, the input truncated and repeated) — a short,
// seeded smoke that `bazel test //...` runs. `bazel run --config=fuzz`
// links libFuzzer's own main instead (bench/fuzz.sh).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

std::string Mutate(std::string s, std::mt19937_64& rng) {
  static const char kInteresting[] = "{}[]\"'\\:,-0123456789.eE+nulltruefalse\n\t %#|!<>=_";
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 6) {
      case 0:
        if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(rng() & 0xff);
        break;
      case 1:
        s.insert(pos, 1, kInteresting[rng() % (sizeof(kInteresting) - 1)]);
        break;
      case 2:
        if (pos < s.size()) s.erase(pos, 1 + rng() % 8);
        break;
      case 3:
        s.resize(pos);
        break;
      case 4:
        if (!s.empty()) s.insert(pos, s.substr(rng() % s.size(), 1 + rng() % 16));
        break;
      default:
        s.insert(pos, std::string(1 + rng() % 3, "9-.e"[rng() % 4]));
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int mutations = std::getenv("RLMESH_FUZZ_MUTATIONS") ? std::atoi(std::getenv("RLMESH_FUZZ_MUTATIONS")) : 300;
  std::mt19937_64 rng(20261201);
  int inputs = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read corpus file %s\n", argv[i]);
      return 1;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string seed = ss.str();
    Run(seed);
    ++inputs;
    for (int m = 0; m < mutations; ++m, ++inputs) Run(Mutate(seed, rng));
  }
  Run("");
  std::printf("ran %d inputs from %d corpus files without a crash\n", inputs + 1, argc - 1);
  return 0;
}
