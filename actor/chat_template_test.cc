// Chat templates: byte-for-byte parity with transformers' apply_chat_template
// (Python jinja2, as transformers configures it, is the reference) on our own
// templates of the Llama 3.x / Qwen shapes; whitespace control, errors that
// name the construct and line, and the limits that keep hostile input from
// crashing or hanging a render.

#include "actor/chat_template.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"

namespace rlmesh::actor {
namespace {

using Json = nlohmann::ordered_json;

std::string Python() {
  const char* p = std::getenv("RLMESH_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The instant render_chat_templates.py fixes datetime.now() to, here in UTC.
absl::Time FixedNow() {
  return absl::FromCivil(absl::CivilSecond(2024, 7, 26, 15, 4, 5), absl::UTCTimeZone()) +
         absl::Microseconds(123456);
}

ChatTemplateRenderOptions FixedClock() {
  ChatTemplateRenderOptions o;
  o.clock = FixedNow;
  o.time_zone = absl::UTCTimeZone();
  return o;
}

// The options a case of conversations.json stands for; the script builds the
// same call to transformers.
ChatTemplateOptions OptionsFor(const Json& spec, const Json& c) {
  ChatTemplateOptions o;
  o.render = FixedClock();
  o.add_generation_prompt = c.value("add_generation_prompt", false);
  if (c.value("tools", false)) o.tools = spec["tools"];
  if (c.value("special_tokens", true)) {
    o.bos_token = spec["special_tokens"]["bos_token"].get<std::string>();
    o.eos_token = spec["special_tokens"]["eos_token"].get<std::string>();
  }
  if (c.contains("kwargs")) o.extra = c["kwargs"];
  return o;
}

absl::StatusOr<std::string> RenderOne(const std::string& source, const Json& context) {
  auto t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(context, FixedClock());
}

std::string Render(const std::string& source, const Json& context = Json::object()) {
  auto r = RenderOne(source, context);
  INFO("template: " << source << "\nstatus: " << r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

absl::Status RenderError(const std::string& source, const Json& context = Json::object()) {
  auto r = RenderOne(source, context);
  INFO("template: " << source);
  REQUIRE(!r.ok());
  return r.status();
}

bool Contains(const absl::Status& s, const std::string& part) {
  return absl::StrContains(s.message(), part);
}

TEST_CASE("Parity with transformers' apply_chat_template on every template x conversation") {
  testing::TempDir dir;
  const std::string templates = testing::Runfile("actor/testdata/chat_templates");
  const std::string conversations = templates + "/conversations.json";
  const std::string expected_path = dir.File("expected.json");
  const std::string cmd = Python() + " " + testing::Runfile("actor/testdata/render_chat_templates.py") +
                          " " + templates + " " + conversations + " " + expected_path;
  REQUIRE(std::system(cmd.c_str()) == 0);
  const Json spec = Json::parse(ReadFile(conversations));
  const Json expected = Json::parse(ReadFile(expected_path));

  std::map<std::string, int> texts_matched;  // per template
  int errors_matched = 0;
  std::map<std::string, ChatTemplate> parsed;
  for (const Json& r : expected["results"]) {
    const std::string name = r["template"].get<std::string>();
    const std::string case_name = r["case"].get<std::string>();
    INFO("template " << name << " x case " << case_name);
    if (parsed.count(name) == 0) {
      auto t = ChatTemplate::Parse(ReadFile(templates + "/" + name));
      INFO(t.status().ToString());
      REQUIRE(t.ok());
      parsed.emplace(name, *t);
    }
    const Json* c = nullptr;
    for (const Json& x : spec["cases"]) {
      if (x["name"] == case_name) c = &x;
    }
    REQUIRE(c != nullptr);
    auto got = parsed.at(name).Apply((*c)["messages"], OptionsFor(spec, *c));
    if (r.contains("text")) {
      INFO(got.status().ToString());
      REQUIRE(got.ok());
      const std::string want = r["text"].get<std::string>();
      CHECK(*got == want);
      if (*got == want) ++texts_matched[name];
    } else {
      // The template's own raise_exception: same refusal, same message.
      REQUIRE(!got.ok());
      const std::string want = r["error"].get<std::string>();
      INFO(got.status().ToString() << " vs python: " << want);
      CHECK(got.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(Contains(got.status(), want));
      ++errors_matched;
    }
  }
  int total = 0;
  int templates_fully_matched = 0;
  const int cases = static_cast<int>(spec["cases"].size());
  for (const auto& [name, n] : texts_matched) {
    total += n;
    templates_fully_matched += n >= cases - 1;  // at most one case raises per template
  }
  INFO(total << " template x conversation texts byte-identical, " << errors_matched
             << " refusals identical");
  CHECK(texts_matched.size() >= 6);
  CHECK(templates_fully_matched >= 6);
  CHECK(total >= 60);
  CHECK(errors_matched >= 2);
  std::cout << "chat template parity: " << total << " texts and " << errors_matched
            << " raise_exception refusals identical to transformers over "
            << texts_matched.size() << " templates x " << cases << " conversations\n";
}

TEST_CASE("The reference renders are not trivial") {
  // The parity check compares with an independent renderer; this makes sure
  // the shared test data exercises what it claims to.
  const std::string templates = testing::Runfile("actor/testdata/chat_templates");
  const Json spec = Json::parse(ReadFile(templates + "/conversations.json"));
  const Json* tool_case = nullptr;
  for (const Json& x : spec["cases"]) {
    if (x["name"] == "agentic_reasoning") tool_case = &x;
  }
  REQUIRE(tool_case != nullptr);
  auto out = RenderChatTemplate(ReadFile(templates + "/reasoning_chatml.jinja"),
                                (*tool_case)["messages"], OptionsFor(spec, *tool_case));
  REQUIRE(out.ok());
  CHECK(absl::StrContains(*out, "<think>\nI should search first.\n</think>"));
  CHECK(absl::StrContains(*out,
                          "{\"name\": \"search\", \"arguments\": {\"query\": \"tides\", "
                          "\"max_results\": 1, \"sites\": [\"noaa.gov\"]}}"));
  CHECK(absl::StrContains(*out, "\"description\": \"City name, e.g. Zürich\""));
  CHECK(absl::EndsWith(*out, "Tides come mainly from the Moon's pull.<|im_end|>\n"));

  auto llama = RenderChatTemplate(ReadFile(templates + "/llama31_like.jinja"),
                                  (*tool_case)["messages"], OptionsFor(spec, *tool_case));
  REQUIRE(llama.ok());
  CHECK(absl::StartsWith(*llama, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                                 "Environment: ipython\nKnowledge cutoff: March 2024\n"
                                 "Current date: 26 Jul 2024\n\n"));
}

TEST_CASE("Whitespace control, trim_blocks and lstrip_blocks as transformers sets them") {
  // Expected strings from jinja2 with transformers' environment.
  CHECK(Render("a\n  {% if true %}\n  b\n  {% endif %}\n c {{ 'x' }}\n") == "a\n  b\n c x");
  CHECK(Render("a  {%- if true -%}  b  {%- endif %}  \n  c") == "ab  \n  c");
  CHECK(Render("{{ 1 }}  {% if true %}x{% endif %}") == "1  x");
  CHECK(Render("  {%+ if true %}x{% endif +%}\ny") == "  x\ny");
  CHECK(Render("a\n    {#- comment -#}   \nb") == "ab");
  CHECK(Render("x\r\ny\r{% if true %}\r\nz{% endif %}\r\n") == "x\ny\nz");
  CHECK(Render("a\n  {% raw %}\n  {{ x }}\n  {% endraw %}\nb") == "a\n\n  {{ x }}\nb");
  CHECK(Render("{{- 'a' -}}  \n  {{- 'b' }}  {{ 'c' -}}\n\n d") == "ab  cd");
  CHECK(Render("\t {% for i in [1,2] %}\n\t\t{{ i }}\n\t {% endfor %}\nend") == "\t\t1\n\t\t2\nend");
}

TEST_CASE("Jinja values: undefined vs none, Python reprs, scoping") {
  CHECK(Render("[{{ missing }}][{{ none }}][{{ missing is defined }}][{{ none is none }}]") ==
        "[][None][False][True]");
  CHECK(Render("{{ [1, 'a', none, true, 1.5, {'k': 'v\"'}] }} {{ ('a',) }}") ==
        "[1, 'a', None, True, 1.5, {'k': 'v\"'}] ('a',)");
  CHECK(Render("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 0.1 + 0.2 }}") ==
        "1e+16 1000000000000000.0 0.0001 1e-05 0.30000000000000004");
  CHECK(Render("{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }}"
               "{% endfor %}{{ x }}") == "0101010");
  CHECK(Render("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
               "{% endfor %}{{ ns.n }}") == "3");
  CHECK(Render("{{ m.items }}", {{"m", {{"items", 1}}}}) ==
        "<built-in method items of dict object>");  // the method wins over the key
  CHECK(Render("{{ m['items'] }}", {{"m", {{"items", 1}}}}) == "1");
  CHECK(Render("{{ 'héllo'[::-1] }} {{ 'héllo'|length }} {{ 'Straße'|upper }} {{ 'ΣΑΣ'|lower }}") ==
        "olléh 5 STRASSE σας");
}

TEST_CASE("Python's generators, Jinja's for-else and statement syntax") {
  // Expected strings and failures from jinja2 with transformers' environment.
  // select/map/items/reverse give generators: true even when empty, no len(),
  // no indexing, and an error only once consumed.
  CHECK(Render("{{ 'yes' if [] | select else 'no' }}|{{ [1, 2] | select('odd') | list }}|"
               "{{ none | map('upper') | list }}|{{ 'yes' if true | selectattr('x') else 'no' }}") ==
        "yes|[1]|[]|yes");
  CHECK(Render("{{ {'a': 1} | items | list }}|{{ [3, 1] | reverse | list }}|{{ [1] | select | first }}|"
               "{{ ([1] | select)[0] }}|") == "[('a', 1)]|[1, 3]|1||");
  CHECK(Contains(RenderError("{{ true | selectattr('x') | list }}"), "'bool' object is not iterable"));
  CHECK(Contains(RenderError("{{ [{'a': 1}] | selectattr('a') | length }}"), "'generator' has no len()"));
  // The else of a for runs unless some iteration reached the end of its body.
  CHECK(Render("{% for i in [1, 2] %}{% break %}{% else %}else ran{% endfor %}|"
               "{% for i in [1, 2] %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% else %}no"
               "{% endfor %}|{% for i in [1] %}{% continue %}{% else %}all skipped{% endfor %}") ==
        "else ran|2|all skipped");
  CHECK(Render("{% if true: %}colon{% endif %}{% for x in [1]: %}{{ x }}{% endfor %}") == "colon1");
  CHECK(Contains(RenderError("{{ 'a' | trim('a', 'b') }}"), "at most 1"));
  CHECK(Contains(RenderError("{{ 1 is defined(2) }}"), "takes 0"));
  CHECK(Contains(RenderError("{{ namespace(a=1, a=2) }}"), "repeated"));
  CHECK(Contains(RenderError("{% for j, in [[1]] %}{% endfor %}"), "expected 'in'"));
}

TEST_CASE("Apply prepares messages as transformers does") {
  // Null-valued keys are dropped; reasoning is copied to `thinking` (first)
  // and `reasoning_content`.
  const Json messages = Json::parse(R"([
    {"role": "user", "content": "hi", "name": null},
    {"role": "assistant", "content": "ok", "reasoning": "r1", "tool_calls": null}])");
  ChatTemplateOptions o;
  o.render = FixedClock();
  auto out = RenderChatTemplate(
      "{{ messages | tojson }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|"
      "{{ bos_token is defined }}{{ eos_token }}|{{ enable_thinking }}",
      messages, [&] {
        o.eos_token = "</s>";
        o.extra = Json{{"enable_thinking", false}, {"eos_token", "<override>"}};
        return o;
      }());
  REQUIRE(out.ok());
  CHECK(*out ==
        "[{\"role\": \"user\", \"content\": \"hi\"}, {\"thinking\": \"r1\", \"role\": "
        "\"assistant\", \"content\": \"ok\", \"reasoning\": \"r1\", \"reasoning_content\": "
        "\"r1\"}]|None|None|False|False<override>|False");
  CHECK(RenderChatTemplate("x", Json::array(), o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(RenderChatTemplate("x", Json::parse("[1]"), o).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("strftime_now reads the injected clock") {
  CHECK(Render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%dT%H:%M:%S.%f%z%Z %A %j %%') }}") ==
        "26 Jul 2024|2024-07-26T15:04:05.123456 Friday 208 %");
}

TEST_CASE("Errors name the construct and the line") {
  absl::Status s = RenderError("line one\n{% macro greet(name) %}hi{% endmacro %}");
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(Contains(s, "line 2"));
  CHECK(Contains(s, "macro"));

  s = RenderError("{{ 'x' }}\n\n{{ messages | foo }}");
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(Contains(s, "line 3"));
  CHECK(Contains(s, "filter 'foo'"));

  s = RenderError("{{ 1 is prime }}");
  CHECK(Contains(s, "test 'prime'"));

  s = RenderError("a\nb\n{% for m in messages %}\n{{ m }}\n");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "line 3"));
  CHECK(Contains(s, "unclosed 'for'"));
  CHECK(Contains(s, "endfor"));

  s = RenderError("{% if x %}\n{% endfor %}");
  CHECK(Contains(s, "line 2"));
  CHECK(Contains(s, "unexpected 'endfor'"));

  s = RenderError("x\n{{ messages\n");
  CHECK(Contains(s, "line 2"));
  CHECK(Contains(s, "unclosed '{{'"));

  s = RenderError("{% include 'other.jinja' %}");
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(Contains(s, "include"));

  s = RenderError("{% break %}");
  CHECK(Contains(s, "'break' outside a for loop"));

  s = RenderError("\n{{ raise_exception('Conversation roles must alternate: ' ~ n) }}", {{"n", 3}});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "line 2"));
  CHECK(Contains(s, "Conversation roles must alternate: 3"));

  s = RenderError("{{ 'abc'.zfill(5) }}");
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(Contains(s, "str.zfill"));

  s = RenderError("{{ missing.attr }}");
  CHECK(Contains(s, "'missing' is undefined"));

  s = RenderError("{{ 'a' + 1 }}");
  CHECK(Contains(s, "'str' and 'int'"));

  s = RenderError("{{ '%s' % 1 }}");
  CHECK(s.code() == absl::StatusCode::kUnimplemented);

  CHECK(!ChatTemplate::Parse(std::string("{{ '\xff' }}")).ok());  // not UTF-8
}

TEST_CASE("Hostile input and templates fail cleanly instead of crashing or hanging") {
  // Input nested far deeper than any conversation.
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "[";
  for (int i = 0; i < 100000; ++i) deep += "]";
  Json context = Json::object();
  context["x"] = Json::parse(deep);
  absl::Status s = RenderError("{{ x }}", context);
  CHECK(Contains(s, "deeper"));

  // Templates nested far deeper than any real one.
  std::string parens = "{{ ";
  for (int i = 0; i < 100000; ++i) parens += "(";
  parens += "1";
  for (int i = 0; i < 100000; ++i) parens += ")";
  CHECK(Contains(RenderError(parens + " }}"), "nests"));
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  CHECK(Contains(RenderError(nots + "1 }}"), "nests"));
  std::string sum = "{{ 1";
  for (int i = 0; i < 100000; ++i) sum += " + 1";
  CHECK(Contains(RenderError(sum + " }}"), "nests"));
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  CHECK(Contains(RenderError(ifs), "nest"));

  // Values a template builds up: deep, long, or many iterations.
  s = RenderError("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
                  "{% endfor %}");
  CHECK(Contains(s, "deeper"));
  s = RenderError("{% set ns = namespace(s='ab') %}{% for i in range(100) %}"
                  "{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(RenderError("{{ 'a' * 1000000000000 }}").code() == absl::StatusCode::kResourceExhausted);
  s = RenderError("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(Contains(s, "iterations"));
  CHECK(RenderError("{{ range(1000000) | length }}").code() == absl::StatusCode::kResourceExhausted);
  CHECK(RenderError("{{ 2 ** 64 }}").code() == absl::StatusCode::kOutOfRange);
  CHECK(Contains(RenderError("{% set ns = namespace() %}{% set ns.me = ns %}"), "namespace"));
}

TEST_CASE("A parsed template renders concurrently") {
  auto t = ChatTemplate::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.role }}:{{ m.content }};{% endfor %}{{ ns.n }}");
  REQUIRE(t.ok());
  std::vector<std::string> out(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      Json messages = Json::array();
      for (int k = 0; k <= i; ++k) messages.push_back({{"role", "user"}, {"content", std::to_string(k)}});
      for (int rep = 0; rep < 200; ++rep) {
        auto r = t->Apply(messages, {});
        out[i] = r.ok() ? *r : r.status().ToString();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) {
    std::string want;
    for (int k = 0; k <= i; ++k) want += "user:" + std::to_string(k) + ";";
    CHECK(out[i] == want + std::to_string(i + 1));
  }
}

TEST_CASE("ChatTemplateFromTokenizerConfig picks the template as transformers does") {
  CHECK(*ChatTemplateFromTokenizerConfig(R"({"chat_template": "{{ x }}", "bos_token": "<s>"})") ==
        "{{ x }}");
  const std::string named = R"({"chat_template": [
      {"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})";
  CHECK(*ChatTemplateFromTokenizerConfig(named) == "D");
  CHECK(*ChatTemplateFromTokenizerConfig(named, /*with_tools=*/true) == "T");
  auto none = ChatTemplateFromTokenizerConfig(R"({"chat_template": [{"name": "rag", "template": "R"}]})");
  CHECK(none.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(none.status(), "rag"));
  CHECK(ChatTemplateFromTokenizerConfig(R"({"model_max_length": 8})").status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(ChatTemplateFromTokenizerConfig("not json").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Options are validated") {
  ChatTemplateOptions o;
  CHECK(o.Validate().ok());
  o.tools = Json::object();
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.tools = nullptr;
  o.extra = Json::array();
  CHECK(!o.Validate().ok());
  o.extra = Json::object();
  o.render.max_output_bytes = 0;
  CHECK(!o.Validate().ok());
}

}  // namespace
}  // namespace rlmesh::actor
