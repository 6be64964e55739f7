#include "coordinator/dashboard.h"

#include <httplib.h>

#include <cstdlib>

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "coordinator/http_serve.h"
#include "google/protobuf/util/json_util.h"

namespace rlmesh {
namespace {

// Compares without an early exit, so the time taken does not tell how much
// of a guessed token was right.
bool SameSecret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

std::string CookieToken(const httplib::Request& req) {
  for (absl::string_view part : absl::StrSplit(req.get_header_value("Cookie"), ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, "rlmesh_token=")) return std::string(part);
  }
  return "";
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.9g", v);
}

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, o).ok()) return "null";
  return out;
}

void Reply(httplib::Response& res, int status, const std::string& body, const char* type = "application/json") {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body, type);
}

void ReplyError(httplib::Response& res, const absl::Status& s) {
  int code = 500;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument: code = 400; break;
    case absl::StatusCode::kNotFound: code = 404; break;
    case absl::StatusCode::kUnauthenticated: code = 401; break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: code = 503; break;
    default: break;
  }
  Reply(res, code, absl::StrCat("{\"error\":", JsonString(s.ToString()), "}"));
}

absl::Status ParseInt(const std::string& name, const std::string& value, int64_t* out) {
  if (!absl::SimpleAtoi(value, out)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": '", value, "' is not an integer"));
  }
  return absl::OkStatus();
}

absl::Status ParseDouble(const std::string& name, const std::string& value, double* out) {
  if (!absl::SimpleAtod(value, out) || !std::isfinite(*out)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": '", value, "' is not a finite number"));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> Params(const httplib::Request& req) {
  return {req.params.begin(), req.params.end()};
}

std::string SamplesJson(const QueryResponse& resp, DashboardSource* source) {
  std::string out = "{\"trajectories\":[";
  bool first = true;
  for (const Trajectory& t : resp.trajectories()) {
    if (!first) out += ",";
    first = false;
    const std::vector<int> response(t.response_token_ids().begin(), t.response_token_ids().end());
    const std::vector<std::string> texts = source->TokenTexts(response);
    absl::StrAppend(&out, "{\"trajectory_id\":", JsonString(t.trajectory_id()), ",\"step\":", t.step(),
                    ",\"group_id\":", JsonString(t.group_id()), ",\"prompt_id\":", JsonString(t.prompt_id()),
                    ",\"sample_index\":", t.sample_index(), ",\"policy_version\":", t.policy_version(),
                    ",\"reward\":", JsonNumber(t.reward()), ",\"finish_reason\":",
                    JsonString(FinishReason_Name(t.finish_reason())), ",\"reference_answer\":",
                    JsonString(t.reference_answer()), ",\"prompt_text\":",
                    JsonString(source->Decode({t.prompt_token_ids().begin(), t.prompt_token_ids().end()})),
                    ",\"response_text\":", JsonString(t.response_text()), ",\"reward_components\":{");
    bool first_c = true;
    for (const auto& [name, value] : t.reward_components()) {
      absl::StrAppend(&out, first_c ? "" : ",", JsonString(name), ":", JsonNumber(value));
      first_c = false;
    }
    out += "},\"tokens\":[";
    for (size_t i = 0; i < response.size(); ++i) {
      const double lp = i < static_cast<size_t>(t.behaviour_logprobs_size()) ? t.behaviour_logprobs(i) : 0.0;
      const bool trained = i >= static_cast<size_t>(t.loss_mask_size()) || t.loss_mask(i) != 0;
      absl::StrAppend(&out, i == 0 ? "" : ",", "{\"text\":", JsonString(i < texts.size() ? texts[i] : ""),
                      ",\"logprob\":", JsonNumber(lp), ",\"trained\":", trained ? "true" : "false", "}");
    }
    // Multi-turn: who wrote which token range (environment tokens are the
    // untrained ones above).
    out += "],\"turns\":[";
    for (int k = 0; k < t.turns_size(); ++k) {
      const Turn& turn = t.turns(k);
      absl::StrAppend(&out, k == 0 ? "" : ",", "{\"source\":",
                      JsonString(turn.source() == Turn::SOURCE_ENVIRONMENT ? "environment" : "model"),
                      ",\"start\":", turn.token_start(), ",\"end\":", turn.token_end(),
                      ",\"reward\":", JsonNumber(turn.reward()), "}");
    }
    out += "]}";
  }
  absl::StrAppend(&out, "],\"next_page_token\":", JsonString(resp.next_page_token()), "}");
  return out;
}

}  // namespace

absl::StatusOr<QueryRequest> SamplesQuery(const std::vector<std::pair<std::string, std::string>>& params) {
  QueryRequest q;
  q.set_limit(20);
  TrajectoryFilter* f = q.mutable_filter();
  bool has_min_reward = false, has_max_reward = false;
  double min_reward = 0, max_reward = 0;
  for (const auto& [name, value] : params) {
    int64_t n = 0;
    if (name == "experiment") {
      f->set_experiment_id(value);
    } else if (name == "min_step" || name == "max_step" || name == "min_version" || name == "max_version" ||
               name == "limit") {
      if (value.empty()) continue;
      if (absl::Status s = ParseInt(name, value, &n); !s.ok()) return s;
      if (n < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": ", n, " is negative"));
      if (name == "min_step") f->set_min_step(n);
      if (name == "max_step") f->set_max_step(n);
      if (name == "min_version") f->set_min_policy_version(n);
      if (name == "max_version") f->set_max_policy_version(n);
      if (name == "limit") {
        if (n < 1 || n > 500) return absl::InvalidArgumentError(absl::StrCat("limit: ", n, " is outside [1, 500]"));
        q.set_limit(static_cast<int>(n));
      }
    } else if (name == "min_reward" || name == "max_reward") {
      if (value.empty()) continue;
      double v = 0;
      if (absl::Status s = ParseDouble(name, value, &v); !s.ok()) return s;
      (name == "min_reward" ? has_min_reward : has_max_reward) = true;
      (name == "min_reward" ? min_reward : max_reward) = v;
    } else if (name == "text") {
      f->set_text_contains(value);
    } else if (name == "page_token") {
      q.set_page_token(value);
    } else if (name != "token") {
      return absl::InvalidArgumentError(absl::StrCat(name, ": unknown parameter"));
    }
  }
  if (f->experiment_id().empty()) return absl::InvalidArgumentError("experiment: required");
  if (has_min_reward || has_max_reward) {
    f->set_has_reward_range(true);
    f->set_min_reward(has_min_reward ? min_reward : -1e300);
    f->set_max_reward(has_max_reward ? max_reward : 1e300);
  }
  return q;
}

struct DashboardServer::Impl {
  httplib::Server server;
};

absl::StatusOr<std::unique_ptr<DashboardServer>> DashboardServer::Start(const DashboardOptions& options,
                                                                        DashboardSource* source) {
  std::unique_ptr<DashboardServer> d(new DashboardServer());
  d->impl_ = std::make_unique<Impl>();
  httplib::Server& http = d->impl_->server;
  const std::string token = options.auth_token;

  // Every route goes through here: auth first, then the handler.
  auto guarded = [token](auto handler) {
    return [token, handler](const httplib::Request& req, httplib::Response& res) {
      if (!token.empty()) {
        std::string given = CookieToken(req);
        const std::string header = req.get_header_value("Authorization");
        if (absl::StartsWith(header, "Bearer ")) given = header.substr(7);
        if (req.path == "/" && req.has_param("token")) given = req.get_param_value("token");
        if (!SameSecret(given, token)) {
          Reply(res, 401, "{\"error\":\"missing or wrong token: open /?token=<token> once\"}");
          return;
        }
        if (req.path == "/" && req.has_param("token")) {
          res.set_header("Set-Cookie", absl::StrCat("rlmesh_token=", token, "; HttpOnly; SameSite=Strict; Path=/"));
        }
      }
      handler(req, res);
    };
  };

  http.Get("/", guarded([](const httplib::Request&, httplib::Response& res) {
    Reply(res, 200, kDashboardHtml, "text/html; charset=utf-8");
  }));
  http.Get("/api/experiments", guarded([source](const httplib::Request&, httplib::Response& res) {
    std::string out = "[";
    bool first = true;
    for (const auto& e : source->Experiments()) {
      absl::StrAppend(&out, first ? "" : ",", ToJson(e));
      first = false;
    }
    Reply(res, 200, out + "]");
  }));
  http.Get("/api/roles", guarded([source](const httplib::Request&, httplib::Response& res) {
    std::string out = "[";
    bool first = true;
    for (const auto& r : source->Roles()) {
      absl::StrAppend(&out, first ? "" : ",", ToJson(r));
      first = false;
    }
    Reply(res, 200, out + "]");
  }));
  http.Get("/api/metrics", guarded([source](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.get_param_value("experiment");
    if (id.empty()) return ReplyError(res, absl::InvalidArgumentError("experiment: required"));
    int64_t from = 0;
    if (req.has_param("from")) {
      if (absl::Status s = ParseInt("from", req.get_param_value("from"), &from); !s.ok()) return ReplyError(res, s);
    }
    auto page = source->Metrics(id, from, 5000);
    if (!page.ok()) return ReplyError(res, page.status());
    // The records are the runner's own JSON objects, passed through.
    std::string out = "{\"records\":[";
    for (size_t i = 0; i < page->records.size(); ++i) absl::StrAppend(&out, i ? "," : "", page->records[i]);
    absl::StrAppend(&out, "],\"next\":", page->next, "}");
    Reply(res, 200, out);
  }));
  http.Get("/api/samples", guarded([source](const httplib::Request& req, httplib::Response& res) {
    auto q = SamplesQuery(Params(req));
    if (!q.ok()) return ReplyError(res, q.status());
    auto resp = source->Samples(*q);
    if (!resp.ok()) return ReplyError(res, resp.status());
    Reply(res, 200, SamplesJson(*resp, source));
  }));

  auto bound = BindAndServe(http, options.host, options.port, "dashboard", &d->thread_);
  if (!bound.ok()) return bound.status();
  d->port_ = *bound;
  return d;
}

DashboardServer::~DashboardServer() {
  if (impl_) impl_->server.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rlmesh
