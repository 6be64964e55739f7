#include "coordinator/memory_plan.h"

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/proto_yaml.h"
#include "coordinator/experiment_config.h"
#include "parallel/layout_shapes.h"

namespace rlmesh {
namespace {

using parallel::ParameterCount;

constexpr double kGib = 1 << 30;

actor::ModelConfig Llama(int64_t vocab, int64_t layers) {
  actor::ModelConfig m;
  m.vocab_size = vocab;
  m.hidden_size = 512;
  m.intermediate_size = 1408;
  m.num_layers = layers;
  m.num_heads = 8;
  m.num_kv_heads = 4;
  m.max_positions = 256;
  return m;
}

ExperimentConfig Experiment(const std::string& yaml) {
  ExperimentConfig cfg;
  YamlSource src;
  REQUIRE(MergeYaml("name: plan\ntask: {kind: arithmetic}\n" + yaml, &cfg, &src).ok());
  absl::Status s = NormalizeExperiment(&cfg, src);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return cfg;
}

// A host of 64 GiB, and a GRPO stage of 8 prompts x 4 samples a step.
PlanCapacity Host64Gib() {
  PlanCapacity cap;
  cap.host_bytes = 64 * kGib;
  return cap;
}
const char* const kGrpo =
    "stages: [{grpo: {rl: {steps: 1, prompts_per_step: 8, samples_per_prompt: 4, optimizer: {lr: 1.0e-5}}}}]\n";

const RoleMemory& Role(const MemoryPlan& plan, const std::string& name) {
  for (const auto& r : plan.roles) {
    if (r.role == name) return r;
  }
  FAIL("no role " << name);
  return plan.roles[0];
}

double Part(const RoleMemory& r, const std::string& prefix) {
  for (const auto& p : r.parts) {
    if (p.name.rfind(prefix, 0) == 0) return p.bytes;
  }
  return -1;
}

TEST_CASE("ParameterCount counts as transformers does") {
  // The two Llamas of bench/learner_memory.md and bench/learner_layouts.md,
  // whose parameters transformers counted: 13.9M and 56.4M.
  CHECK(ParameterCount(Llama(2048, 4)) == 13898240);
  CHECK(ParameterCount(Llama(32000, 8)) == 56369664);
  actor::ModelConfig tiny;
  tiny.vocab_size = 100;
  tiny.hidden_size = 8;
  tiny.intermediate_size = 16;
  tiny.num_layers = 1;
  tiny.num_heads = 2;
  tiny.num_kv_heads = 1;
  CHECK(ParameterCount(tiny) == 2200);  // 2 x 800 + 8 + 16 + 64 + 64 + 64 + 384
  tiny.tie_embeddings = true;
  CHECK(ParameterCount(tiny) == 1400);
  tiny.arch = "qwen2";  // q/k/v biases: 8 + 4 + 4
  CHECK(ParameterCount(tiny) == 1416);
  tiny.arch = "qwen3";  // QK-norm: 2 x 4, no biases
  CHECK(ParameterCount(tiny) == 1408);
  tiny.arch = "qwen3_moe";  // 4 experts of width 6 and a router
  tiny.num_experts = 4;
  tiny.num_experts_per_tok = 2;
  tiny.moe_intermediate_size = 6;
  CHECK(ParameterCount(tiny) == 1408 - 384 + 4 * 8 + 4 * 3 * 8 * 6);
}

TEST_CASE("The learner's state follows the layout") {
  const actor::ModelConfig m = Llama(2048, 4);
  const double p = ParameterCount(m);
  const PlanCapacity cap = Host64Gib();
  const std::string grpo = kGrpo;
  auto plain = PlanMemory(Experiment(grpo), m, {}, cap);
  REQUIRE(plain.ok());
  const RoleMemory& one = Role(*plain, "learner");
  CHECK(one.count == 1);
  CHECK(Part(one, "weights") == 4 * p);
  CHECK(Part(one, "flat weights and gradients") == 8 * p);
  CHECK(Part(one, "AdamW moments") == 8 * p);
  CHECK(Part(one, "gradients") == 4 * p);
  CHECK(Part(one, "frozen reference") == -1);  // kl.coef 0
  CHECK(Part(one, "runtime") == cap.runtime_bytes);
  // 32 sequences of 256 tokens, capped at micro_batch_tokens (8192).
  CHECK(plain->micro_batch_tokens == 8192);
  CHECK(plain->micro_batch_rows == 32);

  auto zero1 = PlanMemory(Experiment(grpo + "learner: {shards: 2, zero: 1}\n"), m, {}, cap);
  REQUIRE(zero1.ok());
  CHECK(Role(*zero1, "learner").count == 2);
  CHECK(Part(Role(*zero1, "learner"), "AdamW moments") == 4 * p);
  CHECK(Part(Role(*zero1, "learner"), "shard of gradients and weights") == 4 * p);
  CHECK(Role(*zero1, "learner").Each() < Role(*plain, "learner").Each());

  // ZeRO-3 syncs the weights in pieces by default: each rank keeps its
  // slice, none the whole policy; with weight_sync.whole_model rank 0 does.
  auto zero3 = PlanMemory(Experiment(grpo + "learner: {shards: 2, zero: 3}\n"), m, {}, cap);
  REQUIRE(zero3.ok());
  CHECK(Role(*zero3, "learner").count == 2);
  CHECK(Part(Role(*zero3, "learner"), "training state") == 10 * p);
  CHECK(Part(Role(*zero3, "learner"), "weight-sync slice") == 2 * p);
  CHECK(Part(Role(*zero3, "learner"), "gathered policy") == -1);
  auto zero3_whole =
      PlanMemory(Experiment(grpo + "learner: {shards: 2, zero: 3}\nweight_sync: {whole_model: true}\n"), m, {}, cap);
  REQUIRE(zero3_whole.ok());
  CHECK(Part(Role(*zero3_whole, "learner 0"), "gathered policy") == 4 * p);
  CHECK(Part(Role(*zero3_whole, "learner"), "gathered policy") == -1);
  CHECK(Part(Role(*zero3_whole, "learner"), "weight-sync slice") == -1);

  auto kl = PlanMemory(Experiment("stages: [{grpo: {rl: {steps: 1, prompts_per_step: 8, optimizer: {lr: 1.0e-5}, "
                                  "kl: {coef: 0.01}}}}]\n"),
                       m, {}, cap);
  REQUIRE(kl.ok());
  CHECK(Part(Role(*kl, "learner"), "frozen reference") == 4 * p);

  // Checkpointing keeps a layer's input instead of its activations.
  auto ckpt = PlanMemory(Experiment(grpo + "learner: {gradient_checkpointing: true}\n"), m, {}, cap);
  REQUIRE(ckpt.ok());
  CHECK(Part(Role(*ckpt, "learner"), "activations (checkpointed)") < 0.5 * Part(one, "activations"));

  // The longest sequences bound the micro-batch and the KV cache, not the
  // context window.
  auto short_rows = PlanMemory(Experiment(grpo), m, {.train = 64, .generate = 48}, cap);
  REQUIRE(short_rows.ok());
  CHECK(short_rows->micro_batch_tokens == 32 * 64);
  CHECK(short_rows->micro_batch_rows == 32);
  CHECK(Part(Role(*short_rows, "rollout_worker"), "KV cache") == 2.0 * 4 * 4 * 64 * 64 * 48 * 4);

  ExperimentConfig moe = Experiment(grpo + "learner: {shards: 2}\n");
  moe.mutable_learner()->set_ep(2);
  auto ep = PlanMemory(moe, m, {}, cap);
  CHECK(ep.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(std::string(ep.status().message()).find("learner.ep") != std::string::npos);
}

TEST_CASE("Tensor, pipeline and context parallelism: what each rank holds and runs") {
  const actor::ModelConfig m = Llama(2048, 4);
  const double p = ParameterCount(m);
  const PlanCapacity cap = Host64Gib();
  const std::string grpo = kGrpo;
  auto plain = PlanMemory(Experiment(grpo), m, {.train = 128}, cap);
  REQUIRE(plain.ok());
  const double plain_activations = Part(Role(*plain, "learner"), "activations");

  // TP: each rank its slice's state; the layers' and the head's activations
  // shrink, the stream's do not. Weight sync in pieces: no whole policy.
  auto tp = PlanMemory(Experiment(grpo + "learner: {shards: 2, tp: 2}\n"), m, {.train = 128}, cap);
  REQUIRE(tp.ok());
  const double slice = ParameterCount(parallel::TensorParallelShardConfig(m, 2));
  CHECK(slice < 0.51 * p);
  CHECK(Role(*tp, "learner").count == 2);
  CHECK(Part(Role(*tp, "learner"), "weights") == 4 * slice);
  CHECK(Part(Role(*tp, "learner"), "AdamW moments") == 8 * slice);
  CHECK(Part(Role(*tp, "learner"), "gathered policy") == -1);
  CHECK(Part(Role(*tp, "learner"), "activations") < 0.8 * plain_activations);
  CHECK(Part(Role(*tp, "learner"), "activations") > 0.3 * plain_activations);
  CHECK(tp->micro_batch_rows == plain->micro_batch_rows);
  auto tp_whole = PlanMemory(Experiment(grpo + "learner: {shards: 4, tp: 2, zero: 1}\nweight_sync: {whole_model: true}\n"),
                             m, {.train = 128}, cap);
  REQUIRE(tp_whole.ok());
  CHECK(Part(Role(*tp_whole, "learner 0"), "gathered policy") == 4 * p);
  CHECK(Role(*tp_whole, "learner").count == 3);
  // ZeRO-1 over the two replicas of each slice.
  CHECK(Part(Role(*tp_whole, "learner"), "AdamW moments") == 4 * slice);

  // PP: stage s holds its layers' parameters (the embedding on the first,
  // the head on the last) and min(pp - s, M) micro-batches' activations;
  // only the last stage scores the vocabulary; rank 0 keeps the whole
  // policy for weight sync.
  auto pp = PlanMemory(Experiment(grpo + "learner: {shards: 4, pp: 2}\n"), m, {.train = 128}, cap);
  REQUIRE(pp.ok());
  auto layers = parallel::BalancedStageLayers(m, 2);
  REQUIRE(layers.ok());
  const std::vector<int64_t> held = parallel::StageParameterCounts(m, *layers);
  CHECK(held[0] + held[1] == static_cast<int64_t>(p));  // untied: nothing held twice
  const RoleMemory& first = Role(*pp, "learner 0 (stage 0)");
  CHECK(first.count == 1);
  CHECK(Role(*pp, "learner stage 0").count == 1);
  CHECK(Role(*pp, "learner stage 1").count == 2);
  CHECK(Part(first, "weights") == 4 * held[0]);
  CHECK(Part(Role(*pp, "learner stage 1"), "weights") == 4 * held[1]);
  CHECK(Part(first, "gathered policy") == 4 * p);
  CHECK(Part(Role(*pp, "learner stage 0"), "gathered policy") == -1);
  // 16 rows a replica in at least 4 micro-batches (2 x pp).
  CHECK(pp->micro_batch_rows == 4);
  const double stage0 = Part(Role(*pp, "learner stage 0"), "activations");
  const double stage1 = Part(Role(*pp, "learner stage 1"), "activations");
  // Two layers each; stage 0 holds two micro-batches of 4 x 128 tokens,
  // stage 1 one but scores the vocabulary: eight [4, 64, 2048] fp32 chunks.
  REQUIRE(*layers == std::vector<int64_t>{2, 2});
  const double micro = 4 * 128 * 2 * 4.0 * (9 * 512 + 4 * 256 + 4 * 1408 + 8 + 4);
  CHECK(stage0 - stage1 == Approx(micro - 4 * 64 * 2048 * 4.0 * 8));
  CHECK(stage0 < plain_activations);
  // Checkpointed, each micro-batch in flight keeps its layers' inputs
  // ([4, 128, 512] fp32 a layer), and one layer's activations of one
  // micro-batch are rebuilt at a time.
  auto pp_ck = PlanMemory(Experiment(grpo + "learner: {shards: 4, pp: 2, gradient_checkpointing: true}\n"), m,
                          {.train = 128}, cap);
  REQUIRE(pp_ck.ok());
  const double input = 4 * 128 * 4.0 * 512;
  CHECK(stage0 - Part(Role(*pp_ck, "learner stage 0"), "activations (checkpointed)") ==
        Approx(2 * micro - (2 * 2 * input + micro / 2)));

  // Interleaved, two chunks a stage (layers 0 and 2 on stage 0, 1 and 3 on
  // stage 1): the schedule holds 5 and 3 chunks' activations at once, 2.5
  // and 1.5 passes through a stage's two layers against 1F1B's 2 and 1.
  auto inter =
      PlanMemory(Experiment(grpo + "learner: {shards: 4, pp: 2, pp_schedule: interleaved}\n"), m, {.train = 128}, cap);
  REQUIRE(inter.ok());
  const std::vector<int64_t> chunk_params = parallel::StageParameterCounts(m, {1, 1, 1, 1});
  CHECK(Part(Role(*inter, "learner stage 0"), "weights") == 4 * (chunk_params[0] + chunk_params[2]));
  CHECK(Part(Role(*inter, "learner stage 1"), "weights") == 4 * (chunk_params[1] + chunk_params[3]));
  CHECK(Part(Role(*inter, "learner stage 0"), "activations") - stage0 == Approx(0.5 * micro));
  CHECK(Part(Role(*inter, "learner stage 1"), "activations") - stage1 == Approx(0.5 * micro));
  auto too_deep = PlanMemory(
      Experiment(grpo + "learner: {shards: 2, pp: 2, pp_schedule: interleaved, pp_virtual_stages: 4}\n"), m,
      {.train = 128}, cap);
  REQUIRE(!too_deep.ok());
  CHECK(absl::StrContains(too_deep.status().message(), "learner.pp_virtual_stages: 2 stages x 4 virtual stages need at least 8 layers"));

  // PP x TP: each stage's ranks hold a tensor-parallel slice of its layers
  // (the shard's parameter count), the vocabulary-parallel head on the last
  // stage; rank 0 still gathers the whole policy.
  auto pptp = PlanMemory(Experiment(grpo + "learner: {shards: 4, pp: 2, tp: 2}\n"), m, {.train = 128}, cap);
  REQUIRE(pptp.ok());
  const std::vector<int64_t> held_slice =
      parallel::StageParameterCounts(parallel::TensorParallelShardConfig(m, 2), *layers);
  CHECK(Part(Role(*pptp, "learner 0 (stage 0)"), "weights") == 4 * held_slice[0]);
  CHECK(Part(Role(*pptp, "learner stage 1"), "weights") == 4 * held_slice[1]);
  CHECK(held_slice[1] < 0.51 * held[1]);
  CHECK(Role(*pptp, "learner stage 1").count == 2);
  CHECK(Part(Role(*pptp, "learner 0 (stage 0)"), "gathered policy") == 4 * p);
  // The layers' activations shrink with the slices (the stream's do not),
  // against the pipeline of one replica alone.
  auto pp_one = PlanMemory(Experiment(grpo + "learner: {shards: 2, pp: 2}\n"), m, {.train = 128}, cap);
  REQUIRE(pp_one.ok());
  CHECK(pptp->micro_batch_rows == pp_one->micro_batch_rows);
  CHECK(Part(Role(*pptp, "learner 0 (stage 0)"), "activations") <
        0.8 * Part(Role(*pp_one, "learner 0 (stage 0)"), "activations"));

  // CP: the whole model on every rank, half the tokens' activations each.
  auto cp = PlanMemory(Experiment(grpo + "learner: {shards: 2, cp: 2}\n"), m, {.train = 128}, cap);
  REQUIRE(cp.ok());
  CHECK(Role(*cp, "learner").count == 2);
  CHECK(Part(Role(*cp, "learner"), "weights") == 4 * p);
  CHECK(Part(Role(*cp, "learner"), "gathered policy") == -1);
  CHECK(Part(Role(*cp, "learner"), "activations") < plain_activations);
  CHECK(cp->micro_batch_rows == plain->micro_batch_rows);
  // cp x tp: a slice's state and half the tokens.
  auto cptp = PlanMemory(Experiment(grpo + "learner: {shards: 4, cp: 2, tp: 2}\n"), m, {.train = 128}, cap);
  REQUIRE(cptp.ok());
  CHECK(Role(*cptp, "learner").count == 4);
  CHECK(Part(Role(*cptp, "learner"), "weights") == 4 * slice);
  CHECK(Part(Role(*cptp, "learner"), "activations") < Part(Role(*tp, "learner"), "activations"));
}

TEST_CASE("The rollout worker's KV cache and a plan that does not fit") {
  actor::ModelConfig m = Llama(2048, 4);
  PlanCapacity cap;
  cap.host_bytes = 64 * kGib;
  auto plan = PlanMemory(Experiment("stages: [{sft: {steps: 1, batch: 4, optimizer: {lr: 1.0e-3}}}]\n"
                                    "rollout: {workers: 2, max_batch: 16}\n"),
                         m, {}, cap);
  REQUIRE(plan.ok());
  const RoleMemory& r = Role(*plan, "rollout_worker");
  CHECK(r.count == 2);
  // 2 (k, v) x 4 layers x 4 KV heads x 64 wide x 16 rows x 256 tokens x 4 B.
  CHECK(Part(r, "KV cache") == 2.0 * 4 * 4 * 64 * 16 * 256 * 4);
  REQUIRE(plan->devices.size() == 1);
  CHECK(plan->devices[0].used == Approx(Role(*plan, "learner").Each() + 2 * r.Each() +
                                        Role(*plan, "reward_server").Each() + cap.replay_buffer_bytes));
  CHECK(CheckMemoryPlan(*plan).ok());

  cap.host_bytes = 0.5 * kGib;
  auto small = PlanMemory(Experiment("stages: [{sft: {steps: 1, batch: 4, optimizer: {lr: 1.0e-3}}}]\n"), m, {}, cap);
  REQUIRE(small.ok());
  absl::Status s = CheckMemoryPlan(*small);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(s.message()).find("cpu needs") != std::string::npos);
  CHECK(std::string(s.message()).find("learner x1") != std::string::npos);
  CHECK(std::string(s.message()).find("rollout_worker x1") != std::string::npos);
  CHECK(FormatMemoryPlan(*small).find("DOES NOT FIT") != std::string::npos);

  // GPUs: one per learner shard; their memory unknown means not checked.
  cap.host_bytes = 64 * kGib;
  auto gpu = PlanMemory(Experiment("model: {device: \"cuda:1\"}\nlearner: {shards: 2}\n"
                                   "stages: [{sft: {steps: 1, batch: 4, optimizer: {lr: 1.0e-3}}}]\n"),
                        m, {}, cap);
  REQUIRE(gpu.ok());
  CHECK(Role(*gpu, "learner 0").device == "cuda:1");
  CHECK(Role(*gpu, "learner 1").device == "cuda:2");
  CHECK(Role(*gpu, "rollout_worker").device == "cuda:1");
  CHECK(CheckMemoryPlan(*gpu).ok());
  // Workers on a GPU hold bf16 weights and KV cache unless rollout.dtype says.
  const double bf16_kv = 2.0 * 4 * 4 * 64 * 64 * 256 * 2;
  CHECK(Part(Role(*gpu, "rollout_worker"), "KV cache") == bf16_kv);
  CHECK(Part(Role(*gpu, "rollout_worker"), "weights") == Part(Role(*gpu, "learner 0"), "weights") / 2);
  auto fp32 = PlanMemory(Experiment("model: {device: \"cuda:1\"}\nrollout: {dtype: fp32}\n"
                                    "stages: [{sft: {steps: 1, batch: 4, optimizer: {lr: 1.0e-3}}}]\n"),
                         m, {}, cap);
  REQUIRE(fp32.ok());
  CHECK(Part(Role(*fp32, "rollout_worker"), "KV cache") == 2 * bf16_kv);
  cap.gpu_bytes = 0.1 * kGib;
  auto tight = PlanMemory(Experiment("model: {device: \"cuda:1\"}\nlearner: {shards: 2}\n"
                                     "stages: [{sft: {steps: 1, batch: 4, optimizer: {lr: 1.0e-3}}}]\n"),
                          m, {}, cap);
  REQUIRE(tight.ok());
  CHECK(std::string(CheckMemoryPlan(*tight).message()).find("cuda:2 needs") != std::string::npos);
}

}  // namespace
}  // namespace rlmesh
