#include "meshtrain/util/error.h"

namespace meshtrain::detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::string where = std::string(file);
  auto pos = where.rfind("meshtrain/");
  if (pos != std::string::npos) where = where.substr(pos);
  throw Error(
      str_cat(msg.empty() ? "check failed" : msg, " [", cond, " at ", where, ":", line, "]"));
}

}  // namespace meshtrain::detail
