#include "common/proto_yaml.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "yaml-cpp/yaml.h"

namespace rlmesh {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

class Loader {
 public:
  explicit Loader(YamlSource* source) : source_(source) {}

  absl::Status Error(const YAML::Node& node, const std::string& path, const std::string& msg) {
    const int line = node.Mark().line >= 0 ? node.Mark().line + 1 : -1;
    if (line > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_->file, ":", line, ": ", path.empty() ? "<top>" : path, ": ", msg));
    }
    return source_->Error(path, msg);
  }

  void Record(const YAML::Node& node, const std::string& path) {
    if (node.Mark().line >= 0) source_->lines[path] = node.Mark().line + 1;
  }

  absl::Status MergeMessage(const YAML::Node& node, const std::string& path, Message* msg) {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node, path, "expected a mapping of keys");
    const Descriptor* desc = msg->GetDescriptor();
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      const std::string child = path.empty() ? key : absl::StrCat(path, ".", key);
      const FieldDescriptor* field = desc->FindFieldByName(key);
      if (field == nullptr) {
        std::vector<std::string> known;
        for (int i = 0; i < desc->field_count(); ++i) known.push_back(desc->field(i)->name());
        return Error(kv.first, child,
                     absl::StrCat("unknown key (known: ", absl::StrJoin(known, ", "), ")"));
      }
      Record(kv.first, child);
      RLMESH_RETURN_IF_ERROR(MergeField(kv.second, child, field, msg));
    }
    return absl::OkStatus();
  }

  absl::Status MergeField(const YAML::Node& node, const std::string& path,
                          const FieldDescriptor* field, Message* msg) {
    const Reflection* refl = msg->GetReflection();
    if (field->is_map()) {
      if (!node.IsMap()) return Error(node, path, "expected a mapping");
      refl->ClearField(msg, field);
      const Descriptor* entry = field->message_type();
      for (const auto& kv : node) {
        Message* e = refl->AddMessage(msg, field);
        const std::string child = absl::StrCat(path, ".", kv.first.as<std::string>());
        RLMESH_RETURN_IF_ERROR(SetScalar(kv.first, child, entry->map_key(), e, false));
        RLMESH_RETURN_IF_ERROR(MergeValue(kv.second, child, entry->map_value(), e, false));
      }
      return absl::OkStatus();
    }
    if (field->is_repeated()) {
      if (!node.IsSequence()) return Error(node, path, "expected a list");
      refl->ClearField(msg, field);
      for (size_t i = 0; i < node.size(); ++i) {
        const std::string child = absl::StrCat(path, "[", i, "]");
        Record(node[i], child);
        RLMESH_RETURN_IF_ERROR(MergeValue(node[i], child, field, msg, true));
      }
      return absl::OkStatus();
    }
    return MergeValue(node, path, field, msg, false);
  }

  absl::Status MergeValue(const YAML::Node& node, const std::string& path,
                          const FieldDescriptor* field, Message* msg, bool add) {
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      const Reflection* refl = msg->GetReflection();
      Message* sub = add ? refl->AddMessage(msg, field) : refl->MutableMessage(msg, field);
      return MergeMessage(node, path, sub);
    }
    return SetScalar(node, path, field, msg, add);
  }

  template <typename T>
  absl::Status ParseInt(const YAML::Node& node, const std::string& path, T* out) {
    const std::string s = node.Scalar();
    if (!absl::SimpleAtoi(s, out)) {
      return Error(node, path,
                   absl::StrCat("expected an integer in [", std::numeric_limits<T>::min(), ", ",
                                std::numeric_limits<T>::max(), "], got '", s, "'"));
    }
    return absl::OkStatus();
  }

  absl::Status SetScalar(const YAML::Node& node, const std::string& path,
                         const FieldDescriptor* field, Message* msg, bool add) {
    if (!node.IsScalar()) return Error(node, path, "expected a single value");
    const Reflection* refl = msg->GetReflection();
    const std::string s = node.Scalar();
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: {
        int32_t v;
        RLMESH_RETURN_IF_ERROR(ParseInt(node, path, &v));
        add ? refl->AddInt32(msg, field, v) : refl->SetInt32(msg, field, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t v;
        RLMESH_RETURN_IF_ERROR(ParseInt(node, path, &v));
        add ? refl->AddInt64(msg, field, v) : refl->SetInt64(msg, field, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        uint32_t v;
        RLMESH_RETURN_IF_ERROR(ParseInt(node, path, &v));
        add ? refl->AddUInt32(msg, field, v) : refl->SetUInt32(msg, field, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t v;
        RLMESH_RETURN_IF_ERROR(ParseInt(node, path, &v));
        add ? refl->AddUInt64(msg, field, v) : refl->SetUInt64(msg, field, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        double v;
        if (!absl::SimpleAtod(s, &v) || !std::isfinite(v)) {
          return Error(node, path, absl::StrCat("expected a finite number, got '", s, "'"));
        }
        if (field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
          add ? refl->AddFloat(msg, field, static_cast<float>(v))
              : refl->SetFloat(msg, field, static_cast<float>(v));
        } else {
          add ? refl->AddDouble(msg, field, v) : refl->SetDouble(msg, field, v);
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        bool v;
        const std::string l = absl::AsciiStrToLower(s);
        if (l == "true" || l == "yes" || l == "on") {
          v = true;
        } else if (l == "false" || l == "no" || l == "off") {
          v = false;
        } else {
          return Error(node, path, absl::StrCat("expected true or false, got '", s, "'"));
        }
        add ? refl->AddBool(msg, field, v) : refl->SetBool(msg, field, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING:
        add ? refl->AddString(msg, field, s) : refl->SetString(msg, field, s);
        break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        const EnumValueDescriptor* v = FindEnum(field, s);
        if (v == nullptr) {
          std::vector<std::string> names;
          for (int i = 0; i < field->enum_type()->value_count(); ++i) {
            names.push_back(field->enum_type()->value(i)->name());
          }
          return Error(node, path,
                       absl::StrCat("unknown value '", s, "' (one of: ", absl::StrJoin(names, ", "), ")"));
        }
        add ? refl->AddEnum(msg, field, v) : refl->SetEnum(msg, field, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return Error(node, path, "expected a mapping");
    }
    return absl::OkStatus();
  }

  // Accepts the full name or a case-insensitive suffix after '_' (shm for
  // WEIGHT_SYNC_SHM, fifo for SAMPLE_FIFO).
  static const EnumValueDescriptor* FindEnum(const FieldDescriptor* field, const std::string& s) {
    const auto* type = field->enum_type();
    if (const auto* v = type->FindValueByName(s)) return v;
    const std::string upper = absl::AsciiStrToUpper(s);
    for (int i = 0; i < type->value_count(); ++i) {
      const std::string& name = type->value(i)->name();
      if (name == upper ||
          (name.size() > upper.size() && name.compare(name.size() - upper.size(), upper.size(), upper) == 0 &&
           name[name.size() - upper.size() - 1] == '_')) {
        return type->value(i);
      }
    }
    return nullptr;
  }

 private:
  YamlSource* source_;
};

}  // namespace

std::string YamlSource::Where(const std::string& path) const {
  auto it = lines.find(path);
  if (it != lines.end()) return absl::StrCat(file, ":", it->second, ": ");
  return file.empty() ? "" : absl::StrCat(file, ": ");
}

absl::Status YamlSource::Error(const std::string& path, const std::string& message) const {
  return absl::InvalidArgumentError(absl::StrCat(Where(path), path, ": ", message));
}

absl::Status MergeYaml(const std::string& yaml_text, Message* message, YamlSource* source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source->file, ":", e.mark.line + 1, ": invalid YAML: ", e.msg));
  }
  try {
    return Loader(source).MergeMessage(root, "", message);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source->file, ":", e.mark.line + 1, ": ", e.msg));
  }
}

absl::Status LoadYamlFile(const std::string& path, Message* message, YamlSource* source) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  source->file = path;
  return MergeYaml(ss.str(), message, source);
}

absl::Status ApplyOverride(const std::string& assignment, Message* message, YamlSource* source) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set ", assignment, ": expected key.path=value"));
  }
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  // Build nested YAML from the dotted path: a.b[1].c=v. List indexes address
  // an existing element, so walk the message for them.
  std::vector<std::string> parts = absl::StrSplit(key, '.');
  Message* target = message;
  std::string prefix;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    std::string name = parts[i];
    int index = -1;
    const size_t br = name.find('[');
    if (br != std::string::npos) {
      if (!absl::SimpleAtoi(name.substr(br + 1, name.size() - br - 2), &index)) {
        return absl::InvalidArgumentError(absl::StrCat("--set ", key, ": bad index in ", name));
      }
      name = name.substr(0, br);
    }
    prefix = prefix.empty() ? parts[i] : absl::StrCat(prefix, ".", parts[i]);
    const FieldDescriptor* f = target->GetDescriptor()->FindFieldByName(name);
    if (f == nullptr || f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || f->is_map()) {
      return absl::InvalidArgumentError(absl::StrCat("--set ", key, ": ", prefix, ": no such section"));
    }
    const Reflection* r = target->GetReflection();
    if (f->is_repeated()) {
      if (index < 0 || index >= r->FieldSize(*target, f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--set ", key, ": ", prefix, ": index out of range"));
      }
      target = r->MutableRepeatedMessage(target, f, index);
    } else {
      if (index >= 0) return absl::InvalidArgumentError(absl::StrCat("--set ", key, ": ", name, " is not a list"));
      target = r->MutableMessage(target, f);
    }
  }
  YamlSource sub;
  sub.file = "--set " + key;
  absl::Status s = MergeYaml(absl::StrCat(parts.back(), ": ", value), target, &sub);
  if (!s.ok()) return s;
  source->lines.erase(key);
  return absl::OkStatus();
}

}  // namespace rlmesh
