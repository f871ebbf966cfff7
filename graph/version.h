// castor's version: the one place it is written (CMake's project() and the
// Bazel build read it from here).
#pragma once

#define CASTOR_VERSION_STRING "0.4.0"

namespace castor {
inline constexpr const char* kCastorVersion = CASTOR_VERSION_STRING;
}  // namespace castor
