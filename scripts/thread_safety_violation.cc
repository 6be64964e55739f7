// Must NOT compile under --config=clang-tsa: it reads and writes a member
// guarded by a mutex it does not hold. scripts/thread_safety.sh builds it
// and fails if it compiles, so the analysis cannot be switched off unseen.
// (gcc ignores the annotations and compiles it, which is why the target is
// manual.)
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rlmesh {

class ThreadSafetyViolation {
 public:
  int Unlocked() { return ++value_; }

 private:
  absl::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

int ThreadSafetyViolationUse() {
  ThreadSafetyViolation v;
  return v.Unlocked();
}

}  // namespace rlmesh
