#include "reward_server/verifiers.h"


#include <fstream>

#include "catch2/catch.hpp"
#include "common/testing/script.h"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

VerifierInput In(const std::string& completion, const std::string& reference = "", int tokens = 0) {
  VerifierInput in;
  in.completion = completion;
  in.reference_answer = reference;
  in.completion_tokens = tokens;
  return in;
}

std::unique_ptr<Verifier> Make(VerifierConfig c) {
  auto v = MakeVerifier(c, "v");
  REQUIRE(v.ok());
  return std::move(*v);
}

const absl::Time kFar = absl::InfiniteFuture();

TEST_CASE("final numbers are extracted the way graders read them") {
  CHECK(*ExtractFinalNumber("46") == 46);
  CHECK(*ExtractFinalNumber("so 3 + 4 = 7") == 7);
  CHECK(*ExtractFinalNumber("it is -12") == -12);
  CHECK(*ExtractFinalNumber("costs 1,234.50 dollars") == Approx(1234.5));
  CHECK(*ExtractFinalNumber("5 apples #### 42 and 7 more") == 42);
  CHECK(*ExtractFinalNumber("answer \\boxed{17} (not 3)") == 17);
  CHECK(*ExtractFinalNumber("10-3") == 3);  // a minus between digits is an operator
  CHECK_FALSE(ExtractFinalNumber("no digits here").has_value());
  CHECK_FALSE(ExtractFinalNumber("").has_value());
}

TEST_CASE("numeric_answer compares within tolerance") {
  VerifierConfig c;
  c.set_name("numeric_answer");
  auto v = Make(c);
  CHECK(*v->Score(In("46", "46"), kFar) == 1.0);
  CHECK(*v->Score(In("45", "46"), kFar) == 0.0);
  CHECK(*v->Score(In("", "46"), kFar) == 0.0);
  CHECK(*v->Score(In("The answer is 46.", "#### 46"), kFar) == 1.0);
  CHECK(v->Score(In("46", "none"), kFar).status().code() == absl::StatusCode::kInvalidArgument);
  c.set_tolerance(0.5);
  CHECK(*Make(c)->Score(In("46.4", "46"), kFar) == 1.0);
}

TEST_CASE("exact_match, format and length") {
  VerifierConfig e;
  e.set_name("exact_match");
  CHECK(*Make(e)->Score(In(" Paris\n", "Paris"), kFar) == 1.0);
  CHECK(*Make(e)->Score(In("paris", "Paris"), kFar) == 0.0);

  VerifierConfig f;
  f.set_name("format");
  f.set_pattern("^<answer>[0-9]+</answer>$");
  CHECK(*Make(f)->Score(In("<answer>12</answer>"), kFar) == 1.0);
  CHECK(*Make(f)->Score(In("12"), kFar) == 0.0);

  VerifierConfig l;
  l.set_name("length");
  l.set_max_tokens(4);
  l.set_penalty_per_token(0.25);
  CHECK(*Make(l)->Score(In("", "", 4), kFar) == 0.0);
  CHECK(*Make(l)->Score(In("", "", 6), kFar) == Approx(-0.5));
}

TEST_CASE("countdown expressions parse and evaluate exactly") {
  auto e = ParseCountdownExpression("3*7+5");
  REQUIRE(e.ok());
  CHECK(e->numbers == std::vector<int64_t>{3, 7, 5});
  CHECK((e->numerator == 26 && e->denominator == 1));
  // Precedence and left associativity.
  CHECK(ParseCountdownExpression("2+3*4")->numerator == 14);
  CHECK(ParseCountdownExpression("(2+3)*4")->numerator == 20);
  CHECK(ParseCountdownExpression("10-4-3")->numerator == 3);
  CHECK(ParseCountdownExpression("10-(4-3)")->numerator == 9);
  CHECK(ParseCountdownExpression("24/4/2")->numerator == 3);
  auto third = ParseCountdownExpression("2/6");
  CHECK((third->numerator == 1 && third->denominator == 3));
  auto neg = ParseCountdownExpression("3-8/2*3");
  CHECK((neg->numerator == -9 && neg->denominator == 1));
  for (const char* bad : {"", "3+", "+3", "-3+4", "(3+4", "3+4)", "3 + 4", "3x4", "()", "3**4", "((3)",
                          "99999999999999999999", "4/(2-2)", "3037000500*3037000500*3037000500"}) {
    INFO(bad);
    CHECK(ParseCountdownExpression(bad).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("countdown: the completion must use exactly the numbers and hit the target") {
  VerifierConfig c;
  c.set_name("countdown");
  auto v = Make(c);
  CHECK(v->label() == "countdown");
  // Problem: 3 7 5 -> 26, given as a reference solution.
  const std::string ref = "3*7+5";
  auto score = [&](const std::string& completion) { return *v->Score(In(completion, ref), kFar); };
  CHECK(score("3*7+5") == 1.0);
  CHECK(score("5+7*3") == 1.0);          // another order
  CHECK(score("(7*3)+5") == 1.0);        // redundant parentheses
  CHECK(score("  5+3*7\n") == 1.0);      // surrounding whitespace
  CHECK(score("5+3*7 and more") == 1.0);  // stops at whitespace
  CHECK(score("5+3*7<eos>junk") == 1.0);  // and at a written-out eos
  CHECK(score("3*7-5") == 0.0);          // wrong value
  CHECK(score("3*7+7") == 0.0);          // reuses 7, misses 5
  CHECK(score("21+5") == 0.0);           // right value, numbers not used
  CHECK(score("3*7") == 0.0);            // missing number
  CHECK(score("3*7+5+0") == 0.0);        // extra number, same value
  CHECK(score("3*7+5*1") == 0.0);        // extra number, same value
  CHECK(score("3*7+5/(3-3)") == 0.0);    // division by zero
  CHECK(score("3*7+5 ") == 1.0);
  CHECK(score("26") == 0.0);
  CHECK(score("") == 0.0);
  CHECK(score("hello") == 0.0);
  CHECK(score("3*7+5)") == 0.0);         // garbage after the expression
  CHECK(score("3*(7+5") == 0.0);
  CHECK(score("3 * 7 + 5") == 0.0);      // ends at the first space: "3"

  // Non-integer intermediates are fine when the value is exact: 3 4 2 -> 6.
  auto six = [&](const std::string& completion) { return *v->Score(In(completion, "3*4/2"), kFar); };
  CHECK(six("4/(2/3)") == 1.0);  // 2/3 on the way
  CHECK(six("3/2*4") == 1.0);    // 3/2 on the way
  CHECK(six("4/2/3") == 0.0);    // 2/3, not 6
  // The classic 1 3 4 6 -> 24 has only a fractional solution.
  CHECK(*v->Score(In("6/(1-3/4)", "6/(1-3/4)"), kFar) == 1.0);
  CHECK(*v->Score(In("6/(1-(3/4))", "6/(1-3/4)"), kFar) == 1.0);
  CHECK(*v->Score(In("6*4*(3-1)", "6/(1-3/4)"), kFar) == 0.0);

  // A reference that is not a solution expression is the caller's error.
  auto bad_ref = v->Score(In("3*7+5", "26"), kFar);
  CHECK(bad_ref.ok());  // "26" is an expression: one number, value 26
  CHECK(*bad_ref == 0.0);
  for (const char* ref : {"3 7 5", "", "4/(2-2)"}) {
    INFO(ref);
    auto r = v->Score(In("3*7+5", ref), kFar);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("reference_answer") != absl::string_view::npos);
  }
}

TEST_CASE("bad verifier configs name the field") {
  VerifierConfig c;
  c.set_name("vibes");
  CHECK(MakeVerifier(c, "reward.verifiers[1]").status().message().find("reward.verifiers[1].name") !=
        absl::string_view::npos);
  c.set_name("format");
  c.set_pattern("(unclosed");
  CHECK(MakeVerifier(c, "v").status().message().find("v.pattern") != absl::string_view::npos);
  c.set_name("length");
  CHECK(MakeVerifier(c, "v").status().message().find("v.max_tokens") != absl::string_view::npos);
  c.set_name("command");
  c.add_command("/no/such/program");
  CHECK(MakeVerifier(c, "v").status().message().find("v.command") != absl::string_view::npos);
}

TEST_CASE("command verifiers: a number on stdout, killed at the deadline") {
  testing::TempDir dir;
  VerifierConfig c;
  c.set_name("command");
  // Reads the JSON and answers 1 if the completion contains "42".
  c.add_command(testing::WriteScript(dir, "ok.sh", "if grep -q '\"completion\":\"42\"'; then echo 1; else echo 0.25; fi"));
  auto v = Make(c);
  CHECK(*v->Score(In("42"), kFar) == 1.0);
  CHECK(*v->Score(In("41"), kFar) == 0.25);

  VerifierConfig slow;
  slow.set_name("command");
  slow.add_command(testing::WriteScript(dir, "slow.sh", "exec sleep 30"));
  const absl::Time start = absl::Now();
  auto r = Make(slow)->Score(In("x"), absl::Now() + absl::Milliseconds(300));
  CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - start < absl::Seconds(5));

  VerifierConfig junk;
  junk.set_name("command");
  junk.add_command(testing::WriteScript(dir, "junk.sh", "echo banana"));
  CHECK(Make(junk)->Score(In("x"), kFar).status().message().find("banana") != absl::string_view::npos);

  // Commands that never read their input, given more than a pipe holds: one
  // exits (the write meets a closed pipe: SIGPIPE killed the whole process
  // before), one sleeps (the write used to block past the deadline).
  const std::string big(1 << 20, '7');
  VerifierConfig deaf;
  deaf.set_name("command");
  deaf.add_command(testing::WriteScript(dir, "deaf.sh", "echo 0.5"));
  auto d = Make(deaf)->Score(In(big), kFar);
  REQUIRE(d.ok());
  CHECK(*d == 0.5);
  VerifierConfig stuck;
  stuck.set_name("command");
  stuck.add_command(testing::WriteScript(dir, "stuck.sh", "exec sleep 30"));
  const absl::Time t0 = absl::Now();
  auto st = Make(stuck)->Score(In(big), absl::Now() + absl::Milliseconds(300));
  CHECK(st.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - t0 < absl::Seconds(5));

  // A command that closes its stdout and keeps running, and one whose
  // background child holds stdout open: both end at the deadline.
  for (const char* body : {"exec >&-; sleep 30", "sleep 30 & echo 1"}) {
    VerifierConfig lingering;
    lingering.set_name("command");
    lingering.add_command(testing::WriteScript(dir, "lingering.sh", body));
    const absl::Time t1 = absl::Now();
    auto l = Make(lingering)->Score(In("x"), absl::Now() + absl::Milliseconds(300));
    CHECK(l.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(absl::Now() - t1 < absl::Seconds(5));
  }
}

}  // namespace
}  // namespace rlmesh
