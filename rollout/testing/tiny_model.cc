#include "rollout/testing/tiny_model.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "actor/checkpoint.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"

namespace rlmesh::rollout::testing {

absl::Status WriteTinyCheckpoint(const std::string& dir, uint64_t seed) {
  actor::CharTokenizer tok;
  actor::ModelConfig c;
  c.vocab_size = tok.vocab_size();
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 64;
  c.eos_token_id = tok.eos_id();
  at::manual_seed(seed);
  actor::Transformer model(c);
  return actor::SaveHfModel(model, dir);
}

absl::Status WriteTinyMoeCheckpoint(const std::string& dir, uint64_t seed, double router_noise) {
  actor::CharTokenizer tok;
  actor::ModelConfig c;
  c.arch = "qwen3_moe";
  c.vocab_size = tok.vocab_size();
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_positions = 64;
  c.num_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  c.eos_token_id = tok.eos_id();
  at::manual_seed(seed);
  actor::Transformer model(c);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : model->NamedParameters()) {
      if (name.find("mlp.gate.") == std::string::npos) continue;
      p.normal_(0, 1.0);
    }
    if (router_noise > 0) {
      at::manual_seed(seed + 1);
      for (auto& [name, p] : model->NamedParameters()) {
        if (name.find("mlp.gate.") != std::string::npos) p.add_(at::randn_like(p) * router_noise);
      }
    }
  }
  return actor::SaveHfModel(model, dir);
}

absl::StatusOr<std::vector<actor::GroupResult>> ReferenceGenerate(
    const std::string& dir, const GenerateRequest& request, int64_t max_batch,
    const std::vector<std::vector<actor::Completion>>* resume) {
  auto model = actor::LoadHfModel(dir);
  if (!model.ok()) return model.status();
  actor::GeneratorOptions go;
  go.max_batch = max_batch;
  actor::Generator gen(*model, go);
  std::vector<actor::GenerationRequest> reqs;
  const SamplingParams& sp = request.sampling();
  for (int i = 0; i < request.prompts_size(); ++i) {
    actor::GenerationRequest g;
    g.id = i;
    g.prompt.assign(request.prompts(i).token_ids().begin(), request.prompts(i).token_ids().end());
    g.sampling.greedy = sp.greedy();
    g.sampling.temperature = sp.temperature() > 0 ? sp.temperature() : 1.0f;
    g.sampling.top_k = sp.top_k();
    g.sampling.top_p = sp.top_p() > 0 ? sp.top_p() : 1.0f;
    g.sampling.max_new_tokens = sp.max_new_tokens();
    g.sampling.stop_token_ids.assign(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
    g.sampling.seed = sp.seed();
    g.sampling.n = request.n();
    g.prompt_index = i;
    g.record_routing = request.record_routing();
    if (resume != nullptr) g.resume = (*resume)[i];
    reqs.push_back(std::move(g));
  }
  return gen.Generate(std::move(reqs));
}

GenerateRequest MakeRequest(const std::vector<std::string>& prompts, int n, int max_new_tokens, uint64_t seed) {
  actor::CharTokenizer tok;
  GenerateRequest r;
  r.set_experiment_id("exp");
  r.set_step(7);
  r.set_n(n);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_max_new_tokens(max_new_tokens);
  r.mutable_sampling()->set_seed(seed);
  for (size_t i = 0; i < prompts.size(); ++i) {
    Prompt* p = r.add_prompts();
    p->set_prompt_id(absl::StrCat("q", i));
    for (int id : tok.Encode(prompts[i])) p->add_token_ids(id);
    p->set_reference_answer(absl::StrCat(i));
  }
  return r;
}

}  // namespace rlmesh::rollout::testing
