// retrace._core: the C++ library behind the `retrace` Python package.
#include "bindings.hpp"

NB_MODULE(_core, m) {
  m.doc() = "retrace: capture device work once, replay it safely (C++ core)";
  retrace::python::bind_errors(m);
  retrace::python::bind_tensors(m);
  retrace::python::bind_ops(m);
  retrace::python::bind_tracer(m);
}
