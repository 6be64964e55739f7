#include "coordinator/model_defaults.h"

#include <filesystem>
#include <fstream>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

bool Has(const std::vector<std::string>& notes, const std::string& what) {
  for (const auto& n : notes) {
    if (n.find(what) != std::string::npos) return true;
  }
  return false;
}

ExperimentConfig FromFolder(const std::string& folder) {
  ExperimentConfig c;
  c.mutable_model()->set_init("checkpoint");
  c.mutable_model()->set_path(folder);
  return c;
}

TEST_CASE("A model folder's generation_config.json gives the sampling defaults the experiment leaves unset") {
  testing::TempDir dir;
  const std::string folder = dir.File("model");
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/tokenizer.json") << "{}";
  std::ofstream(folder + "/config.json") << R"({"model_type": "qwen3", "max_position_embeddings": 4096})";
  std::ofstream(folder + "/generation_config.json")
      << R"({"eos_token_id": [7, 9], "temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": true})";

  ExperimentConfig c = FromFolder(folder);
  c.mutable_rollout()->mutable_sampling()->set_top_p(0.5f);
  std::vector<std::string> notes;
  REQUIRE(ApplyModelFolderDefaults(&c, folder, &notes).ok());
  CHECK(c.rollout().sampling().temperature() == Approx(0.6));
  CHECK(c.rollout().sampling().top_k() == 20);
  CHECK(c.rollout().sampling().top_p() == Approx(0.5));  // the experiment's own
  CHECK(c.model().tokenizer() == folder);
  CHECK(Has(notes, "rollout.sampling.temperature 0.6 from " + folder + "/generation_config.json"));
  CHECK(Has(notes, "rollout.sampling.top_p 0.5 from the experiment"));
  CHECK(Has(notes, "model.tokenizer " + folder));
  CHECK(c.model().max_positions() == 4096);

  // A tokenizer the experiment names is kept.
  ExperimentConfig named = FromFolder(folder);
  named.mutable_model()->set_tokenizer("elsewhere");
  notes.clear();
  REQUIRE(ApplyModelFolderDefaults(&named, folder, &notes).ok());
  CHECK(named.model().tokenizer() == "elsewhere");

  // A scratch model reads nothing.
  ExperimentConfig scratch;
  scratch.mutable_model()->set_path(folder);
  notes.clear();
  REQUIRE(ApplyModelFolderDefaults(&scratch, folder, &notes).ok());
  CHECK(scratch.rollout().sampling().temperature() == 0);
  CHECK(scratch.model().tokenizer().empty());
  CHECK(notes.empty());
}

TEST_CASE("A folder without the files changes nothing") {
  testing::TempDir dir;
  ExperimentConfig c = FromFolder(dir.path());
  std::vector<std::string> notes;
  REQUIRE(ApplyModelFolderDefaults(&c, dir.path(), &notes).ok());
  CHECK(c.model().tokenizer().empty());
  CHECK(c.rollout().sampling().temperature() == 0);
  CHECK(notes.empty());
}

TEST_CASE("A bad generation_config.json is refused naming the file and field") {
  testing::TempDir dir;
  auto refusal = [&](const std::string& text) {
    std::ofstream(dir.File("generation_config.json"), std::ios::trunc) << text;
    ExperimentConfig c = FromFolder(dir.path());
    std::vector<std::string> notes;
    return ApplyModelFolderDefaults(&c, dir.path(), &notes);
  };
  absl::Status s = refusal("[1, 2]");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("generation_config.json: not a JSON object") != std::string::npos);
  s = refusal(R"({"temperature": "hot"})");
  CHECK(std::string(s.message()).find("generation_config.json: temperature must be a number") != std::string::npos);
  s = refusal(R"({"temperature": 0})");
  CHECK(std::string(s.message()).find("temperature must be > 0") != std::string::npos);
  s = refusal(R"({"top_p": 1.5})");
  CHECK(std::string(s.message()).find("top_p must be in (0, 1]") != std::string::npos);
  s = refusal(R"({"top_k": 2.5})");
  CHECK(std::string(s.message()).find("top_k must be an integer") != std::string::npos);
  CHECK(refusal(R"({"temperature": null, "top_k": 0})").ok());
  std::ofstream(dir.File("config.json")) << R"({"max_position_embeddings": 1})";
  s = refusal("{}");
  CHECK(std::string(s.message()).find("config.json: max_position_embeddings must be in [2, 2^30]") != std::string::npos);
}

}  // namespace
}  // namespace rlmesh
