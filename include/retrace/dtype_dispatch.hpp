// dispatch_dtype: calls f(T{}) with the C++ storage type of a DType (float, bfloat16, float16,
// int32_t, uint32_t, int64_t, uint8_t; uint8_t for bool_ too), so code can be written once per storage type:
//
//   retrace::dispatch_dtype(tensor.dtype(), [&]<class T>(T) { ... static_cast<T*>(data) ... });
#pragma once

#include "retrace/bfloat16.hpp"
#include "retrace/float16.hpp"
#include "retrace/types.hpp"

#include <cstdint>
#include <utility>

namespace retrace {

template <class F>
decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32: return std::forward<F>(f)(float{});
    case DType::bfloat16: return std::forward<F>(f)(bfloat16{});
    case DType::float16: return std::forward<F>(f)(float16{});
    case DType::int32: return std::forward<F>(f)(std::int32_t{});
    case DType::uint32: return std::forward<F>(f)(std::uint32_t{});
    case DType::int64: return std::forward<F>(f)(std::int64_t{});
    case DType::uint8:
    case DType::bool_: return std::forward<F>(f)(std::uint8_t{});  // bool_: bytes 0 and 1
  }
  return std::forward<F>(f)(float{});  // unreachable: DType has no other values
}

}  // namespace retrace
