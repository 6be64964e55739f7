#pragma once

// A `command` verifier that blocks, for tests that fill a reward scorer's or
// service's pools: a script in a temp dir of its own that waits for the test
// to open its gate, then prints 1. A gate never opened holds each call until
// its deadline kills it. It outlives the scorers it makes. Not thread-safe,
// except Open().

#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "actor/tokenizer.h"
#include "common/testing/script.h"
#include "common/testing/test_util.h"
#include "proto/config.pb.h"
#include "reward_server/scorer.h"

namespace rlmesh::testing {

class GatedVerifier {
 public:
  // `body` replaces the script's own (a /bin/sh script whose stdin is the
  // item's JSON), for a verifier that blocks otherwise (`sleep 2`).
  explicit GatedVerifier(const std::string& body = "")
      : gate_(dir_.File("gate")),
        program_(WriteScript(dir_, "slow.sh",
                             body.empty() ? "cat > /dev/null\nwhile [ ! -e '" + gate_ +
                                                "' ]; do sleep 0.01; done\necho 1"
                                          : body)) {}

  // The script's path, for a request's `command`.
  const std::string& program() const { return program_; }

  // The verifier that runs it: name "command", weight 1.
  VerifierConfig Config() const {
    VerifierConfig c;
    c.set_name("command");
    c.set_weight(1.0);
    c.add_command(program_);
    return c;
  }

  // Lets every call, running or to come, print its 1.
  void Open() const { std::ofstream(gate_) << "open\n"; }

  // A scorer with `options`, allowed to run program() alone, reading token
  // ids with tokenizer().
  absl::StatusOr<std::unique_ptr<RewardScorer>> MakeScorer(ScorerOptions options = {}) const {
    options.allowed_commands = {program_};
    return RewardScorer::Create(options, &tokenizer_);
  }

  const actor::Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  TempDir dir_;
  const std::string gate_;
  const std::string program_;
  actor::CharTokenizer tokenizer_;
};

}  // namespace rlmesh::testing
