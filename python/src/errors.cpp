// retrace.Error and its subclasses, one per ErrorCategory; retrace::Error becomes the class of
// its category with the C++ message (and .category, .raised_at attributes).
#include "bindings.hpp"

#include "retrace/error.hpp"

#include <array>

namespace retrace::python {
namespace {

struct ErrorClass {
  ErrorCategory category;
  const char* name;
  PyObject* python_base;  // the builtin exception it also derives from
  const char* doc;
};

PyObject* g_error = nullptr;
PyObject* g_invalid_type = nullptr;
std::array<PyObject*, 6> g_classes{};

void set_error(PyObject* cls, std::string_view category, const std::string& message,
               const std::string& raised_at) {
  nb::object instance = nb::steal(PyObject_CallFunction(cls, "s", message.c_str()));
  if (!instance.is_valid()) return;  // the call set its own error
  instance.attr("category") = nb::str(category.data(), category.size());
  instance.attr("raised_at") = nb::str(raised_at.c_str());
  PyErr_SetObject(cls, instance.ptr());
}

PyObject* make_class(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("retrace.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (cls == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

}  // namespace

void throw_invalid_type(const std::string& message) {
  set_error(g_invalid_type, category_name(ErrorCategory::invalid_argument), message, "");
  throw nb::python_error();
}

void bind_errors(nb::module_& m) {
  g_error = make_class(m, "Error", PyExc_Exception,
                       "Base class of every error retrace raises. Attributes: category (the "
                       "C++ ErrorCategory name) and raised_at (where in retrace).");
  const std::array<ErrorClass, 6> table{{
      {ErrorCategory::invalid_argument, "InvalidArgument", PyExc_ValueError,
       "The caller passed something wrong (shape, dtype, device, input path ...)."},
      {ErrorCategory::failed_precondition, "FailedPrecondition", PyExc_RuntimeError,
       "The call is legal but not in this state (a released trace, a closed device ...)."},
      {ErrorCategory::capture_violation, "CaptureViolation", PyExc_RuntimeError,
       "An operation that a trace capture forbids (a host read or write while capturing ...)."},
      {ErrorCategory::out_of_memory, "OutOfMemory", PyExc_MemoryError,
       "Device memory or the trace region is exhausted."},
      {ErrorCategory::device_error, "DeviceError", PyExc_RuntimeError,
       "Queued work failed on the device (e.g. assert_finite found a NaN)."},
      {ErrorCategory::unimplemented, "Unimplemented", PyExc_NotImplementedError,
       "The device has no kernel for this (an op, a dtype, a size)."},
  }};
  for (const auto& entry : table) {
    PyObject* bases = PyTuple_Pack(2, g_error, entry.python_base);
    if (bases == nullptr) throw nb::python_error();
    g_classes[static_cast<std::size_t>(entry.category)] =
        make_class(m, entry.name, bases, entry.doc);
    Py_DECREF(bases);
  }

  {
    PyObject* bases = PyTuple_Pack(
        2, g_classes[static_cast<std::size_t>(ErrorCategory::invalid_argument)], PyExc_TypeError);
    if (bases == nullptr) throw nb::python_error();
    g_invalid_type = make_class(m, "InvalidType", bases,
                                "An input of the wrong type or structure (an InvalidArgument "
                                "that is also a TypeError).");
    Py_DECREF(bases);
  }

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const retrace::Error& e) {
      set_error(g_classes[static_cast<std::size_t>(e.category())], category_name(e.category()),
                e.message(), e.raised_at());
    }
  });
}

}  // namespace retrace::python
