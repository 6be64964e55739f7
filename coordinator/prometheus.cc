#include "coordinator/prometheus.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/http_serve.h"
#include "httplib.h"

namespace rlmesh {
namespace {

// Label values escape backslash, quote and newline.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string RenderPrometheus(const std::vector<ExperimentStatus>& experiments) {
  std::string out;
  out += "# HELP rlmesh_step Learner step within the current stage.\n# TYPE rlmesh_step gauge\n";
  for (const auto& e : experiments) {
    absl::StrAppendFormat(&out, "rlmesh_step{experiment=\"%s\",stage=\"%s\"} %d\n", Escape(e.experiment_id()),
                          Escape(e.stage()), e.step());
  }
  out += "# HELP rlmesh_policy_version Policy (weights) version.\n# TYPE rlmesh_policy_version gauge\n";
  for (const auto& e : experiments) {
    absl::StrAppendFormat(&out, "rlmesh_policy_version{experiment=\"%s\"} %d\n", Escape(e.experiment_id()),
                          e.policy_version());
  }
  out += "# HELP rlmesh_running 1 while the experiment runs.\n# TYPE rlmesh_running gauge\n";
  for (const auto& e : experiments) {
    absl::StrAppendFormat(&out, "rlmesh_running{experiment=\"%s\",state=\"%s\"} %d\n", Escape(e.experiment_id()),
                          Escape(e.state()), e.state() == "RUNNING" ? 1 : 0);
  }
  out += "# HELP rlmesh_metric Latest value of a per-step metric.\n# TYPE rlmesh_metric gauge\n";
  for (const auto& e : experiments) {
    for (const auto& [name, value] : e.metrics()) {
      absl::StrAppendFormat(&out, "rlmesh_metric{experiment=\"%s\",stage=\"%s\",name=\"%s\"} %.9g\n",
                            Escape(e.experiment_id()), Escape(e.stage()), Escape(name), value);
    }
  }
  return out;
}

struct MetricsHttpServer::Impl {
  httplib::Server server;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, std::function<std::vector<ExperimentStatus>()> provider) {
  std::unique_ptr<MetricsHttpServer> m(new MetricsHttpServer());
  m->impl_ = std::make_unique<Impl>();
  m->impl_->server.Get("/metrics", [provider](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderPrometheus(provider()), "text/plain; version=0.0.4");
  });
  auto bound = BindAndServe(m->impl_->server, host, port, "metrics endpoint", &m->thread_);
  if (!bound.ok()) return bound.status();
  m->port_ = *bound;
  return m;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (impl_) impl_->server.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rlmesh
