// Tensor: a cheap, shared handle on host or device storage with a shape, dtype and layout.
//
// Copies of a Tensor share storage (like ttnn.Tensor or torch::Tensor); clone() makes a deep
// copy. A default-constructed Tensor is null, and every API rejects a null tensor by name.
//
// A device tensor may be a strided view of its storage (what permute, transpose, slice, split,
// chunk and expand return: no copy is made, and writes to the storage show through every view
// of it). strides() and storage_offset() are in elements; is_contiguous() says whether the
// elements lie densely in row-major order. Ops read views directly or copy them first (as
// ops::contiguous does); they write only contiguous outputs, except ops::copy and ops::fill,
// which write through any view whose elements do not overlap.
//
//   auto x = retrace::Tensor::from_vector<float>(values, {2, 64}, retrace::DType::bfloat16);
//   auto d = x.to_device(*device);          // host -> device on queue 0
//   std::vector<float> back = d.to_vector<float>();
#pragma once

#include "retrace/bfloat16.hpp"
#include "retrace/float16.hpp"
#include "retrace/device.hpp"
#include "retrace/shape.hpp"
#include "retrace/types.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace retrace {

// Host element types a tensor can be made from or read into.
template <class T>
concept HostElement = std::same_as<T, float> || std::same_as<T, double> ||
                      std::same_as<T, bfloat16> || std::same_as<T, float16> ||
                      std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
                      std::same_as<T, std::uint32_t> || std::same_as<T, std::uint8_t>;

// Bytes a tensor of this shape, dtype and layout occupies (tile layout pads the last two dims).
[[nodiscard]] std::size_t storage_bytes(const Shape& shape, DType dtype, Layout layout);
// Elements in storage, counting tile padding.
[[nodiscard]] std::int64_t storage_elements(const Shape& shape, Layout layout);

class Tensor {
 public:
  Tensor() = default;  // null

  // Host tensor from values (converted to dtype: to bfloat16 and float16 rounds to nearest even,
  // once, from double values too).
  template <HostElement T>
  [[nodiscard]] static Tensor from_vector(std::span<const T> values, const Shape& shape,
                                          DType dtype, Layout layout = Layout::row_major);
  template <HostElement T>
  [[nodiscard]] static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                                          DType dtype, Layout layout = Layout::row_major) {
    return from_vector(std::span<const T>(values), shape, dtype, layout);
  }
  // Uninitialised storage on a device (contents unspecified) or on the host (zeros).
  [[nodiscard]] static Tensor empty(const Shape& shape, DType dtype, Device& device,
                                    Layout layout = Layout::row_major);
  [[nodiscard]] static Tensor empty_host(const Shape& shape, DType dtype,
                                         Layout layout = Layout::row_major);
  // A host tensor over storage someone else owns (a mapped file, a framework's buffer): no
  // copy is made; `storage` keeps that memory alive and holds storage_bytes(shape, dtype,
  // layout) bytes in the tensor's layout.
  [[nodiscard]] static Tensor from_host_storage(std::shared_ptr<std::byte> storage,
                                                const Shape& shape, DType dtype,
                                                Layout layout = Layout::row_major);

  [[nodiscard]] bool is_null() const noexcept { return !buffer_ && !host_; }
  // True for the marker keep_slot() returns (see below).
  [[nodiscard]] bool is_keep_slot() const noexcept;
  explicit operator bool() const noexcept { return !is_null(); }
  [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  [[nodiscard]] Layout layout() const noexcept { return layout_; }
  [[nodiscard]] std::int64_t numel() const noexcept { return shape_.numel(); }
  // Bytes of the elements this handle spans: tile padding included; for a view, the view's
  // own elements (numel x element size), not the whole storage.
  [[nodiscard]] std::size_t nbytes() const noexcept { return bytes_; }
  // Element strides, one per dimension (row-major ones for a contiguous tensor).
  [[nodiscard]] std::span<const std::int64_t> strides() const noexcept {
    return {strides_.data(), shape_.rank()};
  }
  // Elements between the start of the storage and this tensor's first element.
  [[nodiscard]] std::int64_t storage_offset() const noexcept { return offset_; }
  // True when the elements lie densely in row-major order from storage_offset() (extents of 1
  // and empty tensors count as contiguous whatever their strides).
  [[nodiscard]] bool is_contiguous() const noexcept { return contiguous_; }
  [[nodiscard]] bool on_device() const noexcept { return buffer_ != nullptr; }
  [[nodiscard]] bool on_host() const noexcept { return host_ != nullptr; }
  // The device holding the storage; nullptr for host tensors (and once the device is closed).
  [[nodiscard]] Device* device() const noexcept;
  // Device address of the first element (storage_offset() included; what a trace bakes in); 0
  // for host tensors.
  [[nodiscard]] std::uint64_t address() const noexcept;
  [[nodiscard]] const std::shared_ptr<Buffer>& buffer() const noexcept { return buffer_; }
  // Raw host storage (padding included); empty for device tensors.
  [[nodiscard]] std::span<const std::byte> host_bytes() const noexcept;
  [[nodiscard]] std::span<std::byte> host_bytes_mutable() const noexcept;

  // Host -> device (writes on `queue`); device -> the same device returns *this; device ->
  // another device goes through the host.
  [[nodiscard]] Tensor to_device(Device& device, QueueId queue = kDefaultQueue,
                                 Blocking blocking = Blocking::yes) const;
  // Device -> host after the queue's earlier work; host -> *this.
  [[nodiscard]] Tensor to_host(QueueId queue = kDefaultQueue) const;
  // The logical elements in row-major order (tile padding removed), converted to T.
  template <HostElement T>
  [[nodiscard]] std::vector<T> to_vector(QueueId queue = kDefaultQueue) const;
  // A deep copy with its own storage (device copies run on `queue` and are traceable).
  [[nodiscard]] Tensor clone(QueueId queue = kDefaultQueue) const;

  // A handle on the same storage with another shape of the same element count; a contiguous
  // tensor only (ops::reshape copies a strided view first).
  [[nodiscard]] Tensor with_shape(const Shape& shape) const;
  // A view of this device tensor's storage (torch's as_strided): `shape` with element `strides`
  // (>= 0, one per dimension) from `storage_offset` elements into the storage. Every element
  // it reaches must lie inside the storage (invalid_argument otherwise); row_major only.
  [[nodiscard]] Tensor as_strided(const Shape& shape, std::span<const std::int64_t> strides,
                                  std::int64_t storage_offset) const;

  // Stale outputs: a tracer's output is overwritten by every replay. The tracer's own output
  // objects follow (each replay stamps them); a copy taken before a later replay is stale, and
  // reading it (to_host, clone, passing it to an op) raises failed_precondition saying which
  // replay overwrote it. 0 for every tensor that is not a traced output.
  [[nodiscard]] std::uint64_t replay_version() const noexcept { return version_; }

  // "Tensor([2, 64], bfloat16, row_major, cpu:0 @0x7f...)".
  [[nodiscard]] std::string to_string() const;

  // Throws invalid_argument if null: "<what>: <argument> is a null tensor".
  void check_not_null(std::string_view what, std::string_view argument) const;
  // The device of a device tensor; throws invalid_argument for a null or host tensor and
  // failed_precondition naming the device once it is closed.
  [[nodiscard]] Device& require_device(std::string_view what, std::string_view argument) const;

 private:
  Tensor(std::shared_ptr<Buffer> buffer, std::shared_ptr<std::byte> host, const Shape& shape,
         DType dtype, Layout layout, std::size_t bytes);

  friend void detail::stamp_replay_version(Tensor& output, std::uint64_t version) noexcept;

  std::shared_ptr<Buffer> buffer_;
  std::shared_ptr<std::byte> host_;  // never null for a host tensor, even with 0 bytes
  std::size_t bytes_ = 0;
  std::size_t storage_bytes_ = 0;  // the whole storage's usable bytes (bounds of views)
  Shape shape_;
  std::array<std::int64_t, Shape::kMaxRank> strides_{};
  std::int64_t offset_ = 0;
  bool contiguous_ = true;
  DType dtype_ = DType::float32;
  Layout layout_ = Layout::row_major;
  std::uint64_t version_ = 0;  // the replay of its buffer this handle saw (see replay_version)
};

// Passed for a tensor input of a later traced call (Tracer, traced functions), the marker leaves
// that input's slot as it is: the replay reads what the slot holds, for example state the traced
// function itself updates in place (Python: None). Anywhere else it is an empty host tensor, and
// at a capture it is an invalid_argument error (there is no slot yet).
[[nodiscard]] const Tensor& keep_slot() noexcept;

}  // namespace retrace
