// DynamicLibrary (see dynamic_library.h).
#include "backend/dynamic_library.h"

#include <dlfcn.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace castor {

absl::StatusOr<DynamicLibrary> DynamicLibrary::Open(const std::string& file,
                                                    const std::string& needed_for) {
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        needed_for, " (", file, "): ", why != nullptr ? why : "dlopen failed"));
  }
  return DynamicLibrary(handle, file, needed_for);
}

absl::StatusOr<void*> DynamicLibrary::Find(const char* name) const {
  dlerror();  // a symbol may legitimately be null: tell by dlerror
  void* address = dlsym(handle_, name);
  if (const char* why = dlerror(); why != nullptr || address == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(needed_for_, " (", file_, "): the library has no ", name,
                     why != nullptr ? absl::StrCat(" (", why, ")") : ""));
  }
  return address;
}

}  // namespace castor
