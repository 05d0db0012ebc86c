// Device-neutral ops. Each op checks its inputs (null, host, device, dtype, layout, shape),
// allocates its outputs on the inputs' device and enqueues a kernel on a queue (default 0).
// Ops run eagerly or, inside a trace capture, are recorded for replay.
//
//   auto y = retrace::ops::add(x, 1.0);       // x + 1, new tensor
//   retrace::ops::mul(x, w, /*out=*/y);       // y = x * w, in place
//   retrace::ops::copy(src, dst);             // dst <- src (device or host src)
#pragma once

#include "retrace/tensor.hpp"

namespace retrace::ops {

// A new device tensor with every element set to value.
[[nodiscard]] Tensor full(const Shape& shape, double value, Device& device,
                          DType dtype = DType::float32, Layout layout = Layout::row_major,
                          QueueId queue = kDefaultQueue);
void fill(const Tensor& tensor, double value, QueueId queue = kDefaultQueue);

// dst <- src. src on dst's device: a device-to-device copy (traceable). src on the host: a
// host write (not allowed during a capture). Shapes, dtypes and layouts must match.
void copy(const Tensor& src, const Tensor& dst, QueueId queue = kDefaultQueue);

[[nodiscard]] Tensor add(const Tensor& a, const Tensor& b, QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor add(const Tensor& a, double b, QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor mul(const Tensor& a, const Tensor& b, QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor mul(const Tensor& a, double b, QueueId queue = kDefaultQueue);
// out= forms: write into an existing tensor of the result's shape, dtype and layout.
void add(const Tensor& a, const Tensor& b, const Tensor& out, QueueId queue = kDefaultQueue);
void add(const Tensor& a, double b, const Tensor& out, QueueId queue = kDefaultQueue);
void mul(const Tensor& a, const Tensor& b, const Tensor& out, QueueId queue = kDefaultQueue);
void mul(const Tensor& a, double b, const Tensor& out, QueueId queue = kDefaultQueue);

// Device-side check: a NaN or infinity in `tensor` fails the queue with a sticky device error
// naming this op, reported at the next synchronize, replay or read.
void assert_finite(const Tensor& tensor, QueueId queue = kDefaultQueue);

}  // namespace retrace::ops
