// Chat `messages` data and text corpora: assistant-only loss masks equal
// transformers' return_assistant_tokens_mask (a Python reference on the
// shipped chat sample and tokenizer, two templates), hand-computed spans,
// packing boundaries, and bad input named by file:line and field.
#include "tasks/chat_data.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"
#include "tasks/chat_prompts.h"
#include "tasks/task.h"
#include "tasks/text_corpus.h"

namespace rlmesh {
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

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

ChatRenderer Renderer(const std::string& source, std::optional<std::string> eos = std::nullopt) {
  actor::ChatTemplateOptions o;
  o.eos_token = std::move(eos);
  auto r = ChatRenderer::FromSource(source, o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

// Role initial, ':', content, ';' per message; "a:" as the generation prompt.
const char* kTiny =
    "{% for m in messages %}{{ m.role[0] }}:{{ m.content }};{% endfor %}{% if add_generation_prompt %}a:{% endif %}";

TEST_CASE("assistant masks equal transformers' return_assistant_tokens_mask on the shipped sample") {
  const std::string tok_dir = testing::Runfile("configs/data/chat_tokenizer");
  const std::string sample = testing::Runfile("configs/data/chat_sample.jsonl");
  auto tokenizer = actor::LoadTokenizer(tok_dir);
  REQUIRE(tokenizer.ok());
  auto records = ReadChatJsonl(sample, "messages");
  REQUIRE(records.ok());
  REQUIRE(records->size() == 7);
  testing::TempDir dir;
  int straddling = 0;
  for (const char* name : {"chatml_generation.jinja", "llama3_generation.jinja", "plain_generation.jinja"}) {
    INFO("template " << name);
    const std::string tmpl = testing::Runfile(std::string("tasks/testdata/") + name);
    const std::string out = dir.File(std::string(name) + ".json");
    const std::string cmd = Python() + " " + testing::Runfile("tasks/testdata/assistant_masks.py") + " " + tok_dir +
                            " " + tmpl + " " + sample + " " + out;
    REQUIRE(std::system(cmd.c_str()) == 0);
    const Json expected = Json::parse(ReadFile(out));
    REQUIRE(expected.size() == records->size());
    // Our spans come from rendering prefixes; the {% generation %} markers
    // only tell transformers where they are (our renderer ignores them).
    const ChatRenderer renderer = Renderer(ReadFile(tmpl), "<|im_end|>");
    for (size_t i = 0; i < records->size(); ++i) {
      const ChatRecord& rec = (*records)[i];
      INFO("conversation " << rec.where);
      auto rendered = RenderWithAssistantSpans(renderer, rec.messages, rec.tools);
      INFO(rendered.status().ToString());
      REQUIRE(rendered.ok());
      CHECK(rendered->text == expected[i]["text"].get<std::string>());
      auto tok = TokenizeWithSpans(**tokenizer, rendered->text, rendered->assistant);
      REQUIRE(tok.ok());
      // The chat tokenizer has no bos: the ids are exactly the text's.
      CHECK(tok->ids == expected[i]["input_ids"].get<std::vector<int>>());
      std::vector<int> mask(tok->loss.begin(), tok->loss.end());
      CHECK(mask == expected[i]["assistant_masks"].get<std::vector<int>>());
      // Count tokens that cross a span boundary (trained on, as in
      // transformers): the sample must exercise that rule.
      auto ranges = TokenByteSpans(**tokenizer, tokenizer.value()->Encode(rendered->text), rendered->text);
      REQUIRE(ranges.ok());
      for (const ByteSpan& t : *ranges) {
        for (const ByteSpan& s : rendered->assistant) {
          if ((t.begin < s.begin && t.end > s.begin) || (t.begin < s.end && t.end > s.end)) ++straddling;
        }
      }
    }
  }
  CHECK(straddling > 0);
}

TEST_CASE("assistant spans by hand: header out, end marker in, trailing whitespace out") {
  const ChatRenderer r = Renderer(kTiny);
  Json conv = Json::parse(R"([{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "3"},
                              {"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}])");
  auto out = RenderWithAssistantSpans(r, conv);
  REQUIRE(out.ok());
  CHECK(out->text == "u:1+2;a:3;u:2+2;a:4;");
  REQUIRE(out->assistant.size() == 2);
  CHECK(out->assistant[0] == ByteSpan{8, 10});   // "3;"
  CHECK(out->assistant[1] == ByteSpan{18, 20});  // "4;"
  // The char tokenizer: one token per byte after the bos, which is not
  // trained on.
  actor::CharTokenizer chars;
  auto tok = TokenizeWithSpans(chars, out->text, out->assistant);
  REQUIRE(tok.ok());
  REQUIRE(tok->ids.size() == 21);
  CHECK(tok->ids[0] == chars.bos_id());
  std::vector<uint8_t> want(21, 0);
  for (int i : {9, 10, 19, 20}) want[i] = 1;
  CHECK(tok->loss == want);

  // A newline after the turn is not generated: it stays out of the span.
  const ChatRenderer nl = Renderer(
      "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}|\n{% endfor %}{% if add_generation_prompt %}a:{% endif %}");
  auto out2 = RenderWithAssistantSpans(nl, Json::parse(R"([{"role": "user", "content": "q"},
                                                           {"role": "assistant", "content": "r"}])"));
  REQUIRE(out2.ok());
  CHECK(out2->text == "u:q|\na:r|\n");
  REQUIRE(out2->assistant.size() == 1);
  CHECK(out2->assistant[0] == ByteSpan{7, 9});  // "r|"

  // A generation prompt that adds more than the header (an empty think
  // block): the span starts where the message's rendering departs from it.
  const ChatRenderer think = Renderer(
      "{% for m in messages %}{{ m.role[0] }}:{{ m.content }};{% endfor %}{% if add_generation_prompt %}a:<t></t>{% endif %}");
  auto out3 = RenderWithAssistantSpans(think, Json::parse(R"([{"role": "user", "content": "q"},
                                                              {"role": "assistant", "content": "r"}])"));
  REQUIRE(out3.ok());
  CHECK(out3->text == "u:q;a:r;");
  CHECK(out3->assistant[0] == ByteSpan{6, 8});

  // RL prompt: up to the last user turn, with the generation prompt.
  auto prompt = RenderChatPrompt(r, conv);
  REQUIRE(prompt.ok());
  CHECK(*prompt == "u:1+2;a:3;u:2+2;a:");
}

TEST_CASE("a template that rewrites earlier turns, or an assistant turn first, is refused by name") {
  const ChatRenderer last = Renderer(
      "{% for m in messages %}{% if loop.last %}END {% endif %}{{ m.content }};{% endfor %}"
      "{% if add_generation_prompt %}>{% endif %}");
  auto out = RenderWithAssistantSpans(last, Json::parse(R"([{"role": "user", "content": "q"},
      {"role": "assistant", "content": "r"}, {"role": "user", "content": "s"}])"));
  REQUIRE_FALSE(out.ok());
  CHECK(absl::StrContains(out.status().message(), "messages[1]: the template renders"));
  auto first = RenderWithAssistantSpans(Renderer(kTiny), Json::parse(R"([{"role": "assistant", "content": "r"}])"));
  REQUIRE_FALSE(first.ok());
  CHECK(absl::StrContains(first.status().message(), "messages[0]"));
}

TEST_CASE("token byte spans: multi-byte characters, and a tokenizer that cannot give the text back") {
  auto tokenizer = actor::LoadTokenizer(testing::Runfile("configs/data/chat_tokenizer"));
  REQUIRE(tokenizer.ok());
  const std::string text = "7 \xC3\x97 6 \xE2\x9C\x93<|im_end|>";  // "7 × 6 ✓<|im_end|>"
  const std::vector<int> ids = (*tokenizer)->Encode(text);
  auto spans = TokenByteSpans(**tokenizer, ids, text);
  REQUIRE(spans.ok());
  // Contiguous, covering the text, each token inside whole characters.
  int64_t at = 0;
  for (const ByteSpan& s : *spans) {
    CHECK(s.begin <= at);
    CHECK(s.end >= at);
    at = s.end;
  }
  CHECK(at == static_cast<int64_t>(text.size()));
  CHECK(spans->back() == ByteSpan{static_cast<int64_t>(text.size()) - 10, static_cast<int64_t>(text.size())});
  // The char tokenizer has no "é": <unk> does not give it back.
  actor::CharTokenizer chars;
  auto bad = TokenizeWithSpans(chars, "caf\xC3\xA9", {{0, 5}});
  REQUIRE_FALSE(bad.ok());
  CHECK(absl::StrContains(bad.status().message(), "does not give back the text"));
  CHECK(absl::StrContains(bad.status().message(), "byte 3"));
}

TEST_CASE("bad chat lines name file:line and the field") {
  testing::TempDir dir;
  auto refused = [&](const std::string& body, const std::string& expected) {
    const std::string path = dir.File("bad.jsonl");
    WriteFile(path, "{\"messages\": [{\"role\": \"user\", \"content\": \"ok\"}]}\n\n" + body + "\n");
    auto r = ReadChatJsonl(path, "messages");
    INFO(body);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() == absl::StrCat(path, ":3: ", expected));
  };
  refused("not json", "not a JSON object");
  refused("{\"conversation\": []}", "missing field 'messages'");
  refused("{\"messages\": {}}", "messages: must be an array of messages");
  refused("{\"messages\": []}", "messages: is empty");
  refused("{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}",
          "messages[0].role: \"bot\" is not system, user, assistant or tool");
  refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"content\": \"y\"}]}",
          "messages[1].role: missing or not a string");
  refused("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}",
          "messages[0].content: must be a string (content parts are not supported)");
  refused("{\"messages\": [{\"role\": \"user\"}]}",
          "messages[0].content: missing (only an assistant turn with tool_calls may omit it)");
  refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", "tools: must be an array");
  WriteFile(dir.File("empty.jsonl"), "\n\n");
  CHECK(absl::StrContains(ReadChatJsonl(dir.File("empty.jsonl"), "messages").status().message(), "no examples"));
}

TEST_CASE("kind chat: RL prompts as kind jsonl renders them, answers from the field or the assistant turn") {
  const std::string tok = testing::Runfile("configs/data/chat_tokenizer");
  TaskConfig chat;
  chat.set_kind("chat");
  chat.set_train_path(testing::Runfile("configs/data/word_problems_chat_train.jsonl"));
  chat.set_eval_path(testing::Runfile("configs/data/word_problems_chat_eval.jsonl"));
  chat.set_chat_template("model");
  auto c = MakeTask(chat, 1, tok);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  TaskConfig plain;
  plain.set_kind("jsonl");
  plain.set_train_path(testing::Runfile("configs/data/word_problems_train.jsonl"));
  plain.set_eval_path(testing::Runfile("configs/data/word_problems_eval.jsonl"));
  plain.set_chat_template("model");
  auto p = MakeTask(plain, 1, tok);
  REQUIRE(p.ok());
  // The held-out splits are the same problems, one conversation each.
  REQUIRE((*c)->eval().size() == (*p)->eval().size());
  for (size_t i = 0; i < (*p)->eval().size(); ++i) {
    CHECK((*c)->eval()[i].prompt == (*p)->eval()[i].prompt);
    CHECK((*c)->eval()[i].answer == (*p)->eval()[i].answer);
  }
  // Every train conversation has assistant spans ending at <|im_end|>.
  for (const Example& e : (*c)->train()) {
    INFO(e.source);
    REQUIRE(!e.sft_spans.empty());
    for (const auto& [a, b] : e.sft_spans) CHECK(e.sft_text.substr(b - 10, 10) == "<|im_end|>");
  }

  // The answer field wins over the assistant turn; a conversation without
  // either is refused by file:line.
  testing::TempDir dir;
  TaskConfig t;
  t.set_kind("chat");
  t.set_chat_template("model");
  t.set_train_path(dir.File("c.jsonl"));
  WriteFile(dir.File("c.jsonl"), ReadFile(testing::Runfile("configs/data/chat_sample.jsonl")));
  auto s = MakeTask(t, 1, tok);
  REQUIRE(s.ok());
  CHECK((*s)->train()[0].answer == "2*34=68 #### 68");
  CHECK((*s)->train()[2].answer == "40");
  CHECK((*s)->eval().empty());
  WriteFile(dir.File("c.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n");
  auto none = MakeTask(t, 1, tok);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() ==
        absl::StrCat(dir.File("c.jsonl"), ":1: no reference answer: no field 'answer' and no assistant turn after the "
                                          "last user turn"));
  TaskConfig no_template = t;
  no_template.clear_chat_template();
  CHECK(absl::StrContains(MakeTask(no_template, 1, tok).status().message(), "task.chat_template: required for kind chat"));
}

TEST_CASE("text corpora: JSONL, folder and file; bad lines named") {
  testing::TempDir dir;
  WriteFile(dir.File("c.jsonl"), "{\"text\": \"ab\"}\n\n{\"text\": \"\"}\n{\"text\": \"cde\", \"id\": 1}\n");
  auto docs = ReadTextCorpus(dir.File("c.jsonl"), "text");
  REQUIRE(docs.ok());
  REQUIRE(docs->size() == 2);  // the empty document is skipped
  CHECK((*docs)[1].text == "cde");
  CHECK((*docs)[1].source == dir.File("c.jsonl") + ":4");
  WriteFile(dir.File("bad.jsonl"), "{\"text\": \"ab\"}\n{\"body\": \"x\"}\n");
  CHECK(ReadTextCorpus(dir.File("bad.jsonl"), "text").status().message() ==
        dir.File("bad.jsonl") + ":2: missing field 'text'");
  WriteFile(dir.File("bad.jsonl"), "{\"text\": 3}\n");
  CHECK(ReadTextCorpus(dir.File("bad.jsonl"), "text").status().message() ==
        dir.File("bad.jsonl") + ":1: field 'text' is not a string");
  std::filesystem::create_directories(dir.File("corpus"));
  WriteFile(dir.File("corpus/b.txt"), "second");
  WriteFile(dir.File("corpus/a.txt"), "first\n\nparagraph");
  WriteFile(dir.File("corpus/skip.md"), "not a .txt");
  auto folder = ReadTextCorpus(dir.File("corpus"), "text");
  REQUIRE(folder.ok());
  REQUIRE(folder->size() == 2);
  CHECK((*folder)[0].text == "first\n\nparagraph");
  CHECK((*folder)[1].text == "second");
  auto file = ReadTextCorpus(dir.File("corpus/b.txt"), "text");
  REQUIRE(file.ok());
  CHECK(file->size() == 1);
  CHECK(ReadTextCorpus(dir.File("nope.jsonl"), "text").status().code() == absl::StatusCode::kNotFound);

  // The shipped sample loads as a task.
  TaskConfig t;
  t.set_kind("text");
  t.set_train_path(testing::Runfile("configs/data/pretrain_sample.jsonl"));
  auto task = MakeTask(t, 1);
  REQUIRE(task.ok());
  CHECK((*task)->train().size() >= 20);
  CHECK((*task)->eval().empty());
  t.set_chat_template("model");
  CHECK(absl::StrContains(MakeTask(t, 1).status().message(), "task.chat_template: not used by kind text"));
}

TEST_CASE("packing: documents joined with bos/eos, cut into rows, pieces kept apart") {
  actor::CharTokenizer chars;  // bos 1, eos 2
  const int a = chars.Encode("a")[0], b = chars.Encode("b")[0], c = chars.Encode("c")[0], d = chars.Encode("d")[0],
            e = chars.Encode("e")[0];
  // Stream: [1 a b 2] [1 c d e 2] = 9 tokens; rows of 3.
  auto rows = PackDocuments(chars, {"ab", "cde"}, 3);
  REQUIRE(rows.size() == 3);
  using P = std::vector<std::vector<int>>;
  CHECK(rows[0].pieces == P{{1, a, b}});
  CHECK(rows[1].pieces == P{{2}, {1, c}});
  CHECK(rows[2].pieces == P{{d, e, 2}});
  // Rows of 4: the tail row is shorter.
  auto four = PackDocuments(chars, {"ab", "cde"}, 4);
  REQUIRE(four.size() == 3);
  CHECK(four[0].pieces == P{{1, a, b, 2}});
  CHECK(four[1].pieces == P{{1, c, d, e}});
  CHECK(four[2].pieces == P{{2}});
  CHECK(four[2].size() == 1);
}

}  // namespace
}  // namespace rlmesh
