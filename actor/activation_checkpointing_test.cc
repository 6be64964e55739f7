// Activation checkpointing (TransformerImpl::set_activation_checkpointing):
// the same outputs and gradients as the ordinary graph, under fp32 and bf16
// autocast, with padding and packing masks; only the blocks' inputs kept.

#include <functional>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "actor/autocast.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"

namespace rlmesh::actor {
namespace {

ModelConfig Small(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 64;
  c.value_head = true;
  return c;
}

Transformer MakeModel(const ModelConfig& c) {
  torch::manual_seed(7);
  Transformer m(c);
  torch::NoGradGuard g;
  for (auto& p : m->parameters()) {
    if (p.dim() >= 2) p.normal_(0, 0.2);
  }
  return m;
}

struct Pass {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // NamedParameters() order
};

// A loss over the logits and the value head, backward, and the gradients.
Pass Run(Transformer& m, bool checkpoint, bool bf16, const torch::Tensor& ids, const torch::Tensor& pos,
         const torch::Tensor& mask) {
  m->set_activation_checkpointing(checkpoint);
  for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  Pass r;
  torch::Tensor loss;
  {
    AutocastScope ac(c10::DeviceType::CPU, AutocastState{bf16, at::kBFloat16});
    torch::Tensor h = m->ForwardHidden(ids, pos, mask);
    torch::Tensor logits = m->Logits(h).to(at::kFloat);
    torch::Tensor values = m->ValuesFromHidden(h).to(at::kFloat);
    r.out = logits.detach().clone();
    loss = torch::log_softmax(logits, -1).select(-1, 3).sum() + values.pow(2).sum();
  }
  loss.backward();
  for (auto& [name, p] : m->NamedParameters()) {
    REQUIRE(p.grad().defined());
    r.grads.push_back(p.grad().clone());
  }
  return r;
}

double MaxDiff(const Pass& a, const Pass& b) {
  double d = (a.out - b.out).abs().max().item<double>();
  for (size_t i = 0; i < a.grads.size(); ++i) {
    d = std::max(d, (a.grads[i] - b.grads[i]).abs().max().item<double>());
  }
  return d;
}

// Autograd nodes reachable from t's grad_fn.
int CountNodes(const torch::Tensor& t) {
  std::set<torch::autograd::Node*> seen;
  std::function<void(const std::shared_ptr<torch::autograd::Node>&)> walk =
      [&](const std::shared_ptr<torch::autograd::Node>& n) {
        if (!n || !seen.insert(n.get()).second) return;
        for (const auto& e : n->next_edges()) walk(e.function);
      };
  walk(t.grad_fn());
  return static_cast<int>(seen.size());
}

TEST_CASE("Activation checkpointing gives the ordinary graph's outputs and gradients") {
  for (const std::string arch : {"llama", "qwen3"}) {
    Transformer m = MakeModel(Small(arch));
    torch::manual_seed(3);
    const int64_t B = 3, T = 9;
    torch::Tensor ids = torch::randint(0, 61, {B, T});
    torch::Tensor pos = torch::arange(T).unsqueeze(0).expand({B, T}).contiguous();
    // Right padding, and two packed sequences in row 1 (segment ids).
    torch::Tensor padding = torch::ones({B, T}, torch::kLong);
    padding[0].narrow(0, 6, 3).zero_();
    torch::Tensor segments = torch::tensor({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 1, 1, 1, 1, 1, 1,
                                            1, 1, 1},
                                           torch::kLong)
                                 .view({B, T});
    torch::Tensor seg_pos = pos.clone();
    seg_pos[1].narrow(0, 4, 5).copy_(torch::arange(5));
    for (bool bf16 : {false, true}) {
      for (int masking = 0; masking < 3; ++masking) {
        DYNAMIC_SECTION(arch << (bf16 ? " bf16" : " fp32") << " mask " << masking) {
          const torch::Tensor mask = masking == 0 ? torch::Tensor() : masking == 1 ? padding : segments;
          const torch::Tensor& p = masking == 2 ? seg_pos : pos;
          Pass plain = Run(m, false, bf16, ids, p, mask);
          Pass ckpt = Run(m, true, bf16, ids, p, mask);
          // The same kernels on the same inputs in the same order.
          CHECK(MaxDiff(plain, ckpt) == 0.0);
          // bf16 really changed the numbers (so the check above covers the
          // recomputation's autocast).
          if (bf16) CHECK(MaxDiff(plain, Run(m, false, false, ids, p, mask)) > 1e-4);
        }
      }
    }
  }
}

TEST_CASE("Activation checkpointing keeps one node per block, and none without a graph") {
  Transformer m = MakeModel(Small("llama"));
  torch::Tensor ids = torch::randint(0, 61, {2, 8});
  torch::Tensor pos = torch::arange(8).unsqueeze(0).expand({2, 8}).contiguous();
  m->set_activation_checkpointing(false);
  const int plain = CountNodes(m->ForwardHidden(ids, pos));
  m->set_activation_checkpointing(true);
  torch::Tensor h = m->ForwardHidden(ids, pos);
  const int ckpt = CountNodes(h);
  // Embedding, 3 blocks and the final norm, plus their leaves and a handful
  // of nodes: the blocks' dozens of ops each are gone.
  CHECK(ckpt < 20);
  CHECK(plain > 3 * 20);
  int blocks = 0;
  std::set<torch::autograd::Node*> seen;
  std::function<void(const std::shared_ptr<torch::autograd::Node>&)> walk =
      [&](const std::shared_ptr<torch::autograd::Node>& n) {
        if (!n || !seen.insert(n.get()).second) return;
        if (n->name().find("CheckpointedBlock") != std::string::npos) ++blocks;
        for (const auto& e : n->next_edges()) walk(e.function);
      };
  walk(h.grad_fn());
  CHECK(blocks == 3);
  {
    torch::NoGradGuard g;
    CHECK_FALSE(m->ForwardHidden(ids, pos).requires_grad());
  }
}

TEST_CASE("Activation checkpointing is refused for MoE layers") {
  ModelConfig c = Small("qwen3_moe");
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  REQUIRE(c.Validate().ok());
  Transformer m(c);
  CHECK_THROWS_WITH(m->set_activation_checkpointing(true), Catch::Contains("not built for MoE"));
  m->set_activation_checkpointing(false);
  CHECK_FALSE(m->activation_checkpointing());
}

}  // namespace
}  // namespace rlmesh::actor
