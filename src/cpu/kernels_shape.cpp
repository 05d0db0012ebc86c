// Data movement CPU kernels: strided copies (permute, slice, concat), typecasts and tile
// layout conversion.
#include "cpu/elementwise.hpp"
#include "cpu/kernels_internal.hpp"
#include "cpu/parallel.hpp"
#include "retrace/backend/float_to_int.hpp"
#include "retrace/error.hpp"

#include <cstring>

namespace retrace::cpu {

namespace {

template <class T>
void strided_copy_kernel(const std::byte* raw) {
  const auto& p = params_as<StridedCopyParams>(raw);
  const T* src = static_cast<const T*>(p.src);
  T* dst = static_cast<T*>(p.dst);
  const int last = p.rank - 1;
  const std::int64_t inner = p.shape[last];
  const std::int64_t ss = p.src_strides[last], ds = p.dst_strides[last];
  parallel_for(outer_rows(p.shape, p.rank), rows_per_task(inner, kMinTaskElements),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t row = begin; row < end; ++row) {
                   std::int64_t offsets[2];
                   row_offsets(row, p.shape, last, {p.src_strides, p.dst_strides}, offsets);
                   const T* s = src + offsets[0];
                   T* o = dst + offsets[1];
                   if (ss == 1 && ds == 1) {
                     std::memcpy(o, s, static_cast<std::size_t>(inner) * sizeof(T));
                   } else {
                     for (std::int64_t j = 0; j < inner; ++j) o[j * ds] = s[j * ss];
                   }
                 }
               });
}

// One index value, checked: a device error naming the element and the value when it is out of
// range (the caller's queue fails; nothing is read outside src).
template <class I>
std::int64_t checked_index(const GatherParams& p, I v, std::int64_t element) {
  RETRACE_CHECK(v >= 0 && v < p.dim_size, device_error,
                "index element {} is {}, outside [0, {}) (the size of the indexed dimension)",
                element, v, p.dim_size);
  return v;
}

template <class T, class I>
void gather_kernel(const std::byte* raw) {
  const auto& p = params_as<GatherParams>(raw);
  const I* index = static_cast<const I*>(p.index);
  const T* src = static_cast<const T*>(p.src);
  T* out = static_cast<T*>(p.out);
  const int last = p.rank - 1;
  const std::int64_t inner = p.shape[last];
  const std::int64_t ss = p.src_strides[last], is = p.index_strides[last];
  // Rows in order on the calling thread: the first bad index is the one reported.
  for (std::int64_t row = 0, rows = outer_rows(p.shape, p.rank); row < rows; ++row) {
    std::int64_t offsets[2];
    row_offsets(row, p.shape, last, {p.src_strides, p.index_strides}, offsets);
    T* o = out + row * inner;
    if (is == 0) {  // one index for the whole row (embedding, index_select of a leading dim)
      const std::int64_t at = checked_index(p, index[offsets[1]], offsets[1]);
      const T* s = src + offsets[0] + at * p.dim_stride;
      if (ss == 1) {
        std::memcpy(o, s, static_cast<std::size_t>(inner) * sizeof(T));
      } else {
        for (std::int64_t j = 0; j < inner; ++j) o[j] = s[j * ss];
      }
      continue;
    }
    for (std::int64_t j = 0; j < inner; ++j) {
      const std::int64_t e = offsets[1] + j * is;
      o[j] = src[offsets[0] + j * ss + checked_index(p, index[e], e) * p.dim_stride];
    }
  }
}

template <class From, class To>
void typecast_kernel(const std::byte* raw) {
  const auto& p = params_as<TypecastParams>(raw);
  const From* src = static_cast<const From*>(p.src);
  To* dst = static_cast<To*>(p.dst);
  const bool to_bool = p.to == DType::bool_;  // nonzero (NaN included) -> 1, as torch
  for (std::int64_t i = 0; i < p.count; ++i) {
    const auto v = Elem<From>::load(src, i);
    if constexpr (std::is_same_v<To, std::uint8_t>) {
      if (to_bool) {
        dst[i] = v != 0 ? 1 : 0;  // nonzero (NaN included) -> 1, as torch
        continue;
      }
    }
    if constexpr (std::is_same_v<To, bfloat16> || std::is_same_v<To, float16>) {
      // From an integer through double (exact for 32 bits): one rounding, not two.
      dst[i] = std::is_integral_v<decltype(v)> ? To::from_double(static_cast<double>(v))
                                               : To::from_float(static_cast<float>(v));
    } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<decltype(v)>) {
      dst[i] = retrace::detail::float_to_int<To>(v);  // NaN 0, saturating: never undefined
    } else {
      dst[i] = static_cast<To>(v);
    }
  }
}

void tilize_kernel(const std::byte* raw) {
  const auto& p = params_as<TilizeParams>(raw);
  const auto pad = [](std::int64_t n) { return (n + kTileSize - 1) / kTileSize * kTileSize; };
  const std::int64_t prows = pad(p.rows), pcols = pad(p.cols), tiles_per_row = pcols / kTileSize;
  const auto es = static_cast<std::size_t>(p.elem_size);
  const auto* src = static_cast<const std::byte*>(p.src);
  auto* dst = static_cast<std::byte*>(p.dst);
  if (p.to_tile) std::memset(dst, 0, static_cast<std::size_t>(p.batch * prows * pcols) * es);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t r = 0; r < p.rows; ++r) {
      for (std::int64_t c0 = 0; c0 < p.cols; c0 += kTileSize) {
        const std::int64_t n = std::min<std::int64_t>(kTileSize, p.cols - c0);
        const std::int64_t tile = (r / kTileSize) * tiles_per_row + c0 / kTileSize;
        const std::int64_t tiled =
            b * prows * pcols + tile * kTileSize * kTileSize + (r % kTileSize) * kTileSize;
        const std::int64_t plain = (b * p.rows + r) * p.cols + c0;
        if (p.to_tile) {
          std::memcpy(dst + tiled * es, src + plain * es, static_cast<std::size_t>(n) * es);
        } else {
          std::memcpy(dst + plain * es, src + tiled * es, static_cast<std::size_t>(n) * es);
        }
      }
    }
  }
}

}  // namespace

KernelFn resolve(const StridedCopyParams& p) {
  return by_elem_size(p.elem_size, "strided_copy",
                      []<class T>(T) -> KernelFn { return &strided_copy_kernel<T>; });
}

KernelFn resolve(const GatherParams& p) {
  const bool wide = p.index_size == 8;  // int64 indices, else int32
  return by_elem_size(p.elem_size, "gather", [wide]<class T>(T) -> KernelFn {
    return wide ? &gather_kernel<T, std::int64_t> : &gather_kernel<T, std::int32_t>;
  });
}

KernelFn resolve(const TypecastParams& p) {
  return dispatch_dtype(p.from, [&]<class From>(From) {
    return dispatch_dtype(p.to,
                          []<class To>(To) -> KernelFn { return &typecast_kernel<From, To>; });
  });
}

KernelFn resolve(const TilizeParams&) {
  return &tilize_kernel;
}

}  // namespace retrace::cpu
