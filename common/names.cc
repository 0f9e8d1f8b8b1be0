#include "common/names.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/limits.h"
#include "common/utf8.h"

namespace dt {
namespace {

// 1..10 decimal digits: a job id or pid part.
bool IdDigits(absl::string_view s) {
  return !s.empty() && s.size() <= 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

absl::Status Invalid(absl::string_view field, absl::string_view value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", Quote(value), " is invalid: ", rule));
}

}  // namespace

std::string Quote(absl::string_view value) {
  constexpr size_t kShown = 80;
  std::string shown = absl::CHexEscape(value.substr(0, kShown));
  if (value.size() > kShown) absl::StrAppend(&shown, "…(", value.size(), " bytes)");
  return absl::StrCat("\"", shown, "\"");
}

absl::Status ValidateLabel(absl::string_view field, absl::string_view value) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " must not be empty"));
  int64_t chars = Utf8Length(value);
  if (chars < 0) return Invalid(field, value, "not valid UTF-8");
  if (static_cast<size_t>(chars) > kMaxNameChars) {
    return Invalid(field, value, absl::StrCat(chars, " characters exceeds the limit of ", kMaxNameChars));
  }
  return ValidateSingleLine(field, value);
}

absl::Status ValidateSingleLine(absl::string_view field, absl::string_view value) {
  for (char c : value) {
    if (IsControl(static_cast<unsigned char>(c))) return Invalid(field, value, "contains a control character");
  }
  return absl::OkStatus();
}

absl::Status ValidateNodeName(absl::string_view node) {
  constexpr absl::string_view kField = "node name";
  if (absl::Status s = ValidateLabel(kField, node); !s.ok()) return s;
  if (!absl::ascii_isalnum(static_cast<unsigned char>(node.front()))) {
    return Invalid(kField, node, "must start with a letter or digit");
  }
  for (char c : node) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return Invalid(kField, node, "may hold only letters, digits, '.', '_' and '-'");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateHostPort(absl::string_view flag, absl::string_view address, bool port_zero_ok) {
  std::string example = port_zero_ok ? " (e.g. 127.0.0.1:8080; port 0: any free port)" : " (e.g. login1:50051)";
  size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", Quote(address), " is not HOST:PORT", example));
  }
  absl::string_view host = address.substr(0, colon), port_text = address.substr(colon + 1);
  if (absl::StrContains(host, "://")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", Quote(address), " is not HOST:PORT: drop the scheme (no http:// or grpc://)"));
  }
  bool v6 = absl::StartsWith(host, "[") && absl::EndsWith(host, "]");
  if (!v6 && absl::StrContains(host, ':')) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", Quote(address), " is not HOST:PORT: write an IPv6 host in brackets, e.g. [::1]:8080"));
  }
  int port = -1;
  if (port_text.empty() || !absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535 ||
      (port == 0 && !port_zero_ok)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", Quote(address), ": the port must be a number in ",
                                                   port_zero_ok ? "0" : "1", "..65535", example));
  }
  return absl::OkStatus();
}

absl::Status ValidateExperimentName(absl::string_view name) {
  constexpr absl::string_view kField = "experiment name";
  if (absl::Status s = ValidateLabel(kField, name); !s.ok()) return s;
  if (name == "." || name == "..") return Invalid(kField, name, "\".\" and \"..\" are not names");
  if (absl::StrContains(name, '/')) return Invalid(kField, name, "contains '/'");
  if (absl::StrContains(name, "..")) return Invalid(kField, name, "contains \"..\"");
  if (name.front() == '-') return Invalid(kField, name, "starts with '-'");
  if (absl::ascii_isspace(static_cast<unsigned char>(name.front())) ||
      absl::ascii_isspace(static_cast<unsigned char>(name.back()))) {
    return Invalid(kField, name, "starts or ends with whitespace");
  }
  return absl::OkStatus();
}

absl::Status ValidateRunId(absl::string_view run_id) {
  if (run_id.empty()) return absl::InvalidArgumentError("run id must not be empty");
  bool ok = run_id.size() == 18 && absl::StartsWith(run_id, "r-");
  for (size_t i = 2; ok && i < run_id.size(); ++i) {
    char c = run_id[i];
    ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  }
  if (!ok) return Invalid("run id", run_id, "expected \"r-\" and 16 lower-case hex digits");
  return absl::OkStatus();
}

absl::Status ValidateStoreKey(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("store key must not be empty");
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key ", Quote(key), " is ", key.size(), " bytes; the limit is ", kMaxKeyBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateAbsolutePath(absl::string_view field, absl::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " must not be empty"));
  if (path.size() > kMaxPathBytes) {
    return Invalid(field, path, absl::StrCat("longer than ", kMaxPathBytes, " bytes"));
  }
  if (path.front() != '/') return Invalid(field, path, "must be an absolute path");
  if (path.find('\0') != absl::string_view::npos) return Invalid(field, path, "contains NUL");
  if (absl::Status s = ValidateSingleLine(field, path); !s.ok()) return s;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return Invalid(field, path, "contains a \"..\" component");
  }
  return absl::OkStatus();
}

absl::Status ValidateMetricName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("metric name must not be empty");
  if (name.size() > kMaxNameChars) {
    return Invalid("metric name", name, absl::StrCat("longer than ", kMaxNameChars, " characters"));
  }
  if (!absl::ascii_isalpha(static_cast<unsigned char>(name[0])) && name[0] != '_') {
    return Invalid("metric name", name, "must start with a letter or '_'");
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '/' && c != '-') {
      return Invalid("metric name", name, "allowed characters are A-Z a-z 0-9 _ . / -");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSlurmJobId(absl::string_view id) {
  // "123", an array task "123_4", a heterogeneous component "123+1": what sbatch --parsable and
  // SLURM_JOB_ID give. Anything else would reach scancel/squeue as an argument.
  size_t sep = id.find_first_of("_+");
  bool ok = sep == absl::string_view::npos ? IdDigits(id) : IdDigits(id.substr(0, sep)) && IdDigits(id.substr(sep + 1));
  if (!ok) return Invalid("Slurm job id", id, "expected digits, optionally \"_N\" or \"+N\" (e.g. 1234 or 1234_7)");
  return absl::OkStatus();
}

absl::Status ValidateLocalJobId(absl::string_view id) {
  absl::string_view pid = id;
  bool ok = absl::ConsumePrefix(&pid, "local:") && IdDigits(pid);
  if (!ok) return Invalid("local job id", id, "expected \"local:\" and the launcher's pid");
  return absl::OkStatus();
}

}  // namespace dt
