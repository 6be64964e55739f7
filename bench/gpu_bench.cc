// GPU measurements for scripts/device_check.sh: one JSON line per figure,
// each with the reference it is a ratio against measured in the same run
// (the GPU's own bf16 matmul rate, its own device-to-device copy rate, the
// same model in fp32 on the CPU). Not a test; the report is bench/gpu.md.
//
//   gpu_bench [--device=cuda] [--hidden=1024 --layers=24 ...]
//
// On a machine without a GPU it prints the device error and exits 2 (the
// dry run checks exactly that).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "actor/generate.h"
#include "actor/logprobs.h"
#include "actor/transformer.h"
#include "dist/device.h"

ABSL_FLAG(std::string, device, "cuda", "Device to measure: cuda or cuda:<index>.");
ABSL_FLAG(int, hidden, 1024, "Model width (a ~0.5B-shaped model: >= 1024).");
ABSL_FLAG(int, layers, 24, "Decoder layers.");
ABSL_FLAG(int, heads, 16, "Attention heads.");
ABSL_FLAG(int, kv_heads, 4, "Key/value heads.");
ABSL_FLAG(int, intermediate, 2816, "MLP width.");
ABSL_FLAG(int, vocab, 32000, "Vocabulary.");
ABSL_FLAG(int, train_batch, 8, "Sequences per training step.");
ABSL_FLAG(int, train_len, 1024, "Tokens per training sequence.");
ABSL_FLAG(int, repeats, 5, "Timed repeats of each measurement (after one warm-up).");
ABSL_FLAG(int, new_tokens, 128, "Tokens generated per sample in the decode measurements.");

namespace {

using rlmesh::actor::ModelConfig;
using rlmesh::actor::Transformer;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void Sync(const c10::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median seconds of f() over `repeats` after one warm-up, synchronised.
template <typename F>
std::vector<double> Time(const c10::Device& d, int repeats, F&& f) {
  f();
  Sync(d);
  std::vector<double> out;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = Now();
    f();
    Sync(d);
    out.push_back(Now() - t0);
  }
  return out;
}

void Emit(const std::string& what, const std::string& fields) {
  std::printf("{\"what\": \"%s\", %s}\n", what.c_str(), fields.c_str());
  std::fflush(stdout);
}

std::string Spread(const std::vector<double>& s) {
  return absl::StrCat("\"seconds_median\": ", Median(s), ", \"seconds_min\": ", *std::min_element(s.begin(), s.end()),
                      ", \"seconds_max\": ", *std::max_element(s.begin(), s.end()));
}

int64_t NonEmbeddingParams(Transformer& m) {
  int64_t n = 0;
  for (auto& [name, t] : m->NamedParameters()) {
    if (name.find("embed_tokens") == std::string::npos && name.find("lm_head") == std::string::npos) n += t.numel();
  }
  return n;
}

}  // namespace

// Long because: a benchmark script: setup, then each measurement run and printed in order.
int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto resolved = rlmesh::dist::ResolveDevice(absl::GetFlag(FLAGS_device), "gpu_bench --device");
  if (!resolved.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", resolved.status().ToString().c_str());
    return 2;
  }
  const c10::Device dev = *resolved;
  if (!dev.is_cuda()) {
    std::fprintf(stderr, "gpu_bench: --device must be a CUDA device\n");
    return 2;
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  torch::NoGradGuard outer_no_grad;

  // 1. The GPU's own references: a large bf16 matmul and a device copy.
  double matmul_flops = 0, copy_bytes_per_s = 0;
  {
    const int64_t n = 8192;
    auto a = torch::randn({n, n}, torch::TensorOptions().device(dev).dtype(torch::kBFloat16));
    auto b = torch::randn({n, n}, a.options());
    auto s = Time(dev, repeats, [&] { (void)torch::matmul(a, b); });
    matmul_flops = 2.0 * n * n * n / Median(s);
    Emit("matmul_bf16", absl::StrCat("\"n\": ", n, ", \"tflops\": ", matmul_flops / 1e12, ", ", Spread(s)));
    const int64_t bytes = int64_t{1} << 30;
    auto src = torch::empty({bytes}, torch::TensorOptions().device(dev).dtype(torch::kUInt8));
    auto dst = torch::empty_like(src);
    auto c = Time(dev, repeats, [&] { dst.copy_(src); });
    copy_bytes_per_s = static_cast<double>(bytes) / Median(c);  // bytes moved (each read once, written once)
    Emit("copy_d2d", absl::StrCat("\"bytes\": ", bytes, ", \"gb_per_s\": ", copy_bytes_per_s / 1e9,
                                  ", \"read_plus_write_gb_per_s\": ", 2 * copy_bytes_per_s / 1e9, ", ", Spread(c)));
  }

  ModelConfig cfg;
  cfg.vocab_size = absl::GetFlag(FLAGS_vocab);
  cfg.hidden_size = absl::GetFlag(FLAGS_hidden);
  cfg.intermediate_size = absl::GetFlag(FLAGS_intermediate);
  cfg.num_layers = absl::GetFlag(FLAGS_layers);
  cfg.num_heads = absl::GetFlag(FLAGS_heads);
  cfg.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  cfg.max_positions = std::max(2048, absl::GetFlag(FLAGS_train_len) + 64);
  if (absl::Status v = cfg.Validate(); !v.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", v.ToString().c_str());
    return 2;
  }

  // 2. Parity: the same random weights, fp32 on the CPU against bf16 and
  // fp32 on the GPU.
  {
    torch::manual_seed(1234);
    Transformer cpu(cfg);
    const int64_t B = 2, T = 64;
    auto ids = torch::randint(0, cfg.vocab_size, {B, T});
    auto pos = torch::arange(T).unsqueeze(0).expand({B, T}).contiguous();
    auto ref = cpu->Forward(ids, pos);
    Transformer gpu(cfg);
    {
      auto src = cpu->NamedParameters();
      auto dst = gpu->NamedParameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
    }
    gpu->to(dev);
    auto f32 = gpu->Forward(ids.to(dev), pos.to(dev)).to(torch::kCPU);
    gpu->to(torch::kBFloat16);
    auto bf16 = gpu->Forward(ids.to(dev), pos.to(dev)).to(torch::kCPU, torch::kFloat32);
    const double scale = ref.abs().max().item<double>();
    Emit("parity_logits",
         absl::StrCat("\"params\": ", NonEmbeddingParams(cpu), ", \"logit_abs_max\": ", scale,
                      ", \"fp32_gpu_vs_cpu_max_abs\": ", (f32 - ref).abs().max().item<double>(),
                      ", \"bf16_gpu_vs_fp32_cpu_max_abs\": ", (bf16 - ref).abs().max().item<double>(),
                      ", \"bf16_argmax_agreement\": ", bf16.argmax(-1).eq(ref.argmax(-1)).to(torch::kFloat).mean().item<double>()));
  }

  // 3. A learner step: fp32 master weights, bf16 autocast, chunked log-probs,
  // backward, AdamW; MFU against the matmul rate measured above.
  torch::manual_seed(7);
  Transformer model(cfg);
  model->to(dev);
  const int64_t N = NonEmbeddingParams(model);
  {
    torch::AutoGradMode grad(true);
    const int64_t B = absl::GetFlag(FLAGS_train_batch), T = absl::GetFlag(FLAGS_train_len);
    auto ids = torch::randint(0, cfg.vocab_size, {B, T}, torch::TensorOptions().device(dev).dtype(torch::kLong));
    auto pos = torch::arange(T, ids.options()).unsqueeze(0).expand({B, T}).contiguous();
    auto targets = torch::cat({ids.narrow(1, 1, T - 1), torch::full({B, 1}, -1, ids.options())}, 1);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-5));
    auto step = [&] {
      at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, true);
      at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, at::kBFloat16);
      opt.zero_grad();
      auto out = rlmesh::actor::TokenLogProbs(model, ids, pos, targets, 128);
      TORCH_CHECK(out.ok(), "TokenLogProbs: ", out.status().ToString());
      auto loss = -out->logprobs.sum() / static_cast<double>(B * (T - 1));
      at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, false);
      at::autocast::clear_cache();
      loss.backward();
      opt.step();
    };
    auto s = Time(dev, repeats, step);
    const double tokens = static_cast<double>(B * T);
    // 6 N per token for the dense weights, plus causal attention's
    // 6 * layers * T * hidden per token (forward + backward, half masked).
    const double flops = tokens * (6.0 * N + 6.0 * cfg.num_layers * T * cfg.hidden_size);
    const double achieved = flops / Median(s);
    Emit("train_step", absl::StrCat("\"non_embedding_params\": ", N, ", \"tokens\": ", tokens,
                                    ", \"tokens_per_s\": ", tokens / Median(s), ", \"tflops\": ", achieved / 1e12,
                                    ", \"mfu_of_measured_matmul\": ", achieved / matmul_flops, ", ", Spread(s)));
  }

  // 4. Decode in bf16: batch 1 against the bandwidth roofline (every weight
  // read once per token), and batch 64; each without and with CUDA graphs
  // (captured anew in every repeat, as a worker does after each swap).
  model->to(torch::kBFloat16);
  int64_t weight_bytes = 0;
  for (auto& p : model->parameters()) weight_bytes += p.numel() * p.element_size();
  for (int batch : {1, 64}) {
    for (bool graphs : {false, true}) {
      const int new_tokens = absl::GetFlag(FLAGS_new_tokens);
      rlmesh::actor::DecodeGraphStats stats;
      auto s = Time(dev, repeats, [&] {
        rlmesh::actor::Generator gen(model, {.max_batch = batch, .cuda_graphs = graphs});
        std::vector<rlmesh::actor::GenerationRequest> reqs(batch);
        for (int i = 0; i < batch; ++i) {
          reqs[i].prompt.assign(16, (i * 7) % cfg.vocab_size);
          reqs[i].sampling.greedy = true;
          reqs[i].sampling.max_new_tokens = new_tokens;
        }
        auto res = gen.Generate(reqs);
        if (!res.ok()) std::fprintf(stderr, "gpu_bench: decode: %s\n", res.status().ToString().c_str());
        stats = gen.graph_stats();
      });
      if (!stats.error.empty()) std::fprintf(stderr, "gpu_bench: decode graphs: %s\n", stats.error.c_str());
      const double tps = static_cast<double>(batch) * new_tokens / Median(s);
      const double roofline = copy_bytes_per_s * 2 / static_cast<double>(weight_bytes);  // read bandwidth / bytes
      Emit("decode_bf16", absl::StrCat("\"batch\": ", batch, ", \"cuda_graphs\": ", graphs ? "true" : "false",
                                       ", \"graph_replays\": ", stats.replays, ", \"weight_bytes\": ", weight_bytes,
                                       ", \"tokens_per_s\": ", tps, ", \"batch1_roofline_tokens_per_s\": ", roofline,
                                       ", \"fraction_of_roofline_per_sequence\": ", tps / batch / roofline, ", ",
                                       Spread(s)));
    }
  }
  return 0;
}
