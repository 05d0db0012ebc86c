// Devices, dtypes and tensors: retrace.open_device, retrace.Tensor, numpy and DLPack both ways.
#include "bindings.hpp"

#include "retrace/error.hpp"
#include "retrace/ops.hpp"
#include "retrace/registry.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace retrace::python {
namespace {

std::unordered_map<const Device*, PyDevice*>& live_devices() {
  static std::unordered_map<const Device*, PyDevice*> devices;
  return devices;
}

// --- references released without the GIL -------------------------------------------------------
// A host tensor made over a Python array keeps that array alive; its last owner may be a device
// queue's thread, which must not touch Python. Such releases wait here for the next call that
// holds the GIL.
std::mutex g_graveyard_mutex;
std::vector<nb::ndarray<nb::ro>*> g_graveyard;
std::atomic<bool> g_graveyard_full{false};

void release_array(nb::ndarray<nb::ro>* array) {
  if (PyGILState_Check() != 0) {
    delete array;
    return;
  }
  std::lock_guard lock(g_graveyard_mutex);
  g_graveyard.push_back(array);
  g_graveyard_full.store(true, std::memory_order_release);
}

// --- dtypes -------------------------------------------------------------------------------------

std::optional<DType> dtype_from_dlpack(nb::dlpack::dtype d) {
  using Code = nb::dlpack::dtype_code;
  if (d.lanes != 1) return std::nullopt;
  const auto code = static_cast<Code>(d.code);
  if (code == Code::Float && d.bits == 32) return DType::float32;
  if (code == Code::Bfloat && d.bits == 16) return DType::bfloat16;
  if (code == Code::Float && d.bits == 16) return DType::float16;
  if (code == Code::Int && d.bits == 32) return DType::int32;
  if (code == Code::UInt && d.bits == 32) return DType::uint32;
  if (code == Code::UInt && d.bits == 8) return DType::uint8;
  if (code == Code::Bool && d.bits == 8) return DType::bool_;
  return std::nullopt;
}

nb::dlpack::dtype dlpack_from_dtype(DType dtype) {
  switch (dtype) {
    case DType::float32: return nb::dtype<float>();
    case DType::bfloat16:
      return nb::dlpack::dtype{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::float16:
      return nb::dlpack::dtype{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::int32: return nb::dtype<std::int32_t>();
    case DType::uint32: return nb::dtype<std::uint32_t>();
    case DType::int64: return nb::dtype<std::int64_t>();
    case DType::uint8: return nb::dtype<std::uint8_t>();
    case DType::bool_: return nb::dtype<bool>();
  }
  return nb::dtype<float>();
}

std::string describe_dlpack(nb::dlpack::dtype d) {
  using Code = nb::dlpack::dtype_code;
  const char* kind = "unknown";
  switch (static_cast<Code>(d.code)) {
    case Code::Int: kind = "int"; break;
    case Code::UInt: kind = "uint"; break;
    case Code::Float: kind = "float"; break;
    case Code::Bfloat: kind = "bfloat"; break;
    case Code::Complex: kind = "complex"; break;
    case Code::Bool: return "bool";
  }
  return fmt::format("{}{}", kind, d.bits);
}

// --- arrays in ----------------------------------------------------------------------------------

using Array = nb::ndarray<nb::ro, nb::device::cpu>;

// The elements of `a` in C order, as T (a gather for any strides).
template <class Src, class T>
std::vector<T> gather(const Array& a) {
  const std::size_t rank = a.ndim();
  std::size_t count = 1;
  for (std::size_t i = 0; i < rank; ++i) count *= a.shape(i);
  std::vector<T> out;
  out.reserve(count);
  if (count == 0) return out;
  const auto* base = static_cast<const Src*>(a.data());
  std::vector<std::size_t> index(rank, 0);
  for (std::size_t n = 0; n < count; ++n) {
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < rank; ++i) offset += static_cast<std::int64_t>(index[i]) * a.stride(i);
    out.push_back(static_cast<T>(base[offset]));
    for (std::size_t i = rank; i-- > 0;) {
      if (++index[i] < a.shape(i)) break;
      index[i] = 0;
    }
  }
  return out;
}

bool c_contiguous(const Array& a) {
  std::int64_t expected = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= static_cast<std::int64_t>(a.shape(i));
  }
  return true;
}

template <class T>
Tensor tensor_from(std::vector<T> values, const Shape& shape, DType dtype) {
  return Tensor::from_vector<T>(values, shape, dtype);
}

// A 16-bit float array's elements, bits unchanged.
template <class Half>
std::vector<Half> gather_bits(const Array& a) {
  auto raw = gather<std::uint16_t, std::uint16_t>(a);
  std::vector<Half> values(raw.size());
  std::memcpy(values.data(), raw.data(), raw.size() * sizeof(std::uint16_t));
  return values;
}

Tensor convert_array(const Array& a, const Shape& shape, std::optional<DType> wanted,
                     std::string_view what) {
  using Code = nb::dlpack::dtype_code;
  const nb::dlpack::dtype d = a.dtype();
  const auto code = static_cast<Code>(d.code);
  if (const auto native = dtype_from_dlpack(d)) {
    const DType target = wanted.value_or(*native);
    switch (*native) {
      case DType::float32: return tensor_from(gather<float, float>(a), shape, target);
      case DType::bfloat16: return tensor_from(gather_bits<bfloat16>(a), shape, target);
      case DType::float16: return tensor_from(gather_bits<float16>(a), shape, target);
      case DType::int32: return tensor_from(gather<std::int32_t, std::int32_t>(a), shape, target);
      case DType::uint32:
        return tensor_from(gather<std::uint32_t, std::uint32_t>(a), shape, target);
      case DType::uint8:
      case DType::bool_:
        return tensor_from(gather<std::uint8_t, std::uint8_t>(a), shape, target);
    }
  }
  if (code == Code::Float && d.bits == 64 && d.lanes == 1) {
    return tensor_from(gather<double, double>(a), shape, wanted.value_or(DType::float32));
  }
  if (code == Code::Int && d.bits == 64 && d.lanes == 1) {
    // numpy's default integer becomes int32 (range-checked) unless int64 is asked for.
    const DType target = wanted.value_or(DType::int32);
    auto values = gather<std::int64_t, std::int64_t>(a);
    if (target == DType::int64) return tensor_from(std::move(values), shape, target);
    if (!dtype_info(target).is_floating) {
      const std::int64_t lo = target == DType::int32 ? std::numeric_limits<std::int32_t>::min() : 0;
      const std::int64_t hi = target == DType::int32   ? std::numeric_limits<std::int32_t>::max()
                              : target == DType::uint32 ? std::numeric_limits<std::uint32_t>::max()
                                                        : 255;
      for (std::size_t i = 0; i < values.size(); ++i) {
        RETRACE_CHECK(values[i] >= lo && values[i] <= hi, invalid_argument,
                      "{}: element {} of the int64 array is {}, outside the range of {} "
                      "(pass dtype=retrace.int64 to keep 64 bits)",
                      what, i, values[i], dtype_name(target));
      }
    }
    return tensor_from(gather<std::int64_t, double>(a), shape, target);
  }
  RETRACE_FAIL(invalid_argument,
               "{}: arrays of {} cannot become retrace tensors (retrace has float32, bfloat16, "
               "float16, int32, uint32, int64, uint8 and bool; float64 arrays are converted)",
               what, describe_dlpack(d));
}

Shape shape_of(const Array& a, std::string_view what) {
  RETRACE_CHECK(a.ndim() <= Shape::kMaxRank, invalid_argument,
                "{}: the array has rank {}, retrace tensors have rank at most {}", what, a.ndim(),
                Shape::kMaxRank);
  std::vector<std::int64_t> dims(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) dims[i] = static_cast<std::int64_t>(a.shape(i));
  return Shape(std::span<const std::int64_t>(dims));
}

// --- tensors out --------------------------------------------------------------------------------

// An ndarray over a host tensor's storage (row-major), kept alive by a copy of the handle.
template <class... Extra>
nb::ndarray<Extra...> view_of_host(const Tensor& host) {
  auto* keep = new Tensor(host);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<std::size_t> shape(host.shape().dims().begin(), host.shape().dims().end());
  void* data = const_cast<std::byte*>(host.host_bytes().data());
  return nb::ndarray<Extra...>(data, shape.size(), shape.data(), owner, nullptr,
                               dlpack_from_dtype(host.dtype()), nb::device::cpu::value, 0);
}

// A row-major host tensor holding t's values (t itself when it already is one).
Tensor row_major_host(const Tensor& t, QueueId queue) {
  t.check_not_null("numpy", "tensor");
  Tensor host = t.on_host() ? t : t.to_host(queue);
  if (host.layout() != Layout::row_major) {
    host = ops::to_layout(host.to_device(*t.device()), Layout::row_major, queue).to_host(queue);
  }
  return host;
}

nb::object tensor_numpy(const Tensor& t, nb::handle queue) {
  const QueueId q = parse_queue(queue);
  if (t.dtype() == DType::bfloat16) {
    // numpy has no bfloat16: the values come out as float32 (exactly).
    auto values = new std::vector<float>(t.to_vector<float>(q));
    nb::capsule owner(values, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    std::vector<std::size_t> shape(t.shape().dims().begin(), t.shape().dims().end());
    return nb::cast(nb::ndarray<nb::numpy, float>(values->data(), shape.size(), shape.data(),
                                                  owner));
  }
  if (t.on_host() && t.layout() == Layout::row_major) return nb::cast(view_of_host<nb::numpy>(t));
  return nb::cast(view_of_host<nb::numpy>(row_major_host(t, q)));
}

nb::tuple shape_tuple(const Shape& shape) {
  nb::list dims;
  for (std::int64_t d : shape.dims()) dims.append(d);
  return nb::tuple(dims);
}

// A tensor of a's shape and device (and dtype, unless given) filled with value: the left
// operand of `value <op> a`.
Tensor scalar_like(const Tensor& a, double value, const char* op,
                   std::optional<DType> dtype = std::nullopt) {
  return ops::full(a.shape(), value, a.require_device(op, "a"), dtype.value_or(a.dtype()));
}

// a <op> b for the Python operators (b a Tensor or a number).
Tensor binary_operator(const Tensor& a, nb::handle b, std::string_view op) {
  using TensorOp = Tensor (*)(const Tensor&, const Tensor&, QueueId);
  using ScalarOp = Tensor (*)(const Tensor&, double, QueueId);
  struct Entry {
    std::string_view name;
    TensorOp tensor;
    ScalarOp scalar;
  };
  static const Entry table[] = {
      {"add", &ops::add, &ops::add}, {"sub", &ops::sub, &ops::sub}, {"mul", &ops::mul, &ops::mul},
      {"div", &ops::div, &ops::div}, {"pow", &ops::pow, &ops::pow},
      {"floor_divide", &ops::floor_divide, &ops::floor_divide},
      {"remainder", &ops::remainder, &ops::remainder},
      {"true_divide", &ops::true_divide, &ops::true_divide}};
  for (const Entry& e : table) {
    if (e.name != op) continue;
    if (nb::isinstance<Tensor>(b)) return e.tensor(a, *nb::inst_ptr<Tensor>(b), kDefaultQueue);
    double scalar = 0;
    if (!nb::try_cast(b, scalar)) throw nb::next_overload();
    return e.scalar(a, scalar, kDefaultQueue);
  }
  throw nb::next_overload();
}

// --- indexing: views ------------------------------------------------------------------------------

// t[key] as numpy's basic indexing does it, as a view of t's storage: integers (negative from the
// end; a dimension is dropped), slices with a positive step, None (a new dimension of 1) and one
// Ellipsis, alone or in a tuple.
Tensor index_view(const Tensor& t, nb::handle key) {
  constexpr std::string_view what = "Tensor indexing";
  (void)t.require_device(what, "the tensor");
  std::vector<nb::handle> items;
  if (PyTuple_Check(key.ptr()) != 0) {
    for (nb::handle item : nb::borrow<nb::tuple>(key)) items.push_back(item);
  } else {
    items.push_back(key);
  }
  const std::size_t rank = t.shape().rank();
  std::size_t consuming = 0, ellipses = 0;
  for (nb::handle item : items) {
    if (item.ptr() == Py_Ellipsis) {
      ++ellipses;
    } else if (!item.is_none()) {
      ++consuming;
    }
  }
  RETRACE_CHECK(ellipses <= 1, invalid_argument, "{}: more than one Ellipsis (...)", what);
  RETRACE_CHECK(consuming <= rank, invalid_argument,
                "{}: {} indices for a tensor of rank {} (shape {})", what, consuming, rank,
                t.shape());
  std::vector<std::int64_t> dims, strides;
  std::int64_t offset = t.storage_offset();
  std::size_t d = 0;  // the next dimension of t
  auto keep = [&](std::size_t count) {
    for (std::size_t i = 0; i < count; ++i, ++d) {
      dims.push_back(t.shape().dims()[d]);
      strides.push_back(t.strides()[d]);
    }
  };
  for (nb::handle item : items) {
    if (item.is_none()) {
      dims.push_back(1);
      strides.push_back(0);
    } else if (item.ptr() == Py_Ellipsis) {
      keep(rank - consuming);
    } else if (PySlice_Check(item.ptr()) != 0) {
      Py_ssize_t start = 0, stop = 0, step = 0;
      if (PySlice_Unpack(item.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
      RETRACE_CHECK(step > 0, invalid_argument,
                    "{}: slice step {} along dimension {}: only positive steps make views "
                    "(ops.flip reverses, as a copy)",
                    what, step, d);
      const std::int64_t extent = t.shape().dims()[d];
      const Py_ssize_t length =
          PySlice_AdjustIndices(static_cast<Py_ssize_t>(extent), &start, &stop, step);
      if (length > 0) offset += start * t.strides()[d];
      dims.push_back(length);
      strides.push_back(t.strides()[d] * (length > 1 ? step : 1));
      ++d;
    } else {
      std::int64_t index = 0;
      if (!nb::try_cast(item, index) || PyBool_Check(item.ptr()) != 0) {
        RETRACE_FAIL(invalid_argument,
                     "{}: index {} is a {}; integers, slices, None and ... index a tensor (use "
                     "ops.index_select or ops.gather with an index tensor)",
                     what, nb::repr(item).c_str(), nb::type_name(item.type()).c_str());
      }
      const std::int64_t extent = t.shape().dims()[d];
      if (index < -extent || index >= extent) {
        PyErr_Format(PyExc_IndexError, "index %lld is out of range for dimension %zu of size %lld",
                     static_cast<long long>(index), d, static_cast<long long>(extent));
        throw nb::python_error();
      }
      offset += (index < 0 ? index + extent : index) * t.strides()[d];
      ++d;
    }
  }
  keep(rank - d);
  return t.as_strided(Shape(std::span<const std::int64_t>(dims)), strides, offset);
}

// t[key] = value: a number fills the view, a tensor (or array) of a shape that broadcasts to it
// is copied in.
void index_assign(const Tensor& t, nb::handle key, nb::handle value) {
  const Tensor view = index_view(t, key);
  double scalar = 0;
  if (!nb::isinstance<Tensor>(value) && nb::try_cast(value, scalar)) {
    ops::fill(view, scalar);
    return;
  }
  Tensor source = nb::isinstance<Tensor>(value)
                      ? *nb::inst_ptr<Tensor>(value)
                      : host_tensor_from_array(value, view.dtype(), "Tensor indexing");
  if (source.on_host()) source = source.to_device(*view.device());
  if (!(source.shape() == view.shape())) {
    const std::vector<std::int64_t> to(view.shape().dims().begin(), view.shape().dims().end());
    source = ops::expand(source, to);
  }
  ops::copy(source, view);
}

}  // namespace

// --- PyDevice -----------------------------------------------------------------------------------

PyDevice::PyDevice(std::unique_ptr<Device> device)
    : device_(std::move(device)), name_(device_->name()) {
  live_devices()[device_.get()] = this;
}
PyDevice::PyDevice(Device* member, std::string mesh_name)
    : member_(member), name_(member->name()), mesh_name_(std::move(mesh_name)) {
  live_devices()[member_] = this;
}
void PyDevice::detach() noexcept {
  if (member_ == nullptr) return;
  live_devices().erase(member_);
  member_ = nullptr;
}
PyDevice::~PyDevice() {
  if (member_ != nullptr) {
    detach();
    return;
  }
  live_devices().erase(device_.get());
  // Closing waits for queued work, which may drop the last reference to a Python array.
  if (device_) {
    nb::gil_scoped_release release;
    device_.reset();
  }
}
Device& PyDevice::get(std::string_view what) const {
  RETRACE_CHECK(!closed(), failed_precondition, "{}: {} was closed", what, name_);
  return *raw();
}
void PyDevice::close() {
  RETRACE_CHECK(member_ == nullptr, failed_precondition,
                "close: {} is a member of {}; close the mesh", name_, mesh_name_);
  if (!device_) return;
  nb::gil_scoped_release release;
  device_->close();
}
nb::object PyDevice::find(const Device* device) {
  if (device == nullptr) return nb::none();
  const auto it = live_devices().find(device);
  if (it == live_devices().end()) return nb::none();
  return nb::find(it->second);
}

Device& device_of(nb::handle device, std::string_view what) {
  RETRACE_CHECK(nb::isinstance<PyDevice>(device), invalid_argument,
                "{}: expected a retrace.Device, got {}", what,
                nb::type_name(device.type()).c_str());
  return nb::cast<PyDevice&>(device).get(what);
}

DType parse_dtype(nb::handle spec) {
  if (nb::isinstance<DType>(spec)) return nb::cast<DType>(spec);
  std::string name;
  if (nb::isinstance<nb::str>(spec)) {
    name = nb::cast<std::string>(spec);
  } else if (nb::hasattr(spec, "dtype") || nb::isinstance<nb::type_object>(spec) ||
             nb::hasattr(spec, "itemsize")) {
    // numpy dtypes and scalar types (np.float32), torch dtypes (torch.float32)
    nb::object text = nb::str(spec);
    name = nb::cast<std::string>(text);
    if (nb::hasattr(spec, "name") && !nb::isinstance<nb::type_object>(spec)) {
      name = nb::cast<std::string>(spec.attr("name"));
    } else if (nb::hasattr(spec, "__name__")) {
      name = nb::cast<std::string>(spec.attr("__name__"));
    }
  } else {
    name = nb::cast<std::string>(nb::str(spec));
  }
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  for (const auto& info : kDTypeTable) {
    if (info.name == name) return info.dtype;
  }
  RETRACE_FAIL(invalid_argument, "unknown dtype {} (retrace dtypes: float32, bfloat16, float16, "
               "int32, uint32, int64, uint8, bool)", nb::cast<std::string>(nb::repr(spec)));
}

std::optional<DType> parse_optional_dtype(nb::handle spec) {
  if (spec.is_none()) return std::nullopt;
  return parse_dtype(spec);
}

QueueId parse_queue(nb::handle queue) {
  if (queue.is_none()) return kDefaultQueue;
  const auto value = nb::cast<std::int64_t>(queue);
  RETRACE_CHECK(value >= 0 && value < 64, invalid_argument,
                "queue {} is out of range (queues are numbered from 0)", value);
  return QueueId{static_cast<std::uint32_t>(value)};
}

void drain_released_references() {
  if (!g_graveyard_full.load(std::memory_order_acquire)) return;
  std::vector<nb::ndarray<nb::ro>*> dead;
  {
    std::lock_guard lock(g_graveyard_mutex);
    dead.swap(g_graveyard);
    g_graveyard_full.store(false, std::memory_order_relaxed);
  }
  for (auto* array : dead) delete array;
}

std::vector<std::int64_t> int_list(nb::handle values, std::string_view what,
                                   std::string_view argument) {
  std::vector<std::int64_t> out;
  if (nb::isinstance<nb::int_>(values)) {
    out.push_back(nb::cast<std::int64_t>(values));
    return out;
  }
  RETRACE_CHECK(nb::isinstance<nb::sequence>(values), invalid_argument,
                "{}: {} must be a sequence of integers, got {}", what, argument,
                nb::type_name(values.type()).c_str());
  for (nb::handle v : nb::iter(values)) {
    RETRACE_CHECK(nb::isinstance<nb::int_>(v), invalid_argument,
                  "{}: {} must be a sequence of integers, got an element of type {}", what,
                  argument, nb::type_name(v.type()).c_str());
    out.push_back(nb::cast<std::int64_t>(v));
  }
  return out;
}

bool is_array_like(nb::handle object) {
  return nb::hasattr(object, "__dlpack__") || nb::hasattr(object, "__array_interface__");
}

Tensor host_tensor_from_array(nb::handle object, std::optional<DType> dtype,
                              std::string_view what) {
  drain_released_references();
  Array a;
  if (!nb::try_cast(object, a)) {
    RETRACE_FAIL(invalid_argument, "{}: expected an array (numpy, DLPack or buffer protocol) on "
                 "the host, got {}", what, nb::type_name(object.type()).c_str());
  }
  const Shape shape = shape_of(a, what);
  const auto native = dtype_from_dlpack(a.dtype());
  if (native && (!dtype || *dtype == *native) && c_contiguous(a)) {
    // No copy: the tensor borrows the array's memory and keeps the array alive.
    auto* keep = new nb::ndarray<nb::ro>(a);
    std::shared_ptr<std::byte> storage(
        static_cast<std::byte*>(const_cast<void*>(a.data())),
        [keep](std::byte*) { release_array(keep); });
    return Tensor::from_host_storage(std::move(storage), shape, *native);
  }
  return convert_array(a, shape, dtype, what);
}

// --- bindings -----------------------------------------------------------------------------------

void bind_tensors(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element types of retrace tensors.")
      .value("float32", DType::float32)
      .value("bfloat16", DType::bfloat16)
      .value("float16", DType::float16)
      .value("int32", DType::int32)
      .value("uint32", DType::uint32)
      .value("int64", DType::int64)
      .value("uint8", DType::uint8)
      .value("bool", DType::bool_)
      .def_prop_ro("itemsize", [](DType d) { return dtype_size(d); })
      .def_prop_ro("is_floating_point", [](DType d) { return dtype_info(d).is_floating; })
      .def("__str__", [](DType d) { return std::string(dtype_name(d)); });
  for (const auto& info : kDTypeTable) m.attr(std::string(info.name).c_str()) = info.dtype;

  nb::enum_<Layout>(m, "Layout", "How a tensor's elements are arranged in its storage.")
      .value("row_major", Layout::row_major)
      .value("tile", Layout::tile)
      .def("__str__", [](Layout l) { return std::string(layout_name(l)); });
  m.attr("ROW_MAJOR_LAYOUT") = Layout::row_major;
  m.attr("TILE_LAYOUT") = Layout::tile;

  nb::class_<PyDevice>(m, "Device", "A retrace device (open one with retrace.open_device).")
      .def_prop_ro("name", &PyDevice::name)
      .def_prop_ro("id", [](const PyDevice& d) { return d.get("Device.id").id().value; })
      .def_prop_ro("backend", [](const PyDevice& d) {
        return std::string(d.get("Device.backend").backend());
      })
      .def_prop_ro("closed", &PyDevice::closed)
      .def_prop_ro("num_queues",
                   [](const PyDevice& d) { return d.get("Device.num_queues").num_queues(); })
      .def("description", [](const PyDevice& d) { return d.get("Device.description").description(); })
      .def(
          "synchronize",
          [](PyDevice& d, nb::handle queue) {
            Device& device = d.get("synchronize");
            const bool all = queue.is_none();
            const QueueId q = parse_queue(queue);
            nb::gil_scoped_release release;
            if (all) {
              device.synchronize();
            } else {
              device.synchronize(q);
            }
          },
          nb::arg("queue") = nb::none(),
          "Waits for the work queued on `queue` (every queue when None).")
      .def("live_traces",
           [](const PyDevice& d) { return d.get("live_traces").live_traces().size(); })
      .def("close", &PyDevice::close,
           "Waits for queued work and closes the device; tensors and tracers on it then raise "
           "FailedPrecondition.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); },
           nb::sig("def __enter__(self) -> Device"))
      .def("__exit__", [](PyDevice& d, nb::args) { d.close(); })
      .def("__repr__", [](const PyDevice& d) {
        return fmt::format("Device({}{})", d.name(), d.closed() ? ", closed" : "");
      });

  m.def(
      "open_device",
      [](std::string_view spec, std::optional<std::size_t> memory,
         std::optional<std::uint32_t> queues, std::optional<std::uint32_t> kernel_threads,
         std::optional<std::size_t> trace_memory) {
        DeviceOptions options = default_device_options(spec);
        if (memory) options.memory_bytes = *memory;
        if (trace_memory) options.trace_region_bytes = *trace_memory;
        if (queues) options.num_queues = *queues;
        if (kernel_threads) options.kernel_threads = *kernel_threads;
        auto device = open_device(spec, options);
        return new PyDevice(std::move(device));
      },
      nb::arg("spec") = "cpu", nb::kw_only(), nb::arg("memory") = nb::none(),
      nb::arg("queues") = nb::none(), nb::arg("kernel_threads") = nb::none(),
      nb::arg("trace_memory") = nb::none(), nb::rv_policy::take_ownership,
      "Opens a device: \"cpu\", \"cpu:1\", \"cuda:0\" ... `memory` in bytes; `trace_memory`: "
      "the bytes its traces may hold together (default 256 MiB). `kernel_threads`: "
      "0 (the default) splits a CPU device's kernels over the process's kernel threads (one per "
      "usable CPU), 1 keeps them on the queue's thread, n > 1 uses at most n.");
  m.def("available_backends", [] {
    nb::list out;
    for (const auto& b : available_backends()) {
      nb::dict entry;
      entry["name"] = b.name;
      entry["available"] = b.available;
      entry["reason"] = b.reason;
      out.append(entry);
    }
    return out;
  });

  nb::class_<Tensor>(m, "Tensor",
                     "A handle on host or device storage with a shape, dtype and layout. Copies "
                     "share storage; clone() makes a deep copy.")
      .def_prop_ro("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("layout", &Tensor::layout)
      .def_prop_ro("ndim", [](const Tensor& t) { return t.shape().rank(); })
      .def_prop_ro("numel", &Tensor::numel)
      .def_prop_ro("nbytes", &Tensor::nbytes)
      .def_prop_ro("on_host", &Tensor::on_host)
      .def_prop_ro("on_device", &Tensor::on_device)
      .def_prop_ro("device", [](const Tensor& t) { return PyDevice::find(t.device()); },
                   nb::for_getter(nb::sig("def device(self) -> Device | None")),
                   "The Device holding the storage (None for host tensors).")
      .def_prop_ro("address", &Tensor::address)
      .def("__getitem__", &index_view, nb::arg("key"),
           "A view (no copy) by numpy's basic indexing: integers, slices with a positive step, "
           "None and ....")
      .def("__setitem__", &index_assign, nb::arg("key"), nb::arg("value"),
           "Writes a number, or a tensor or array broadcast to the indexed view, into it.")
      .def("stride",
           [](const Tensor& t) {
             nb::list out;
             for (std::int64_t s : t.strides()) out.append(s);
             return nb::tuple(out);
           },
           "Element strides, one per dimension (torch's Tensor.stride()).")
      .def("storage_offset", &Tensor::storage_offset,
           "Elements between the start of the storage and the first element.")
      .def("is_contiguous", &Tensor::is_contiguous,
           "Whether the elements lie densely in row-major order (views may not).")
      .def(
          "contiguous",
          [](const Tensor& t, nb::handle queue) {
            return t.on_host() ? t : ops::contiguous(t, parse_queue(queue));
          },
          nb::kw_only(), nb::arg("queue") = nb::none(),
          "The tensor itself when contiguous, else a dense copy.")
      .def_prop_ro("replay_version", &Tensor::replay_version)
      .def("__len__", [](const Tensor& t) {
        RETRACE_CHECK(t.shape().rank() > 0, invalid_argument, "len() of a rank-0 tensor");
        return t.shape()[0];
      })
      .def("numpy", &tensor_numpy, nb::arg("queue") = nb::none(),
           nb::sig("def numpy(self, queue: int | None = None) -> numpy.typing.NDArray[typing.Any]"),
           "The values as a numpy array: a view of a host tensor's memory, else a copy "
           "(bfloat16 comes out as float32).")
      .def(
          "__array__",
          [](const Tensor& t, nb::handle dtype, nb::handle copy) {
            const bool view = t.on_host() && t.layout() == Layout::row_major &&
                              t.dtype() != DType::bfloat16;
            if (!copy.is_none() && !nb::cast<bool>(copy) && !view) {
              throw nb::value_error("retrace.Tensor: numpy needs a copy of this tensor (device "
                                    "memory, tile layout or bfloat16), but copy=False");
            }
            nb::object array = tensor_numpy(t, nb::none());
            if (!dtype.is_none()) array = array.attr("astype")(dtype);
            return array;
          },
          nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none(),
          nb::sig("def __array__(self, dtype: object | None = None, copy: bool | None = None) "
                  "-> numpy.typing.NDArray[typing.Any]"))
      .def(
          "__dlpack__",
          [](const Tensor& t, nb::kwargs kwargs) {
            const Tensor host = row_major_host(t, kDefaultQueue);
            nb::object array = nb::cast(view_of_host<nb::array_api>(host));
            return array.attr("__dlpack__")(**kwargs);
          },
          "DLPack export (host memory; a device tensor is copied to the host first).")
      .def("__dlpack_device__",
           [](const Tensor&) { return nb::make_tuple(1 /* kDLCPU */, 0); })
      .def(
          "clone", [](const Tensor& t, nb::handle queue) { return t.clone(parse_queue(queue)); },
          nb::arg("queue") = nb::none())
      .def(
          "to_device",
          [](const Tensor& t, nb::handle device, nb::handle queue, bool blocking) {
            return t.to_device(device_of(device, "to_device"), parse_queue(queue),
                               blocking ? Blocking::yes : Blocking::no);
          },
          nb::arg("device"), nb::arg("queue") = nb::none(), nb::arg("blocking") = true)
      .def(
          "to_host", [](const Tensor& t, nb::handle queue) { return t.to_host(parse_queue(queue)); },
          nb::arg("queue") = nb::none())
      .def("tolist", [](const Tensor& t) { return tensor_numpy(t, nb::none()).attr("tolist")(); },
           nb::sig("def tolist(self) -> typing.Any"))
      .def("__repr__", &Tensor::to_string)
      // Arithmetic operators are the ops (numpy broadcasting; a number on either side).
      .def("__add__", [](const Tensor& a, nb::handle b) { return binary_operator(a, b, "add"); })
      .def("__radd__", [](const Tensor& a, nb::handle b) { return binary_operator(a, b, "add"); })
      .def("__sub__", [](const Tensor& a, nb::handle b) { return binary_operator(a, b, "sub"); })
      .def("__rsub__",
           [](const Tensor& a, double b) { return ops::neg(ops::sub(a, b)); })
      .def("__mul__", [](const Tensor& a, nb::handle b) { return binary_operator(a, b, "mul"); })
      .def("__rmul__", [](const Tensor& a, nb::handle b) { return binary_operator(a, b, "mul"); })
      // `/` is true division (integers promote to float32), as in Python, numpy and torch.
      .def("__truediv__",
           [](const Tensor& a, nb::handle b) { return binary_operator(a, b, "true_divide"); })
      .def("__rtruediv__",
           [](const Tensor& a, double b) {
             // The numerator in the dtype true_divide divides in: a's if floating, else float32.
             const DType dtype = dtype_info(a.dtype()).is_floating ? a.dtype() : DType::float32;
             return ops::true_divide(scalar_like(a, b, "true_divide", dtype), a);
           })
      .def("__pow__", [](const Tensor& a, nb::handle b) { return binary_operator(a, b, "pow"); })
      // `//` and `%` round toward -inf, as in Python and torch (integers: x // 0 and x % 0 are 0).
      .def("__floordiv__",
           [](const Tensor& a, nb::handle b) { return binary_operator(a, b, "floor_divide"); })
      .def("__rfloordiv__",
           [](const Tensor& a, double b) {
             return ops::floor_divide(scalar_like(a, b, "floor_divide"), a);
           })
      .def("__mod__",
           [](const Tensor& a, nb::handle b) { return binary_operator(a, b, "remainder"); })
      .def("__rmod__",
           [](const Tensor& a, double b) {
             return ops::remainder(scalar_like(a, b, "remainder"), a);
           })
      .def("__neg__", [](const Tensor& a) { return ops::neg(a); })
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return ops::matmul(a, b); });

  m.def(
      "from_numpy",
      [](nb::handle array, nb::handle device, nb::handle dtype, Layout layout, nb::handle queue) {
        Tensor host = host_tensor_from_array(array, parse_optional_dtype(dtype), "from_numpy");
        if (layout != Layout::row_major) {
          RETRACE_CHECK(!device.is_none(), invalid_argument,
                        "from_numpy: layout=tile needs a device (the layout is converted there)");
        }
        if (device.is_none()) return host;
        Device& d = device_of(device, "from_numpy");
        Tensor out = host.to_device(d, parse_queue(queue));
        return layout == Layout::row_major ? out : ops::to_layout(out, layout, parse_queue(queue));
      },
      nb::arg("array"), nb::arg("device") = nb::none(), nb::arg("dtype") = nb::none(),
      nb::arg("layout") = Layout::row_major, nb::arg("queue") = nb::none(),
      "A tensor from an array: on the host, sharing the array's memory when it is C-contiguous "
      "in a retrace dtype (and dtype is None or that dtype), or on `device`.");
  m.attr("from_dlpack") = m.attr("from_numpy");
  m.def(
      "empty",
      [](nb::handle shape, nb::handle device, nb::handle dtype, Layout layout) {
        const auto dims = int_list(shape, "empty", "shape");
        const Shape s{std::span<const std::int64_t>(dims)};
        const DType d = dtype.is_none() ? DType::float32 : parse_dtype(dtype);
        if (device.is_none()) return Tensor::empty_host(s, d, layout);
        return Tensor::empty(s, d, device_of(device, "empty"), layout);
      },
      nb::arg("shape"), nb::arg("device") = nb::none(), nb::arg("dtype") = nb::none(),
      nb::arg("layout") = Layout::row_major,
      "Uninitialised device storage (contents unspecified), or zeros on the host.");
}

}  // namespace retrace::python
