// `coordinator eval EXPERIMENT.yaml --model DIR`: evaluates a model folder
// with the experiment's task, chat template and verifiers.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "coordinator/cli.h"

namespace rlmesh {

// `coordinator eval CONFIG --model DIR`: `run` with the model folder as
// the initial model and no stage run; --data and --workers set the
// held-out file and the workers.
int Eval(const std::vector<std::string>& args, std::vector<std::string> sets) {
  if (args.size() != 1) return Fail("eval", absl::InvalidArgumentError("expected one experiment YAML"));
  if (!absl::GetFlag(FLAGS_resume).empty()) return Fail("eval", absl::InvalidArgumentError("--resume: not with eval"));
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) return Fail("eval", absl::InvalidArgumentError("--model: required (the folder to evaluate)"));
  const std::string folder = std::filesystem::absolute(UserPath(model)).lexically_normal().string();
  std::error_code ec;
  if (!std::filesystem::exists(folder + "/config.json", ec)) {
    return Fail("eval", absl::NotFoundError(absl::StrCat("--model: ", folder, "/config.json does not exist")));
  }
  sets.push_back("model.init=checkpoint");
  sets.push_back("model.path=" + folder);
  if (!absl::GetFlag(FLAGS_data).empty()) {
    const std::string data = std::filesystem::absolute(UserPath(absl::GetFlag(FLAGS_data))).string();
    if (!std::filesystem::exists(data, ec)) {
      return Fail("eval", absl::NotFoundError(absl::StrCat("--data: ", data, " does not exist")));
    }
    sets.push_back("task.eval_path=" + data);
  }
  if (absl::GetFlag(FLAGS_workers) < 0) return Fail("eval", absl::InvalidArgumentError("--workers: must be >= 1"));
  if (absl::GetFlag(FLAGS_workers) > 0) sets.push_back(absl::StrCat("rollout.workers=", absl::GetFlag(FLAGS_workers)));
  return Run(args, sets, folder);
}

}  // namespace rlmesh
