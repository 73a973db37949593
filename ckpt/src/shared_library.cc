#include "ckpt/shared_library.h"

#include <dlfcn.h>

namespace ckpt {

Result<SharedLibrary> SharedLibrary::Open(const std::vector<std::string>& candidates,
                                          std::string_view what) {
  std::string tried, why;
  for (const std::string& c : candidates) {
    if (void* h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL))
      return SharedLibrary(h, c, std::string(what));
    const char* e = ::dlerror();
    tried += (tried.empty() ? "" : " or ") + c;
    if (e) why = e;  // the last candidate's reason
  }
  return FailedPrecondition("cannot open " + std::string(what) + " (" + tried +
                            "): " + (why.empty() ? std::string("no candidate") : why));
}

void* SharedLibrary::Symbol(const char* name) const { return ::dlsym(handle_, name); }

}  // namespace ckpt
