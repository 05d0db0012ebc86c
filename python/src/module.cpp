// retrace._core: the C++ library behind the `retrace` Python package.
#include "bindings.hpp"

#include <cstdlib>

NB_MODULE(_core, m) {
  m.doc() = "retrace: capture device work once, replay it safely (C++ core)";
  // nanobind lists objects still alive when the interpreter exits; objects held by module
  // globals at shutdown are routine, so the list is opt-in (RETRACE_PY_LEAK_WARNINGS=1).
  nanobind::set_leak_warnings(std::getenv("RETRACE_PY_LEAK_WARNINGS") != nullptr);
  retrace::python::bind_errors(m);
  retrace::python::bind_tensors(m);
  retrace::python::bind_ops(m);
  retrace::python::bind_tracer(m);
  retrace::python::bind_mesh(m);
  retrace::python::bind_models(m);
}
