// A minimal JSON object writer for --json output (flat values and nested raw JSON).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace facli {

// A JSON number; inf and NaN have no JSON spelling and become null.
inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& value) { return add_raw(key, json_string(value)); }
  JsonObject& add(const std::string& key, const char* value) { return add_raw(key, json_string(value)); }
  JsonObject& add(const std::string& key, double value) { return add_raw(key, json_number(value)); }
  JsonObject& add(const std::string& key, int value) { return add_raw(key, std::to_string(value)); }
  JsonObject& add(const std::string& key, bool value) { return add_raw(key, value ? "true" : "false"); }
  JsonObject& add_raw(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ", ") + json_string(key) + ": " + json;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace facli
