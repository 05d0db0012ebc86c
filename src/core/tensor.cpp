#include "retrace/tensor.hpp"

#include "retrace/dtype_dispatch.hpp"
#include "retrace/error.hpp"
#include "retrace/ops.hpp"

#include <cstring>

namespace retrace {

namespace {

struct TileGeometry {
  std::int64_t batch, rows, cols, padded_rows, padded_cols;
};

TileGeometry tile_geometry(const Shape& shape) {
  const std::size_t rank = shape.rank();
  const std::int64_t cols = rank >= 1 ? shape[-1] : 1;
  const std::int64_t rows = rank >= 2 ? shape[-2] : 1;
  std::int64_t batch = 1;
  for (std::size_t i = 0; i + 2 < rank; ++i) batch *= shape.dims()[i];
  auto pad = [](std::int64_t n) { return (n + kTileSize - 1) / kTileSize * kTileSize; };
  return {batch, rows, cols, pad(rows), pad(cols)};
}

// Calls visit(logical_index, storage_index) for every logical element, in row-major order.
template <class Visit>
void for_each_element(const Shape& shape, Layout layout, Visit visit) {
  if (layout == Layout::row_major) {
    const std::int64_t n = shape.numel();
    for (std::int64_t i = 0; i < n; ++i) visit(i, i);
    return;
  }
  const TileGeometry g = tile_geometry(shape);
  const std::int64_t tiles_per_row = g.padded_cols / kTileSize;
  std::int64_t logical = 0;
  for (std::int64_t b = 0; b < g.batch; ++b) {
    const std::int64_t base = b * g.padded_rows * g.padded_cols;
    for (std::int64_t r = 0; r < g.rows; ++r) {
      for (std::int64_t c = 0; c < g.cols; ++c) {
        const std::int64_t tile = (r / kTileSize) * tiles_per_row + c / kTileSize;
        visit(logical++, base + tile * kTileSize * kTileSize + (r % kTileSize) * kTileSize +
                             c % kTileSize);
      }
    }
  }
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return v.to_float();
  } else {
    return static_cast<double>(v);
  }
}

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16::from_float(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// Converts between host values of type T and storage of type S.
template <class T, class S>
S convert(T v) {
  if constexpr (std::is_same_v<T, S>) {
    return v;
  } else if constexpr (std::is_same_v<S, bfloat16> && std::is_same_v<T, float>) {
    return bfloat16::from_float(v);
  } else {
    return from_double<S>(to_double(v));
  }
}

}  // namespace

std::int64_t storage_elements(const Shape& shape, Layout layout) {
  if (layout == Layout::row_major) return shape.numel();
  const TileGeometry g = tile_geometry(shape);
  return g.batch * g.padded_rows * g.padded_cols;
}

std::size_t storage_bytes(const Shape& shape, DType dtype, Layout layout) {
  return static_cast<std::size_t>(storage_elements(shape, layout)) * dtype_size(dtype);
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, std::shared_ptr<std::vector<std::byte>> host,
               const Shape& shape, DType dtype, Layout layout)
    : buffer_(std::move(buffer)), host_(std::move(host)), shape_(shape), dtype_(dtype),
      layout_(layout) {}

template <HostElement T>
Tensor Tensor::from_vector(std::span<const T> values, const Shape& shape, DType dtype,
                           Layout layout) {
  RETRACE_CHECK(static_cast<std::int64_t>(values.size()) == shape.numel(), invalid_argument,
                "from_vector: {} values do not fill shape {} ({} elements)", values.size(),
                shape, shape.numel());
  Tensor tensor = empty_host(shape, dtype, layout);
  std::byte* raw = tensor.host_->data();
  dispatch_dtype(dtype, [&]<class S>(S) {
    S* out = reinterpret_cast<S*>(raw);
    for_each_element(shape, layout,
                     [&](std::int64_t i, std::int64_t s) { out[s] = convert<T, S>(values[i]); });
  });
  return tensor;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device& device, Layout layout) {
  return Tensor(device.allocate(storage_bytes(shape, dtype, layout)), nullptr, shape, dtype,
                layout);
}

Tensor Tensor::empty_host(const Shape& shape, DType dtype, Layout layout) {
  return Tensor(nullptr,
                std::make_shared<std::vector<std::byte>>(storage_bytes(shape, dtype, layout)),
                shape, dtype, layout);
}

std::size_t Tensor::nbytes() const noexcept {
  if (buffer_) return storage_bytes(shape_, dtype_, layout_);
  return host_ ? host_->size() : 0;
}

Device* Tensor::device() const noexcept { return buffer_ ? buffer_->device() : nullptr; }

std::uint64_t Tensor::address() const noexcept { return buffer_ ? buffer_->address() : 0; }

std::span<const std::byte> Tensor::host_bytes() const noexcept {
  return host_ ? std::span<const std::byte>(*host_) : std::span<const std::byte>();
}

std::span<std::byte> Tensor::host_bytes_mutable() const noexcept {
  return host_ ? std::span<std::byte>(*host_) : std::span<std::byte>();
}

void Tensor::check_not_null(std::string_view what, std::string_view argument) const {
  RETRACE_CHECK(!is_null(), invalid_argument, "{}: {} is a null tensor", what, argument);
}

Tensor Tensor::to_device(Device& device, QueueId queue, Blocking blocking) const {
  check_not_null("to_device", "the tensor");
  if (on_device()) {
    if (this->device() == &device) return *this;
    return to_host().to_device(device, queue, blocking);
  }
  Tensor result = empty(shape_, dtype_, device, layout_);
  device.write(queue, *result.buffer_, 0, *host_, blocking);
  return result;
}

Tensor Tensor::to_host(QueueId queue) const {
  check_not_null("to_host", "the tensor");
  if (on_host()) return *this;
  Device* owner = device();
  RETRACE_CHECK(owner != nullptr, failed_precondition,
                "to_host: the tensor's device was closed; its contents are gone");
  Tensor result = empty_host(shape_, dtype_, layout_);
  owner->read(queue, *buffer_, 0, *result.host_);
  return result;
}

template <HostElement T>
std::vector<T> Tensor::to_vector(QueueId queue) const {
  const Tensor host = to_host(queue);
  std::vector<T> values(static_cast<std::size_t>(numel()));
  const std::byte* raw = host.host_->data();
  dispatch_dtype(dtype_, [&]<class S>(S) {
    const S* in = reinterpret_cast<const S*>(raw);
    for_each_element(shape_, layout_,
                     [&](std::int64_t i, std::int64_t s) { values[i] = convert<S, T>(in[s]); });
  });
  return values;
}

Tensor Tensor::clone(QueueId queue) const {
  check_not_null("clone", "the tensor");
  if (on_host()) {
    return Tensor(nullptr, std::make_shared<std::vector<std::byte>>(*host_), shape_, dtype_,
                  layout_);
  }
  Device* owner = device();
  RETRACE_CHECK(owner != nullptr, failed_precondition, "clone: the tensor's device was closed");
  Tensor result = empty(shape_, dtype_, *owner, layout_);
  ops::copy(*this, result, queue);
  return result;
}

Tensor Tensor::with_shape(const Shape& shape) const {
  check_not_null("with_shape", "the tensor");
  RETRACE_CHECK(layout_ == Layout::row_major, invalid_argument,
                "with_shape: a {} tensor cannot be reshaped in place; convert it to row_major",
                layout_);
  RETRACE_CHECK(shape.numel() == numel(), invalid_argument,
                "with_shape: shape {} ({} elements) does not match the tensor's shape {} ({} "
                "elements)",
                shape, shape.numel(), shape_, numel());
  return Tensor(buffer_, host_, shape, dtype_, layout_);
}

std::string Tensor::to_string() const {
  if (is_null()) return "Tensor(null)";
  const std::string where =
      on_host() ? std::string("host")
                : fmt::format("{} @0x{:x}", device() ? device()->name() : "closed device",
                              address());
  return fmt::format("Tensor({}, {}, {}, {})", shape_, dtype_, layout_, where);
}

#define RETRACE_INSTANTIATE(T)                                                              \
  template Tensor Tensor::from_vector<T>(std::span<const T>, const Shape&, DType, Layout); \
  template std::vector<T> Tensor::to_vector<T>(QueueId) const;
RETRACE_INSTANTIATE(float)
RETRACE_INSTANTIATE(double)
RETRACE_INSTANTIATE(bfloat16)
RETRACE_INSTANTIATE(std::int32_t)
RETRACE_INSTANTIATE(std::uint32_t)
RETRACE_INSTANTIATE(std::uint8_t)
#undef RETRACE_INSTANTIATE

}  // namespace retrace
