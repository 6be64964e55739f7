#include "environment/expression.h"

#include "catch2/catch.hpp"

namespace rlmesh::environment {
namespace {

double Eval(const std::string& s) {
  auto v = EvaluateExpression(s);
  REQUIRE(v.ok());
  return *v;
}

TEST_CASE("expressions evaluate with the usual precedence") {
  CHECK(Eval("12*34") == 408);
  CHECK(Eval("2+3*4") == 14);
  CHECK(Eval("(2+3)*4") == 20);
  CHECK(Eval(" 10 - 4 - 3 ") == 3);  // left-associative
  CHECK(Eval("2^3^2") == 512);       // right-associative: 2^9
  CHECK(Eval("2**10") == 1024);
  CHECK(Eval("-3^2") == -9);         // unary minus binds looser than ^
  CHECK(Eval("7/2") == 3.5);
  CHECK(Eval("17%5") == 2);
  CHECK(Eval("1.5*4") == 6);
  CHECK(Eval("--4") == 4);
}

TEST_CASE("bad expressions are errors naming the problem") {
  CHECK(EvaluateExpression("1/0").status().message().find("division by zero") != std::string::npos);
  CHECK(EvaluateExpression("5%0").status().message().find("modulo by zero") != std::string::npos);
  CHECK(EvaluateExpression("(1+2").status().message().find("missing ')'") != std::string::npos);
  CHECK(EvaluateExpression("1+").status().message().find("expected a number") != std::string::npos);
  CHECK(EvaluateExpression("2 3").status().message().find("unexpected '3'") != std::string::npos);
  CHECK(EvaluateExpression("import os").status().message().find("unexpected 'i'") != std::string::npos);
  CHECK(EvaluateExpression("").status().message().find("empty") != std::string::npos);
  CHECK(EvaluateExpression("10^400").status().message().find("overflows") != std::string::npos);
  CHECK(EvaluateExpression(std::string(40, '(') + "1" + std::string(40, ')')).status().message().find("nesting") !=
        std::string::npos);
  CHECK(EvaluateExpression(std::string(300, '1')).status().message().find("longer than") != std::string::npos);
}

TEST_CASE("numbers are formatted as integers when integral") {
  CHECK(FormatNumber(408) == "408");
  CHECK(FormatNumber(-12) == "-12");
  CHECK(FormatNumber(-0.0) == "0");
  CHECK(FormatNumber(3.5) == "3.5");
  CHECK(FormatNumber(1.0 / 3) == "0.333333333333");
  CHECK(FormatNumber(1e20) == "1e+20");
}

}  // namespace
}  // namespace rlmesh::environment
