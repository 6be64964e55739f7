// Learner RL training step throughput (not a test). Report: bench/learner.md.
//
// Builds a rlmesh::learner::Trainer (world size 1, one GRPO stage, token-mean
// loss, one optimizer step per TrainStep) from a Hugging Face folder and
// times TrainStep on fixed synthetic groups. What one TrainStep does here:
// proto -> tensors, a no-grad forward for the old log-probs (the learner
// always recomputes them), GRPO advantages, forward + chunked log-probs +
// clipped-surrogate loss, backward, global-norm clip, AdamW.
//
// bench/learner_step_bench.py runs this binary once per repeat and the same
// step in PyTorch eager, interleaved; it builds the identical batch with the
// same formulas (SyntheticGroups below; keep the two in sync).
//
//   bazel build //bench:learner_step_bench
//   bazel-bin/bench/learner_step_bench --model_dir=DIR --threads=1 --steps=3
//
// With --world > 1 it is one rank of a learner layout (--rank, --store, and
// learner.tp / learner.zero / learner.pp and its schedule / learner.cp from
// their flags):
// bench/learner_layouts.py and bench/memory_plan.py start the ranks as
// processes.
//
// With --lora_rank > 0 the stage trains LoRA adapters (experiment.model.lora,
// all seven targets, alpha = 2 x rank); --kl_coef > 0 gives the GRPO stage a
// KL reference (a frozen copy of the policy, or under LoRA the policy with
// its adapters off). bench/lora.py compares the two.
//
// Prints, once configured, {"parameters": {"trainable", "total",
// "sync_bytes", "policy_bytes"}}: the parameters the optimizer holds (the
// adapters under LoRA, else the whole policy), the policy's own (adapters
// excluded), and the bytes of one weight sync (Trainer::SyncTensors) and of
// the whole policy. Then one JSON line per timed step: seconds (wall time of
// TrainStep), tokens (prompt + response tokens in the batch), and the
// trainer's own seconds_forward_backward / seconds_optimizer.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "actor/lora.h"
#include "actor/transformer.h"
#include "bench/process_memory.h"
#include "learner/trainer.h"
#include "proto/config.pb.h"
#include "proto/learner.pb.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face folder (config.json + safetensors) to start from.");
ABSL_FLAG(std::string, tokenizer, "",
          "model.tokenizer (e.g. char for a model of the main job's vocabulary); empty = the folder's own.");
ABSL_FLAG(int, threads, 1, "LibTorch intra-op threads (at::set_num_threads).");
ABSL_FLAG(int, interop_threads, 0, "LibTorch inter-op threads; 0 = leave the default.");
ABSL_FLAG(int, steps, 3, "Timed TrainSteps.");
ABSL_FLAG(int, warmup, 1, "Untimed TrainSteps first.");
ABSL_FLAG(int, groups, 2, "Groups per step.");
ABSL_FLAG(int, group_size, 4, "Samples per group.");
ABSL_FLAG(int, prompt_len, 32, "Prompt tokens per sample.");
ABSL_FLAG(int, response_len, 96, "Response tokens per sample.");
ABSL_FLAG(int, logprob_chunk, 64, "TrainerOptions.logprob_chunk (time steps per log-prob chunk).");
ABSL_FLAG(bool, recompute_old_logprobs, false,
          "TrainerOptions.recompute_old_logprobs: run the no-grad old log-prob pass even on one epoch, one mini-batch.");
ABSL_FLAG(double, lr, 1e-5, "AdamW learning rate.");
ABSL_FLAG(double, long_tail_mean, 0,
          "> 0: sample r's response has min(response_len, 1 + floor(-mean * ln u_r)) tokens (u_r a fixed "
          "hash of r in (0, 1)): long-tailed lengths like a random policy's; 0: every response has "
          "response_len tokens.");
ABSL_FLAG(std::string, pack_rl, "auto", "TrainerOptions.pack_rl: auto, off or on.");
ABSL_FLAG(bool, share_prompts, true, "TrainerOptions.share_prompts.");
ABSL_FLAG(bool, group_prompts, false,
          "The samples of a group have one prompt, as GRPO's do (the prompt tokens of the group's first "
          "sample); else every sample's prompt differs.");
ABSL_FLAG(int64_t, micro_batch_tokens, 8192, "learner.micro_batch_tokens.");
ABSL_FLAG(int, rank, 0, "This process's learner rank (with --world > 1).");
ABSL_FLAG(int, world, 1, "Learner processes (learner.shards).");
ABSL_FLAG(std::string, store, "", "File for the ranks' c10d FileStore (with --world > 1).");
ABSL_FLAG(int, tp, 1, "learner.tp.");
ABSL_FLAG(bool, sequence_parallel, false, "learner.sequence_parallel.");
ABSL_FLAG(int, zero, 0, "learner.zero (0, 1 or 3).");
ABSL_FLAG(int, ep, 1, "learner.ep (a MoE --model_dir; equal to --world when > 1).");
ABSL_FLAG(int, pp, 1, "learner.pp.");
ABSL_FLAG(int, pp_microbatches, 0, "learner.pp_microbatches (0 = 2 x pp).");
ABSL_FLAG(std::string, pp_schedule, "1f1b", "learner.pp_schedule: 1f1b or interleaved.");
ABSL_FLAG(int, pp_virtual_stages, 1, "learner.pp_virtual_stages (> 1 with pp_schedule interleaved).");
ABSL_FLAG(int, cp, 1, "learner.cp.");
ABSL_FLAG(bool, gradient_checkpointing, false, "learner.gradient_checkpointing.");
ABSL_FLAG(std::string, autocast, "fp32", "learner.autocast: fp32 or bf16.");
ABSL_FLAG(bool, whole_model, false,
          "weight_sync.whole_model: under --tp > 1 or --zero 3, rank 0 keeps the whole policy after every step "
          "(else it is gathered only for checkpoints).");
ABSL_FLAG(int, lora_rank, 0,
          "experiment.model.lora.rank (alpha = 2 x rank); 0 = the whole policy trains.");
ABSL_FLAG(std::string, lora_targets, "",
          "experiment.model.lora.targets, comma-separated (e.g. q_proj,v_proj); empty = all seven.");
ABSL_FLAG(double, kl_coef, 0, "The RL stage's rl.kl.coef; > 0 keeps a KL reference.");
ABSL_FLAG(std::string, stage, "grpo", "The RL stage: grpo, or ppo (with a critic, the policy plus a value head).");
ABSL_FLAG(std::string, save, "",
          "After the steps, Save a checkpoint to this path (every rank the same) and report the save's time "
          "and its own peak resident set.");
ABSL_FLAG(bool, load, false,
          "With --save: then Load that checkpoint back (every rank) and report the load's time and its own peak "
          "resident set.");
ABSL_FLAG(bool, grad_norms, false,
          "After each timed step also print {\"grad_norms\": {name: L2 norm}} of the raw (pre-clip) "
          "parameter gradients, for comparing against the eager side.");

namespace rlmesh {
namespace {

// Deterministic synthetic batch; bench/learner_step_bench.py builds the same.
// Sample r (global index g * group_size + i) at absolute position t has
// token (1 + 37 r + 101 t + (t^2 mod 17)) mod V; behaviour log-prob of
// response token j is -7.6 - 0.01 (j mod 5); the last 4 response tokens of
// odd samples are masked out; reward i mod 3 (variance in every group).
GroupList SyntheticGroups(int groups, int group_size, int prompt_len, int max_response_len, int vocab,
                          double long_tail_mean, bool group_prompts) {
  GroupList out;
  for (int g = 0; g < groups; ++g) {
    TrajectoryGroup* grp = out.add_groups();
    grp->set_group_id("g" + std::to_string(g));
    for (int i = 0; i < group_size; ++i) {
      const int r = g * group_size + i;
      int response_len = max_response_len;
      if (long_tail_mean > 0) {
        const double u = (static_cast<double>((static_cast<uint64_t>(r) * 2654435761u) % 1000003) + 0.5) / 1000003.0;
        response_len = std::min(max_response_len, 1 + static_cast<int>(std::floor(-long_tail_mean * std::log(u))));
      }
      Trajectory* t = grp->add_samples();
      for (int pos = 0; pos < prompt_len + response_len; ++pos) {
        const int owner = pos < prompt_len && group_prompts ? g * group_size : r;
        const int id = (1 + 37 * owner + 101 * pos + (pos * pos) % 17) % vocab;
        if (pos < prompt_len) {
          t->add_prompt_token_ids(id);
        } else {
          const int j = pos - prompt_len;
          t->add_response_token_ids(id);
          t->add_behaviour_logprobs(-7.6f - 0.01f * static_cast<float>(j % 5));
          t->add_loss_mask((r % 2 == 1 && j >= response_len - 4) ? 0 : 1);
        }
      }
      t->set_reward(static_cast<double>(i % 3));
    }
  }
  return out;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Memory freed so far goes back to the system: glibc's with malloc_trim,
// TCMalloc's (the learner's malloc, looked up so that the glibc build links
// too) with its own release.
void ReleaseFreeMemory() {
  malloc_trim(0);
  if (auto release = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"))) {
    release();
  }
}

// Runs `op` (a save or a load) and prints {"<what>": {"seconds", "rss_before",
// "peak_rss"}}: its own peak, from the resident set just before it (the
// memory freed so far given back first). False, with the error printed,
// when the peak cannot be reset or `op` fails.
bool MeasureOwnPeak(const char* what, const std::function<absl::Status()>& op) {
  ReleaseFreeMemory();
  if (!bench::ResetPeakRss()) {
    std::fprintf(stderr, "--%s: cannot reset the peak resident set (/proc/self/clear_refs)\n", what);
    return false;
  }
  const double rss_before = bench::RssBytes();
  const double t0 = Now();
  const absl::Status s = op();
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    return false;
  }
  std::printf("{\"%s\": {\"seconds\": %.6f, \"rss_before\": %.0f, \"peak_rss\": %.0f}}\n", what, Now() - t0,
              rss_before, bench::PeakRssBytes());
  return true;
}

// Long because: a benchmark script: setup, then each measurement run and printed in order.
int Run() {
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) {
    std::fprintf(stderr, "--model_dir is required\n");
    return 2;
  }
  actor::ConfigureThreads(absl::GetFlag(FLAGS_threads));
  if (absl::GetFlag(FLAGS_interop_threads) > 0) at::set_num_interop_threads(absl::GetFlag(FLAGS_interop_threads));
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);

  ExperimentConfig e;
  e.set_name("learner_step_bench");
  e.set_seed(1);
  e.mutable_model()->set_init("checkpoint");
  e.mutable_model()->set_path(dir);
  e.mutable_model()->set_tokenizer(absl::GetFlag(FLAGS_tokenizer));
  const std::string stage = absl::GetFlag(FLAGS_stage);
  if (stage != "grpo" && stage != "ppo") {
    std::fprintf(stderr, "--stage: grpo or ppo, not '%s'\n", stage.c_str());
    return 2;
  }
  Stage* st = e.add_stages();
  auto* rl = stage == "ppo" ? st->mutable_ppo()->mutable_rl() : st->mutable_grpo()->mutable_rl();
  rl->set_steps(warmup + steps);
  // The batch the experiment describes (the schema requires it); the steps
  // train on SyntheticGroups of this shape.
  rl->set_prompts_per_step(absl::GetFlag(FLAGS_groups));
  rl->set_samples_per_prompt(absl::GetFlag(FLAGS_group_size));
  rl->mutable_optimizer()->set_lr(absl::GetFlag(FLAGS_lr));
  rl->mutable_kl()->set_coef(absl::GetFlag(FLAGS_kl_coef));
  if (const int rank = absl::GetFlag(FLAGS_lora_rank); rank > 0) {
    LoraConfig* lora = e.mutable_model()->mutable_lora();
    lora->set_rank(rank);
    lora->set_alpha(2.0f * static_cast<float>(rank));
    const std::string targets = absl::GetFlag(FLAGS_lora_targets);
    if (targets.empty()) {
      for (const std::string& t : actor::LoraTargetNames()) lora->add_targets(t);
    } else {
      for (absl::string_view t : absl::StrSplit(targets, ',')) lora->add_targets(std::string(t));
    }
  }
  // Everything else at its default: token-mean, clip 0.2, no entropy
  // bonus, grad clip 1.0, 1 epoch x 1 mini-batch, 8192-token micro-batches
  // (one micro-batch for the default 8 x 128 batch).
  e.mutable_learner()->set_shards(absl::GetFlag(FLAGS_world));
  e.mutable_learner()->set_tp(absl::GetFlag(FLAGS_tp));
  e.mutable_learner()->set_sequence_parallel(absl::GetFlag(FLAGS_sequence_parallel));
  e.mutable_learner()->set_zero(absl::GetFlag(FLAGS_zero));
  e.mutable_learner()->set_ep(absl::GetFlag(FLAGS_ep));
  e.mutable_learner()->set_pp(absl::GetFlag(FLAGS_pp));
  e.mutable_learner()->set_pp_microbatches(absl::GetFlag(FLAGS_pp_microbatches));
  e.mutable_learner()->set_pp_schedule(absl::GetFlag(FLAGS_pp_schedule));
  e.mutable_learner()->set_pp_virtual_stages(absl::GetFlag(FLAGS_pp_virtual_stages));
  e.mutable_learner()->set_cp(absl::GetFlag(FLAGS_cp));
  e.mutable_learner()->set_gradient_checkpointing(absl::GetFlag(FLAGS_gradient_checkpointing));
  e.mutable_learner()->set_autocast(absl::GetFlag(FLAGS_autocast));
  e.mutable_weight_sync()->set_whole_model(absl::GetFlag(FLAGS_whole_model));
  ConfigureRequest req;
  req.set_world_size(absl::GetFlag(FLAGS_world));
  req.set_rank(absl::GetFlag(FLAGS_rank));
  if (req.world_size() > 1) req.set_store_address("file:" + absl::GetFlag(FLAGS_store));
  learner::TrainerOptions opts;
  opts.logprob_chunk = absl::GetFlag(FLAGS_logprob_chunk);
  opts.recompute_old_logprobs = absl::GetFlag(FLAGS_recompute_old_logprobs);
  const std::string pack = absl::GetFlag(FLAGS_pack_rl);
  if (pack == "off") {
    opts.pack_rl = learner::TrainerOptions::RlPacking::kOff;
  } else if (pack == "on") {
    opts.pack_rl = learner::TrainerOptions::RlPacking::kOn;
  } else if (pack != "auto") {
    std::fprintf(stderr, "--pack_rl: auto, off or on, not '%s'\n", pack.c_str());
    return 2;
  }
  opts.share_prompts = absl::GetFlag(FLAGS_share_prompts);
  e.mutable_learner()->set_micro_batch_tokens(absl::GetFlag(FLAGS_micro_batch_tokens));
  *req.mutable_experiment() = e;
  // LibTorch's own start-up memory, before any model exists.
  [[maybe_unused]] at::Tensor warm = at::randn({64, 64}).matmul(at::randn({64, 64}));
  const double rss_before = bench::RssBytes();
  learner::Trainer trainer(opts);
  auto cfg = trainer.Configure(req);
  if (!cfg.ok()) {
    std::fprintf(stderr, "configure: %s\n", cfg.status().ToString().c_str());
    return 1;
  }
  // Memory the trainer freed while configuring (the broadcast's whole
  // policy on the ranks that drop it) goes back to the system first.
  ReleaseFreeMemory();
  const double rss_configured = bench::RssBytes();
  // From the config: under ZeRO-3, EP and TP only rank 0's policy holds data
  // (under TP with weight sync in pieces, none does between checkpoints).
  const actor::ModelConfig& mc = (*static_cast<actor::Transformer*>(trainer.policy_model()))->config();
  const int vocab = static_cast<int>(mc.vocab_size);
  int64_t params = 0, policy_bytes = 0;
  for (const auto& [name, t] : trainer.PolicyParameters()) {
    params += t.numel();
    policy_bytes += static_cast<int64_t>(t.nbytes());
  }
  int64_t trainable = params;
  if (absl::GetFlag(FLAGS_lora_rank) > 0) {
    trainable = 0;
    for (const auto& [name, t] : (*static_cast<actor::Transformer*>(trainer.policy_model()))->AdapterParameters()) {
      trainable += t.numel();
    }
  }
  // Rank 0 publishes; under TP or ZeRO-3 with weight sync in pieces there is
  // no whole-model sync (-1).
  int64_t sync_bytes = -1;
  if (auto sync = trainer.SyncTensors(); sync.ok()) {
    sync_bytes = 0;
    for (const auto& [name, t] : *sync) sync_bytes += static_cast<int64_t>(t.nbytes());
  }
  std::printf(
      "{\"parameters\": {\"trainable\": %lld, \"total\": %lld, \"sync_bytes\": %lld, \"policy_bytes\": %lld}}\n",
      static_cast<long long>(trainable), static_cast<long long>(params), static_cast<long long>(sync_bytes),
      static_cast<long long>(policy_bytes));
  std::fflush(stdout);
  TrainStepRequest step;
  *step.mutable_groups() =
      SyntheticGroups(absl::GetFlag(FLAGS_groups), absl::GetFlag(FLAGS_group_size),
                      absl::GetFlag(FLAGS_prompt_len), absl::GetFlag(FLAGS_response_len), vocab,
                      absl::GetFlag(FLAGS_long_tail_mean), absl::GetFlag(FLAGS_group_prompts));
  for (int s = 0; s < warmup + steps; ++s) {
    step.set_step(trainer.step());
    const double t0 = Now();
    auto r = trainer.TrainStep(step);
    const double secs = Now() - t0;
    if (!r.ok()) {
      std::fprintf(stderr, "train step %d: %s\n", s, r.status().ToString().c_str());
      return 1;
    }
    if (s < warmup) continue;
    const auto& m = r->metrics().values();
    std::printf(
        "{\"seconds\": %.6f, \"tokens\": %.0f, \"seconds_forward_backward\": %.6f, \"seconds_optimizer\": %.6f, "
        "\"loss\": %.6g, \"grad_norm\": %.6g, \"pad_frac\": %.4f, \"packed_frac\": %.4f, "
        "\"shared_prompt_frac\": %.4f, \"threads\": %d, \"interop_threads\": %d}\n",
        secs, m.at("tokens"), m.at("seconds_forward_backward"), m.at("seconds_optimizer"), m.at("loss"),
        m.at("grad_norm"), m.at("pad_frac"), m.at("packed_frac"), m.at("shared_prompt_frac"),
        static_cast<int>(at::get_num_threads()), static_cast<int>(at::get_num_interop_threads()));
    if (absl::GetFlag(FLAGS_grad_norms)) {
      // DataParallel clips a packed copy; the parameters' .grad() keep the raw gradient.
      std::string line = "{\"grad_norms\": {";
      bool first = true;
      for (const auto& [name, t] : trainer.PolicyParameters()) {
        const double n = t.grad().defined() ? t.grad().norm().item<double>() : 0.0;
        line += (first ? "\"" : ", \"") + name + "\": " + std::to_string(n);
        first = false;
      }
      std::printf("%s}}\n", line.c_str());
    }
    std::fflush(stdout);
  }
  // Memory: the resident set before the trainer existed, once it was
  // configured (weights, optimizer state), and the peak over the steps.
  std::printf("{\"memory\": {\"rss_before\": %.0f, \"rss_configured\": %.0f, \"peak_rss\": %.0f, "
              "\"params\": %lld, \"critic_held\": %lld}}\n",
              rss_before, rss_configured, bench::PeakRssBytes(), static_cast<long long>(params),
              static_cast<long long>(trainer.CriticElementsHeld()));
  if (const std::string save = absl::GetFlag(FLAGS_save); !save.empty()) {
    std::string saved;
    if (!MeasureOwnPeak("save", [&]() -> absl::Status {
          auto r = trainer.Save(save);
          if (r.ok()) saved = r->path();
          return r.status();
        })) {
      return 1;
    }
    if (absl::GetFlag(FLAGS_load) && !MeasureOwnPeak("load", [&] { return trainer.Load(saved).status(); })) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return rlmesh::Run();
}
