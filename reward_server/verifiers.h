#pragma once

// Rule verifiers: pure functions of (prompt, completion, reference) that the
// reward server sums with their configured weights.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"

namespace rlmesh {

struct VerifierInput {
  std::string prompt;
  std::string completion;
  std::string reference_answer;
  // Completion length in tokens and the limit it was generated under.
  int completion_tokens = 0;
  int max_new_tokens = 0;
};

// Implementations are immutable after construction and safe for concurrent use.
class Verifier {
 public:
  virtual ~Verifier() = default;
  // Name used as the reward component key.
  virtual const std::string& label() const = 0;
  // Score of one completion. `deadline` bounds the call; a verifier that
  // cannot finish by then returns DEADLINE_EXCEEDED (the command verifier
  // kills its child).
  virtual absl::StatusOr<double> Score(const VerifierInput& in, absl::Time deadline) const = 0;
  // True if Score may run long or hang (external code, user regexes): the
  // scorer then runs it on a separate thread it can abandon at the deadline.
  virtual bool may_block() const { return false; }
};

// Builds the verifier a config names. `path` prefixes error messages
// ("reward.verifiers[2]").
absl::StatusOr<std::unique_ptr<Verifier>> MakeVerifier(const VerifierConfig& config,
                                                       const std::string& path);

// The final answer in `text`: the number right after the last "####"
// (GSM8K), else the last number inside the last "\boxed{}", else the last
// number; thousands commas are dropped. None if there is no number.
std::optional<double> ExtractFinalNumber(const std::string& text);

// A countdown expression: non-negative integer literals, binary + - * /
// and parentheses (no unary operators, no spaces), evaluated exactly.
struct CountdownExpression {
  // Integer literals in order of appearance.
  std::vector<int64_t> numbers;
  // Value as a fraction in lowest terms; denominator > 0.
  int64_t numerator = 0;
  int64_t denominator = 1;
};

// Parses and evaluates `text` in exact rational arithmetic. INVALID_ARGUMENT
// when it is not such an expression, divides by zero, or a value overflows
// 64-bit integers.
absl::StatusOr<CountdownExpression> ParseCountdownExpression(const std::string& text);

}  // namespace rlmesh
