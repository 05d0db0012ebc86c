// Mesh devices from Python: retrace.open_mesh, MeshDevice, Placement, MeshTensor, distribute,
// gather_to_host, gather_shards, and the collectives in retrace.ops (retrace/mesh.hpp).
#include "bindings.hpp"

#include "retrace/error.hpp"
#include "retrace/mesh.hpp"
#ifdef RETRACE_PY_HAVE_MPI
#include "retrace/mpi.hpp"
#endif

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

namespace retrace::python {

namespace {

// A mesh opened from Python, with one Python Device object per member (Tensor.device finds it).
class PyMesh {
 public:
  explicit PyMesh(std::unique_ptr<MeshDevice> mesh) : mesh_(std::move(mesh)) {
    for (std::size_t i = 0; i < mesh_->local_size(); ++i) {
      members_.append(nb::cast(new PyDevice(&mesh_->local_member(i), mesh_->name()),
                               nb::rv_policy::take_ownership));
    }
  }
  PyMesh(const PyMesh&) = delete;
  PyMesh& operator=(const PyMesh&) = delete;
  ~PyMesh() { close(); }

  [[nodiscard]] MeshDevice& get(std::string_view what) const {
    RETRACE_CHECK(!mesh_->is_closed(), failed_precondition, "{}: {} was closed", what,
                  mesh_->name());
    return *mesh_;
  }
  [[nodiscard]] const MeshDevice& mesh() const noexcept { return *mesh_; }
  [[nodiscard]] nb::list devices() const {
    (void)get("MeshDevice.devices");
    return nb::list(members_);
  }
  void close() {
    if (mesh_->is_closed()) return;
    for (nb::handle member : members_) nb::cast<PyDevice&>(member).detach();
    nb::gil_scoped_release release;  // closing waits for the members' queued work
    mesh_->close();
  }

 private:
  std::unique_ptr<MeshDevice> mesh_;
  nb::list members_;
};

std::vector<Placement> placements_of(nb::handle value, std::string_view what) {
  std::vector<Placement> out;
  if (nb::isinstance<Placement>(value)) {
    out.push_back(nb::cast<Placement>(value));
    return out;
  }
  RETRACE_CHECK(nb::isinstance<nb::sequence>(value) && !nb::isinstance<nb::str>(value),
                invalid_argument,
                "{}: placements must be a retrace.Placement or a sequence of them (one per mesh "
                "axis), got {}",
                what, nb::type_name(value.type()).c_str());
  for (nb::handle p : nb::iter(value)) {
    RETRACE_CHECK(nb::isinstance<Placement>(p), invalid_argument,
                  "{}: placements must be retrace.Placement objects, got {}", what,
                  nb::type_name(p.type()).c_str());
    out.push_back(nb::cast<Placement>(p));
  }
  return out;
}

nb::tuple shape_of(const Shape& shape) {
  nb::list dims;
  for (std::int64_t d : shape.dims()) dims.append(d);
  return nb::tuple(dims);
}

}  // namespace

std::optional<std::vector<Device*>> mesh_devices(nb::handle object) {
  if (!nb::isinstance<PyMesh>(object)) return std::nullopt;
  const MeshDevice& mesh = nb::cast<PyMesh&>(object).get("Tracer");
  return mesh.devices();
}

namespace {

// MeshOptions from the Python keywords (collective_timeout in seconds).
MeshOptions mesh_options(const char* op, std::optional<double> collective_timeout) {
  MeshOptions options;
  if (collective_timeout) {
    RETRACE_CHECK(*collective_timeout > 0.0, invalid_argument,
                  "{}: collective_timeout must be positive, got {}", op, *collective_timeout);
    options.collective_timeout = std::chrono::milliseconds(
        std::max<std::int64_t>(1, static_cast<std::int64_t>(*collective_timeout * 1e3)));
  }
  return options;
}

// retrace.mpi: meshes across processes, one member per MPI rank (when built with MPI).
void bind_mpi(nb::module_& m) {
  nb::module_ mpi = m.def_submodule(
      "mpi", "Meshes across processes and machines over MPI: one member device per rank; run "
             "the program with mpirun.");
#ifdef RETRACE_PY_HAVE_MPI
  mpi.attr("available") = true;
  mpi.def("init", [] { retrace::mpi::init(); },
          "Initialises MPI (MPI_THREAD_MULTIPLE) unless it is already; open_mesh does it too.");
  mpi.def("launched", &retrace::mpi::launched,
          "Whether an MPI launcher (mpirun, mpiexec, srun) started this process.");
  mpi.def("world_rank", [] {
    retrace::mpi::init();
    return retrace::mpi::world_rank();
  });
  mpi.def("world_size", [] {
    retrace::mpi::init();
    return retrace::mpi::world_size();
  });
  mpi.def(
      "open_mesh",
      [](std::string_view backend, std::vector<std::size_t> shape, std::uint32_t first_id,
         std::optional<double> collective_timeout) {
        std::unique_ptr<MeshDevice> mesh;
        {
          nb::gil_scoped_release release;  // every rank must arrive: do not hold the GIL
          mesh = retrace::mpi::open_mesh(backend, std::move(shape), std::nullopt,
                                         mesh_options("mpi.open_mesh", collective_timeout),
                                         first_id);
        }
        return new PyMesh(std::move(mesh));
      },
      nb::arg("backend") = "cpu", nb::arg("shape") = std::vector<std::size_t>{}, nb::kw_only(),
      nb::arg("first_id") = 0, nb::arg("collective_timeout") = nb::none(),
      nb::rv_policy::take_ownership,
      "Opens a mesh of one member per MPI rank (rank r opens backend:first_id + r); shape () "
      "is 1-D over every rank, (rows, cols) 2-D. Every rank must call it.");
#else
  mpi.attr("available") = false;
  mpi.def("open_mesh", [](nb::args, nb::kwargs) -> nb::object {
    RETRACE_FAIL(unimplemented, "retrace.mpi.open_mesh: this build of retrace has no MPI "
                                "(install an MPI library, e.g. libopenmpi-dev, and reinstall)");
  });
#endif
}

}  // namespace

void bind_mesh(nb::module_& m) {
  bind_mpi(m);
  nb::class_<PyMesh>(m, "MeshDevice",
                     "Several devices used as one (open one with retrace.open_mesh): tensors "
                     "split or copied across them, collectives between them.")
      .def_prop_ro("size", [](const PyMesh& p) { return p.mesh().size(); })
      .def_prop_ro("shape", [](const PyMesh& p) {
        nb::list dims;
        for (std::size_t e : p.mesh().shape()) dims.append(e);
        return nb::tuple(dims);
      })
      .def_prop_ro("name", [](const PyMesh& p) { return p.mesh().name(); })
      .def_prop_ro("closed", [](const PyMesh& p) { return p.mesh().is_closed(); })
      .def_prop_ro("devices", &PyMesh::devices, "The member devices, in mesh order.")
      .def(
          "member", [](const PyMesh& p, std::size_t i) { return p.devices()[i]; },
          nb::arg("index"), nb::sig("def member(self, index: int) -> Device"))
      .def("coords", [](const PyMesh& p, std::size_t i) {
        nb::list c;
        for (std::size_t x : p.get("MeshDevice.coords").coords(i)) c.append(x);
        return nb::tuple(c);
      })
      .def("synchronize",
           [](PyMesh& p) {
             MeshDevice& mesh = p.get("MeshDevice.synchronize");
             nb::gil_scoped_release release;
             mesh.synchronize();
           })
      .def("close", &PyMesh::close,
           "Fails collectives still waiting, then closes every member. Idempotent.")
      .def("__len__", [](const PyMesh& p) { return p.mesh().size(); })
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); },
           nb::sig("def __enter__(self) -> MeshDevice"))
      .def("__exit__", [](PyMesh& p, nb::args) { p.close(); })
      .def("__repr__", [](const PyMesh& p) {
        return fmt::format("MeshDevice({}{})", p.mesh().name(),
                           p.mesh().is_closed() ? ", closed" : "");
      });

  m.def(
      "open_mesh",
      [](std::string_view backend, std::vector<std::size_t> shape, std::uint32_t first_id,
         std::optional<double> collective_timeout) {
        return new PyMesh(MeshDevice::open(backend, std::move(shape), std::nullopt,
                                           mesh_options("open_mesh", collective_timeout),
                                           first_id));
      },
      nb::arg("backend") = "cpu", nb::arg("shape") = std::vector<std::size_t>{2}, nb::kw_only(),
      nb::arg("first_id") = 0, nb::arg("collective_timeout") = nb::none(),
      nb::rv_policy::take_ownership,
      "Opens one device per mesh position (\"cpu\": ids first_id, first_id + 1, ... in "
      "row-major order): shape (n,) is a 1-D mesh, (rows, cols) a 2-D one. "
      "collective_timeout: seconds a member waits for its peers (default 300).");

  nb::class_<Placement>(m, "Placement",
                        "Where a mesh tensor's values are along one mesh axis: replicate(), "
                        "shard(dim) or partial().")
      .def_static("replicate", &Placement::replicate)
      .def_static("shard", &Placement::shard, nb::arg("dim"))
      .def_static("partial", &Placement::partial)
      .def_prop_ro("kind",
                   [](const Placement& p) {
                     switch (p.kind) {
                       case Placement::Kind::replicated: return "replicated";
                       case Placement::Kind::sharded: return "sharded";
                       case Placement::Kind::partial: return "partial";
                     }
                     return "?";
                   })
      .def_prop_ro("dim", [](const Placement& p) { return p.dim; })
      .def("__eq__", [](const Placement& a, const Placement& b) { return a == b; })
      .def("__hash__", [](const Placement& p) {
        return std::hash<std::string>{}(p.to_string());
      })
      .def("__repr__", &Placement::to_string);

  nb::class_<MeshTensor>(m, "MeshTensor",
                         "One logical tensor over a mesh: a shard on every member and a "
                         "placement per mesh axis.")
      .def(
          "__init__",
          [](MeshTensor* self, std::vector<Tensor> shards, const PyMesh& mesh,
             nb::handle placements) {
            new (self) MeshTensor(std::move(shards), mesh.get("MeshTensor"),
                                  placements_of(placements, "MeshTensor"));
          },
          nb::arg("shards"), nb::arg("mesh"), nb::arg("placements"))
      .def_prop_ro("shards", [](const MeshTensor& t) { return t.shards(); })
      .def_prop_ro("placements", [](const MeshTensor& t) { return t.placements(); })
      .def_prop_ro("shape", [](const MeshTensor& t) { return shape_of(t.shape()); })
      .def_prop_ro("dtype", &MeshTensor::dtype)
      .def(
          "with_placements",
          [](const MeshTensor& t, nb::handle placements) {
            return t.with_placements(placements_of(placements, "with_placements"));
          },
          nb::arg("placements"))
      .def(
          "with_shards",
          [](const MeshTensor& t, std::vector<Tensor> shards, nb::handle placements) {
            return MeshTensor::from_shards(std::move(shards), t.mesh(),
                                           placements.is_none()
                                               ? t.placements()
                                               : placements_of(placements, "with_shards"));
          },
          nb::arg("shards"), nb::arg("placements") = nb::none(),
          "A mesh tensor on the same mesh with other shards (one per member, shard i on member "
          "i) and these placements (default: this one's).")
      .def("__repr__", &MeshTensor::to_string);

  m.def(
      "distribute",
      [](nb::handle value, const PyMesh& mesh, nb::handle placements, nb::handle queue) {
        const Tensor tensor = nb::isinstance<Tensor>(value)
                                  ? nb::cast<Tensor>(value)
                                  : host_tensor_from_array(value, std::nullopt, "distribute");
        return distribute(tensor, mesh.get("distribute"), placements_of(placements, "distribute"),
                          parse_queue(queue));
      },
      nb::arg("value"), nb::arg("mesh"), nb::arg("placements"), nb::kw_only(),
      nb::arg("queue") = nb::none(),
      "Splits or copies a tensor (or array) over the mesh: one placement per mesh axis.");
  m.def(
      "gather_to_host",
      [](const MeshTensor& t, nb::handle queue) {
        const QueueId q = parse_queue(queue);
        nb::gil_scoped_release release;
        return gather_to_host(t, q);
      },
      nb::arg("tensor"), nb::kw_only(), nb::arg("queue") = nb::none(),
      "The logical tensor on the host: shards concatenated, replicas from the first member, "
      "partial values summed in member order.");
  m.def(
      "gather_shards",
      [](const MeshTensor& t, nb::handle queue) {
        const QueueId q = parse_queue(queue);
        nb::gil_scoped_release release;
        return gather_shards(t, q);
      },
      nb::arg("tensor"), nb::kw_only(), nb::arg("queue") = nb::none(),
      "Every member's shard on the host, in member order.");

  nb::module_ ops = nb::borrow<nb::module_>(m.attr("ops"));
  ops.def(
      "all_reduce",
      [](const MeshTensor& x, std::size_t mesh_axis, nb::handle queue) {
        return ops::all_reduce(x, mesh_axis, parse_queue(queue));
      },
      nb::arg("x"), nb::arg("mesh_axis") = 0, nb::kw_only(), nb::arg("queue") = nb::none(),
      "Sums the partial values along a mesh axis; the result is replicated along it.");
  ops.def(
      "all_gather",
      [](const MeshTensor& x, std::size_t mesh_axis, nb::handle queue) {
        return ops::all_gather(x, mesh_axis, parse_queue(queue));
      },
      nb::arg("x"), nb::arg("mesh_axis") = 0, nb::kw_only(), nb::arg("queue") = nb::none(),
      "Concatenates the shards along their sharded dimension; replicated along the axis.");
  ops.def(
      "reduce_scatter",
      [](const MeshTensor& x, std::int64_t dim, std::size_t mesh_axis, nb::handle queue) {
        return ops::reduce_scatter(x, dim, mesh_axis, parse_queue(queue));
      },
      nb::arg("x"), nb::arg("dim"), nb::arg("mesh_axis") = 0, nb::kw_only(),
      nb::arg("queue") = nb::none(),
      "Sums the partial values along a mesh axis, member k keeping the k-th slice of `dim`.");
}

}  // namespace retrace::python
