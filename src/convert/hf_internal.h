// Internals shared by the Hugging Face converter's files (hf_config.cc, hf_rope.cc, hf.cc,
// hf_metadata.cc). Not part of the module's interface.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "convert/hf.h"

namespace arbor::convert::hf_internal {

using Json = nlohmann::json;

// Reads an unsigned integer key; kNotFound when absent and `required`.
inline Status read_u32(const Json& j, const char* key, bool required, uint32_t* out,
                const std::string& name) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return not_found(name, ": missing required key \"", key, "\"");
    return ok_status();
  }
  if (!it->is_number_integer() || it->get<int64_t>() <= 0 ||
      it->get<int64_t>() > (int64_t{1} << 30)) {
    return invalid_argument(name, ": \"", key, "\" = ", it->dump(),
                            " is not a positive integer below 2^30");
  }
  *out = static_cast<uint32_t>(it->get<int64_t>());
  return ok_status();
}

inline Status read_float(const Json& j, const char* key, bool required, float* out,
                  const std::string& name) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return not_found(name, ": missing required key \"", key, "\"");
    return ok_status();
  }
  if (!it->is_number() || !(it->get<double>() > 0.0) || !std::isfinite(it->get<double>())) {
    return invalid_argument(name, ": \"", key, "\" = ", it->dump(), " is not a positive number");
  }
  *out = static_cast<float>(it->get<double>());
  return ok_status();
}

inline Status read_opt_float(const Json& j, const char* key, std::optional<float>* out,
                      const std::string& name) {
  if (!j.contains(key) || j[key].is_null()) return ok_status();
  float v = 0.0f;
  ARBOR_RETURN_IF_ERROR(read_float(j, key, true, &v, name));
  *out = v;
  return ok_status();
}

inline bool read_bool(const Json& j, const char* key, bool fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// Reads rope_scaling / rope_parameters into c->rope, c->rope_theta(_swa) and c->rope_dim;
// refuses a type not in `allowed` and parameters llama.cpp would ignore. (hf_rope.cc)
Status read_rope(const Json& j, const std::vector<RopeScalingType>& allowed, HfConfig* c,
                 const std::string& name);

// Sliding-window, NoPE and per-architecture scalars (softcaps, multipliers, attention scale):
// reads them and refuses layouts llama.cpp's fixed patterns cannot express. (hf_rope.cc)
Status read_layout(const Json& j, HfConfig* c, const std::string& name);

}  // namespace arbor::convert::hf_internal
