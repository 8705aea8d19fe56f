// Error types shared by every layer. Library code reports failures by throwing one of these;
// only the command-line front ends turn them into a message and an exit status.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace meshtrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: a config key, a flag, a value out of range. Front ends exit with status 2.
class ValueError : public Error {
 public:
  using Error::Error;
};

// A file that is missing, truncated or corrupt.
class IoError : public Error {
 public:
  using Error::Error;
};

// A collective or peer connection failed (peer died, link dropped, protocol violation).
class CommError : public Error {
 public:
  using Error::Error;
};

// The rendezvous store refused or failed a request.
class StoreError : public Error {
 public:
  using Error::Error;
};

// A deadline passed.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A blocking call gave up early because its wake-up fired (a launcher signalled to stop): the
// caller goes on to act on what woke it.
class InterruptedError : public Error {
 public:
  using Error::Error;
};

// A peer or client failed authentication.
class AuthError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  ((os << std::forward<Args>(args)), ...);
  return os.str();
}

[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);

}  // namespace detail
}  // namespace meshtrain

// Precondition check: throws meshtrain::Error naming the file, line, condition and message.
#define MT_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) [[unlikely]] {                                                                    \
      ::meshtrain::detail::check_failed(                                                           \
          __FILE__, __LINE__, #cond, ::meshtrain::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                              \
  } while (0)

// Throws the given error type with a message assembled from the arguments.
#define MT_THROW(Type, ...) throw Type(::meshtrain::detail::str_cat(__VA_ARGS__))
