// Timing driver for bench/actor_bench.py: loads a Hugging Face folder and
// prints one JSON line per measurement (seconds per repeat). Not a test.
//
//   actor_bench DIR THREADS REPEATS

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "actor/checkpoint.h"
#include "actor/generate.h"
#include "actor/logprobs.h"
#include "actor/transformer.h"

using namespace rlmesh::actor;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Emit(const char* what, int batch, int64_t tokens, double secs) {
  std::printf("{\"impl\": \"rlmesh\", \"what\": \"%s\", \"batch\": %d, \"tokens\": %lld, \"seconds\": %.6f}\n", what,
              batch, static_cast<long long>(tokens), secs);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: actor_bench DIR THREADS REPEATS\n");
    return 2;
  }
  const std::string dir = argv[1];
  ConfigureThreads(std::atoi(argv[2]));
  const int repeats = std::atoi(argv[3]);
  auto loaded = LoadHfModel(dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  Transformer model = *loaded;
  const int64_t V = model->config().vocab_size;
  torch::manual_seed(0);
  const int64_t B = 8, T = 128;
  auto ids = torch::randint(0, V, {B, T});
  auto pos = torch::arange(T).unsqueeze(0).expand({B, T}).contiguous();
  {  // forward
    torch::NoGradGuard g;
    model->Forward(ids, pos);
    for (int r = 0; r < repeats; ++r) {
      double t0 = Now();
      model->Forward(ids, pos);
      Emit("forward", B, B * T, Now() - t0);
    }
  }
  {  // training step: next-token NLL via chunked log-probs, backward, AdamW
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-5));
    auto targets = torch::cat({ids.narrow(1, 1, T - 1), torch::full({B, 1}, -1, torch::kLong)}, 1);
    for (int r = 0; r < repeats + 1; ++r) {
      double t0 = Now();
      opt.zero_grad();
      auto out = TokenLogProbs(model, ids, pos, targets, T);
      auto loss = -out->logprobs.sum() / (B * (T - 1));
      loss.backward();
      opt.step();
      if (r > 0) Emit("train", B, B * T, Now() - t0);
    }
  }
  for (int batch : {1, 16, 64}) {  // decode
    const int new_tokens = 64;
    for (int r = 0; r < repeats; ++r) {
      Generator gen(model, {.max_batch = batch});
      std::vector<GenerationRequest> reqs(batch);
      for (int i = 0; i < batch; ++i) {
        reqs[i].prompt.assign(16, (i * 7) % V);
        reqs[i].sampling.greedy = true;
        reqs[i].sampling.max_new_tokens = new_tokens;
      }
      double t0 = Now();
      auto res = gen.Generate(reqs);
      double dt = Now() - t0;
      if (!res.ok()) return 1;
      Emit("decode", batch, int64_t{batch} * new_tokens, dt);
    }
  }
  return 0;
}
