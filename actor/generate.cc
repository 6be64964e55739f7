// Over 600 lines: the continuous-batching generation loop and the KV cache
// bookkeeping it owns (admission, per-row positions, stop rules, routing
// records) are one state machine.
#include "actor/generate.h"

#include <algorithm>
#include <map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/str_cat.h"
#include "actor/fixed_decode.h"
#include "actor/transformer.h"
#include "dist/device.h"

namespace rlmesh::actor {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A per-sample stream: splitmix64 over a state mixed from the three keys.
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t prompt_index, uint64_t sample_index) {
    uint64_t s = seed;
    state_ = SplitMix64(&s);
    s = state_ ^ (prompt_index * 0xD1B54A32D192ED03ULL);
    state_ = SplitMix64(&s);
    s = state_ ^ (sample_index * 0x8CB92BA72F3D8DD7ULL + 1);
    state_ = SplitMix64(&s);
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(SplitMix64(&state_) >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

bool NeedsFilter(const SamplingOptions& o) { return !o.greedy && (o.top_k > 0 || o.top_p < 1.0f); }

}  // namespace

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kAborted: return "aborted";
  }
  return "?";
}

absl::Status SamplingOptions::Validate() const {
  if (!greedy && !(temperature > 0)) return absl::InvalidArgumentError("sampling.temperature: must be > 0");
  if (top_k < 0) return absl::InvalidArgumentError("sampling.top_k: must be >= 0");
  if (!(top_p > 0 && top_p <= 1)) return absl::InvalidArgumentError("sampling.top_p: must be in (0, 1]");
  if (max_new_tokens <= 0) return absl::InvalidArgumentError("sampling.max_new_tokens: must be > 0");
  if (n <= 0) return absl::InvalidArgumentError("sampling.n: must be > 0");
  for (size_t i = 0; i < stop_sequences.size(); ++i) {
    if (stop_sequences[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop_sequences[", i, "]: must not be empty"));
    }
  }
  return absl::OkStatus();
}

absl::Status GeneratorOptions::Validate() const {
  if (max_batch <= 0) return absl::InvalidArgumentError("GeneratorOptions.max_batch: must be > 0");
  if (max_prefill_tokens <= 0) return absl::InvalidArgumentError("GeneratorOptions.max_prefill_tokens: must be > 0");
  return absl::OkStatus();
}

torch::Tensor SamplingDistribution(const torch::Tensor& logits_row, const SamplingOptions& o) {
  auto logits = logits_row.to(torch::kFloat32);
  const int64_t V = logits.size(0);
  if (o.greedy) {
    auto p = torch::zeros({V}, logits.options());
    p.index_put_({logits.argmax()}, 1.0f);
    return p;
  }
  auto probs = torch::softmax(logits / o.temperature, -1);
  if (!NeedsFilter(o)) return probs;
  auto [sorted, order] = probs.sort(-1, /*descending=*/true);
  auto keep = torch::ones({V}, torch::TensorOptions().dtype(torch::kBool));
  if (o.top_k > 0 && o.top_k < V) keep.narrow(0, o.top_k, V - o.top_k).fill_(false);
  if (o.top_p < 1.0f) {
    auto before = sorted.cumsum(0) - sorted;  // mass strictly before each token
    keep = keep.logical_and(before.lt(o.top_p));
  }
  auto kept = torch::where(keep, sorted, torch::zeros_like(sorted));
  auto out = torch::zeros({V}, logits.options());
  out.scatter_(0, order, kept / kept.sum());
  return out;
}

namespace {

// Host values bound for the model's device, packed so that they cross in
// one copy: on a GPU every copy from pageable host memory waits for the
// host, and each copy is a launch of its own. The pack is doubles, which
// hold every value sent exactly (token ids, lengths and top-k are integers
// below 2^53; the rest are floats), and Get converts a slice back to its
// dtype on the device.
class Upload {
 public:
  // Appends `values`; returns their handle for Get.
  template <typename T>
  int Add(const std::vector<T>& values) {
    slices_.push_back({static_cast<int64_t>(values_.size()), static_cast<int64_t>(values.size())});
    values_.insert(values_.end(), values.begin(), values.end());
    return static_cast<int>(slices_.size()) - 1;
  }
  // The one copy. On CUDA the pack is pinned and copied with non_blocking:
  // the host goes on, and the caching host allocator keeps the buffer until
  // the copy has run.
  void Send(torch::Device device, DecodeTransfers* count) {
    auto host = torch::empty({static_cast<int64_t>(values_.size())},
                             torch::TensorOptions().dtype(torch::kFloat64).pinned_memory(device.is_cuda()));
    std::copy(values_.begin(), values_.end(), host.data_ptr<double>());
    sent_ = host.to(device, /*non_blocking=*/true);
    if (count != nullptr) ++count->host_to_device;
  }
  // Slice `i` of the sent copy as `dtype`, on the device.
  torch::Tensor Get(int i, torch::ScalarType dtype) const {
    return sent_.narrow(0, slices_[i].first, slices_[i].second).to(dtype);
  }

 private:
  std::vector<double> values_;
  std::vector<std::pair<int64_t, int64_t>> slices_;  // (offset, size)
  torch::Tensor sent_;
};

// Device values the host needs, read back in one copy: on a GPU a copy to
// the host waits for everything queued before it, so one wait a step, not
// one per value. The values cross as doubles (exact for token ids, expert
// ids and fp32 log-probs).
class Download {
 public:
  // Queues `t` (any shape and dtype, flattened); returns its handle.
  int Add(const torch::Tensor& t) {
    parts_.push_back(t.reshape({-1}).to(torch::kFloat64));
    slices_.push_back({total_, parts_.back().numel()});
    total_ += parts_.back().numel();
    return static_cast<int>(parts_.size()) - 1;
  }
  // The one copy.
  void Receive(DecodeTransfers* count) {
    host_ = torch::cat(parts_).to(torch::kCPU).contiguous();
    if (count != nullptr) ++count->device_to_host;
  }
  const double* Data(int i) const { return host_.data_ptr<double>() + slices_[i].first; }

 private:
  std::vector<torch::Tensor> parts_;
  std::vector<std::pair<int64_t, int64_t>> slices_;  // (offset, size)
  int64_t total_ = 0;
  torch::Tensor host_;
};

// Rows' sampling options as the sampler reads them, one entry per row on
// the model's device. A row's options never change while it runs, so they
// go up with the admission that adds the row and move on the device when
// rows leave: a decode step sends none of them.
struct RowOptions {
  torch::Tensor inv_t;   // float: 1 / temperature (1 for greedy rows)
  torch::Tensor top_k;   // int64: min(top_k, V), V when off
  torch::Tensor top_p;   // float: top_p (1 for greedy rows)
  torch::Tensor greedy;  // bool

  struct Handles {
    int inv_t, top_k, top_p, greedy;
  };
  // Queues the options of rows `o` (vocabulary V) on `up`; FromUpload reads
  // them from the sent copy.
  static Handles Pack(const std::vector<const SamplingOptions*>& o, int64_t V, Upload* up) {
    const size_t n = o.size();
    std::vector<float> inv_t(n), top_p(n);
    std::vector<int64_t> top_k(n), greedy(n);
    for (size_t r = 0; r < n; ++r) {
      inv_t[r] = o[r]->greedy ? 1.0f : 1.0f / o[r]->temperature;
      top_k[r] = o[r]->top_k > 0 ? std::min<int64_t>(o[r]->top_k, V) : V;
      top_p[r] = o[r]->greedy ? 1.0f : o[r]->top_p;
      greedy[r] = o[r]->greedy ? 1 : 0;
    }
    return {up->Add(inv_t), up->Add(top_k), up->Add(top_p), up->Add(greedy)};
  }
  static RowOptions FromUpload(const Upload& up, Handles h) {
    return {up.Get(h.inv_t, torch::kFloat32), up.Get(h.top_k, torch::kInt64), up.Get(h.top_p, torch::kFloat32),
            up.Get(h.greedy, torch::kBool)};
  }
  // Rows [first, first + n).
  RowOptions Rows(int64_t first, int64_t n) const {
    return {inv_t.narrow(0, first, n), top_k.narrow(0, first, n), top_p.narrow(0, first, n),
            greedy.narrow(0, first, n)};
  }
  // Appends `more`'s rows.
  void Append(const RowOptions& more) {
    auto cat = [](const torch::Tensor& a, const torch::Tensor& b) { return a.defined() ? torch::cat({a, b}) : b; };
    *this = {cat(inv_t, more.inv_t), cat(top_k, more.top_k), cat(top_p, more.top_p), cat(greedy, more.greedy)};
  }
  // Row `from` over row `to`, a copy on the device (a row leaving).
  void Move(int64_t from, int64_t to) {
    for (torch::Tensor* t : {&inv_t, &top_k, &top_p, &greedy}) t->select(0, to).copy_(t->select(0, from));
  }
  // Keeps the first n rows.
  void Truncate(int64_t n) {
    if (n == 0) *this = RowOptions();
    if (!inv_t.defined() || n == inv_t.size(0)) return;
    *this = Rows(0, n);
  }
};

// SampleTokens on the model's device, its results left there: tokens [N]
// int64 and their behaviour log-probs [N] fp32 from logits [N,V], for rows
// with options `o` and uniforms `u` [N] fp32. `any_filter` (a row has top-k
// or top-p) and `any_sample` (a row is not greedy) pick the kernels, as
// they always did: with a filter anywhere every row draws from its sorted
// distribution, so that is kept for the tokens to stay the same.
std::pair<torch::Tensor, torch::Tensor> SampleOnDevice(const torch::Tensor& logits_in, const RowOptions& o,
                                                       const torch::Tensor& u, bool any_filter, bool any_sample) {
  const int64_t V = logits_in.size(1);
  auto logits = logits_in.to(torch::kFloat32).contiguous();
  auto logp = torch::log_softmax(logits * o.inv_t.unsqueeze(1), -1);  // behaviour distribution
  auto tokens = logits.argmax(-1);
  if (any_sample) {
    torch::Tensor probs, order;
    if (any_filter) {
      auto sorted = logp.sort(-1, /*descending=*/true);
      probs = std::get<0>(sorted).exp();
      order = std::get<1>(sorted);
      auto rank = torch::arange(V, torch::TensorOptions().dtype(torch::kInt64).device(logits.device())).view({1, V});
      auto keep = rank.lt(o.top_k.unsqueeze(1));
      auto before = probs.cumsum(-1) - probs;
      auto p_lim = o.top_p.unsqueeze(1);
      keep = keep.logical_and(before.lt(p_lim).logical_or(p_lim.ge(1.0f)));
      probs = torch::where(keep, probs, torch::zeros_like(probs));
    } else {
      probs = logp.exp();
    }
    auto cdf = probs.cumsum(-1);
    auto total = cdf.select(-1, V - 1).unsqueeze(-1);
    auto target = u.unsqueeze(1) * total;
    auto pick = torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).clamp_max(V - 1);
    // Never land on a zero-probability token through rounding at the top end.
    auto last_kept = (probs.gt(0).to(torch::kInt64) * torch::arange(V, pick.options()).view({1, V})).amax(-1, true);
    pick = torch::minimum(pick, last_kept);
    if (any_filter) pick = order.gather(-1, pick);
    tokens = torch::where(o.greedy, tokens, pick.squeeze(-1));
  }
  auto lp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
  return {tokens, lp};
}

// Whether any of `o` filters (top-k/top-p) and whether any samples.
std::pair<bool, bool> Kernels(const std::vector<const SamplingOptions*>& o) {
  bool any_filter = false, any_sample = false;
  for (const SamplingOptions* r : o) {
    any_filter |= NeedsFilter(*r);
    any_sample |= !r->greedy;
  }
  return {any_filter, any_sample};
}

}  // namespace

void SampleTokens(const torch::Tensor& logits, const std::vector<const SamplingOptions*>& options,
                  const std::vector<double>& uniforms, std::vector<int64_t>* tokens, std::vector<float>* logprobs) {
  const int64_t N = logits.size(0);
  Upload up;
  const RowOptions::Handles h = RowOptions::Pack(options, logits.size(1), &up);
  // Rounded to fp32 here, as the sampler compares in fp32.
  const int u = up.Add(std::vector<float>(uniforms.begin(), uniforms.end()));
  up.Send(logits.device(), nullptr);
  const auto [any_filter, any_sample] = Kernels(options);
  auto [tok, lp] = SampleOnDevice(logits, RowOptions::FromUpload(up, h), up.Get(u, torch::kFloat32), any_filter,
                                  any_sample);
  Download down;
  const int tok_i = down.Add(tok), lp_i = down.Add(lp);
  down.Receive(nullptr);
  tokens->assign(down.Data(tok_i), down.Data(tok_i) + N);
  logprobs->assign(down.Data(lp_i), down.Data(lp_i) + N);
}

// ---------------------------------------------------------------------------

namespace {

struct Group {
  GenerationRequest request;
  int64_t prompt_index = 0;
  std::vector<Completion> done;
  int remaining = 0;
};

// One decoding sequence (a KV-cache row).
struct Row {
  std::shared_ptr<Group> group;
  int sample_index = 0;
  SampleRng rng{0, 0, 0};
  int64_t len = 0;        // tokens in the cache
  int64_t next = 0;       // last sampled token, not yet fed
  int64_t capacity = 0;   // cache slots this row may need
  Completion out;
};

// Positions of the cache are reserved in steps of this many, so that the
// prompts' varying lengths rarely make the cache grow.
constexpr int64_t kCapacityStep = 64;

// Grows `c` to at least `rows` rows and `capacity` positions, keeping the
// contents of its first `live` rows. Rows grow geometrically up to
// `max_rows`; positions round up to kCapacityStep (at most `max_positions`).
// An empty `c` takes its layers, heads, dtype and device from `like`. New
// space is zeroed: attention multiplies masked positions' values by 0, and
// uninitialised memory could hold NaN.
void Reserve(KvCache* c, const KvCache& like, int64_t live, int64_t rows, int64_t capacity, int64_t max_rows,
             int64_t max_positions) {
  if (c->rows() >= rows && c->capacity() >= capacity) return;
  const torch::Tensor& shape = c->k.empty() ? like.k[0] : c->k[0];
  const int64_t new_rows = std::max(c->rows(), std::max(rows, std::min(max_rows, 2 * c->rows())));
  int64_t new_cap = std::max(c->capacity(), (capacity + kCapacityStep - 1) / kCapacityStep * kCapacityStep);
  new_cap = std::max(capacity, std::min(new_cap, max_positions));
  KvCache grown;
  const size_t layers = c->k.empty() ? like.k.size() : c->k.size();
  for (size_t i = 0; i < layers; ++i) {
    for (auto [from, to] : {std::pair<std::vector<torch::Tensor>*, std::vector<torch::Tensor>*>{&c->k, &grown.k},
                            {&c->v, &grown.v}}) {
      to->push_back(torch::zeros({new_rows, shape.size(1), new_cap, shape.size(3)}, shape.options()));
      if (live > 0) {
        const torch::Tensor& old = (*from)[i];
        to->back().narrow(0, 0, live).narrow(2, 0, old.size(2)).copy_(old.narrow(0, 0, live));
      }
    }
  }
  *c = std::move(grown);
}

// Copies row `from`'s first `len` positions over row `to`, in every layer.
void MoveRow(KvCache* c, int64_t from, int64_t to, int64_t len) {
  for (size_t i = 0; i < c->k.size(); ++i) {
    c->k[i].select(0, to).narrow(1, 0, len).copy_(c->k[i].select(0, from).narrow(1, 0, len));
    c->v[i].select(0, to).narrow(1, 0, len).copy_(c->v[i].select(0, from).narrow(1, 0, len));
  }
}

}  // namespace

namespace {

// Sets the model's MoE routing record for one call and clears it however the
// call ends (a LibTorch error included), so the model never keeps a pointer
// to a record that is gone.
class RoutingScope {
 public:
  RoutingScope(GenerationModel& model, MoeRouting* routing) : model_(model) {
    if (routing != nullptr) model_.set_routing(routing);
  }
  ~RoutingScope() { model_.set_routing(nullptr); }
  RoutingScope(const RoutingScope&) = delete;
  RoutingScope& operator=(const RoutingScope&) = delete;

 private:
  GenerationModel& model_;
};

}  // namespace

struct Generator::State {
  std::shared_ptr<GenerationModel> model;
  GeneratorOptions options;
  std::deque<std::shared_ptr<Group>> queue;
  std::vector<Row> rows;
  KvCache cache;
  int64_t submitted = 0;
  torch::Device device{torch::kCPU};
  // static_decode / cuda_graphs; null otherwise.
  std::unique_ptr<FixedShapeDecoder> fixed;
  // The sampling options of `rows`, entry i for rows[i], on the device.
  RowOptions row_options;
  DecodeTransfers transfers;

  bool IsMoe() const { return model->config().NumMoeLayers() > 0; }
  // Whether a sample of `req` gets its routes recorded.
  bool Records(const GenerationRequest& req) const { return IsMoe() && (options.record_routing || req.record_routing); }
  int64_t RoutesPerPosition() const { return model->config().NumMoeLayers() * model->config().num_experts_per_tok; }
  // Queues the recorded expert ids, [tokens, layers, k] flattened, on `down`.
  static int QueueRoutes(const MoeRouting& routing, Download* down) { return down->Add(torch::stack(routing.chosen, 1)); }

  // Appends the sampled token to a row; true when the row is finished.
  bool Accept(Row& row, int64_t token, float logprob) {
    row.out.tokens.push_back(token);
    row.out.logprobs.push_back(logprob);
    row.next = token;
    const auto& sp = row.group->request.sampling;
    const int64_t total = static_cast<int64_t>(row.group->request.prompt.size() + row.out.tokens.size());
    if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), token) != sp.stop_token_ids.end()) {
      row.out.finish_reason = FinishReason::kStop;
      return true;
    }
    for (const auto& seq : sp.stop_sequences) {
      const auto& t = row.out.tokens;
      if (seq.size() <= t.size() && std::equal(seq.begin(), seq.end(), t.end() - static_cast<int64_t>(seq.size()))) {
        row.out.finish_reason = FinishReason::kStop;
        return true;
      }
    }
    if (static_cast<int>(row.out.tokens.size()) >= sp.max_new_tokens) {
      row.out.finish_reason = FinishReason::kLength;
      return true;
    }
    if (total >= model->config().max_positions) {
      row.out.finish_reason = FinishReason::kContext;
      return true;
    }
    return false;
  }

  void Finish(Row& row, const GroupCallback& cb) {
    row.out.sample_index = row.sample_index;
    auto g = row.group;
    g->done.push_back(std::move(row.out));
    if (--g->remaining == 0) {
      GroupResult res;
      res.id = g->request.id;
      res.prompt_index = g->prompt_index;
      res.samples = std::move(g->done);
      std::sort(res.samples.begin(), res.samples.end(),
                [](const Completion& a, const Completion& b) { return a.sample_index < b.sample_index; });
      if (cb) cb(std::move(res));
    }
  }

  // Each of `rs`' rows from `first` on draws its uniform for its next token
  // (every row draws once per token, greedy or not, so streams stay
  // aligned), rounded to fp32 as the sampler compares.
  static std::vector<float> DrawUniforms(std::vector<Row>& rs, size_t first) {
    std::vector<float> u;
    for (size_t i = first; i < rs.size(); ++i) u.push_back(static_cast<float>(rs[i].rng.Uniform()));
    return u;
  }

  // Queues the sampling of rows [first, end) on `down`, from logits [N,V]
  // of those rows and their uniforms `u` [N] on the device; returns the
  // handles of the tokens and log-probs.
  std::pair<int, int> SampleRows(const torch::Tensor& logits, size_t first, const torch::Tensor& u, Download* down) {
    std::vector<const SamplingOptions*> opts;
    for (size_t i = first; i < rows.size(); ++i) opts.push_back(&rows[i].group->request.sampling);
    const auto [any_filter, any_sample] = Kernels(opts);
    const auto [tok, lp] = SampleOnDevice(
        logits, row_options.Rows(static_cast<int64_t>(first), static_cast<int64_t>(rows.size() - first)), u,
        any_filter, any_sample);
    return {down->Add(tok), down->Add(lp)};
  }

  // Appends what SampleRows queued, now received, to rows [first, end).
  void AcceptRows(const Download& down, std::pair<int, int> sampled, size_t first, std::vector<bool>* finished) {
    const double* tok = down.Data(sampled.first);
    const double* lp = down.Data(sampled.second);
    for (size_t i = first; i < rows.size(); ++i) {
      (*finished)[i] = Accept(rows[i], static_cast<int64_t>(tok[i - first]), static_cast<float>(lp[i - first]));
    }
  }

  // One sequence to prefill and the sample rows it fans out to: a fresh
  // request is one unit (its prompt, computed once, for all n samples); a
  // resumed sample is a unit of its own (prompt + its tokens so far).
  struct Unit {
    std::shared_ptr<Group> group;
    std::vector<int64_t> ids;
    std::vector<int> samples;
  };

  // Takes the queued requests that fit (max_batch, max_prefill_tokens) off
  // the queue as units; reports at once the samples that have nothing to
  // decode (final before an abort, or a prompt that fills the context).
  std::vector<Unit> TakeUnits(const GroupCallback& cb) {
    const int64_t max_pos = model->config().max_positions;
    std::vector<Unit> units;
    int64_t rows_now = static_cast<int64_t>(rows.size());
    int64_t prefill_tokens = 0;
    while (!queue.empty()) {
      std::shared_ptr<Group> g = queue.front();
      const GenerationRequest& req = g->request;
      const int64_t plen = static_cast<int64_t>(req.prompt.size());
      std::vector<int> open;
      int64_t tokens = 0;
      for (int i = 0; i < req.sampling.n; ++i) {
        if (!req.resume.empty() && req.resume[i].finish_reason != FinishReason::kAborted) continue;
        open.push_back(i);
        if (!req.resume.empty()) tokens += plen + static_cast<int64_t>(req.resume[i].tokens.size());
      }
      if (req.resume.empty()) tokens = plen;
      if (rows_now + static_cast<int64_t>(open.size()) > options.max_batch) break;
      if (!units.empty() && prefill_tokens + tokens > options.max_prefill_tokens) break;
      queue.pop_front();
      // Samples that had ended before an abort are final.
      for (int i = 0; i < static_cast<int>(req.resume.size()); ++i) {
        if (req.resume[i].finish_reason == FinishReason::kAborted) continue;
        Row r;
        r.group = g;
        r.sample_index = i;
        r.out = req.resume[i];
        Finish(r, cb);
      }
      if (open.empty()) continue;
      if (plen >= max_pos) {
        // No room for a single token: finish every open sample at once.
        for (int i : open) {
          Row r;
          r.group = g;
          r.sample_index = i;
          r.out.finish_reason = FinishReason::kContext;
          Finish(r, cb);
        }
        continue;
      }
      rows_now += static_cast<int64_t>(open.size());
      prefill_tokens += tokens;
      if (req.resume.empty()) {
        units.push_back(Unit{g, req.prompt, open});
      } else {
        for (int i : open) {
          Unit u{g, req.prompt, {i}};
          u.ids.insert(u.ids.end(), req.resume[i].tokens.begin(), req.resume[i].tokens.end());
          units.push_back(std::move(u));
        }
      }
    }
    return units;
  }

  // The sample rows of `units`, in order (routes not yet recorded); src[j]:
  // the unit of row j.
  static std::vector<Row> FanOut(const std::vector<Unit>& units, int64_t max_pos, std::vector<int64_t>* src) {
    std::vector<Row> out;
    for (size_t p = 0; p < units.size(); ++p) {
      const auto& g = units[p].group;
      const GenerationRequest& req = g->request;
      for (int i : units[p].samples) {
        Row r;
        r.group = g;
        r.sample_index = i;
        r.rng = SampleRng(req.sampling.seed, static_cast<uint64_t>(g->prompt_index), static_cast<uint64_t>(i));
        if (!req.resume.empty()) {
          // Continue the sample: its tokens, log-probs and random stream.
          r.out.tokens = req.resume[i].tokens;
          r.out.logprobs = req.resume[i].logprobs;
          for (size_t k = 0; k < r.out.tokens.size(); ++k) r.rng.Uniform();
        }
        r.len = static_cast<int64_t>(units[p].ids.size());
        r.capacity = std::min(static_cast<int64_t>(req.prompt.size()) + req.sampling.max_new_tokens, max_pos);
        out.push_back(std::move(r));
        src->push_back(static_cast<int64_t>(p));
      }
    }
    return out;
  }

  // Admits the queued requests that fit: prefills them as one batch (one
  // copy to the device: the prompts and the joining rows' uniforms and
  // sampling options; one back: first tokens, log-probs, routes), adds
  // their sample rows after the running ones and samples each row's first
  // token.
  void Admit(const GroupCallback& cb, std::vector<bool>* finished) {
    const std::vector<Unit> units = TakeUnits(cb);
    if (units.empty()) return;
    const int64_t max_pos = model->config().max_positions;
    const int64_t P = static_cast<int64_t>(units.size());
    int64_t T = 0, cap = 0;
    for (const auto& u : units) {
      T = std::max(T, static_cast<int64_t>(u.ids.size()));
      const auto& req = u.group->request;
      cap = std::max(cap, std::min(static_cast<int64_t>(req.prompt.size()) + req.sampling.max_new_tokens, max_pos));
    }
    std::vector<int64_t> ids(P * T, 0), lens(P), src;
    for (int64_t p = 0; p < P; ++p) {
      std::copy(units[p].ids.begin(), units[p].ids.end(), ids.begin() + p * T);
      lens[p] = static_cast<int64_t>(units[p].ids.size());
    }
    std::vector<Row> joined = FanOut(units, max_pos, &src);
    std::vector<const SamplingOptions*> opts;
    for (const Row& r : joined) opts.push_back(&r.group->request.sampling);
    Upload up;
    const int ids_i = up.Add(ids), lens_i = up.Add(lens), src_i = up.Add(src), u_i = up.Add(DrawUniforms(joined, 0));
    const RowOptions::Handles opts_i = RowOptions::Pack(opts, model->config().vocab_size, &up);
    up.Send(device, &transfers);
    ++transfers.admissions;
    KvCache fresh;
    MoeRouting routing;
    routing.record = false;
    for (const auto& u : units) routing.record |= Records(u.group->request);
    torch::Tensor hidden;
    {
      RoutingScope scope(*model, routing.record ? &routing : nullptr);
      // The prompts' keys and values only: they are copied into the cache's
      // reserved rows below.
      hidden = model->Prefill(up.Get(ids_i, torch::kInt64).view({P, T}), up.Get(lens_i, torch::kInt64), T, &fresh);
    }
    const torch::Tensor src_t = up.Get(src_i, torch::kInt64);
    auto logits = model->Logits(hidden.index_select(0, src_t)).to(torch::kFloat32);
    // The new rows go after the live ones; the cache grows only when they do
    // not fit (never a copy of the live rows otherwise).
    const size_t first = rows.size();
    const int64_t live = static_cast<int64_t>(first), add = static_cast<int64_t>(joined.size());
    Reserve(&cache, fresh, live, live + add, cap, options.max_batch, max_pos);
    for (size_t i = 0; i < cache.k.size(); ++i) {
      cache.k[i].narrow(0, live, add).narrow(2, 0, fresh.capacity()).copy_(fresh.k[i].index_select(0, src_t));
      cache.v[i].narrow(0, live, add).narrow(2, 0, fresh.capacity()).copy_(fresh.v[i].index_select(0, src_t));
    }
    for (Row& r : joined) rows.push_back(std::move(r));
    row_options.Append(RowOptions::FromUpload(up, opts_i));
    Download down;
    // [P, T, layers, k] expert ids of every prefilled position.
    const int routes_i = routing.record ? QueueRoutes(routing, &down) : -1;
    const auto sampled = SampleRows(logits, first, up.Get(u_i, torch::kFloat32), &down);
    down.Receive(&transfers);
    const int64_t per_pos = routing.record ? RoutesPerPosition() : 0;
    for (size_t j = 0; routing.record && first + j < rows.size(); ++j) {
      Row& r = rows[first + j];
      if (!Records(r.group->request)) continue;
      const double* begin = down.Data(routes_i) + src[j] * T * per_pos;
      r.out.routes.assign(begin, begin + lens[src[j]] * per_pos);
    }
    finished->resize(rows.size(), false);
    AcceptRows(down, sampled, first, finished);
  }

  std::vector<GroupResult> Abort() {
    std::vector<std::shared_ptr<Group>> order;
    for (Row& r : rows) {
      if (std::find(order.begin(), order.end(), r.group) == order.end()) order.push_back(r.group);
      r.out.sample_index = r.sample_index;
      r.out.finish_reason = FinishReason::kAborted;
      r.group->done.push_back(std::move(r.out));
    }
    std::vector<GroupResult> out;
    for (auto& g : order) {
      GroupResult res;
      res.id = g->request.id;
      res.prompt_index = g->prompt_index;
      res.samples = std::move(g->done);
      out.push_back(std::move(res));
    }
    for (auto& g : queue) {
      GroupResult res;
      res.id = g->request.id;
      res.prompt_index = g->prompt_index;
      if (!g->request.resume.empty()) {
        res.samples = g->request.resume;
      } else {
        res.samples.resize(g->request.sampling.n);
        for (int i = 0; i < g->request.sampling.n; ++i) res.samples[i].finish_reason = FinishReason::kAborted;
      }
      out.push_back(std::move(res));
    }
    for (auto& res : out) {
      std::sort(res.samples.begin(), res.samples.end(),
                [](const Completion& a, const Completion& b) { return a.sample_index < b.sample_index; });
      for (size_t i = 0; i < res.samples.size(); ++i) res.samples[i].sample_index = static_cast<int>(i);
    }
    rows.clear();
    queue.clear();
    cache = KvCache();
    row_options = RowOptions();
    return out;
  }

  // Drops finished rows (reporting them, in row order) and fills each hole
  // with the last live row, moved in place: a finish copies one row of the
  // cache, not the whole of it.
  void Compact(const std::vector<bool>& finished, const GroupCallback& cb) {
    if (std::find(finished.begin(), finished.end(), true) == finished.end()) return;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (finished[i]) Finish(rows[i], cb);
    }
    // Descending, so every row past the hole being filled is live.
    for (size_t i = rows.size(); i-- > 0;) {
      if (!finished[i]) continue;
      const size_t last = rows.size() - 1;
      if (i != last) {
        MoveRow(&cache, static_cast<int64_t>(last), static_cast<int64_t>(i), rows[last].len);
        row_options.Move(static_cast<int64_t>(last), static_cast<int64_t>(i));
        rows[i] = std::move(rows[last]);
      }
      rows.pop_back();
    }
    row_options.Truncate(static_cast<int64_t>(rows.size()));
    if (rows.empty()) cache = KvCache();
  }

  void Decode(std::vector<bool>* finished) {
    const int64_t N = static_cast<int64_t>(rows.size());
    std::vector<int64_t> ids(N), lens(N);
    int64_t max_len = 0;
    for (int64_t i = 0; i < N; ++i) {
      ids[i] = rows[i].next;
      lens[i] = rows[i].len;
      max_len = std::max(max_len, lens[i]);
    }
    // The fixed shapes need every layer's routing and RoPE base to be
    // independent of the data.
    const bool fixed_shapes = fixed != nullptr && !IsMoe() && model->config().rope.type != "dynamic";
    const int64_t step_rows = fixed_shapes ? fixed->Bucket(N) : N;
    Reserve(&cache, cache, N, step_rows, max_len + 1, options.max_batch, model->config().max_positions);
    // The step's one copy to the device: the fed tokens, their positions and
    // each row's uniform (the rows' options are there already).
    Upload up;
    const int ids_i = up.Add(fixed_shapes ? std::vector<int64_t>() : ids);
    const int lens_i = up.Add(fixed_shapes ? std::vector<int64_t>() : lens);
    const int u_i = up.Add(DrawUniforms(rows, 0));
    up.Send(device, &transfers);
    ++transfers.decode_steps;
    MoeRouting routing;
    routing.record = false;
    for (const Row& r : rows) routing.record |= Records(r.group->request);
    torch::Tensor hidden;
    if (fixed_shapes) {
      hidden = fixed->Step(*model, cache, ids, lens);
      transfers.host_to_device += 2;  // its own copies of ids and lens, into buffers a graph replays
    } else {
      KvCache live = cache.FirstRows(N);
      RoutingScope scope(*model, routing.record ? &routing : nullptr);
      hidden = model->DecodeStep(up.Get(ids_i, torch::kInt64), up.Get(lens_i, torch::kInt64), max_len, &live);
    }
    for (auto& r : rows) ++r.len;
    auto logits = model->Logits(hidden).to(torch::kFloat32);
    // The step's one copy back: tokens, log-probs and the routes.
    Download down;
    const int routes_i = routing.record ? QueueRoutes(routing, &down) : -1;  // [N, layers, k]
    const auto sampled = SampleRows(logits, 0, up.Get(u_i, torch::kFloat32), &down);
    down.Receive(&transfers);
    if (routing.record) {
      const double* routes = down.Data(routes_i);
      const int64_t per_pos = RoutesPerPosition();
      for (int64_t i = 0; i < N; ++i) {
        if (!Records(rows[i].group->request)) continue;
        rows[i].out.routes.insert(rows[i].out.routes.end(), routes + i * per_pos, routes + (i + 1) * per_pos);
      }
    }
    finished->assign(N, false);
    AcceptRows(down, sampled, 0, finished);
  }
};

TransformerGeneration::TransformerGeneration(std::shared_ptr<TransformerImpl> model) : model_(std::move(model)) {
  auto params = model_->parameters();
  if (!params.empty()) device_ = params[0].device();
}

TransformerGeneration::~TransformerGeneration() = default;

const ModelConfig& TransformerGeneration::config() const { return model_->config(); }

at::Tensor TransformerGeneration::Prefill(const at::Tensor& ids, const at::Tensor& lens, int64_t capacity,
                                          KvCache* cache) {
  return model_->Prefill(ids, lens, capacity, cache);
}

at::Tensor TransformerGeneration::DecodeStep(const at::Tensor& ids, const at::Tensor& lens, int64_t max_len,
                                             KvCache* cache) {
  return model_->DecodeStep(ids, lens, max_len, cache);
}

at::Tensor TransformerGeneration::Logits(const at::Tensor& hidden) { return model_->Logits(hidden); }

void TransformerGeneration::set_routing(MoeRouting* routing) { model_->set_routing(routing); }

Generator::Generator(Transformer model, GeneratorOptions options)
    : Generator(std::make_shared<TransformerGeneration>(model.ptr()), options) {}

Generator::Generator(std::shared_ptr<GenerationModel> model, GeneratorOptions options)
    : s_(std::make_unique<State>()) {
  s_->model = std::move(model);
  s_->options = options;
  s_->device = s_->model->device();
  if (options.static_decode || options.cuda_graphs) {
    s_->fixed = std::make_unique<FixedShapeDecoder>(std::max<int64_t>(1, options.max_batch),
                                                    options.cuda_graphs && s_->device.is_cuda(), s_->device);
  }
}

Generator::~Generator() = default;

absl::Status Generator::Submit(GenerationRequest request) {
  absl::Status s = s_->options.Validate();
  if (!s.ok()) return s;
  if (s_->options.cuda_graphs && (s_->IsMoe() || s_->model->config().rope.type == "dynamic")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GeneratorOptions.cuda_graphs (rollout.cuda_graphs): the policy's decode has data-dependent shapes (",
        s_->IsMoe() ? "MoE routing" : "dynamic RoPE", ") and cannot be captured; turn cuda_graphs off"));
  }
  if (s_->options.cuda_graphs && !s_->device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("GeneratorOptions.cuda_graphs: needs the model on a GPU (it is on ",
                                                   s_->device.str(), ")"));
  }
  s = request.sampling.Validate();
  if (!s.ok()) return s;
  if (request.prompt.empty()) return absl::InvalidArgumentError("request.prompt: must not be empty");
  const int64_t V = s_->model->config().vocab_size;
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= V) {
      return absl::InvalidArgumentError(
          absl::StrCat("request.prompt[", i, "]: token ", request.prompt[i], " outside [0, ", V, ")"));
    }
  }
  if (request.sampling.n > s_->options.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.n: ", request.sampling.n, " exceeds max_batch ", s_->options.max_batch));
  }
  if (!request.resume.empty()) {
    if (static_cast<int>(request.resume.size()) != request.sampling.n) {
      return absl::InvalidArgumentError(absl::StrCat("request.resume: ", request.resume.size(),
                                                     " samples for sampling.n = ", request.sampling.n));
    }
    for (size_t i = 0; i < request.resume.size(); ++i) {
      const Completion& c = request.resume[i];
      if (c.tokens.size() != c.logprobs.size()) {
        return absl::InvalidArgumentError(absl::StrCat("request.resume[", i, "]: ", c.tokens.size(), " tokens but ",
                                                       c.logprobs.size(), " log-probs"));
      }
      if (c.finish_reason == FinishReason::kAborted &&
          static_cast<int64_t>(c.tokens.size()) >= request.sampling.max_new_tokens) {
        return absl::InvalidArgumentError(absl::StrCat("request.resume[", i, "]: ", c.tokens.size(),
                                                       " tokens already reach max_new_tokens"));
      }
      for (int64_t t : c.tokens) {
        if (t < 0 || t >= V) {
          return absl::InvalidArgumentError(
              absl::StrCat("request.resume[", i, "].tokens: token ", t, " outside [0, ", V, ")"));
        }
      }
    }
  }
  auto g = std::make_shared<Group>();
  g->prompt_index = request.prompt_index >= 0 ? request.prompt_index : s_->submitted;
  ++s_->submitted;
  g->remaining = request.sampling.n;
  g->request = std::move(request);
  s_->queue.push_back(std::move(g));
  return absl::OkStatus();
}

bool Generator::Idle() const { return s_->queue.empty() && s_->rows.empty(); }

int64_t Generator::running() const { return static_cast<int64_t>(s_->rows.size()); }

DecodeGraphStats Generator::graph_stats() const {
  DecodeGraphStats out;
  if (s_->fixed == nullptr) return out;
  out.captures = s_->fixed->captures();
  out.replays = s_->fixed->replays();
  out.error = s_->fixed->graph_error();
  return out;
}

DecodeTransfers Generator::transfers() const { return s_->transfers; }

std::vector<GroupResult> Generator::Abort() { return s_->Abort(); }

absl::Status Generator::Step(const GroupCallback& on_group) {
  try {
    c10::InferenceMode guard;
    std::vector<bool> finished(s_->rows.size(), false);
    // Rows that already have an unfed token decode first; joiners get their
    // first token from the prefill, then decode from the next step on.
    if (!s_->rows.empty()) {
      s_->Decode(&finished);
      s_->Compact(finished, on_group);
    }
    finished.assign(s_->rows.size(), false);
    s_->Admit(on_group, &finished);
    s_->Compact(finished, on_group);
  } catch (const c10::Error& e) {
    return dist::ExceptionStatus(e, absl::StatusCode::kInternal, "Generator::Step");
  }
  return absl::OkStatus();
}

absl::Status Generator::RunUntilIdle(const GroupCallback& on_group) {
  while (!Idle()) {
    absl::Status s = Step(on_group);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GroupResult>> Generator::Generate(std::vector<GenerationRequest> requests) {
  if (!Idle()) return absl::FailedPreconditionError("Generator::Generate: other requests are queued or running");
  const size_t n = requests.size();
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = requests[i].id;
    requests[i].id = i;  // tag with the position; restored below
    absl::Status s = Submit(std::move(requests[i]));
    if (!s.ok()) {
      s_->queue.clear();  // nothing half-submitted stays behind
      return s;
    }
  }
  std::vector<GroupResult> out(n);
  absl::Status s = RunUntilIdle([&](GroupResult g) {
    size_t pos = g.id;
    g.id = ids[pos];
    out[pos] = std::move(g);
  });
  if (!s.ok()) return s;
  return out;
}

}  // namespace rlmesh::actor
