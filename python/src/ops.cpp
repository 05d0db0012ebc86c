// retrace.ops: every op of the C++ library, with keyword arguments and out=.
#include "bindings.hpp"
#include "retrace/random.hpp"

#include "retrace/error.hpp"
#include "retrace/ops.hpp"

#include <algorithm>
#include <array>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <tuple>
#include <vector>

namespace retrace::python {
namespace {

Tensor optional_tensor(const Tensor* t) { return t != nullptr ? *t : Tensor{}; }

const Tensor& tensor_arg(nb::handle value, std::string_view what, std::string_view argument) {
  RETRACE_CHECK(nb::isinstance<Tensor>(value), invalid_argument,
                "{}: {} must be a retrace.Tensor, got {}", what, argument,
                nb::type_name(value.type()).c_str());
  return *nb::inst_ptr<Tensor>(value);
}

// A Python sequence of tensors (argument `tensors` of `what`).
std::vector<Tensor> tensor_list(nb::handle tensors, std::string_view what) {
  RETRACE_CHECK(nb::isinstance<nb::sequence>(tensors), invalid_argument,
                "{}: tensors must be a sequence of retrace.Tensor", what);
  std::vector<Tensor> list;
  std::size_t i = 0;
  for (nb::handle t : nb::iter(tensors)) {
    list.push_back(tensor_arg(t, what, fmt::format("tensors[{}]", i++)));
  }
  return list;
}

// The result, or `out` after an out= call.
// A tensor result as a Python object (typed Tensor in the stubs).
using TensorObject = nb::typed<nb::object, Tensor>;
TensorObject tensor_object(Tensor t) { return nb::borrow<TensorObject>(nb::cast(std::move(t))); }

template <class Make, class Into>
TensorObject with_out(nb::handle out, Make&& make, Into&& into,
                                       std::string_view what) {
  if (out.is_none()) return tensor_object(make());
  into(tensor_arg(out, what, "out"));
  return nb::borrow<nb::typed<nb::object, Tensor>>(out);
}

template <auto TensorOp, auto ScalarOp, auto TensorOut, auto ScalarOut>
void def_binary(nb::module_& ops, const char* name, const char* doc) {
  ops.def(
      name,
      [name](const Tensor& a, nb::handle b, nb::handle out, nb::handle queue) {
        const QueueId q = parse_queue(queue);
        if (nb::isinstance<Tensor>(b)) {
          const Tensor& bt = *nb::inst_ptr<Tensor>(b);
          return with_out(
              out, [&] { return TensorOp(a, bt, q); }, [&](const Tensor& o) { TensorOut(a, bt, o, q); },
              name);
        }
        double scalar = 0;
        RETRACE_CHECK(nb::try_cast(b, scalar), invalid_argument,
                      "{}: b must be a retrace.Tensor or a number, got {}", name,
                      nb::type_name(b.type()).c_str());
        return with_out(
            out, [&] { return ScalarOp(a, scalar, q); },
            [&](const Tensor& o) { ScalarOut(a, scalar, o, q); }, name);
      },
      nb::arg("a"), nb::arg("b"), nb::kw_only(), nb::arg("out") = nb::none(),
      nb::arg("queue") = nb::none(), doc);
}

template <auto Op, auto Out>
void def_unary(nb::module_& ops, const char* name) {
  ops.def(
      name,
      [name](const Tensor& a, nb::handle out, nb::handle queue) {
        const QueueId q = parse_queue(queue);
        return with_out(out, [&] { return Op(a, q); }, [&](const Tensor& o) { Out(a, o, q); }, name);
      },
      nb::arg("a"), nb::kw_only(), nb::arg("out") = nb::none(), nb::arg("queue") = nb::none());
}

ops::KeepDim keep(bool keepdim) { return keepdim ? ops::KeepDim::yes : ops::KeepDim::no; }

// Moves `dim` last for a last-dimension kernel and back (softmax along any dimension).
template <class F>
Tensor along(const Tensor& a, std::int64_t dim, QueueId q, F&& f) {
  a.check_not_null("softmax", "a");
  const auto rank = static_cast<std::int64_t>(a.shape().rank());
  const std::int64_t d = dim < 0 ? dim + rank : dim;
  RETRACE_CHECK(d >= 0 && d < std::max<std::int64_t>(rank, 1), invalid_argument,
                "dim {} is out of range for a tensor of rank {}", dim, rank);
  if (rank == 0 || d == rank - 1) return f(a);
  return ops::transpose(f(ops::transpose(a, d, rank - 1, q)), d, rank - 1, q);
}

}  // namespace

void bind_ops(nb::module_& m) {
  nb::module_ ops = m.def_submodule("ops", "Device-neutral ops (eager, or recorded in a capture).");

  ops.def(
      "full",
      [](nb::handle shape, double value, nb::handle device, nb::handle dtype, Layout layout,
         nb::handle queue) {
        const auto dims = int_list(shape, "full", "shape");
        return ops::full(Shape(std::span<const std::int64_t>(dims)), value,
                         device_of(device, "full"),
                         dtype.is_none() ? DType::float32 : parse_dtype(dtype), layout,
                         parse_queue(queue));
      },
      nb::arg("shape"), nb::arg("value"), nb::arg("device"), nb::arg("dtype") = nb::none(),
      nb::arg("layout") = Layout::row_major, nb::arg("queue") = nb::none());
  ops.def(
      "zeros",
      [](nb::handle shape, nb::handle device, nb::handle dtype, Layout layout, nb::handle queue) {
        const auto dims = int_list(shape, "zeros", "shape");
        return ops::full(Shape(std::span<const std::int64_t>(dims)), 0.0,
                         device_of(device, "zeros"),
                         dtype.is_none() ? DType::float32 : parse_dtype(dtype), layout,
                         parse_queue(queue));
      },
      nb::arg("shape"), nb::arg("device"), nb::arg("dtype") = nb::none(),
      nb::arg("layout") = Layout::row_major, nb::arg("queue") = nb::none());
  ops.def(
      "arange",
      [](double start, std::optional<double> end, double step, nb::handle device,
         nb::handle dtype, nb::handle queue) {
        if (!end) {  // arange(end)
          end = start;
          start = 0.0;
        }
        return ops::arange(start, *end, step, device_of(device, "arange"),
                           dtype.is_none() ? DType::float32 : parse_dtype(dtype),
                           parse_queue(queue));
      },
      nb::arg("start"), nb::arg("end") = nb::none(), nb::arg("step") = 1.0, nb::kw_only(),
      nb::arg("device"), nb::arg("dtype") = nb::none(), nb::arg("queue") = nb::none(),
      "[start, start + step, ...) below end (arange(n): 0 .. n-1), on the device.");
  nb::class_<Generator>(m, "Generator",
                        "A counter-based random generator (Philox4x32-10) whose state (seed, "
                        "offset) lives on the device: draws inside a trace advance it on every "
                        "replay.")
      .def(
          "__init__",
          [](Generator* self, nb::handle device, std::uint64_t seed) {
            new (self) Generator(device_of(device, "Generator"), seed);
          },
          nb::arg("device"), nb::arg("seed") = 0, nb::keep_alive<1, 2>())
      .def("manual_seed", [](Generator& g, std::uint64_t seed) { g.manual_seed(seed); },
           nb::arg("seed"), "Reseed (offset back to 0).")
      .def_prop_rw(
          "offset", [](const Generator& g) { return g.offset(); },
          [](Generator& g, std::uint64_t offset) { g.set_offset(offset); },
          "Draws made since seeding (read from the device).")
      .def_prop_ro("seed", [](const Generator& g) { return g.seed(); })
      .def_prop_ro("state", [](const Generator& g) { return g.state(); },
                   "uint32 [4] device tensor: seed low, seed high, offset low, offset high.");
  const auto def_random = [&ops](const char* name, auto make, auto into, const char* doc) {
    ops.def(
        name,
        [name, make, into](nb::handle shape, Generator& gen, nb::handle dtype, nb::handle out,
                           nb::handle queue) {
          const QueueId q = parse_queue(queue);
          if (!out.is_none()) {
            RETRACE_CHECK(shape.is_none(), invalid_argument,
                          "{}: give a shape or out=, not both", name);
            into(gen, tensor_arg(out, name, "out"), q);
            return nb::borrow<TensorObject>(out);
          }
          const auto dims = int_list(shape, name, "shape");
          return tensor_object(make(Shape(std::span<const std::int64_t>(dims)), gen,
                                    dtype.is_none() ? DType::float32 : parse_dtype(dtype), q));
        },
        nb::arg("shape") = nb::none(), nb::kw_only(), nb::arg("generator"),
        nb::arg("dtype") = nb::none(), nb::arg("out") = nb::none(), nb::arg("queue") = nb::none(),
        doc);
  };
  def_random(
      "randn",
      [](const Shape& s, Generator& g, DType d, QueueId q) { return ops::randn(s, g, d, q); },
      [](Generator& g, const Tensor& o, QueueId q) { ops::randn(g, o, q); },
      "Standard normal values from one draw of `generator` (advances it by one).");
  def_random(
      "rand",
      [](const Shape& s, Generator& g, DType d, QueueId q) { return ops::rand(s, g, d, q); },
      [](Generator& g, const Tensor& o, QueueId q) { ops::rand(g, o, q); },
      "Uniform values in [0, 1) from one draw of `generator` (advances it by one).");
#define RETRACE_PY_COMPARE(name)                                                           \
  ops.def(                                                                                 \
      #name,                                                                               \
      [](const Tensor& a, nb::handle b, nb::handle out, nb::handle queue) {                \
        const QueueId q = parse_queue(queue);                                              \
        if (!nb::isinstance<Tensor>(b)) {                                                  \
          RETRACE_CHECK(out.is_none(), invalid_argument,                                   \
                        #name ": out= takes a tensor b, not a scalar");                    \
          return tensor_object(ops::name(a, nb::cast<double>(b), q));                           \
        }                                                                                  \
        const Tensor& bt = *nb::inst_ptr<Tensor>(b);                                       \
        return with_out(out, [&] { return ops::name(a, bt, q); },                          \
                        [&](const Tensor& o) { ops::name(a, bt, o, q); }, #name);          \
      },                                                                                   \
      nb::arg("a"), nb::arg("b"), nb::kw_only(), nb::arg("out") = nb::none(),              \
      nb::arg("queue") = nb::none(), "Elementwise comparison: a bool tensor.");
  RETRACE_PY_COMPARE(eq)
  RETRACE_PY_COMPARE(ne)
  RETRACE_PY_COMPARE(lt)
  RETRACE_PY_COMPARE(le)
  RETRACE_PY_COMPARE(gt)
  RETRACE_PY_COMPARE(ge)
#undef RETRACE_PY_COMPARE
  ops.def(
      "where",
      [](const Tensor& cond, nb::handle a_in, nb::handle b_in, nb::handle out, nb::handle queue) {
        const QueueId q = parse_queue(queue);
        // A number for a or b (as torch.where's scalars): a 0-d tensor of the other's dtype
        // (float32 when both are numbers) on cond's device.
        const Tensor* other = nullptr;
        Tensor a_t, b_t;
        if (nb::try_cast(a_in, a_t)) other = &a_t;
        if (nb::try_cast(b_in, b_t) && other == nullptr) other = &b_t;
        auto operand = [&](nb::handle v, Tensor& t, const char* name) {
          if (!t.is_null()) return;
          RETRACE_CHECK(nb::isinstance<nb::float_>(v) || nb::isinstance<nb::int_>(v) ||
                            nb::isinstance<nb::bool_>(v),
                        invalid_argument, "where: {} must be a tensor or a number, got {}", name,
                        nb::type_name(v.type()).c_str());
          RETRACE_CHECK(cond.device() != nullptr, invalid_argument,
                        "where: cond is on the host; a number operand needs cond on a device");
          t = ops::full(Shape{}, nb::cast<double>(v), *cond.device(),
                        other != nullptr ? other->dtype() : DType::float32, Layout::row_major, q);
        };
        operand(a_in, a_t, "a");
        operand(b_in, b_t, "b");
        return with_out(out, [&] { return ops::where(cond, a_t, b_t, q); },
                        [&](const Tensor& o) { ops::where(cond, a_t, b_t, o, q); }, "where");
      },
      nb::arg("cond"), nb::arg("a"), nb::arg("b"), nb::kw_only(), nb::arg("out") = nb::none(),
      nb::arg("queue") = nb::none(),
      "cond ? a : b elementwise (cond bool; broadcasting; a or b may be a number, as "
      "torch.where).");
  ops.def(
      "masked_fill",
      [](const Tensor& a, const Tensor& mask, double value, nb::handle queue) {
        return ops::masked_fill(a, mask, value, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("mask"), nb::arg("value"), nb::kw_only(),
      nb::arg("queue") = nb::none(), "a with value where mask (bool) is true.");
  for (auto [name, fn] : {std::pair{"logical_and", &ops::logical_and},
                          std::pair{"logical_or", &ops::logical_or},
                          std::pair{"logical_xor", &ops::logical_xor}}) {
    ops.def(
        name,
        [fn](const Tensor& a, const Tensor& b, nb::handle queue) {
          return fn(a, b, parse_queue(queue));
        },
        nb::arg("a"), nb::arg("b"), nb::kw_only(), nb::arg("queue") = nb::none(),
        "Elementwise logic on truth values (nonzero is true), broadcasting; bool results.");
  }
  ops.def(
      "logical_not",
      [](const Tensor& a, nb::handle queue) { return ops::logical_not(a, parse_queue(queue)); },
      nb::arg("a"), nb::kw_only(), nb::arg("queue") = nb::none(),
      "True where a is zero (false); bool results.");
  ops.def(
      "embedding",
      [](const Tensor& weight, const Tensor& indices, nb::handle queue) {
        return ops::embedding(weight, indices, parse_queue(queue));
      },
      nb::arg("weight"), nb::arg("indices"), nb::kw_only(), nb::arg("queue") = nb::none(),
      "Rows of weight [V, D] at int32 indices of any shape: [..., D] (torch's embedding).");
  ops.def(
      "index_select",
      [](const Tensor& a, std::int64_t dim, const Tensor& index, nb::handle queue) {
        return ops::index_select(a, dim, index, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("dim"), nb::arg("index"), nb::kw_only(),
      nb::arg("queue") = nb::none(), "a's slices at int32 indices along dim (torch.index_select).");
  ops.def(
      "gather",
      [](const Tensor& a, std::int64_t dim, const Tensor& index, nb::handle queue) {
        return ops::gather(a, dim, index, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("dim"), nb::arg("index"), nb::kw_only(),
      nb::arg("queue") = nb::none(), "Elements of a picked along dim by index (torch.gather).");
  ops.def(
      "fill", [](const Tensor& t, double value, nb::handle queue) { ops::fill(t, value, parse_queue(queue)); },
      nb::arg("tensor"), nb::arg("value"), nb::kw_only(), nb::arg("queue") = nb::none());
  ops.def(
      "copy",
      [](const Tensor& src, const Tensor& dst, nb::handle queue) {
        ops::copy(src, dst, parse_queue(queue));
      },
      nb::arg("src"), nb::arg("dst"), nb::kw_only(), nb::arg("queue") = nb::none(),
      "dst <- src (device to device, traceable; or a host write).");
  ops.def(
      "assert_finite",
      [](const Tensor& t, nb::handle queue) { ops::assert_finite(t, parse_queue(queue)); },
      nb::arg("tensor"), nb::kw_only(), nb::arg("queue") = nb::none());

#define RETRACE_PY_BINARY(name, doc)                                                              \
  def_binary<static_cast<Tensor (*)(const Tensor&, const Tensor&, QueueId)>(&ops::name),        \
             static_cast<Tensor (*)(const Tensor&, double, QueueId)>(&ops::name),               \
             static_cast<void (*)(const Tensor&, const Tensor&, const Tensor&, QueueId)>(&ops::name), \
             static_cast<void (*)(const Tensor&, double, const Tensor&, QueueId)>(&ops::name)>( \
      ops, #name, doc)
  RETRACE_PY_BINARY(add, "a + b (numpy broadcasting).");
  RETRACE_PY_BINARY(sub, "a - b (numpy broadcasting).");
  RETRACE_PY_BINARY(mul, "a * b (numpy broadcasting).");
  RETRACE_PY_BINARY(div, "a / b in the operands' dtype (integers truncate; x / 0 is 0).");
  RETRACE_PY_BINARY(maximum, "Elementwise maximum (NaN propagates).");
  RETRACE_PY_BINARY(minimum, "Elementwise minimum (NaN propagates).");
  RETRACE_PY_BINARY(pow, "a ** b.");
  RETRACE_PY_BINARY(floor_divide,
                    "a // b: the quotient rounded toward -inf (integers: x // 0 is 0).");
  RETRACE_PY_BINARY(fmod, "The remainder of a / b with the sign of a (C's fmod).");
  RETRACE_PY_BINARY(remainder,
                    "a % b: the remainder with the sign of b (integers: x % 0 is 0).");
  RETRACE_PY_BINARY(true_divide,
                    "a / b in floating point (integers promote to float32, as torch and the "
                    "`/` operator).");
#undef RETRACE_PY_BINARY

#define RETRACE_PY_UNARY(name)                                                                  \
  def_unary<static_cast<Tensor (*)(const Tensor&, QueueId)>(&ops::name),                       \
            static_cast<void (*)(const Tensor&, const Tensor&, QueueId)>(&ops::name)>(ops, #name)
  RETRACE_PY_UNARY(neg);
  RETRACE_PY_UNARY(abs);
  RETRACE_PY_UNARY(exp);
  RETRACE_PY_UNARY(log);
  RETRACE_PY_UNARY(sqrt);
  RETRACE_PY_UNARY(rsqrt);
  RETRACE_PY_UNARY(tanh);
  RETRACE_PY_UNARY(sigmoid);
  RETRACE_PY_UNARY(relu);
  RETRACE_PY_UNARY(silu);
  RETRACE_PY_UNARY(gelu);
  RETRACE_PY_UNARY(gelu_tanh);
  RETRACE_PY_UNARY(sin);
  RETRACE_PY_UNARY(cos);
  RETRACE_PY_UNARY(square);
  RETRACE_PY_UNARY(erf);
  RETRACE_PY_UNARY(floor);
  RETRACE_PY_UNARY(ceil);
  RETRACE_PY_UNARY(round);
  RETRACE_PY_UNARY(trunc);
#undef RETRACE_PY_UNARY

  ops.def(
      "clamp",
      [](const Tensor& a, std::optional<double> lo, std::optional<double> hi, nb::handle out,
         nb::handle queue) {
        const QueueId q = parse_queue(queue);
        return with_out(
            out, [&] { return ops::clamp(a, lo, hi, q); },
            [&](const Tensor& o) { ops::clamp(a, lo, hi, o, q); }, "clamp");
      },
      nb::arg("a"), nb::arg("min") = nb::none(), nb::arg("max") = nb::none(), nb::kw_only(),
      nb::arg("out") = nb::none(), nb::arg("queue") = nb::none());

  // dim: one dimension, or (sum, mean, max, min) a sequence of them as torch's dim=(2, 3):
  // reduced one after the other, from the last, keeping them until the end (a mean divides
  // once by the product of their extents).
  const auto reduce_dims = [](const Tensor& a, nb::handle dim, bool keepdim, const char* op,
                              bool many, auto&& one) -> Tensor {
    if (nb::isinstance<nb::int_>(dim)) return one(a, nb::cast<std::int64_t>(dim), keepdim);
    RETRACE_CHECK(many, invalid_argument, "{}: dim must be one integer", op);
    std::vector<std::int64_t> dims = int_list(dim, op, "dim");
    const auto rank = static_cast<std::int64_t>(a.shape().rank());
    RETRACE_CHECK(!dims.empty(), invalid_argument, "{}: dim is an empty sequence", op);
    for (std::int64_t& d : dims) {
      RETRACE_CHECK(d >= -rank && d < rank, invalid_argument,
                    "{}: dimension {} is out of range for a tensor of rank {}", op, d, rank);
      if (d < 0) d += rank;
    }
    std::sort(dims.begin(), dims.end());
    RETRACE_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), invalid_argument,
                  "{}: a dimension appears twice in dim", op);
    Tensor r = a;
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) r = one(r, *it, true);
    if (keepdim) return r;
    std::vector<std::int64_t> shape;
    for (std::int64_t d = 0; d < rank; ++d) {
      if (!std::binary_search(dims.begin(), dims.end(), d)) shape.push_back(r.shape()[d]);
    }
    return ops::reshape(r, std::span<const std::int64_t>(shape));
  };
#define RETRACE_PY_REDUCE(name, many)                                                           \
  ops.def(                                                                                      \
      #name,                                                                                    \
      [reduce_dims](const Tensor& a, nb::handle dim, bool keepdim, nb::handle queue) {          \
        const QueueId q = parse_queue(queue);                                                   \
        return reduce_dims(a, dim, keepdim, #name, many,                                        \
                           [q](const Tensor& t, std::int64_t d, bool k) {                       \
                             return ops::name(t, d, keep(k), q);                                \
                           });                                                                  \
      },                                                                                        \
      nb::arg("a"), nb::arg("dim") = -1, nb::arg("keepdim") = false, nb::kw_only(),             \
      nb::arg("queue") = nb::none(),                                                            \
      many ? "Reduction along `dim` (default: the last; or a sequence of dimensions, as "       \
             "torch's dim=(2, 3))."                                                            \
           : "Reduction along `dim` (default: the last).")
  RETRACE_PY_REDUCE(sum, true);
  RETRACE_PY_REDUCE(argmax, false);
  RETRACE_PY_REDUCE(max, true);
  RETRACE_PY_REDUCE(min, true);
#undef RETRACE_PY_REDUCE
  // mean over several dimensions: their sum divided once by the number of values summed.
  ops.def(
      "mean",
      [reduce_dims](const Tensor& a, nb::handle dim, bool keepdim, nb::handle queue) {
        const QueueId q = parse_queue(queue);
        if (nb::isinstance<nb::int_>(dim)) {
          return ops::mean(a, nb::cast<std::int64_t>(dim), keep(keepdim), q);
        }
        const Tensor total = reduce_dims(a, dim, keepdim, "mean", true,
                                         [q](const Tensor& t, std::int64_t d, bool k) {
                                           return ops::sum(t, d, keep(k), q);
                                         });
        const double count = static_cast<double>(a.numel()) /
                             static_cast<double>(std::max<std::int64_t>(total.numel(), 1));
        return ops::div(total, count, q);
      },
      nb::arg("a"), nb::arg("dim") = -1, nb::arg("keepdim") = false, nb::kw_only(),
      nb::arg("queue") = nb::none(),
      "Reduction along `dim` (default: the last; or a sequence of dimensions, as torch's "
      "dim=(2, 3)).");
  ops.def(
      "var",
      [](const Tensor& a, std::int64_t dim, double correction, bool keepdim, nb::handle queue) {
        return ops::var(a, dim, correction, keep(keepdim), parse_queue(queue));
      },
      nb::arg("a"), nb::arg("dim") = -1, nb::kw_only(), nb::arg("correction") = 1.0,
      nb::arg("keepdim") = false, nb::arg("queue") = nb::none());
  ops.def(
      "std",
      [](const Tensor& a, std::int64_t dim, double correction, bool keepdim, nb::handle queue) {
        return ops::std(a, dim, correction, keep(keepdim), parse_queue(queue));
      },
      nb::arg("a"), nb::arg("dim") = -1, nb::kw_only(), nb::arg("correction") = 1.0,
      nb::arg("keepdim") = false, nb::arg("queue") = nb::none());
  ops.def(
      "softmax",
      [](const Tensor& a, std::int64_t dim, nb::handle out, nb::handle queue) {
        const QueueId q = parse_queue(queue);
        if (!out.is_none()) {
          const auto rank = static_cast<std::int64_t>(a.shape().rank());
          RETRACE_CHECK(dim == -1 || dim == rank - 1, invalid_argument,
                        "softmax: out= is supported along the last dimension only (dim {})", dim);
        }
        return with_out(
            out, [&] { return along(a, dim, q, [&](const Tensor& x) { return ops::softmax(x, q); }); },
            [&](const Tensor& o) { ops::softmax(a, o, q); }, "softmax");
      },
      nb::arg("a"), nb::arg("dim") = -1, nb::kw_only(), nb::arg("out") = nb::none(),
      nb::arg("queue") = nb::none());
  ops.def(
      "log_softmax",
      [](const Tensor& a, std::int64_t dim, nb::handle queue) {
        return ops::log_softmax(a, dim, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("dim") = -1, nb::kw_only(), nb::arg("queue") = nb::none());
  ops.def(
      "layer_norm",
      [](const Tensor& a, const Tensor* weight, const Tensor* bias, double eps, nb::handle out,
         nb::handle queue) {
        const QueueId q = parse_queue(queue);
        const Tensor w = optional_tensor(weight), b = optional_tensor(bias);
        return with_out(
            out, [&] { return ops::layer_norm(a, w, b, eps, q); },
            [&](const Tensor& o) { ops::layer_norm(a, w, b, eps, o, q); }, "layer_norm");
      },
      nb::arg("a"), nb::arg("weight").none() = nb::none(), nb::arg("bias").none() = nb::none(),
      nb::arg("eps") = 1e-5, nb::kw_only(), nb::arg("out") = nb::none(),
      nb::arg("queue") = nb::none());
  ops.def(
      "rms_norm",
      [](const Tensor& a, const Tensor* weight, double eps, nb::handle out, nb::handle queue) {
        const QueueId q = parse_queue(queue);
        const Tensor w = optional_tensor(weight);
        return with_out(
            out, [&] { return ops::rms_norm(a, w, eps, q); },
            [&](const Tensor& o) { ops::rms_norm(a, w, eps, o, q); }, "rms_norm");
      },
      nb::arg("a"), nb::arg("weight").none() = nb::none(), nb::arg("eps") = 1e-6, nb::kw_only(),
      nb::arg("out") = nb::none(), nb::arg("queue") = nb::none());
  ops.def(
      "group_norm",
      [](const Tensor& x, std::int64_t groups, const Tensor* weight, const Tensor* bias,
         double eps, nb::handle queue) {
        return ops::group_norm(x, groups, optional_tensor(weight), optional_tensor(bias), eps,
                               parse_queue(queue));
      },
      nb::arg("x"), nb::arg("groups"), nb::arg("weight").none() = nb::none(),
      nb::arg("bias").none() = nb::none(), nb::arg("eps") = 1e-5, nb::kw_only(),
      nb::arg("queue") = nb::none());

  ops.def(
      "matmul",
      [](const Tensor& a, const Tensor& b, bool ta, bool tb, nb::handle out, nb::handle queue) {
        const QueueId q = parse_queue(queue);
        const auto tra = ta ? ops::Transpose::yes : ops::Transpose::no;
        const auto trb = tb ? ops::Transpose::yes : ops::Transpose::no;
        return with_out(
            out, [&] { return ops::matmul(a, b, tra, trb, q); },
            [&](const Tensor& o) { ops::matmul(a, b, o, tra, trb, q); }, "matmul");
      },
      nb::arg("a"), nb::arg("b"), nb::kw_only(), nb::arg("transpose_a") = false,
      nb::arg("transpose_b") = false, nb::arg("out") = nb::none(), nb::arg("queue") = nb::none());
  ops.def(
      "linear",
      [](const Tensor& x, const Tensor& weight, const Tensor* bias, nb::handle out,
         nb::handle queue) {
        const QueueId q = parse_queue(queue);
        const Tensor b = optional_tensor(bias);
        return with_out(
            out, [&] { return ops::linear(x, weight, b, q); },
            [&](const Tensor& o) { ops::linear(x, weight, b, o, q); }, "linear");
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("bias").none() = nb::none(), nb::kw_only(),
      nb::arg("out") = nb::none(), nb::arg("queue") = nb::none(),
      "x @ weight.T + bias (weight [out, in]).");
  ops.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask,
         std::optional<double> scale, bool is_causal, nb::handle out, nb::handle queue) {
        const QueueId qu = parse_queue(queue);
        const Tensor m = optional_tensor(mask);
        const auto causal = is_causal ? ops::Causal::yes : ops::Causal::no;
        return with_out(
            out, [&] { return ops::scaled_dot_product_attention(q, k, v, m, scale, causal, qu); },
            [&](const Tensor& o) {
              if (!is_causal) {
                ops::scaled_dot_product_attention(q, k, v, m, scale, o, qu);
              } else {
                ops::copy(ops::scaled_dot_product_attention(q, k, v, m, scale, causal, qu), o, qu);
              }
            },
            "scaled_dot_product_attention");
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask").none() = nb::none(),
      nb::kw_only(), nb::arg("scale") = nb::none(), nb::arg("is_causal") = false,
      nb::arg("out") = nb::none(), nb::arg("queue") = nb::none(),
      "softmax(q k^T * scale + mask) v; q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv].");

  ops.def(
      "reshape",
      [](const Tensor& a, nb::handle shape) {
        const auto dims = int_list(shape, "reshape", "shape");
        return ops::reshape(a, std::span<const std::int64_t>(dims));
      },
      nb::arg("a"), nb::arg("shape"), "A view with another shape (one extent may be -1).");
  ops.def(
      "permute",
      [](const Tensor& a, nb::handle dims, nb::handle queue) {
        const auto d = int_list(dims, "permute", "dims");
        return ops::permute(a, std::span<const std::int64_t>(d), parse_queue(queue));
      },
      nb::arg("a"), nb::arg("dims"), nb::kw_only(), nb::arg("queue") = nb::none(),
      "A view with the dimensions reordered (no copy).");
  ops.def(
      "transpose",
      [](const Tensor& a, std::int64_t d0, std::int64_t d1, nb::handle queue) {
        return ops::transpose(a, d0, d1, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("dim0"), nb::arg("dim1"), nb::kw_only(), nb::arg("queue") = nb::none());
  ops.def(
      "slice",
      [](const Tensor& a, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step,
         nb::handle queue) { return ops::slice(a, dim, start, end, step, parse_queue(queue)); },
      nb::arg("a"), nb::arg("dim"), nb::arg("start"), nb::arg("end"), nb::arg("step") = 1,
      nb::kw_only(), nb::arg("queue") = nb::none(),
      "A view of elements [start, end) with a step along dim (no copy).");
  ops.def(
      "split",
      [](const Tensor& a, nb::handle sizes, std::int64_t dim, nb::handle queue) {
        // torch.split: an integer is the size of every piece, a sequence the pieces' sizes.
        if (nb::isinstance<nb::int_>(sizes)) {
          return ops::split(a, nb::cast<std::int64_t>(sizes), dim, parse_queue(queue));
        }
        const auto s = int_list(sizes, "split", "sizes");
        return ops::split(a, std::span<const std::int64_t>(s), dim, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("sizes"), nb::arg("dim") = 0, nb::kw_only(),
      nb::arg("queue") = nb::none(),
      "Views along dim, as torch.split: sizes is the size of every piece (the last possibly "
      "smaller) or the list of the pieces' sizes.");
  ops.def(
      "chunk",
      [](const Tensor& a, std::int64_t chunks, std::int64_t dim, nb::handle queue) {
        return ops::chunk(a, chunks, dim, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("chunks"), nb::arg("dim") = 0, nb::kw_only(),
      nb::arg("queue") = nb::none());
  ops.def(
      "concat",
      [](nb::handle tensors, std::int64_t dim, nb::handle queue) {
        return ops::concat(tensor_list(tensors, "concat"), dim, parse_queue(queue));
      },
      nb::arg("tensors"), nb::arg("dim") = 0, nb::kw_only(), nb::arg("queue") = nb::none());
  ops.attr("cat") = ops.attr("concat");
  ops.def(
      "stack",
      [](nb::handle tensors, std::int64_t dim, nb::handle queue) {
        return ops::stack(tensor_list(tensors, "stack"), dim, parse_queue(queue));
      },
      nb::arg("tensors"), nb::arg("dim") = 0, nb::kw_only(), nb::arg("queue") = nb::none(),
      "torch.stack: the tensors along a new dimension.");
  // Ops that take a list of extents or dimensions.
  using ListOp = Tensor (*)(const Tensor&, std::span<const std::int64_t>, QueueId);
  for (const auto& [name, fn, arg, doc] : std::initializer_list<
           std::tuple<const char*, ListOp, const char*, const char*>>{
           {"expand", &ops::expand, "shape",
            "torch's expand, a view: extents of 1 broadcast to shape (-1 keeps one)."},
           {"repeat", &ops::repeat, "repeats", "torch's Tensor.repeat: the tensor tiled."},
           {"flip", &ops::flip, "dims", "torch.flip: elements reversed along dims."}}) {
    ops.def(
        name,
        [fn, name, arg](const Tensor& a, nb::handle values, nb::handle queue) {
          const auto v = int_list(values, name, arg);
          return fn(a, std::span<const std::int64_t>(v), parse_queue(queue));
        },
        nb::arg("a"), nb::arg(arg), nb::kw_only(), nb::arg("queue") = nb::none(), doc);
  }
  ops.def(
      "contiguous", [](const Tensor& a, nb::handle queue) {
        return ops::contiguous(a, parse_queue(queue));
      },
      nb::arg("a"), nb::kw_only(), nb::arg("queue") = nb::none(),
      "a itself when contiguous, else a dense copy of the view.");
  ops.def(
      "typecast",
      [](const Tensor& a, nb::handle dtype, nb::handle queue) {
        return ops::typecast(a, parse_dtype(dtype), parse_queue(queue));
      },
      nb::arg("a"), nb::arg("dtype"), nb::kw_only(), nb::arg("queue") = nb::none());
  ops.def(
      "to_layout",
      [](const Tensor& a, Layout layout, nb::handle queue) {
        return ops::to_layout(a, layout, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("layout"), nb::kw_only(), nb::arg("queue") = nb::none());
  ops.def(
      "pad",
      [](const Tensor& a, nb::handle pads, double value, nb::handle queue) {
        const std::vector<std::int64_t> p = int_list(pads, "pad", "pads");
        return ops::pad(a, p, value, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("pads"), nb::arg("value") = 0.0, nb::kw_only(),
      nb::arg("queue") = nb::none(),
      "Constant padding, torch.nn.functional.pad's order: (before, after) pairs from the last "
      "dimension.");
  // size: one integer for both dimensions (as torch's) or (out_h, out_w).
  const auto size_pair = [](nb::handle size, const char* op) {
    std::vector<std::int64_t> s = int_list(size, op, "size");
    if (s.size() == 1 && nb::isinstance<nb::int_>(size)) s.push_back(s[0]);
    RETRACE_CHECK(s.size() == 2, invalid_argument, "{}: size is (out_h, out_w), got {} values", op,
                  s.size());
    return s;
  };
  ops.def(
      "interpolate_nearest",
      [size_pair](const Tensor& a, nb::handle size, nb::handle queue) {
        const std::vector<std::int64_t> s = size_pair(size, "interpolate_nearest");
        return ops::interpolate_nearest(a, s[0], s[1], parse_queue(queue));
      },
      nb::arg("a"), nb::arg("size"), nb::kw_only(), nb::arg("queue") = nb::none(),
      "Nearest-neighbour resizing of the last two dimensions to size, as "
      "torch's interpolate(mode='nearest').");
  ops.def(
      "interpolate",
      [size_pair](const Tensor& a, nb::handle size, std::string_view mode, bool align_corners,
                  nb::handle scale_factor, bool recompute_scale_factor, nb::handle queue) {
        constexpr const char* op = "interpolate";
        ops::InterpolateOptions options;
        options.align_corners = align_corners;
        if (mode == "nearest") options.mode = ops::InterpolateMode::nearest;
        else if (mode == "nearest-exact") options.mode = ops::InterpolateMode::nearest_exact;
        else if (mode == "bilinear") options.mode = ops::InterpolateMode::bilinear;
        else if (mode == "bicubic") options.mode = ops::InterpolateMode::bicubic;
        else if (mode == "area") options.mode = ops::InterpolateMode::area;
        else {
          RETRACE_FAIL(invalid_argument,
                       "interpolate: mode '{}' is not one of 'nearest', 'nearest-exact', "
                       "'bilinear', 'bicubic', 'area'",
                       mode);
        }
        RETRACE_CHECK(size.is_none() != scale_factor.is_none(), invalid_argument,
                      "interpolate: give exactly one of size and scale_factor");
        if (!size.is_none()) {
          const std::vector<std::int64_t> s = size_pair(size, op);
          return ops::interpolate(a, s[0], s[1], options, parse_queue(queue));
        }
        // scale_factor: one number for both dimensions or (scale_h, scale_w).
        std::vector<double> f;
        const auto number = [&](nb::handle v) {
          RETRACE_CHECK(nb::isinstance<nb::float_>(v) || nb::isinstance<nb::int_>(v),
                        invalid_argument,
                        "interpolate: scale_factor must be a number or two, got {}",
                        nb::type_name(v.type()).c_str());
          f.push_back(nb::cast<double>(v));
        };
        if (nb::isinstance<nb::sequence>(scale_factor)) {
          for (nb::handle v : nb::iter(scale_factor)) number(v);
        } else {
          number(scale_factor);
          f.push_back(f[0]);
        }
        RETRACE_CHECK(f.size() == 2, invalid_argument,
                      "interpolate: scale_factor is one number or (scale_h, scale_w), got {} "
                      "values",
                      f.size());
        options.recompute_scale_factor = recompute_scale_factor;
        return ops::interpolate_scaled(a, f[0], f[1], options, parse_queue(queue));
      },
      nb::arg("a"), nb::arg("size").none() = nb::none(), nb::arg("mode") = "nearest",
      nb::arg("align_corners") = false, nb::kw_only(),
      nb::arg("scale_factor").none() = nb::none(), nb::arg("recompute_scale_factor") = false,
      nb::arg("queue") = nb::none(),
      "Resizing of the last two dimensions [..., H, W] to size = (out_h, out_w) (or one integer "
      "for both), or by scale_factor (a number, or (scale_h, scale_w)), as "
      "torch.nn.functional.interpolate(size=... or scale_factor=..., mode=...): mode 'nearest', "
      "'nearest-exact', 'bilinear', 'bicubic' (align_corners as torch's) or 'area'. With "
      "scale_factor the output is floor(in * factor) and the positions are read through "
      "1 / factor, as torch's (unless recompute_scale_factor=True, which reads them through the "
      "sizes).");
  ops.def(
      "conv2d",
      [](const Tensor& x, const Tensor& weight, const Tensor* bias, nb::handle stride,
         nb::handle padding, nb::handle dilation, std::int64_t groups, nb::handle queue) {
        const auto pair = [](nb::handle v, const char* name) {
          std::vector<std::int64_t> p = int_list(v, "conv2d", name);
          if (p.size() == 1) p.push_back(p[0]);
          RETRACE_CHECK(p.size() == 2, invalid_argument,
                        "conv2d: {} is one integer or two, got {} values", name, p.size());
          return std::array<std::int64_t, 2>{p[0], p[1]};
        };
        ops::Conv2dOptions options;
        options.stride = pair(stride, "stride");
        options.padding = pair(padding, "padding");
        options.dilation = pair(dilation, "dilation");
        options.groups = groups;
        return ops::conv2d(x, weight, optional_tensor(bias), options, parse_queue(queue));
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("bias").none() = nb::none(), nb::kw_only(),
      nb::arg("stride") = 1, nb::arg("padding") = 0, nb::arg("dilation") = 1,
      nb::arg("groups") = 1, nb::arg("queue") = nb::none(),
      "2-D convolution as torch's conv2d: x [N, C, H, W], weight [O, C / groups, kh, kw].");
}

}  // namespace retrace::python
