#include "retrace/tensor.hpp"
#include "retrace/round_to_odd.hpp"
#include "retrace/backend/float_to_int.hpp"

#include "retrace/dtype_dispatch.hpp"
#include "retrace/error.hpp"
#include "retrace/ops.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

namespace retrace {

namespace {

struct TileGeometry {
  std::int64_t batch, rows, cols, padded_rows, padded_cols;
};

// Throws naming the shape when its tile-padded storage would overflow a 64-bit count.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const Shape& shape, Layout layout) {
  std::int64_t out = 0;
  RETRACE_CHECK(!__builtin_mul_overflow(a, b, &out), invalid_argument,
                "a {} tensor of shape {} would need more than 2^63 - 1 storage elements", layout,
                shape);
  return out;
}

TileGeometry tile_geometry(const Shape& shape) {
  const std::size_t rank = shape.rank();
  const std::int64_t cols = rank >= 1 ? shape[-1] : 1;
  const std::int64_t rows = rank >= 2 ? shape[-2] : 1;
  std::int64_t batch = 1;
  for (std::size_t i = 0; i + 2 < rank; ++i) batch *= shape.dims()[i];
  // Extents fit in 63 bits, so padding one up to a multiple of 32 cannot overflow.
  auto pad = [](std::int64_t n) { return n / kTileSize * kTileSize + (n % kTileSize ? kTileSize : 0); };
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
constexpr bool kHalfFloat = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

template <class T>
double to_double(T v) {
  if constexpr (kHalfFloat<T>) {
    return v.to_float();
  } else {
    return static_cast<double>(v);
  }
}

// Converts between host values of type T and storage of type S.
template <class T, class S>
S convert(T v) {
  if constexpr (std::is_same_v<T, S>) {
    return v;
  } else if constexpr (std::is_integral_v<T> && std::is_integral_v<S>) {
    return static_cast<S>(v);  // integer to integer: exact, or wraps (as typecast does)
  } else if constexpr (std::is_integral_v<T> && std::is_same_v<S, float>) {
    return static_cast<float>(v);  // one rounding (through double would round twice for int64)
  } else if constexpr (std::is_integral_v<S>) {
    return detail::float_to_int<S>(to_double(v));  // truncates, saturates, NaN 0 (as typecast)
  } else if constexpr (kHalfFloat<S> && std::is_same_v<T, float>) {
    return S::from_float(v);
  } else {
    return detail::narrow_from_double<S>(to_double(v));
  }
}

// Row-major strides of `shape` into `strides`.
void row_major_strides(const Shape& shape, std::array<std::int64_t, Shape::kMaxRank>& strides) {
  std::int64_t step = 1;
  for (std::size_t i = shape.rank(); i-- > 0;) {
    strides[i] = step;
    step *= std::max<std::int64_t>(shape.dims()[i], 1);
  }
}

// Whether `strides` lay `shape` out densely in row-major order (extent-1 dimensions and empty
// shapes excepted).
bool dense_row_major(const Shape& shape, std::span<const std::int64_t> strides) {
  if (shape.numel() == 0) return true;
  std::int64_t step = 1;
  for (std::size_t i = shape.rank(); i-- > 0;) {
    const std::int64_t extent = shape.dims()[i];
    if (extent == 1) continue;
    if (strides[i] != step) return false;
    step *= extent;
  }
  return true;
}

}  // namespace

std::int64_t storage_elements(const Shape& shape, Layout layout) {
  if (layout == Layout::row_major) return shape.numel();
  const TileGeometry g = tile_geometry(shape);
  if (g.padded_rows == 0 || g.padded_cols == 0) return 0;
  return checked_mul(checked_mul(g.batch, g.padded_rows, shape, layout), g.padded_cols, shape,
                     layout);
}

std::size_t storage_bytes(const Shape& shape, DType dtype, Layout layout) {
  const std::int64_t elements = storage_elements(shape, layout);
  std::int64_t bytes = 0;
  RETRACE_CHECK(!__builtin_mul_overflow(elements, static_cast<std::int64_t>(dtype_size(dtype)),
                                        &bytes),
                invalid_argument,
                "a {} {} tensor of shape {} would need more than 2^63 - 1 bytes of storage", dtype,
                layout, shape);
  return static_cast<std::size_t>(bytes);
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, std::shared_ptr<std::byte> host,
               const Shape& shape, DType dtype, Layout layout, std::size_t bytes)
    : buffer_(std::move(buffer)), host_(std::move(host)), bytes_(bytes), storage_bytes_(bytes),
      shape_(shape), dtype_(dtype), layout_(layout) {
  row_major_strides(shape_, strides_);
}

template <HostElement T>
Tensor Tensor::from_vector(std::span<const T> values, const Shape& shape, DType dtype,
                           Layout layout) {
  RETRACE_CHECK(static_cast<std::int64_t>(values.size()) == shape.numel(), invalid_argument,
                "from_vector: {} values do not fill shape {} ({} elements)", values.size(),
                shape, shape.numel());
  Tensor tensor = empty_host(shape, dtype, layout);
  std::byte* raw = tensor.host_.get();
  if (dtype == DType::bool_) {  // nonzero (NaN included) is true, as typecast to bool
    auto* out = reinterpret_cast<std::uint8_t*>(raw);
    for_each_element(shape, layout, [&](std::int64_t i, std::int64_t s) {
      out[s] = to_double(values[i]) != 0.0 ? 1 : 0;
    });
    return tensor;
  }
  dispatch_dtype(dtype, [&]<class S>(S) {
    S* out = reinterpret_cast<S*>(raw);
    for_each_element(shape, layout,
                     [&](std::int64_t i, std::int64_t s) { out[s] = convert<T, S>(values[i]); });
  });
  return tensor;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device& device, Layout layout) {
  const std::size_t bytes = storage_bytes(shape, dtype, layout);
  return Tensor(device.allocate(bytes), nullptr, shape, dtype, layout, bytes);
}

namespace {
std::byte keep_slot_storage{};
}  // namespace

const Tensor& keep_slot() noexcept {
  static const Tensor marker = Tensor::from_host_storage(
      std::shared_ptr<std::byte>(&keep_slot_storage, [](std::byte*) {}), Shape{0},
      DType::float32);
  return marker;
}

bool Tensor::is_keep_slot() const noexcept { return host_.get() == &keep_slot_storage; }

Tensor Tensor::empty_host(const Shape& shape, DType dtype, Layout layout) {
  const std::size_t bytes = storage_bytes(shape, dtype, layout);
  // At least one byte, so even an empty host tensor has storage (and a non-null pointer).
  std::shared_ptr<std::byte[]> storage(new std::byte[std::max<std::size_t>(bytes, 1)]());
  return Tensor(nullptr, std::shared_ptr<std::byte>(storage, storage.get()), shape, dtype, layout,
                bytes);
}

Tensor Tensor::from_host_storage(std::shared_ptr<std::byte> storage, const Shape& shape,
                                 DType dtype, Layout layout) {
  RETRACE_CHECK(storage != nullptr, invalid_argument,
                "from_host_storage: the storage pointer is null");
  const std::size_t bytes = storage_bytes(shape, dtype, layout);
  return Tensor(nullptr, std::move(storage), shape, dtype, layout, bytes);
}

Device* Tensor::device() const noexcept { return buffer_ ? buffer_->device() : nullptr; }

std::uint64_t Tensor::address() const noexcept {
  if (!buffer_) return 0;
  return buffer_->address() + static_cast<std::uint64_t>(offset_) * dtype_size(dtype_);
}

std::span<const std::byte> Tensor::host_bytes() const noexcept {
  return host_ ? std::span<const std::byte>(host_.get(), bytes_) : std::span<const std::byte>();
}

std::span<std::byte> Tensor::host_bytes_mutable() const noexcept {
  return host_ ? std::span<std::byte>(host_.get(), bytes_) : std::span<std::byte>();
}

void Tensor::check_not_null(std::string_view what, std::string_view argument) const {
  RETRACE_CHECK(!is_null(), invalid_argument, "{}: {} is a null tensor", what, argument);
}

Device& Tensor::require_device(std::string_view what, std::string_view argument) const {
  check_not_null(what, argument);
  RETRACE_CHECK(on_device(), invalid_argument,
                "{}: {} is a host tensor; move it to a device with to_device() first", what,
                argument);
  Device* open = buffer_->device();
  if (open == nullptr) [[unlikely]] {
    return buffer_->link().require_open(fmt::format("{}: {}", what, argument));
  }
  const std::uint64_t current = buffer_->replay_version();
  RETRACE_CHECK(version_ == current, failed_precondition,
                "{}: {} is a stale copy of a traced output: replay {} of its trace overwrote the "
                "output after this copy was taken{}. Read the tracer's own output object "
                "(the reference a traced call returns), or clone() an output to keep it across "
                "replays",
                what, argument, current,
                version_ == 0 ? "" : fmt::format(" (the copy holds replay {})", version_));
  return *open;
}

void detail::stamp_replay_version(Tensor& output, std::uint64_t version) noexcept {
  output.version_ = version;
  output.buffer_->replay_version_.store(version, std::memory_order_relaxed);
}

Tensor Tensor::to_device(Device& device, QueueId queue, Blocking blocking) const {
  check_not_null("to_device", "the tensor");
  if (on_device()) {
    if (&require_device("to_device", "the tensor") == &device) return *this;
    return to_host().to_device(device, queue, blocking);
  }
  Tensor result = empty(shape_, dtype_, device, layout_);
  device.write(queue, *result.buffer_, 0, host_bytes(), blocking);
  return result;
}

Tensor Tensor::to_host(QueueId queue) const {
  check_not_null("to_host", "the tensor");
  if (on_host()) return *this;
  Device& owner = require_device("to_host", "the tensor");
  if (!contiguous_) return ops::contiguous(*this, queue).to_host(queue);
  Tensor result = empty_host(shape_, dtype_, layout_);
  owner.read(queue, *buffer_, static_cast<std::size_t>(offset_) * dtype_size(dtype_),
             result.host_bytes_mutable());
  return result;
}

template <HostElement T>
std::vector<T> Tensor::to_vector(QueueId queue) const {
  const Tensor host = to_host(queue);
  std::vector<T> values(static_cast<std::size_t>(numel()));
  const std::byte* raw = host.host_.get();
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
    Tensor copy = empty_host(shape_, dtype_, layout_);
    std::copy_n(host_.get(), bytes_, copy.host_.get());
    return copy;
  }
  Tensor result = empty(shape_, dtype_, require_device("clone", "the tensor"), layout_);
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
  RETRACE_CHECK(contiguous_, invalid_argument,
                "with_shape: the tensor is a strided view (shape {}, strides [{}]); call "
                "ops::contiguous() first, or ops::reshape, which copies it",
                shape_, fmt::join(strides(), ", "));
  Tensor view(buffer_, host_, shape, dtype_, layout_, bytes_);
  view.storage_bytes_ = storage_bytes_;
  view.offset_ = offset_;
  view.version_ = version_;  // a view of a traced output goes stale with it
  return view;
}

Tensor Tensor::as_strided(const Shape& shape, std::span<const std::int64_t> strides,
                          std::int64_t storage_offset) const {
  constexpr std::string_view what = "as_strided";
  (void)require_device(what, "the tensor");
  RETRACE_CHECK(layout_ == Layout::row_major, invalid_argument,
                "{}: a {} tensor has no strided views; convert it to row_major", what, layout_);
  RETRACE_CHECK(strides.size() == shape.rank(), invalid_argument,
                "{}: {} strides given for shape {} (one per dimension)", what, strides.size(),
                shape);
  RETRACE_CHECK(storage_offset >= 0, invalid_argument, "{}: storage offset {} is negative", what,
                storage_offset);
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype_));
  const std::int64_t capacity = static_cast<std::int64_t>(storage_bytes_) / elem;
  std::int64_t last = storage_offset;  // the furthest element reached
  for (std::size_t i = 0; i < shape.rank(); ++i) {
    RETRACE_CHECK(strides[i] >= 0, invalid_argument,
                  "{}: stride {} of dimension {} is negative (flip copies instead)", what,
                  strides[i], i);
    if (shape.numel() == 0) continue;
    std::int64_t reach = 0;
    RETRACE_CHECK(!__builtin_mul_overflow(shape.dims()[i] - 1, strides[i], &reach) &&
                      !__builtin_add_overflow(last, reach, &last),
                  invalid_argument, "{}: shape {} with strides [{}] overflows 64-bit offsets",
                  what, shape, fmt::join(strides, ", "));
  }
  RETRACE_CHECK(shape.numel() == 0 || last < capacity, invalid_argument,
                "{}: shape {} with strides [{}] from offset {} reaches element {}, past the "
                "storage's {} elements",
                what, shape, fmt::join(strides, ", "), storage_offset, last, capacity);
  Tensor view(buffer_, host_, shape, dtype_, layout_,
              static_cast<std::size_t>(shape.numel() * elem));
  view.storage_bytes_ = storage_bytes_;
  std::copy(strides.begin(), strides.end(), view.strides_.begin());
  view.offset_ = shape.numel() == 0 ? 0 : storage_offset;  // an empty view reaches nothing
  view.contiguous_ = dense_row_major(shape, strides);
  if (view.contiguous_) row_major_strides(shape, view.strides_);  // canonical strides
  view.version_ = version_;
  return view;
}

std::string Tensor::to_string() const {
  if (is_null()) return "Tensor(null)";
  const std::string where =
      on_host() ? std::string("host")
                : fmt::format("{}{} @0x{:x}", buffer_->link().name,
                              device() ? "" : " (closed)", address());
  if (contiguous_) return fmt::format("Tensor({}, {}, {}, {})", shape_, dtype_, layout_, where);
  return fmt::format("Tensor({}, {}, {}, {}, strides [{}])", shape_, dtype_, layout_, where,
                     fmt::join(strides(), ", "));
}

#define RETRACE_INSTANTIATE(T)                                                              \
  template Tensor Tensor::from_vector<T>(std::span<const T>, const Shape&, DType, Layout); \
  template std::vector<T> Tensor::to_vector<T>(QueueId) const;
RETRACE_INSTANTIATE(float)
RETRACE_INSTANTIATE(double)
RETRACE_INSTANTIATE(bfloat16)
RETRACE_INSTANTIATE(float16)
RETRACE_INSTANTIATE(std::int32_t)
RETRACE_INSTANTIATE(std::int64_t)
RETRACE_INSTANTIATE(std::uint32_t)
RETRACE_INSTANTIATE(std::uint8_t)
#undef RETRACE_INSTANTIATE

}  // namespace retrace
