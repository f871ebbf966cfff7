// Bulk float conversions (see float_io.h).
#include "backend/cpu/float_io.h"

#include <cstring>

namespace castor::cpu {

void ToFloat32(DType dtype, const void* src, float* dst, int64_t n) {
  DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* s = static_cast<const T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = LoadF(s[i]);
  });
}

void FromFloat32(DType dtype, const float* src, void* dst, int64_t n) {
  DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* d = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) StoreF(&d[i], src[i]);
  });
}

}  // namespace castor::cpu
