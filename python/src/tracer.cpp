// retrace.Tracer on the C++ TracerCore: inputs and outputs are Python trees (tuple, list, dict
// with str keys, None, bool, int, float, str, tensors and host arrays). The trees are walked in
// C++; a replay never calls into Python.
#include "bindings.hpp"

#include "retrace/mesh.hpp"

#include "retrace/error.hpp"
#include "retrace/state_tensor.hpp"
#include "retrace/traced_function.hpp"
#include "retrace/tracer.hpp"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <string>
#include <vector>

namespace retrace::python {

// Raises retrace.InvalidType (an InvalidArgument that is also a TypeError).
[[noreturn]] void throw_invalid_type(const std::string& message);

namespace {

PyTypeObject* tensor_type() {
  static PyTypeObject* type = reinterpret_cast<PyTypeObject*>(nb::type<Tensor>().ptr());
  return type;
}
bool is_tensor(nb::handle h) { return Py_TYPE(h.ptr()) == tensor_type(); }
Tensor& tensor_ref(nb::handle h) { return *nb::inst_ptr<Tensor>(h); }
// A MeshTensor is a node whose children are its shards (and whose placements must match).
bool is_mesh_tensor(nb::handle h) { return nb::isinstance<MeshTensor>(h); }
MeshTensor& mesh_ref(nb::handle h) { return *nb::inst_ptr<MeshTensor>(h); }

std::string_view str_view(nb::handle key) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(key.ptr(), &size);
  if (data == nullptr) throw nb::python_error();
  return {data, static_cast<std::size_t>(size)};
}

std::string py_type_name(nb::handle h) { return nb::type_name(h.type()).c_str(); }
// "<class 'numpy.float32'>", as Python (and ttnn's tracing utilities) print a type.
std::string py_type_repr(nb::handle h) { return nb::repr(h.type()).c_str(); }

[[noreturn]] void tree_type_error(const TreePath& path, const std::string& what) {
  throw_invalid_type(fmt::format("{}: {}", path.describe(), what));
}

// "is a float, the captured input is a int", with the original's phrase for the same error.
[[noreturn]] void type_mismatch(const TreePath& path, nb::handle value, std::string_view captured,
                                std::string_view captured_type) {
  tree_type_error(path, fmt::format("is a {}, the captured input is a {} (type {} does not match "
                                    "the initial type {})",
                                    py_type_name(value), captured, py_type_repr(value),
                                    captured_type));
}

// None, bool, int, float and str, subclasses included (np.float64 is a float): the values a
// trace bakes in. numpy's other scalars (np.float32, np.int64, ...) are not: see numpy_scalar.
bool is_scalar(nb::handle h) {
  PyObject* p = h.ptr();
  return h.is_none() || PyBool_Check(p) || PyLong_Check(p) || PyFloat_Check(p) ||
         PyUnicode_Check(p);
}

// Python's repr(), held for the life of the process.
PyObject* builtin_repr() {
  static PyObject* repr = nb::object(nb::module_::import_("builtins").attr("repr")).release().ptr();
  return repr;
}

// An instance of numpy.generic that is not a Python scalar: refused as an input or output
// (as ttnn's tracing utilities refuse it) rather than silently made a tensor.
bool numpy_scalar(nb::handle h) {
  static PyObject* generic = [] {
    nb::object numpy = nb::module_::import_("numpy");
    return nb::object(numpy.attr("generic")).release().ptr();
  }();
  const int is = PyObject_IsInstance(h.ptr(), generic);
  if (is < 0) throw nb::python_error();
  return is == 1;
}

[[noreturn]] void unsupported_type(const TreePath& path, nb::handle value, std::string_view what) {
  tree_type_error(path, fmt::format("has unsupported type {} ({}{})", py_type_repr(value), what,
                                    numpy_scalar(value)
                                        ? "; a numpy scalar: float(x) or int(x) bakes it into "
                                          "the trace, np.asarray(x) makes it a tensor input"
                                        : ""));
}

// Dictionary keys of traced trees: the scalar types (str, int, float, bool, None).
void require_key(const TreePath& path, nb::handle key) {
  if (is_scalar(key)) return;
  tree_type_error(path, fmt::format("has a key of type {}; dictionary keys in traced inputs and "
                                    "outputs are str, int, float, bool or None",
                                    py_type_repr(key)));
}

// The path of a dictionary's entry: ["name"] for a str key, [3] for other keys. `text` holds
// the key's repr while the path is in use.
TreePath key_path(const TreePath& path, nb::handle key, std::string& text) {
  if (PyUnicode_Check(key.ptr())) return path.key(str_view(key));
  text = nb::repr(key).c_str();
  return path.literal(text);
}

// A host tensor for a slot: float arrays take the slot's floating dtype (numpy has no bfloat16).
Tensor host_for_slot(nb::handle array, const Tensor& slot, const TreePath& path) {
  const std::string where = path.describe();
  Tensor host = host_tensor_from_array(array, std::nullopt, where);
  if (host.dtype() != slot.dtype() && dtype_info(host.dtype()).is_floating &&
      dtype_info(slot.dtype()).is_floating) {
    host = host_tensor_from_array(array, slot.dtype(), where);
  }
  return host;
}

nb::dict stats_dict(const TraceStats& s) {
  nb::dict d;
  d["captures"] = s.captures;
  d["replays"] = s.replays;
  d["evictions"] = s.evictions;
  d["live_traces"] = s.live_traces;
  d["trace_bytes"] = s.trace_bytes;
  d["bytes_refreshed"] = s.bytes_refreshed;
  d["copies"] = s.copies;
  d["copies_skipped"] = s.copies_skipped;
  return d;
}

// Interned names of the call-time keywords.
struct CallKeywords {
  nb::object traced = nb::steal(PyUnicode_InternFromString("traced"));
  nb::object cq_id = nb::steal(PyUnicode_InternFromString("tracer_cq_id"));
  nb::object blocking = nb::steal(PyUnicode_InternFromString("tracer_blocking_execution"));
  nb::object execute = nb::steal(PyUnicode_InternFromString("tracer_execute_on_capture"));
};
const CallKeywords& call_keywords() {
  static const CallKeywords* keywords = new CallKeywords();
  return *keywords;
}

// Removes `key` from `kwargs` and returns its value (an invalid handle when absent).
nb::object pop(nb::handle kwargs, nb::handle key) {
  PyObject* value = PyDict_GetItemWithError(kwargs.ptr(), key.ptr());
  if (value == nullptr) {
    if (PyErr_Occurred() != nullptr) throw nb::python_error();
    return {};
  }
  nb::object out = nb::borrow(value);
  if (PyDict_DelItem(kwargs.ptr(), key.ptr()) != 0) throw nb::python_error();
  return out;
}

// Tracer._traces_live: live traces per device id, as ttnn's Tracer counts them (a class
// attribute shared by every tracer; entries appear when a tracer of the device is made).
nb::dict& traces_live() {
  static nb::dict* live = new nb::dict();
  return *live;
}

void count_live(const std::vector<std::uint32_t>& ids, long delta) noexcept {
  try {
    nb::dict& live = traces_live();
    for (std::uint32_t id : ids) {
      nb::int_ key(id);
      const long now = live.contains(key) ? nb::cast<long>(live[key]) : 0;
      live[key] = now + delta;
    }
  } catch (...) {
    PyErr_Clear();  // bookkeeping only: never fail a release over it
  }
}

}  // namespace

class PyTracer {
 public:
  PyTracer(nb::object function, nb::handle device, nb::handle devices, bool prep_run,
           bool clone_prep_inputs, std::string name)
      : core_(resolve_devices(device, devices), make_options(prep_run, clone_prep_inputs, name)),
        function_(std::move(function)) {
    if (!devices.is_none()) {
      const nb::object members =
          mesh_devices(devices) ? nb::object(devices.attr("devices")) : nb::borrow(devices);
      for (nb::handle d : nb::iter(members)) device_objects_.append(d);
    } else {
      device_objects_.append(device);
    }
    RETRACE_CHECK(PyCallable_Check(function_.ptr()) != 0, invalid_argument,
                  "Tracer: the function must be callable, got {}", py_type_name(function_));
    for (Device* d : core_.devices()) device_ids_.push_back(d->id().value);
    count_live(device_ids_, 0);
  }
  ~PyTracer() { release_trace(); }

  nb::object call(nb::args args, nb::kwargs kwargs) {
    drain_released_references();
    CallOptions options;
    bool traced = true;
    if (PyDict_GET_SIZE(kwargs.ptr()) != 0) {
      const auto& k = call_keywords();
      if (nb::object v = pop(kwargs, k.traced); v.is_valid()) traced = nb::cast<bool>(v);
      if (nb::object v = pop(kwargs, k.cq_id); v.is_valid()) options.queue = parse_queue(v);
      if (nb::object v = pop(kwargs, k.blocking); v.is_valid()) {
        options.blocking = nb::cast<bool>(v) ? Blocking::yes : Blocking::no;
      }
      if (nb::object v = pop(kwargs, k.execute); v.is_valid()) {
        options.execute_on_capture = nb::cast<bool>(v);
      }
    }
    if (options.queue == kDefaultQueue) options.queue = QueueId{0};
    // One call at a time: a replay releases the GIL while the device runs, and the function
    // of a capture may call anything; a second call meanwhile would corrupt the tracer's state.
    RETRACE_CHECK(!busy_, failed_precondition,
                  "tracer '{}' was called while a call of it is still running (from another "
                  "thread, or from inside its own function); a tracer runs one call at a time",
                  name());
    busy_ = true;
    struct Done {
      bool& flag;
      ~Done() { flag = false; }
    } done{busy_};
    if (!traced) return untraced(args, kwargs);
    Call steps(*this, std::move(args), std::move(kwargs));
    struct DropOwned {
      std::deque<Tensor>& owned;
      ~DropOwned() { owned.clear(); }  // host tensors made from arrays for this call
    } drop{owned_};
    core_.call(options, steps, has_function());
    return outputs_;
  }

  [[nodiscard]] bool trace_captured() const noexcept {
    return core_.state() == TracerState::captured;
  }
  [[nodiscard]] bool has_function() const noexcept { return !function_.is_none(); }
  [[nodiscard]] nb::object function() const { return function_; }

  // {0: args[0], 1: args[1], ..., "name": kwargs["name"]}: the input slots once captured, the
  // last untraced call's inputs before.
  [[nodiscard]] nb::dict inputs() const {
    nb::dict out;
    if (args_.is_valid()) {
      std::size_t i = 0;
      for (nb::handle a : nb::borrow<nb::tuple>(args_)) out[nb::int_(i++)] = a;
    }
    if (kwargs_.is_valid()) {
      for (auto [key, value] : nb::borrow<nb::dict>(kwargs_)) out[key] = value;
    }
    return out;
  }
  [[nodiscard]] nb::object outputs() const { return outputs_.is_valid() ? outputs_ : nb::none(); }
  [[nodiscard]] nb::dict stats() const { return stats_dict(core_.stats()); }
  [[nodiscard]] std::string last_capture_reason() const { return core_.last_capture_reason(); }
  [[nodiscard]] std::size_t trace_bytes() const { return core_.trace_bytes(); }
  [[nodiscard]] nb::list devices() const { return device_objects_; }
  // Per device: the trace replayed `replays` times with every command timed.
  [[nodiscard]] nb::list profile(std::size_t replays) {
    core_.require_devices_open("profile");
    core_.require_captured("profile");
    nb::list out;
    const auto& ids = core_.trace_ids();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      Device* device = core_.devices()[i];
      TraceProfile p;
      {
        nb::gil_scoped_release release;
        p = device->profile_trace(ids[i], QueueId{0}, replays);
      }
      nb::dict d;
      d["device"] = device->name();
      d["replays"] = p.replays;
      d["replay_ns"] = p.replay_ns;
      nb::list ops, ns;
      for (std::size_t c = 0; c < p.ops.size(); ++c) {
        ops.append(nb::str(p.ops[c].data(), p.ops[c].size()));
        ns.append(p.command_ns[c]);
      }
      d["ops"] = ops;
      d["command_ns"] = ns;
      out.append(d);
    }
    return out;
  }
  // Per device: the captured trace's id, commands, private memory and outside buffers.
  [[nodiscard]] nb::list trace_info() const {
    nb::list out;
    const auto& ids = core_.trace_ids();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      Device* device = core_.devices()[i];
      const TraceInfo info = device->trace_info(ids[i]);
      nb::dict d;
      d["device"] = device->name();
      d["id"] = info.id.value;
      d["commands"] = info.commands;
      d["bytes"] = info.bytes;
      d["pool_buffers"] = info.pool_buffers;
      d["external_buffers"] = info.external_buffers;
      nb::list ops;
      for (std::string_view op : info.ops) ops.append(nb::str(op.data(), op.size()));
      d["ops"] = ops;
      out.append(d);
    }
    return out;
  }
  [[nodiscard]] const std::string& name() const { return core_.options().name; }

  void release_trace() noexcept {
    if (!core_.release()) return;
    count_live(device_ids_, -1);
    args_ = {};
    kwargs_ = {};
    outputs_ = {};
  }
  void release_function() noexcept { function_ = nb::none(); }

  // Garbage collection: a tracer whose function refers back to it (a closure, a method of an
  // object that holds it) forms a cycle the collector can break.
  int traverse(visitproc visit, void* arg) const {
    Py_VISIT(function_.ptr());
    Py_VISIT(device_objects_.ptr());
    Py_VISIT(args_.ptr());
    Py_VISIT(kwargs_.ptr());
    Py_VISIT(outputs_.ptr());
    return 0;
  }
  void clear() noexcept {
    release_trace();
    function_ = nb::none();
  }

 private:
  static std::vector<Device*> resolve_devices(nb::handle device, nb::handle devices) {
    RETRACE_CHECK(device.is_none() != devices.is_none(), invalid_argument,
                  "Tracer: exactly one of 'device' or 'devices' must be provided");
    std::vector<Device*> out;
    if (!device.is_none()) {
      out.push_back(&device_of(device, "Tracer"));
    } else if (auto members = mesh_devices(devices)) {
      out = std::move(*members);
    } else {
      RETRACE_CHECK(nb::isinstance<nb::sequence>(devices), invalid_argument,
                    "Tracer: devices must be a retrace.MeshDevice or a sequence of "
                    "retrace.Device");
      for (nb::handle d : nb::iter(devices)) out.push_back(&device_of(d, "Tracer"));
      RETRACE_CHECK(!out.empty(), invalid_argument, "Tracer: devices is empty");
    }
    return out;
  }
  static TraceOptions make_options(bool prep_run, bool clone_prep_inputs, std::string name) {
    TraceOptions options;
    options.prep_run = prep_run;
    options.clone_prep_inputs = clone_prep_inputs;
    if (!name.empty()) options.name = std::move(name);
    return options;
  }

  nb::object untraced(nb::args args, nb::kwargs kwargs) {
    RETRACE_CHECK(has_function(), failed_precondition,
                  "tracer '{}': untraced execution is not possible after the captured function "
                  "has been released (release_function)",
                  name());
    RETRACE_CHECK(!trace_captured(), failed_precondition,
                  "tracer '{}': untraced execution is not allowed after the trace has been "
                  "captured (call release_trace() first)",
                  name());
    args_ = args;
    kwargs_ = kwargs;
    return function_(*args, **kwargs);
  }

  // --- capture ---------------------------------------------------------------------------------

  // Pass 1: checks every leaf and turns host arrays into host tensors (no device work).
  nb::object check_input(const TreePath& path, nb::handle value) {
    if (is_tensor(value)) {
      core_.check_capture_input(path, tensor_ref(value));
      return nb::borrow(value);
    }
    if (is_mesh_tensor(value)) {
      const MeshTensor& m = mesh_ref(value);
      for (std::size_t i = 0; i < m.shards().size(); ++i) {
        core_.check_capture_input(path.at(i), m.shards()[i]);
      }
      return nb::borrow(value);
    }
    if (is_scalar(value)) return nb::borrow(value);
    if (PyTuple_CheckExact(value.ptr()) || PyList_CheckExact(value.ptr())) {
      const bool tuple = PyTuple_CheckExact(value.ptr());
      nb::list items;
      std::size_t i = 0;
      for (nb::handle item : nb::iter(value)) items.append(check_input(path.at(i++), item));
      return tuple ? nb::object(nb::tuple(items)) : nb::object(items);
    }
    if (PyDict_CheckExact(value.ptr())) {
      nb::dict out;
      std::string text;
      for (auto [key, item] : nb::borrow<nb::dict>(value)) {
        require_key(path, key);
        out[key] = check_input(key_path(path, key, text), item);
      }
      return out;
    }
    if (!numpy_scalar(value) && is_array_like(value)) {
      Tensor host = host_tensor_from_array(value, std::nullopt, path.describe());
      core_.check_capture_input(path, host);
      return nb::cast(std::move(host));
    }
    unsupported_type(path, value,
                     "traced inputs are retrace tensors, arrays, int, float, bool, str and None, "
                     "in tuples, lists and dicts");
  }

  // Maps every tensor leaf through f(handle, tensor) (containers rebuilt; scalars shared; the
  // handle of a mesh tensor's shard is invalid).
  template <class F>
  static nb::object map_tensors(nb::handle value, F& f) {
    if (is_tensor(value)) return f(value, tensor_ref(value));
    if (is_mesh_tensor(value)) {
      const MeshTensor& m = mesh_ref(value);
      std::vector<Tensor> shards;
      for (const Tensor& shard : m.shards()) shards.push_back(nb::cast<Tensor>(f(nb::handle(), shard)));
      return nb::cast(MeshTensor::from_shards(std::move(shards), m.mesh(), m.placements()));
    }
    if (PyTuple_CheckExact(value.ptr()) || PyList_CheckExact(value.ptr())) {
      nb::list items;
      for (nb::handle item : nb::iter(value)) items.append(map_tensors(item, f));
      return PyTuple_CheckExact(value.ptr()) ? nb::object(nb::tuple(items)) : nb::object(items);
    }
    if (PyDict_CheckExact(value.ptr())) {
      nb::dict out;
      for (auto [key, item] : nb::borrow<nb::dict>(value)) out[key] = map_tensors(item, f);
      return out;
    }
    return nb::borrow(value);
  }

  // Tensor leaves in walk order (tuple/list order, dict insertion order).
  static void collect_tensors(nb::handle value, std::vector<Tensor*>& out) {
    if (is_tensor(value)) {
      out.push_back(&tensor_ref(value));
    } else if (is_mesh_tensor(value)) {
      // The shards of a mesh tensor the tracer owns (a slot or an output): refreshed in place.
      for (const Tensor& shard : mesh_ref(value).shards()) out.push_back(const_cast<Tensor*>(&shard));
    } else if (PyTuple_CheckExact(value.ptr()) || PyList_CheckExact(value.ptr())) {
      for (nb::handle item : nb::iter(value)) collect_tensors(item, out);
    } else if (PyDict_CheckExact(value.ptr())) {
      for (auto [key, item] : nb::borrow<nb::dict>(value)) collect_tensors(item, out);
    }
  }

  void check_outputs(const TreePath& path, nb::handle value) {
    if (is_tensor(value)) {
      core_.check_output(path, tensor_ref(value));
    } else if (is_mesh_tensor(value)) {
      const MeshTensor& m = mesh_ref(value);
      for (std::size_t i = 0; i < m.shards().size(); ++i) core_.check_output(path.at(i), m.shards()[i]);
    } else if (is_scalar(value)) {
    } else if (PyTuple_CheckExact(value.ptr()) || PyList_CheckExact(value.ptr())) {
      std::size_t i = 0;
      for (nb::handle item : nb::iter(value)) check_outputs(path.at(i++), item);
    } else if (PyDict_CheckExact(value.ptr())) {
      std::string text;
      for (auto [key, item] : nb::borrow<nb::dict>(value)) {
        require_key(path, key);
        check_outputs(key_path(path, key, text), item);
      }
    } else {
      unsupported_type(path, value,
                       "a traced function returns retrace tensors, int, float, bool, str and "
                       "None, in tuples, lists and dicts");
    }
  }

  // --- replay ----------------------------------------------------------------------------------

  void match(const TreePath& path, nb::handle slot, nb::handle value) {
    if (is_mesh_tensor(slot)) {
      if (value.is_none()) {  // None keeps the slots as they are
        for (std::size_t i = 0; i < mesh_ref(slot).shards().size(); ++i) {
          incoming_->push_back(&keep_slot());
        }
        return;
      }
      if (!is_mesh_tensor(value)) type_mismatch(path, value, "MeshTensor", py_type_repr(slot));
      const MeshTensor& s = mesh_ref(slot);
      const MeshTensor& in = mesh_ref(value);
      if (in.mesh() != s.mesh() || in.placements() != s.placements()) {
        throw_tree_error(path, fmt::format("is {}, the captured input is {} (the mesh and the "
                                           "placements are part of the trace)",
                                           in.to_string(), s.to_string()));
      }
      for (std::size_t i = 0; i < s.shards().size(); ++i) {
        core_.check_replay_input(path.at(i), s.shards()[i], in.shards()[i]);
        incoming_->push_back(&in.shards()[i]);
      }
      return;
    }
    if (is_tensor(slot)) {
      const Tensor& s = tensor_ref(slot);
      if (is_tensor(value)) {
        const Tensor& in = tensor_ref(value);
        core_.check_replay_input(path, s, in);
        incoming_->push_back(&in);
      } else if (value.is_none()) {
        incoming_->push_back(&keep_slot());  // the slot stays as it is
      } else if (!is_scalar(value) && !PyTuple_Check(value.ptr()) && !PyList_Check(value.ptr()) &&
                 !PyDict_Check(value.ptr()) && !numpy_scalar(value) && is_array_like(value)) {
        Tensor host = host_for_slot(value, s, path);
        core_.check_replay_input(path, s, host);
        incoming_->push_back(&owned_.emplace_back(std::move(host)));
      } else {
        type_mismatch(path, value, "tensor", py_type_repr(slot));
      }
      return;
    }
    PyObject* sp = slot.ptr();
    PyObject* vp = value.ptr();
    if (PyTuple_CheckExact(sp) || PyList_CheckExact(sp)) {
      if (Py_TYPE(vp) != Py_TYPE(sp)) type_mismatch(path, value, py_type_name(slot), py_type_repr(slot));
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(sp);
      if (PySequence_Fast_GET_SIZE(vp) != n) {
        throw_tree_error(path, fmt::format("has {} elements, the captured input has {} ({} lengths "
                                           "should be the same: {} != {})",
                                           PySequence_Fast_GET_SIZE(vp), n, py_type_name(slot), n,
                                           PySequence_Fast_GET_SIZE(vp)));
      }
      for (Py_ssize_t i = 0; i < n; ++i) {
        match(path.at(static_cast<std::size_t>(i)), PySequence_Fast_GET_ITEM(sp, i),
              PySequence_Fast_GET_ITEM(vp, i));
      }
      return;
    }
    if (PyDict_CheckExact(sp)) {
      if (!PyDict_CheckExact(vp)) type_mismatch(path, value, "dict", py_type_repr(slot));
      check_same_keys(path, slot, value, false);
      Py_ssize_t pos = 0;
      PyObject* key = nullptr;
      PyObject* item = nullptr;
      std::string text;
      while (PyDict_Next(sp, &pos, &key, &item)) {
        match(key_path(path, key, text), item, PyDict_GetItem(vp, key));
      }
      return;
    }
    // Scalars: same type, same value (values are baked into the trace).
    if (Py_TYPE(vp) != Py_TYPE(sp)) type_mismatch(path, value, py_type_name(slot), py_type_repr(slot));
    if (PyFloat_Check(sp)) {
      const double a = PyFloat_AS_DOUBLE(sp), b = PyFloat_AS_DOUBLE(vp);
      if (a == b || (std::isnan(a) && std::isnan(b))) return;
    } else if (sp == vp) {
      return;
    } else {
      const int equal = PyObject_RichCompareBool(sp, vp, Py_EQ);
      if (equal < 0) throw nb::python_error();
      if (equal == 1) return;
    }
    throw_tree_error(path, fmt::format("value {} does not match the captured value {} (the input "
                                       "does not match the initial value: values are baked into "
                                       "the trace; pass a tensor, or use a trace key for values "
                                       "that change)",
                                       nb::repr(value).c_str(), nb::repr(slot).c_str()));
  }

  // A dict input (or the call's keywords) with the captured keys. The message lists both key
  // sets sorted (by repr: keys of several types do not sort otherwise), with the phrase of
  // ttnn's tracing utilities for the same error.
  static void check_same_keys(const TreePath& path, nb::handle slot, nb::handle value,
                              bool keywords) {
    bool same = PyDict_GET_SIZE(slot.ptr()) == PyDict_GET_SIZE(value.ptr());
    if (same) {
      Py_ssize_t pos = 0;
      PyObject* key = nullptr;
      PyObject* item = nullptr;
      while (same && PyDict_Next(slot.ptr(), &pos, &key, &item)) {
        same = PyDict_Contains(value.ptr(), key) == 1;
      }
    }
    if (same) return;
    auto keys = [](nb::handle d) {
      static PyObject* repr = builtin_repr();
      nb::list k = nb::list(nb::iter(d));
      k.attr("sort")(nb::arg("key") = nb::handle(repr));
      return std::string(nb::repr(k).c_str());
    };
    const std::string got = keys(value), captured = keys(slot);
    tree_type_error(path, fmt::format("keys {} do not match the captured keys {} ({})", got,
                                      captured,
                                      keywords ? fmt::format("expected kwargs {}, got {}",
                                                             captured, got)
                                               : std::string("dict keys should be the same")));
  }

  // Replay: the call's leaves against the slots, the incoming tensors in slot order.
  void match_call(nb::args args, nb::kwargs kwargs, std::vector<const Tensor*>& incoming) {
    const auto slot_args = nb::borrow<nb::tuple>(args_);
    if (args.size() != slot_args.size()) {
      throw_invalid_type(fmt::format("tracer '{}': expected {} positional args, got {} (a replay "
                                     "takes the arguments of the capturing call)",
                                     name(), slot_args.size(), args.size()));
    }
    incoming_ = &incoming;
    owned_.clear();
    const TreePath args_root = TreePath::root("args", "input");
    for (std::size_t i = 0; i < args.size(); ++i) match(args_root.at(i), slot_args[i], args[i]);
    if (PyDict_GET_SIZE(kwargs.ptr()) != 0 || PyDict_GET_SIZE(kwargs_.ptr()) != 0) {
      const TreePath kwargs_root = TreePath::root("kwargs", "input");
      check_same_keys(kwargs_root, kwargs_, kwargs, true);
      Py_ssize_t pos = 0;
      PyObject* key = nullptr;
      PyObject* item = nullptr;
      while (PyDict_Next(kwargs_.ptr(), &pos, &key, &item)) {
        match(kwargs_root.key(str_view(key)), item, PyDict_GetItem(kwargs.ptr(), key));
      }
    }
  }

  // The tree walks of one traced call, for the core (detail::TracedCall).
  class Call final : public detail::TracedCall {
   public:
    Call(PyTracer& tracer, nb::args args, nb::kwargs kwargs)
        : t_(tracer), args_(std::move(args)), kwargs_(std::move(kwargs)) {}

    void check_inputs() override {
      const TreePath args_root = TreePath::root("args", "input");
      const TreePath kwargs_root = TreePath::root("kwargs", "input");
      nb::list checked;
      for (std::size_t i = 0; i < args_.size(); ++i) {
        checked.append(t_.check_input(args_root.at(i), args_[i]));
      }
      slot_args_ = nb::tuple(checked);
      nb::dict checked_kwargs;
      for (auto [key, value] : kwargs_) {
        checked_kwargs[key] = t_.check_input(kwargs_root.key(str_view(key)), value);
      }
      slot_kwargs_ = checked_kwargs;
    }
    void place_inputs(QueueId queue) override {
      // A device tensor that becomes its slot stays the caller's object: inputs[0] is x.
      auto place = [&](nb::handle original, const Tensor& t) {
        Tensor placed = t_.core_.place_capture_input(t, queue);
        if (original.is_valid() && placed.buffer() == t.buffer() &&
            placed.address() == t.address() && placed.shape() == t.shape() &&
            placed.is_contiguous() == t.is_contiguous()) {
          return nb::borrow(original);
        }
        return nb::cast(std::move(placed));
      };
      slot_args_ = map_tensors(slot_args_, place);
      slot_kwargs_ = map_tensors(slot_kwargs_, place);
    }
    void prep_run(bool clone, QueueId queue) override {
      if (!clone) {
        (void)t_.function_(*slot_args_, **slot_kwargs_);
        return;
      }
      auto copy = [&](nb::handle, const Tensor& t) { return nb::cast(t.clone(queue)); };
      nb::object prep_args = map_tensors(slot_args_, copy);
      nb::object prep_kwargs = map_tensors(slot_kwargs_, copy);
      (void)t_.function_(*prep_args, **prep_kwargs);
    }
    void invoke() override { outputs_ = t_.function_(*slot_args_, **slot_kwargs_); }
    void check_outputs() override {
      t_.check_outputs(TreePath::root("outputs", "output"), outputs_);
    }
    void commit(std::vector<Tensor*>& slots, std::vector<Tensor*>& outputs) override {
      t_.args_ = slot_args_;
      t_.kwargs_ = slot_kwargs_;
      t_.outputs_ = outputs_;
      collect_tensors(t_.args_, slots);
      collect_tensors(t_.kwargs_, slots);
      collect_tensors(t_.outputs_, outputs);
      count_live(t_.device_ids_, 1);
    }
    void match(std::vector<const Tensor*>& incoming) override {
      t_.match_call(args_, kwargs_, incoming);
    }
    void execute(detail::TracerCore& core, const CallOptions& options) override {
      if (options.blocking == Blocking::yes) {
        nb::gil_scoped_release release;
        core.execute(options);
      } else {
        core.execute(options);
      }
    }
    void release() noexcept override { t_.release_trace(); }

   private:
    PyTracer& t_;
    nb::args args_;
    nb::kwargs kwargs_;
    nb::object slot_args_, slot_kwargs_, outputs_;
  };

  detail::TracerCore core_;
  nb::object function_;
  nb::list device_objects_;
  nb::object args_;    // tuple: the slots once captured
  nb::object kwargs_;  // dict
  nb::object outputs_;
  // A replay's scratch: the incoming tensors in slot order, and the host tensors made from
  // arrays for it (a deque: their addresses stay put while it grows).
  std::vector<const Tensor*>* incoming_ = nullptr;
  std::deque<Tensor> owned_;
  std::vector<std::uint32_t> device_ids_;  // for Tracer._traces_live
  bool busy_ = false;             // a call is running
};

namespace {

// A string that identifies the structure, tensor properties and scalar values of a call's
// inputs (what an automatic trace key selects by).
void signature_of(nb::handle value, std::string& out) {
  if (is_tensor(value)) {
    const Tensor& t = tensor_ref(value);
    out += fmt::format("T{}{}{}@{};", t.shape(), dtype_name(t.dtype()), layout_name(t.layout()),
                       t.on_host() ? std::uint64_t{0} : t.buffer()->link().uid);
  } else if (is_mesh_tensor(value)) {
    const MeshTensor& m = mesh_ref(value);
    out += fmt::format("M{}{}@{};", m.to_string(), m.shards().front().shape(),
                       static_cast<const void*>(m.mesh().get()));
  } else if (PyTuple_CheckExact(value.ptr()) || PyList_CheckExact(value.ptr())) {
    out += PyTuple_CheckExact(value.ptr()) ? "(" : "[";
    for (nb::handle item : nb::iter(value)) signature_of(item, out);
    out += PyTuple_CheckExact(value.ptr()) ? ")" : "]";
  } else if (PyDict_CheckExact(value.ptr())) {
    out += "{";
    static PyObject* repr = builtin_repr();
    nb::list keys = nb::list(nb::iter(value));
    keys.attr("sort")(nb::arg("key") = nb::handle(repr));  // keys of several types too
    for (nb::handle key : keys) {
      out += nb::repr(key).c_str();
      out += ":";
      signature_of(nb::borrow<nb::dict>(value)[key], out);
    }
    out += "}";
  } else if (is_scalar(value)) {
    out += py_type_name(value);
    out += "=";
    out += nb::repr(value).c_str();
    out += ";";
  } else if (is_array_like(value)) {
    const Tensor host = host_tensor_from_array(value, std::nullopt, "signature");
    out += fmt::format("A{}{};", host.shape(), dtype_name(host.dtype()));
  } else {
    out += "?";
    out += py_type_name(value);
    out += ";";
  }
}

}  // namespace

namespace {
int tracer_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  return nb::inst_ptr<PyTracer>(self)->traverse(visit, arg);
}
int tracer_clear(PyObject* self) {
  if (nb::inst_ready(self)) nb::inst_ptr<PyTracer>(self)->clear();
  return 0;
}
PyType_Slot tracer_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(tracer_traverse)},
                              {Py_tp_clear, reinterpret_cast<void*>(tracer_clear)},
                              {0, nullptr}};
}  // namespace

void bind_tracer(nb::module_& m) {
  auto tracer_class = nb::class_<PyTracer>(m, "Tracer",
                       "Captures a function's device work on the first traced call and replays "
                       "it on every later one. Outputs are the same objects on every call.",
                       nb::type_slots(tracer_slots))
      .def(nb::init<nb::object, nb::handle, nb::handle, bool, bool, std::string>(),
           nb::arg("function"), nb::kw_only(), nb::arg("device") = nb::none(),
           nb::arg("devices") = nb::none(), nb::arg("prep_run") = true,
           nb::arg("clone_prep_inputs") = true, nb::arg("name") = "")
      .def("__call__", &PyTracer::call,
           nb::sig("def __call__(self, *args: typing.Any, **kwargs: typing.Any) -> typing.Any"),
           "tracer(*args, traced=True, tracer_cq_id=0, tracer_blocking_execution=True, "
           "tracer_execute_on_capture=True, **kwargs)")
      .def_prop_ro("trace_captured", &PyTracer::trace_captured)
      .def_prop_ro("has_function", &PyTracer::has_function)
      .def_prop_ro("inputs", &PyTracer::inputs,
                   nb::for_getter(nb::sig("def inputs(self) -> dict[int | str, typing.Any]")))
      .def_prop_ro("outputs", &PyTracer::outputs,
                   nb::for_getter(nb::sig("def outputs(self) -> typing.Any")))
      .def_prop_ro("stats", &PyTracer::stats)
      .def_prop_ro("last_capture_reason", &PyTracer::last_capture_reason)
      .def_prop_ro("trace_bytes", &PyTracer::trace_bytes)
      .def_prop_ro("devices", &PyTracer::devices)
      .def("profile", &PyTracer::profile, nb::arg("replays") = 10,
           "Per device: the trace replayed `replays` times with every command timed: ops, "
           "command_ns (medians), replay_ns.")
      .def("trace_info", &PyTracer::trace_info,
           "Per device: id, commands, bytes (private trace memory), pool_buffers, "
           "external_buffers and the op of each command.")
      .def_prop_ro("name", &PyTracer::name)
      .def_prop_ro("_function", [](const PyTracer& t) { return t.function(); },
                   "The traced function (None after release_function), as ttnn's Tracer has it.")
      .def("release_trace", &PyTracer::release_trace)
      .def("release_function", &PyTracer::release_function);
  tracer_class.attr("_traces_live") = traces_live();

  // retrace.StateTensor's rule (a traced update copies into the buffer, checked; otherwise it
  // rebinds), the C++ StateTensor's own; retrace.StateTensor converts Python values around it.
  nb::class_<StateTensor>(m, "_StateTensor")
      .def(nb::init<>())
      .def_prop_ro("data", [](const StateTensor& s) { return s.data(); })
      .def(
          "update",
          [](StateTensor& s, const Tensor& value, bool traced, nb::handle device) {
            const bool rebinds = !traced || !s.has_value();
            Device* target = device.is_none() ? nullptr : &device_of(device, "StateTensor.update");
            s.update(value, traced ? Traced::yes : Traced::no, target);
            return rebinds;
          },
          nb::arg("value"), nb::arg("traced"), nb::arg("device") = nb::none(),
          "Updates the state; True when it rebound to the value (untraced, or the first update), "
          "False when it copied into its buffer.");

  // The eviction order of the traced_function decorator's trace stores: the C++ wrappers' own
  // (detail::TraceBounds), not a copy.
  nb::class_<detail::TraceBounds>(m, "_TraceBounds")
      .def(nb::init<std::size_t, std::size_t>(), nb::arg("max_traces"), nb::arg("max_trace_bytes"))
      .def("touch", &detail::TraceBounds::touch, "A stamp for an entry used now.")
      .def(
          "victims",
          [](const detail::TraceBounds& bounds,
             const std::vector<std::pair<std::uint64_t, std::size_t>>& entries,
             std::size_t newest) {
            std::vector<detail::TraceBounds::Entry> list;
            list.reserve(entries.size());
            for (const auto& [last_used, bytes] : entries) list.push_back({last_used, bytes});
            return bounds.victims(list, newest);
          },
          nb::arg("entries"), nb::arg("newest"),
          "Indices of the (last_used, bytes) entries to release, least recently used first, "
          "to stay within the bounds; never `newest`.");

  // For the call-overhead benchmark: ns per call of a C++ Tracer of the same function as the
  // benchmark's Python one (N tensor leaves in, the same leaves out, inputs already in their
  // slots), timed in this process.
  m.def("_bench_cpp_tracer", [](nb::handle device, std::size_t leaves, std::size_t calls) {
    Device& d = device_of(device, "_bench_cpp_tracer");
    std::vector<Tensor> xs;
    for (std::size_t i = 0; i < leaves; ++i) xs.push_back(ops::full({16}, double(i), d));
    auto tracer = make_tracer([](const std::vector<Tensor>& in) { return in; }, d,
                              TraceOptions{.prep_run = false});
    tracer(xs);
    const auto& slots = std::get<0>(tracer.inputs());
    nb::gil_scoped_release release;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < calls; ++i) (void)tracer(slots);
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / double(calls);
  });

  m.def(
      "_signature",
      [](nb::args args, nb::kwargs kwargs) {
        std::string out;
        signature_of(args, out);
        signature_of(kwargs, out);
        return out;
      },
      "The input signature an automatic trace key uses.");
}

}  // namespace retrace::python
