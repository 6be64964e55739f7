#pragma once

// Names of actor/transformer.h's model types, for headers that take a model
// by reference or pointer or keep it through a pointer. The definitions pull
// in torch/nn, about 10 s of compile time in each file that includes them
// (docs/design/build.md): a header declares with this one, and the files
// that call into the model include actor/transformer.h.

namespace rlmesh::actor {

class TransformerImpl;
// A torch::nn::ModuleHolder over TransformerImpl (TORCH_MODULE); by value it
// holds a shared_ptr<TransformerImpl>.
class Transformer;
struct KvCache;
struct MoeRouting;

}  // namespace rlmesh::actor
