#pragma once

// The tiny experiment the trainer tests train: a 2-layer, hidden-32 model
// with the char tokenizer on 1-digit arithmetic (`train` examples, 4
// held-out). Small enough that a test trains it for dozens of steps in
// seconds.

#include <cstdint>

#include "proto/config.pb.h"

namespace rlmesh::learner::testing {

inline ExperimentConfig TinyExperiment(uint64_t seed, int64_t train) {
  ExperimentConfig e;
  e.set_name("tiny");
  e.set_seed(seed);
  auto* m = e.mutable_model();
  m->set_hidden(32);
  m->set_layers(2);
  m->set_heads(2);
  m->set_max_positions(32);
  auto* t = e.mutable_task();
  t->set_kind("arithmetic");
  t->set_digits(1);
  t->set_train(train);
  t->set_eval(4);
  return e;
}

}  // namespace rlmesh::learner::testing
