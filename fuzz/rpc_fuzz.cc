#include "fuzz/rpc_fuzz.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_callback.h"

namespace rlmesh::fuzz {
namespace {

namespace pb = google::protobuf;

uint64_t Bits(ByteReader& in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(in.U8()) << (8 * i);
  return v;
}

// Fills messages field by field. `budget_` bounds the request's size.
class Filler {
 public:
  Filler(ByteReader& in, const FillOptions& options) : in_(in), o_(options), budget_(options.max_bytes) {}

  void Fill(pb::Message* m, int depth) {
    const pb::Descriptor* d = m->GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      const uint8_t c = in_.U8();
      if (c % 3 == 0 || budget_ == 0) continue;  // left unset (every field once the input runs out)
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && depth >= o_.max_depth) continue;
      if (!f->is_repeated()) {
        SetOne(m, f, depth);
        continue;
      }
      size_t n = 0;
      switch (in_.U8() % 8) {
        case 0: n = 0; break;
        case 5: n = in_.U8() % 32; break;
        case 6:  // huge: many elements, mostly zero once the input runs out
          n = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE ? 64 : 4096;
          break;
        default: n = 1 + c % 4; break;
      }
      for (size_t k = 0; k < n && budget_ > 0; ++k) AddOne(m, f, depth);
    }
  }

 private:
  void Spend(size_t n) { budget_ = n >= budget_ ? 0 : budget_ - n; }

  int64_t Signed(int bits) {
    const int64_t max = bits == 32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
    const int64_t min = bits == 32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
    switch (in_.U8() % 10) {
      case 0: return 0;
      case 1: return 1;
      case 2: return -1;
      case 3: return 2;
      case 4: return max;
      case 5: return min;
      case 6: return max - 1;
      case 7: return static_cast<int64_t>(Bits(in_, bits / 8)) & max;  // anywhere in range
      case 8: return -static_cast<int64_t>(in_.U8());
      default: return in_.U8();
    }
  }

  uint64_t Unsigned(int bits) {
    const uint64_t max = bits == 32 ? std::numeric_limits<uint32_t>::max() : std::numeric_limits<uint64_t>::max();
    switch (in_.U8() % 6) {
      case 0: return 0;
      case 1: return 1;
      case 2: return max;
      case 3: return Bits(in_, bits / 8);
      default: return in_.U8();
    }
  }

  double Real() {
    switch (in_.U8() % 14) {
      case 0: return 0.0;
      case 1: return 1.0;
      case 2: return -1.0;
      case 3: return 0.5;
      case 4: return std::numeric_limits<double>::quiet_NaN();
      case 5: return std::numeric_limits<double>::infinity();
      case 6: return -std::numeric_limits<double>::infinity();
      case 7: return 1e300;
      case 8: return -1e-300;
      case 9: return std::numeric_limits<double>::denorm_min();
      case 10: {
        const uint64_t b = Bits(in_, 8);
        double d;
        std::memcpy(&d, &b, sizeof d);
        return d;
      }
      case 11: return 1e9;
      default: return static_cast<double>(in_.U8()) / 16.0;
    }
  }

  std::string Text(bool bytes) {
    const auto& known = o_.known_strings;
    std::string s;
    switch (in_.U8() % 12) {
      case 0: break;
      case 1:
      case 2:
      case 3:
        if (!known.empty()) s = known[in_.U8() % known.size()];
        break;
      case 4: s = "../../../../etc/passwd"; break;
      case 5: s = std::string(5000, 'a' + in_.U8() % 26); break;
      case 6: s = "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x99\x82"; break;  // é中🙂
      case 7:
        if (!known.empty()) s = absl::StrCat(known[in_.U8() % known.size()], "/../x");
        break;
      case 8: {
        static const char* const kNumbers[] = {"-1", "0", "1e308", "nan", "inf", "99999999999999999999", "0x10"};
        s = kNumbers[in_.U8() % 7];
        break;
      }
      default: {
        const size_t n = in_.U8() % 48;
        for (size_t i = 0; i < n; ++i) {
          const uint8_t b = in_.U8();
          // string fields must be UTF-8 (proto3): printable ASCII there.
          s.push_back(bytes ? static_cast<char>(b) : static_cast<char>(32 + b % 95));
        }
      }
    }
    Spend(s.size());
    return s;
  }

  int EnumValue(const pb::FieldDescriptor* f) {
    const pb::EnumDescriptor* e = f->enum_type();
    const bool open = f->file()->syntax() == pb::FileDescriptor::SYNTAX_PROTO3;
    if (open && in_.U8() % 4 == 0) return static_cast<int>(Signed(32));  // unknown values too
    return e->value(in_.U8() % e->value_count())->number();
  }

  void SetOne(pb::Message* m, const pb::FieldDescriptor* f, int depth) {
    const pb::Reflection* r = m->GetReflection();
    Spend(8);
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, static_cast<int32_t>(Signed(32))); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, Signed(64)); break;
      case pb::FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, static_cast<uint32_t>(Unsigned(32))); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, Unsigned(64)); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, Real()); break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, static_cast<float>(Real())); break;
      case pb::FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, in_.U8() & 1); break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: r->SetEnumValue(m, f, EnumValue(f)); break;
      case pb::FieldDescriptor::CPPTYPE_STRING:
        r->SetString(m, f, Text(f->type() == pb::FieldDescriptor::TYPE_BYTES));
        break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE: Fill(r->MutableMessage(m, f), depth + 1); break;
    }
  }

  void AddOne(pb::Message* m, const pb::FieldDescriptor* f, int depth) {
    const pb::Reflection* r = m->GetReflection();
    Spend(8);
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: r->AddInt32(m, f, static_cast<int32_t>(Signed(32))); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: r->AddInt64(m, f, Signed(64)); break;
      case pb::FieldDescriptor::CPPTYPE_UINT32: r->AddUInt32(m, f, static_cast<uint32_t>(Unsigned(32))); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(m, f, Unsigned(64)); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(m, f, Real()); break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(m, f, static_cast<float>(Real())); break;
      case pb::FieldDescriptor::CPPTYPE_BOOL: r->AddBool(m, f, in_.U8() & 1); break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: r->AddEnumValue(m, f, EnumValue(f)); break;
      case pb::FieldDescriptor::CPPTYPE_STRING:
        r->AddString(m, f, Text(f->type() == pb::FieldDescriptor::TYPE_BYTES));
        break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE: Fill(r->AddMessage(m, f), depth + 1); break;
    }
  }

  ByteReader& in_;
  const FillOptions& o_;
  size_t budget_;
};

grpc::ByteBuffer ToBuffer(const pb::Message& m) {
  grpc::Slice slice(m.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

bool ParsesAs(const grpc::ByteBuffer& buffer, const pb::Descriptor* type) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  std::unique_ptr<pb::Message> m(pb::MessageFactory::generated_factory()->GetPrototype(type)->New());
  return m->ParseFromString(bytes);
}

// One call of a streaming method: the request, half-close, every answer.
class StreamCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamCall(grpc::GenericStub* stub, grpc::ClientContext* ctx, const std::string& path,
             const grpc::ByteBuffer* request, const pb::Descriptor* response_type)
      : response_type_(response_type) {
    stub->PrepareBidiStreamingCall(ctx, path, grpc::StubOptions(), this);
    StartWriteLast(request, grpc::WriteOptions());
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (!ParsesAs(response_, response_type_)) bad_message_ = true;
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& s) override {
    status_ = s;
    done_.Notify();
  }
  bool Wait(absl::Duration timeout) { return done_.WaitForNotificationWithTimeout(timeout); }
  const grpc::Status& status() const { return status_; }
  bool bad_message() const { return bad_message_; }

 private:
  const pb::Descriptor* const response_type_;
  grpc::ByteBuffer response_;
  bool bad_message_ = false;
  grpc::Status status_;
  absl::Notification done_;
};

// The live harness, for the report at exit.
RpcFuzzHarness* g_harness = nullptr;

}  // namespace

uint32_t ByteReader::U32() { return static_cast<uint32_t>(Bits(*this, 4)); }
uint64_t ByteReader::U64() { return Bits(*this, 8); }

void FillMessage(ByteReader& in, const FillOptions& options, pb::Message* msg) {
  msg->Clear();
  Filler(in, options).Fill(msg, 0);
}

struct RpcFuzzHarness::Impl {
  struct Method {
    const pb::MethodDescriptor* desc;
    std::string path;  // "/rlmesh.ReplayBuffer/PutGroups"
  };
  struct CodeCount {
    int64_t calls = 0;
    std::string first_message;
  };

  RpcFuzzTarget target;
  // RLMESH_RPC_FUZZ_VERBOSE=1: one line per call (method, code, time).
  const bool verbose = std::getenv("RLMESH_RPC_FUZZ_VERBOSE") != nullptr;
  std::unique_ptr<RpcServer> server;
  std::unique_ptr<RpcClient> client;
  std::unique_ptr<grpc::GenericStub> stub;
  std::vector<Method> methods;
  absl::Mutex mu;
  std::map<std::string, std::map<int, CodeCount>> codes ABSL_GUARDED_BY(mu);

  [[noreturn]] void Die(const Method& m, const pb::Message& request, const std::string& why) {
    std::string text = request.ShortDebugString();
    if (text.size() > 4000) text = text.substr(0, 4000) + "...";
    std::fprintf(stderr, "rpc_fuzz: %s: %s\nrequest: %s\n", m.path.c_str(), why.c_str(), text.c_str());
    std::fflush(stderr);
    std::abort();
  }

  void Count(const Method& m, const grpc::Status& s) {
    absl::MutexLock lock(&mu);
    CodeCount& c = codes[m.path][s.error_code()];
    if (c.calls++ == 0) c.first_message = s.error_message().substr(0, 300);
  }

  void Report() {
    absl::MutexLock lock(&mu);
    std::fprintf(stderr, "rpc_fuzz: status codes per method (calls, first message)\n");
    for (const auto& [path, by_code] : codes) {
      for (const auto& [code, c] : by_code) {
        std::fprintf(stderr, "  %s code=%d calls=%lld %s\n", path.c_str(), code, static_cast<long long>(c.calls),
                     c.first_message.c_str());
      }
    }
  }
};

RpcFuzzHarness::RpcFuzzHarness(RpcFuzzTarget target) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.target = std::move(target);
  for (const std::string& name : s.target.service_names) {
    const pb::ServiceDescriptor* service = pb::DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service == nullptr) {
      std::fprintf(stderr, "rpc_fuzz: unknown service %s\n", name.c_str());
      std::abort();
    }
    for (int i = 0; i < service->method_count(); ++i) {
      const pb::MethodDescriptor* m = service->method(i);
      s.methods.push_back({m, absl::StrCat("/", name, "/", m->name())});
    }
  }
  ServerOptions so;
  so.role = "fuzz";
  s.server = std::make_unique<RpcServer>(so);
  for (grpc::Service* service : s.target.services) s.server->AddService(service);
  if (absl::Status st = s.server->Start(); !st.ok()) {
    std::fprintf(stderr, "rpc_fuzz: server: %s\n", st.ToString().c_str());
    std::abort();
  }
  auto client = RpcClient::Create(s.server->address());
  if (!client.ok()) std::abort();
  s.client = std::make_unique<RpcClient>(*std::move(client));
  s.stub = std::make_unique<grpc::GenericStub>(s.client->channel());
  if (g_harness == nullptr) {
    std::atexit([] {
      if (g_harness != nullptr) g_harness->ReportCodes();
    });
  }
  g_harness = this;
}

RpcFuzzHarness::~RpcFuzzHarness() {
  if (g_harness == this) g_harness = nullptr;
  impl_->server->Shutdown();
}

void RpcFuzzHarness::ReportCodes() const { impl_->Report(); }

const std::string& RpcFuzzHarness::address() const { return impl_->client->address(); }

int RpcFuzzHarness::Run(const uint8_t* data, size_t size) {
  Impl& s = *impl_;
  ByteReader in(data, size);
  const Impl::Method& method = s.methods[in.U8() % s.methods.size()];
  const absl::Duration deadline = in.U8() % 16 == 0 ? absl::Milliseconds(1) : s.target.deadline;
  std::unique_ptr<pb::Message> request(
      pb::MessageFactory::generated_factory()->GetPrototype(method.desc->input_type())->New());
  FillMessage(in, s.target.fill, request.get());
  if (s.target.prepare) s.target.prepare(*method.desc, request.get());
  if (s.target.allow && !s.target.allow(*method.desc, *request)) return 0;

  const grpc::ByteBuffer request_bytes = ToBuffer(*request);
  const absl::Time started = absl::Now();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  grpc::Status status;
  if (method.desc->server_streaming() || method.desc->client_streaming()) {
    StreamCall call(s.stub.get(), &ctx, method.path, &request_bytes, method.desc->output_type());
    if (!call.Wait(deadline + s.target.grace)) s.Die(method, *request, "the call did not end after its deadline");
    if (call.bad_message()) s.Die(method, *request, "an answer does not parse as the response type");
    status = call.status();
  } else {
    grpc::ByteBuffer response;
    absl::Notification done;
    s.stub->UnaryCall(&ctx, method.path, grpc::StubOptions(), &request_bytes, &response,
                      [&](grpc::Status st) {
                        status = std::move(st);
                        done.Notify();
                      });
    if (!done.WaitForNotificationWithTimeout(deadline + s.target.grace)) {
      s.Die(method, *request, "the call did not end after its deadline");
    }
    if (status.ok() && !ParsesAs(response, method.desc->output_type())) {
      s.Die(method, *request, "the answer does not parse as the response type");
    }
  }
  s.Count(method, status);
  if (s.verbose) {
    std::fprintf(stderr, "rpc_fuzz: %s -> %d (%s) in %.1f ms\n", method.path.c_str(), status.error_code(),
                 status.error_message().substr(0, 120).c_str(), absl::ToDoubleMilliseconds(absl::Now() - started));
  }

  auto health = CheckHealth(*s.client, s.target.grace);
  if (!health.ok() || *health != "SERVING") {
    s.Die(method, *request,
          absl::StrCat("afterwards the health check says ", health.ok() ? *health : health.status().ToString()));
  }
  if (s.target.check) {
    const std::string broken = s.target.check(s.client->address());
    if (!broken.empty()) s.Die(method, *request, absl::StrCat("afterwards: ", broken));
  }
  return 0;
}

}  // namespace rlmesh::fuzz
