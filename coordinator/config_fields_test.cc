// Every field of ExperimentConfig (and of ClusterConfig) is honoured or refused: this test walks
// the schema (proto/config.proto, through its descriptor) and fails for a
// field that has no entry below naming the file that reads it, and for an
// entry whose file does not read it. A file reads `rlmesh.RolloutConfig.dtype`
// when it has `.dtype(`, `->dtype(` or `.dtype_size(` and also names the
// parent message: its C++ type (`RolloutConfig`) or the accessor of a field
// of that type (`rollout(`, `mutable_rollout(`), so a file that reads only
// `model().dtype()` does not count. Fields of the root message need no parent
// (code reaches the root through whatever holds it: `cfg()`, `config->`).
// Adding a field to the schema without code that reads it therefore fails
// here. A field that is refused rather than honoured points at
// schema/experiment.cc, where the refusal is.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "google/protobuf/descriptor.h"
#include "proto/config.pb.h"

namespace rlmesh {
namespace {

// Field (full name) -> a source file that reads it.
const std::map<std::string, std::string>& Readers() {
  static const auto* readers = new std::map<std::string, std::string>{
    {"rlmesh.ExperimentConfig.name", "coordinator/cmd_run.cc"},
    {"rlmesh.ExperimentConfig.seed", "coordinator/stages.cc"},
    {"rlmesh.ExperimentConfig.model", "coordinator/stages.cc"},
    {"rlmesh.ModelConfig.init", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.path", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.arch", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.hidden", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.intermediate", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.layers", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.heads", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.kv_heads", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.max_positions", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.rope_theta", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.rms_norm_eps", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.tie_embeddings", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.tokenizer", "coordinator/stages.cc"},
    {"rlmesh.ModelConfig.dtype", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.device", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.threads", "coordinator/cmd_run.cc"},
    {"rlmesh.ModelConfig.head_dim", "learner/model_set.cc"},
    {"rlmesh.ModelConfig.lora", "learner/model_set.cc"},
    {"rlmesh.LoraConfig.rank", "learner/model_set.cc"},
    {"rlmesh.LoraConfig.alpha", "learner/model_set.cc"},
    {"rlmesh.LoraConfig.dropout", "learner/model_set.cc"},
    {"rlmesh.LoraConfig.targets", "learner/model_set.cc"},
    {"rlmesh.LoraConfig.init", "learner/model_set.cc"},
    {"rlmesh.LoraConfig.stages", "learner/model_set.cc"},
    {"rlmesh.LoraConfig.path", "learner/model_set.cc"},
    {"rlmesh.ExperimentConfig.task", "coordinator/stages.cc"},
    {"rlmesh.TaskConfig.kind", "tasks/task.cc"},
    {"rlmesh.TaskConfig.digits", "tasks/task.cc"},
    {"rlmesh.TaskConfig.ops", "tasks/task.cc"},
    {"rlmesh.TaskConfig.train", "tasks/task.cc"},
    {"rlmesh.TaskConfig.eval", "tasks/task.cc"},
    {"rlmesh.TaskConfig.train_path", "tasks/task.cc"},
    {"rlmesh.TaskConfig.eval_path", "tasks/task.cc"},
    {"rlmesh.TaskConfig.prompt_field", "tasks/task.cc"},
    {"rlmesh.TaskConfig.answer_field", "tasks/task.cc"},
    {"rlmesh.TaskConfig.prompt_template", "tasks/task.cc"},
    {"rlmesh.TaskConfig.chat_template", "tasks/chat_prompts.cc"},
    {"rlmesh.TaskConfig.system_prompt", "tasks/chat_prompts.cc"},
    {"rlmesh.TaskConfig.chat_template_kwargs", "tasks/chat_prompts.cc"},
    {"rlmesh.TaskConfig.numbers", "tasks/task.cc"},
    {"rlmesh.TaskConfig.sft_tool_calls", "tasks/task.cc"},
    {"rlmesh.EnvironmentConfig.launch", "coordinator/cmd_run.cc"},
    {"rlmesh.TaskConfig.min_number", "tasks/task.cc"},
    {"rlmesh.TaskConfig.max_number", "tasks/task.cc"},
    {"rlmesh.TaskConfig.max_target", "tasks/task.cc"},
    {"rlmesh.TaskConfig.sft_carry_errors", "tasks/task.cc"},
    {"rlmesh.TaskConfig.messages_field", "tasks/task.cc"},
    {"rlmesh.TaskConfig.text_field", "tasks/task.cc"},
    {"rlmesh.TaskConfig.sequence_length", "learner/trainer.cc"},
    {"rlmesh.ExperimentConfig.stages", "coordinator/stages.cc"},
    {"rlmesh.ExperimentConfig.environment", "coordinator/generation.cc"},
    {"rlmesh.EnvironmentConfig.address", "rollout/episodes.cc"},
    {"rlmesh.EnvironmentConfig.name", "rollout/episodes.cc"},
    {"rlmesh.EnvironmentConfig.max_turns", "rollout/episodes.cc"},
    {"rlmesh.EnvironmentConfig.max_total_tokens", "rollout/episodes.cc"},
    {"rlmesh.EnvironmentConfig.stop_markers", "rollout/episodes.cc"},
    {"rlmesh.EnvironmentConfig.timeout_ms", "rollout/episodes.cc"},
    {"rlmesh.EnvironmentConfig.reward_weight", "rollout/episodes.cc"},
    {"rlmesh.Stage.name", "schema/experiment.cc"},
    {"rlmesh.Stage.sft", "learner/stage_options.cc"},
    {"rlmesh.SftStage.steps", "coordinator/stages.cc"},
    {"rlmesh.SftStage.batch", "learner/stage_options.cc"},
    {"rlmesh.SftStage.optimizer", "learner/stage_options.cc"},
    {"rlmesh.OptimizerConfig.lr", "learner/stage_options.cc"},
    {"rlmesh.OptimizerConfig.weight_decay", "learner/stage_options.cc"},
    {"rlmesh.OptimizerConfig.beta1", "learner/stage_options.cc"},
    {"rlmesh.OptimizerConfig.beta2", "learner/stage_options.cc"},
    {"rlmesh.OptimizerConfig.eps", "learner/stage_options.cc"},
    {"rlmesh.OptimizerConfig.warmup_steps", "learner/stage_options.cc"},
    {"rlmesh.OptimizerConfig.schedule", "learner/stage_options.cc"},
    {"rlmesh.OptimizerConfig.min_lr_ratio", "learner/stage_options.cc"},
    {"rlmesh.OptimizerConfig.grad_clip", "learner/stage_options.cc"},
    {"rlmesh.SftStage.packing", "learner/stage_options.cc"},
    {"rlmesh.SftStage.train_on_prompt", "learner/stage_options.cc"},
    {"rlmesh.SftStage.until", "coordinator/rl_loop.cc"},
    {"rlmesh.SftUntil.eval_accuracy", "coordinator/rl_loop.cc"},
    {"rlmesh.SftUntil.every", "coordinator/rl_loop.cc"},
    {"rlmesh.SftUntil.after", "coordinator/rl_loop.cc"},
    {"rlmesh.Stage.reward_model", "learner/stage_options.cc"},
    {"rlmesh.RewardModelStage.steps", "learner/stage_options.cc"},
    {"rlmesh.RewardModelStage.batch", "learner/stage_options.cc"},
    {"rlmesh.RewardModelStage.optimizer", "learner/stage_options.cc"},
    {"rlmesh.RewardModelStage.pairs_path", "learner/stage_options.cc"},
    {"rlmesh.RewardModelStage.output", "learner/stage_options.cc"},
    {"rlmesh.Stage.dpo", "learner/stage_options.cc"},
    {"rlmesh.DpoStage.steps", "learner/stage_options.cc"},
    {"rlmesh.DpoStage.batch", "learner/stage_options.cc"},
    {"rlmesh.DpoStage.optimizer", "learner/stage_options.cc"},
    {"rlmesh.DpoStage.beta", "learner/stage_options.cc"},
    {"rlmesh.DpoStage.pairs_path", "learner/stage_options.cc"},
    {"rlmesh.Stage.ppo", "learner/stage_options.cc"},
    {"rlmesh.PpoStage.rl", "learner/stage_options.cc"},
    {"rlmesh.RlStage.steps", "coordinator/stages.cc"},
    {"rlmesh.RlStage.prompts_per_step", "coordinator/rl_loop.cc"},
    {"rlmesh.RlStage.samples_per_prompt", "coordinator/generation.cc"},
    {"rlmesh.RlStage.optimizer", "learner/stage_options.cc"},
    {"rlmesh.RlStage.clip_low", "learner/stage_options.cc"},
    {"rlmesh.RlStage.clip_high", "learner/stage_options.cc"},
    {"rlmesh.RlStage.dual_clip", "learner/stage_options.cc"},
    {"rlmesh.RlStage.kl", "learner/stage_options.cc"},
    {"rlmesh.KlConfig.coef", "learner/stage_options.cc"},
    {"rlmesh.KlConfig.estimator", "learner/stage_options.cc"},
    {"rlmesh.KlConfig.in_reward", "learner/stage_options.cc"},
    {"rlmesh.RlStage.entropy_coef", "learner/stage_options.cc"},
    {"rlmesh.RlStage.loss_agg", "learner/stage_options.cc"},
    {"rlmesh.RlStage.max_staleness", "coordinator/rl_loop.cc"},
    {"rlmesh.RlStage.importance_cap", "schema/experiment.cc"},
    {"rlmesh.RlStage.epochs", "learner/stage_options.cc"},
    {"rlmesh.RlStage.mini_batches", "learner/stage_options.cc"},
    {"rlmesh.RlStage.drop_zero_variance", "learner/stage_options.cc"},
    {"rlmesh.RlStage.overlong_buffer", "learner/stage_options.cc"},
    {"rlmesh.RlStage.overlong_penalty", "learner/stage_options.cc"},
    {"rlmesh.RlStage.routing_replay", "learner/stage_options.cc"},
    {"rlmesh.RlStage.router_aux_loss_coef", "learner/stage_options.cc"},
    {"rlmesh.RlStage.policy_loss", "learner/stage_options.cc"},
    {"rlmesh.RlStage.mismatch", "learner/stage_options.cc"},
    {"rlmesh.MismatchConfig.mode", "learner/stage_options.cc"},
    {"rlmesh.MismatchConfig.level", "learner/stage_options.cc"},
    {"rlmesh.MismatchConfig.low", "learner/stage_options.cc"},
    {"rlmesh.MismatchConfig.high", "learner/stage_options.cc"},
    {"rlmesh.RlStage.dynamic_sampling", "coordinator/rl_loop.cc"},
    {"rlmesh.DynamicSamplingConfig.mode", "coordinator/generation.cc"},
    {"rlmesh.DynamicSamplingConfig.max_rounds", "coordinator/generation.cc"},
    {"rlmesh.RlStage.overlong_filter", "learner/stage_options.cc"},
    {"rlmesh.RlStage.distillation", "learner/stage_options.cc"},
    {"rlmesh.DistillationConfig.teacher", "learner/stage_options.cc"},
    {"rlmesh.DistillationConfig.coef", "learner/stage_options.cc"},
    {"rlmesh.DistillationConfig.task_reward", "learner/stage_options.cc"},
    {"rlmesh.PpoStage.gamma", "learner/stage_options.cc"},
    {"rlmesh.PpoStage.lam", "learner/stage_options.cc"},
    {"rlmesh.PpoStage.value_clip", "learner/stage_options.cc"},
    {"rlmesh.PpoStage.vf_coef", "learner/stage_options.cc"},
    {"rlmesh.PpoStage.critic_optimizer", "learner/stage_options.cc"},
    {"rlmesh.PpoStage.no_whiten", "learner/stage_options.cc"},
    {"rlmesh.Stage.grpo", "learner/stage_options.cc"},
    {"rlmesh.GrpoStage.rl", "learner/stage_options.cc"},
    {"rlmesh.GrpoStage.advantage", "learner/stage_options.cc"},
    {"rlmesh.ExperimentConfig.rollout", "coordinator/rl_loop.cc"},
    {"rlmesh.RolloutConfig.workers", "coordinator/cmd_run.cc"},
    {"rlmesh.RolloutConfig.sampling", "learner/stage_options.cc"},
    {"rlmesh.SamplingParams.temperature", "rollout/requests.cc"},
    {"rlmesh.SamplingParams.top_k", "rollout/requests.cc"},
    {"rlmesh.SamplingParams.top_p", "rollout/requests.cc"},
    {"rlmesh.SamplingParams.max_new_tokens", "coordinator/generation.cc"},
    {"rlmesh.SamplingParams.stop_token_ids", "coordinator/generation.cc"},
    {"rlmesh.SamplingParams.seed", "schema/experiment.cc"},
    {"rlmesh.SamplingParams.greedy", "schema/experiment.cc"},
    {"rlmesh.RolloutConfig.max_batch", "coordinator/cmd_run.cc"},
    {"rlmesh.RolloutConfig.on_update", "coordinator/cmd_run.cc"},
    {"rlmesh.RolloutConfig.max_queue", "coordinator/cmd_run.cc"},
    {"rlmesh.RolloutConfig.device", "coordinator/cmd_run.cc"},
    {"rlmesh.RolloutConfig.request_timeout_ms", "coordinator/generation.cc"},
    {"rlmesh.RolloutConfig.on_timeout", "coordinator/generation.cc"},
    {"rlmesh.RolloutConfig.tp", "coordinator/cmd_run.cc"},
    {"rlmesh.RolloutConfig.sleep", "coordinator/weights.cc"},
    {"rlmesh.RolloutConfig.cuda_memory_fraction", "coordinator/cmd_run.cc"},
    {"rlmesh.RolloutConfig.cuda_graphs", "coordinator/cmd_run.cc"},
    {"rlmesh.RolloutConfig.dtype", "coordinator/weights.cc"},
    {"rlmesh.ExperimentConfig.reward", "coordinator/rl_loop.cc"},
    {"rlmesh.RewardConfig.servers", "coordinator/cmd_run.cc"},
    {"rlmesh.RewardConfig.verifiers", "coordinator/evaluation.cc"},
    {"rlmesh.VerifierConfig.name", "reward_server/verifiers.cc"},
    {"rlmesh.VerifierConfig.weight", "reward_server/scorer.cc"},
    {"rlmesh.VerifierConfig.tolerance", "reward_server/verifiers.cc"},
    {"rlmesh.VerifierConfig.pattern", "reward_server/verifiers.cc"},
    {"rlmesh.VerifierConfig.max_tokens", "reward_server/verifiers.cc"},
    {"rlmesh.VerifierConfig.penalty_per_token", "reward_server/verifiers.cc"},
    {"rlmesh.VerifierConfig.command", "reward_server/verifiers.cc"},
    {"rlmesh.VerifierConfig.label", "coordinator/evaluation.cc"},
    {"rlmesh.RewardConfig.reward_model", "coordinator/cmd_run.cc"},
    {"rlmesh.RewardConfig.reward_model_weight", "coordinator/cmd_run.cc"},
    {"rlmesh.RewardConfig.verifier_timeout_ms", "coordinator/generation.cc"},
    {"rlmesh.RewardConfig.call", "coordinator/generation.cc"},
    {"rlmesh.RewardCallPolicy.timeout_ms", "reward_server/reward_call.cc"},
    {"rlmesh.RewardCallPolicy.on_failure", "reward_server/reward_call.cc"},
    {"rlmesh.RewardCallPolicy.retries", "reward_server/reward_call.cc"},
    {"rlmesh.RewardCallPolicy.breaker_failures", "reward_server/reward_call.cc"},
    {"rlmesh.RewardCallPolicy.breaker_cooldown_ms", "reward_server/reward_call.cc"},
    {"rlmesh.ExperimentConfig.buffer", "coordinator/rl_loop.cc"},
    {"rlmesh.BufferConfig.sample_mode", "coordinator/learners.cc"},
    {"rlmesh.BufferConfig.keep_steps", "coordinator/rl_loop.cc"},
    {"rlmesh.BufferConfig.max_bytes", "coordinator/rl_loop.cc"},
    {"rlmesh.ExperimentConfig.learner", "coordinator/runner_options.cc"},
    {"rlmesh.LearnerConfig.shards", "coordinator/runner_options.cc"},
    {"rlmesh.LearnerConfig.zero", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.micro_batch_tokens", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.autocast", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.tp", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.sequence_parallel", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.gradient_checkpointing", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.cuda_memory_fraction", "coordinator/cmd_run.cc"},
    {"rlmesh.LearnerConfig.sleep", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.ep", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.pp", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.pp_microbatches", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.pp_layers", "learner/stage_options.cc"},
    {"rlmesh.LearnerConfig.cp", "learner/stage_options.cc"},
    // The schema turns the schedule into pp_virtual_stages (1 for 1f1b).
    {"rlmesh.LearnerConfig.pp_schedule", "schema/experiment.cc"},
    {"rlmesh.LearnerConfig.pp_virtual_stages", "learner/stage_options.cc"},
    {"rlmesh.ExperimentConfig.weight_sync", "coordinator/weights.cc"},
    {"rlmesh.WeightSyncConfig.backend", "coordinator/weights.cc"},
    {"rlmesh.WeightSyncConfig.bucket_mb", "coordinator/weights.cc"},
    {"rlmesh.WeightSyncConfig.timeout_ms", "coordinator/weights.cc"},
    {"rlmesh.WeightSyncConfig.whole_model", "weight_sync/pieces.cc"},
    {"rlmesh.WeightSyncConfig.fallback", "coordinator/weights.cc"},
    {"rlmesh.ExperimentConfig.checkpoint", "coordinator/rl_loop.cc"},
    {"rlmesh.CheckpointConfig.every", "coordinator/rl_loop.cc"},
    {"rlmesh.CheckpointConfig.keep", "learner/stage_options.cc"},
    {"rlmesh.ExperimentConfig.eval", "coordinator/rl_loop.cc"},
    {"rlmesh.EvalConfig.every", "coordinator/rl_loop.cc"},
    {"rlmesh.EvalConfig.prompts", "coordinator/evaluation.cc"},
    {"rlmesh.EvalConfig.pass_at", "coordinator/evaluation.cc"},
    {"rlmesh.ExperimentConfig.logging", "coordinator/stages.cc"},
    {"rlmesh.LoggingConfig.no_jsonl", "coordinator/stages.cc"},
    {"rlmesh.LoggingConfig.tensorboard", "coordinator/stages.cc"},
    {"rlmesh.LoggingConfig.prometheus_port", "coordinator/cmd_run.cc"},
    {"rlmesh.LoggingConfig.quiet", "coordinator/rl_loop.cc"},
    {"rlmesh.LoggingConfig.hang_dump_seconds", "coordinator/cmd_run.cc"},
    {"rlmesh.ExperimentConfig.run_dir", "coordinator/cmd_run.cc"},
  };
  return *readers;
}

// ClusterConfig (cluster YAML) field (full name) -> a source file that reads it.
const std::map<std::string, std::string>& ClusterReaders() {
  static const auto* readers = new std::map<std::string, std::string>{
    {"rlmesh.ClusterConfig.name", "coordinator/cmd_launch.cc"},
    {"rlmesh.ClusterConfig.bind", "coordinator/cluster.cc"},
    {"rlmesh.ClusterConfig.coordinator_port", "coordinator/cmd_launch.cc"},
    {"rlmesh.ClusterConfig.rollout_workers", "coordinator/cluster.cc"},
    {"rlmesh.ClusterConfig.reward_servers", "coordinator/cluster.cc"},
    {"rlmesh.ClusterConfig.learners", "coordinator/cluster.cc"},
    {"rlmesh.ClusterConfig.buffer_path", "coordinator/cluster.cc"},
    {"rlmesh.ClusterConfig.run_dir", "coordinator/cmd_launch.cc"},
    {"rlmesh.ClusterConfig.auth_token_file", "coordinator/cluster.cc"},
    {"rlmesh.ClusterConfig.tokenizer", "coordinator/cluster.cc"},
    {"rlmesh.ClusterConfig.launcher", "coordinator/cli.cc"},
    {"rlmesh.ClusterConfig.slurm", "coordinator/cli.cc"},
    {"rlmesh.ClusterConfig.tls", "coordinator/cli.cc"},
    {"rlmesh.ClusterConfig.gpus", "coordinator/cluster.cc"},
    {"rlmesh.GpuConfig.learner", "coordinator/cluster.cc"},
    {"rlmesh.GpuConfig.rollout_worker", "coordinator/cluster.cc"},
    {"rlmesh.GpuConfig.reward_server", "coordinator/cluster.cc"},
    {"rlmesh.GpuConfig.colocate", "coordinator/cluster.cc"},
    {"rlmesh.GpuConfig.learner_memory_fraction", "coordinator/cluster.cc"},
    {"rlmesh.GpuConfig.rollout_worker_memory_fraction", "coordinator/cluster.cc"},
    {"rlmesh.GpuConfig.reward_server_memory_fraction", "coordinator/cluster.cc"},
    {"rlmesh.ClusterConfig.kubernetes", "coordinator/k8s_manifests.cc"},
    {"rlmesh.SlurmConfig.partition", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.nodes", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.time_limit", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.replay_buffer_nodes", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.reward_server_nodes", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.rollout_worker_nodes", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.learner_nodes", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.coordinator_address", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.network_interface", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.sbatch_args", "coordinator/slurm_launcher.cc"},
    {"rlmesh.SlurmConfig.start_timeout_seconds", "coordinator/slurm_launcher.cc"},
    {"rlmesh.TlsConfig.cert_file", "coordinator/cli.cc"},
    {"rlmesh.TlsConfig.key_file", "coordinator/cli.cc"},
    {"rlmesh.TlsConfig.root_cert_file", "coordinator/cli.cc"},
    {"rlmesh.TlsConfig.mutual", "coordinator/cli.cc"},
    {"rlmesh.KubernetesConfig.namespace", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.create_namespace", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.image", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.bin_dir", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.image_pull_policy", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.image_pull_secrets", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.storage_class", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.storage_size", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.existing_claim", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.mount_path", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.cluster_domain", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.replay_buffer_port", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.reward_server_port", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.rollout_worker_port", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.learner_port", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.coordinator_resources", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.replay_buffer_resources", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.reward_server_resources", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.rollout_worker_resources", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.learner_resources", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.service_account", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.network_interface", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesConfig.start_timeout_seconds", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesResources.cpu", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesResources.memory", "coordinator/k8s_manifests.cc"},
    {"rlmesh.KubernetesResources.gpus", "coordinator/k8s_manifests.cc"},
  };
  return *readers;
}

// The fields reachable from a root message, and for each message of the
// schema the names of the fields whose type it is (its accessors).
struct Schema {
  std::map<std::string, const google::protobuf::FieldDescriptor*> fields;  // by full name
  std::map<const google::protobuf::Descriptor*, std::set<std::string>> accessors;
};

void Walk(const google::protobuf::Descriptor* m, std::set<const google::protobuf::Descriptor*>* seen,
          Schema* schema) {
  if (!seen->insert(m).second) return;
  for (int i = 0; i < m->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = m->field(i);
    schema->fields[f->full_name()] = f;
    if (f->message_type() != nullptr) {
      schema->accessors[f->message_type()].insert(f->name());
      Walk(f->message_type(), seen, schema);
    }
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// protoc's C++ name of a message: "rlmesh.Outer.Inner" -> "Outer_Inner".
std::string CppTypeName(const google::protobuf::Descriptor* m) {
  const std::string& package = m->file()->package();
  std::string name = m->full_name().substr(package.empty() ? 0 : package.size() + 1);
  for (char& c : name) {
    if (c == '.') c = '_';
  }
  return name;
}

// Matches a mention of `parent` in source text: its C++ type name, or a read
// of a field of that type (`rollout(`, `->mutable_rollout(`). A field named
// like a C++ keyword is read through its accessor with a trailing '_'.
std::regex ParentMention(const google::protobuf::Descriptor* parent, const std::set<std::string>& accessors) {
  std::string alternatives = "\\b" + CppTypeName(parent) + "\\b";
  for (const std::string& a : accessors) alternatives += "|[.>](mutable_)?" + a + "_?\\(";
  return std::regex(alternatives);
}

// Fails for a field of `root`'s schema without an entry in `readers`, for
// an entry whose file does not read the field (of its own message), and for
// a stale entry.
void CheckReaders(const google::protobuf::Descriptor* root, const std::map<std::string, std::string>& readers,
                  size_t at_least) {
  std::set<const google::protobuf::Descriptor*> seen;
  Schema schema;
  Walk(root, &seen, &schema);
  REQUIRE(schema.fields.size() > at_least);
  std::map<std::string, std::string> sources;
  for (const auto& [f, field] : schema.fields) {
    INFO("field " << f);
    auto it = readers.find(f);
    // A new field: honour it (and name the file here) or refuse it.
    REQUIRE(it != readers.end());
    std::string& text = sources[it->second];
    if (text.empty()) text = ReadFile(testing::Runfile(it->second));
    REQUIRE(!text.empty());
    INFO("file " << it->second);
    const std::regex read("[.>]" + field->name() + "_?(_size)?\\(");
    CHECK(std::regex_search(text, read));
    const google::protobuf::Descriptor* parent = field->containing_type();
    if (parent != root) {
      INFO("parent " << parent->full_name() << ": the file names neither " << CppTypeName(parent)
                     << " nor a field of that type");
      CHECK(std::regex_search(text, ParentMention(parent, schema.accessors.at(parent))));
    }
  }
  // No entry for a field that no longer exists.
  for (const auto& [f, file] : readers) {
    INFO("entry " << f);
    CHECK(schema.fields.count(f) == 1);
  }
}

TEST_CASE("every ExperimentConfig field has code that reads it") {
  CheckReaders(ExperimentConfig::descriptor(), Readers(), 100);
}

TEST_CASE("every ClusterConfig field (local, slurm, tls, kubernetes) has code that reads it") {
  CheckReaders(ClusterConfig::descriptor(), ClusterReaders(), 50);
}

}  // namespace
}  // namespace rlmesh
