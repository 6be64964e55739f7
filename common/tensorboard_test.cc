// Our event files, read back by PyPI tensorboard's EventAccumulator.
#include "common/tensorboard.h"

#include <cstdlib>
#include <fstream>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

TEST_CASE("crc32c matches the standard check value") {
  CHECK(Crc32c("123456789") == 0xe3069283u);
  CHECK(Crc32c("") == 0u);
}

TEST_CASE("TensorBoard reads back every scalar we write") {
  testing::TempDir dir;
  auto w = TensorBoardWriter::Create(dir.File("tb"));
  REQUIRE(w.ok());
  for (int step = 1; step <= 5; ++step) {
    REQUIRE((*w)->AddScalar("grpo/reward_mean", step, 0.1 * step, 1000.0 + step).ok());
    REQUIRE((*w)->AddScalar("eval/accuracy", step, 1.0 - 0.1 * step, 1000.0 + step).ok());
  }
  const char* py = std::getenv("RLMESH_PYTHON");
  const std::string script = dir.File("read.py");
  std::ofstream(script) << R"(import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
r = [(e.step, round(e.value, 4)) for e in acc.Scalars("grpo/reward_mean")]
a = [(e.step, round(e.value, 4)) for e in acc.Scalars("eval/accuracy")]
assert r == [(s, round(0.1 * s, 4)) for s in range(1, 6)], r
assert a == [(s, round(1 - 0.1 * s, 4)) for s in range(1, 6)], a
print("ok")
)";
  const std::string cmd = std::string(py && *py ? py : "python3") + " " + script + " " + dir.File("tb") + " > " +
                          dir.File("py.out") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir.File("py.out"));
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("ok") != std::string::npos);
}

}  // namespace
}  // namespace rlmesh
