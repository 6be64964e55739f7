// SFT on the dataset kinds chat and text (tiny model, char tokenizer): the
// loss covers exactly the assistant tokens of a conversation, or every
// token of a packed corpus row but the first of each document piece; both
// learn.
#include <fstream>
#include <string>

#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "learner/testing/tiny_experiment.h"
#include "learner/trainer.h"

namespace rlmesh::learner {
namespace {

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

ConfigureRequest Request(const ExperimentConfig& e) {
  ConfigureRequest r;
  *r.mutable_experiment() = e;
  r.set_world_size(1);
  return r;
}

TrainStepRequest SftStep(int64_t step) {
  TrainStepRequest r;
  r.set_step(step);
  r.set_from_task(true);
  return r;
}

ExperimentConfig WithSft(ExperimentConfig e, int batch) {
  auto* sft = e.add_stages()->mutable_sft();
  sft->set_steps(40);
  sft->set_batch(batch);
  sft->mutable_optimizer()->set_lr(1e-2);
  return e;
}

TEST_CASE("kind chat: the loss covers the assistant tokens only") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  // "u:1+2;a:3;" and "u:1+1;a:2;u:2+2;a:4;": 2 and 4 assistant tokens
  // ("3;", "2;", "4;"), each predicted from the token before it.
  WriteFile(dir.File("t.jinja"),
            "{% for m in messages %}{{ m.role[0] }}:{{ m.content }};{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}");
  WriteFile(dir.File("c.jsonl"),
            "{\"messages\": [{\"role\": \"user\", \"content\": \"1+2\"}, {\"role\": \"assistant\", \"content\": "
            "\"3\"}]}\n"
            "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1\"}, {\"role\": \"assistant\", \"content\": "
            "\"2\"}, {\"role\": \"user\", \"content\": \"2+2\"}, {\"role\": \"assistant\", \"content\": \"4\"}]}\n");
  ExperimentConfig e = testing::TinyExperiment(7, 8);
  e.mutable_task()->Clear();
  e.mutable_task()->set_kind("chat");
  e.mutable_task()->set_train_path(dir.File("c.jsonl"));
  e.mutable_task()->set_chat_template(dir.File("t.jinja"));
  Trainer t;
  REQUIRE(t.Configure(Request(WithSft(e, 2))).ok());
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    auto r = t.TrainStep(SftStep(step));
    REQUIRE(r.ok());
    const auto& m = r->metrics().values();
    CHECK(m.at("tokens") == 11 + 21);  // bos + the rendered text
    CHECK(m.at("loss_tokens") == 2 + 4);
    if (step == 0) first = m.at("loss");
    last = m.at("loss");
  }
  CHECK(last < 0.2 * first);

  // train_on_prompt: every token after the first of each sequence.
  ExperimentConfig all = WithSft(e, 2);
  all.mutable_stages(0)->mutable_sft()->set_train_on_prompt(true);
  Trainer u;
  REQUIRE(u.Configure(Request(all)).ok());
  auto r = u.TrainStep(SftStep(0));
  REQUIRE(r.ok());
  CHECK(r->metrics().values().at("loss_tokens") == 10 + 20);

  // A conversation with no assistant turn has nothing to train on.
  WriteFile(dir.File("c.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"1+2\"}], \"answer\": \"3\"}\n");
  Trainer v;
  auto bad = v.Configure(Request(WithSft(e, 2)));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() ==
        "experiment.task: " + dir.File("c.jsonl") + ":1: no assistant turn to train on (SFT needs one)");
}

TEST_CASE("kind text: packed rows, every token but each piece's first is trained on") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  // With bos and eos: 5 + 13 + 4 = 22 tokens; rows of 16: [5 | 11] and
  // [2 | 4], two pieces each.
  WriteFile(dir.File("c.jsonl"), "{\"text\": \"abc\"}\n{\"text\": \"hello world\"}\n{\"text\": \"xy\"}\n");
  ExperimentConfig e = testing::TinyExperiment(7, 8);
  e.mutable_task()->Clear();
  e.mutable_task()->set_kind("text");
  e.mutable_task()->set_train_path(dir.File("c.jsonl"));
  e.mutable_task()->set_sequence_length(16);
  Trainer t;
  REQUIRE(t.Configure(Request(WithSft(e, 2))).ok());
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    auto r = t.TrainStep(SftStep(step));
    REQUIRE(r.ok());
    const auto& m = r->metrics().values();
    CHECK(m.at("rows") == 2);
    CHECK(m.at("tokens") == 22);
    CHECK(m.at("loss_tokens") == 22 - 4);
    if (step == 0) first = m.at("loss");
    last = m.at("loss");
  }
  CHECK(last < 0.5 * first);
}

}  // namespace
}  // namespace rlmesh::learner
