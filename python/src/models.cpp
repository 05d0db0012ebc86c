// retrace._core.models: the C++ models' VAE decoder and files (.safetensors, .npy, PNG) for
// Python: retrace.models re-exports them.
#include "bindings.hpp"

#include <retrace/models/npy.hpp>
#include <retrace/models/preview.hpp>
#include <retrace/models/safetensors.hpp>
#include <retrace/models/vae.hpp>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

namespace retrace::python {

namespace {

// The decoder with the Python device object that owns its device (kept alive by the object).
class PyVaeDecoder {
 public:
  PyVaeDecoder(const std::string& path, nb::handle device, nb::handle dtype,
               std::int64_t norm_groups, double scaling_factor, bool allow_unused)
      : device_(nb::borrow(device)) {
    Device& d = device_of(device, "VaeDecoder");
    const auto weights = models::read_safetensors(path);
    const models::VaeDecoderConfig config = models::infer_vae_decoder_config(
        weights, models::VaeInference{.norm_groups = norm_groups,
                                      .scaling_factor = scaling_factor,
                                      .dtype = dtype.is_none() ? DType::float32 : parse_dtype(dtype)});
    decoder_ = std::make_unique<models::VaeDecoder>(
        config, d, weights, allow_unused ? models::UnusedWeights::warn : models::UnusedWeights::error);
  }

  [[nodiscard]] const models::VaeDecoder& get() const { return *decoder_; }
  [[nodiscard]] nb::object device() const { return device_; }

 private:
  nb::object device_;
  std::unique_ptr<models::VaeDecoder> decoder_;
};

}  // namespace

void bind_models(nb::module_& parent) {
  nb::module_ m = parent.def_submodule(
      "models", "The Stable Diffusion VAE decoder and the model files (retrace.models).");
  nb::class_<PyVaeDecoder>(
      m, "VaeDecoder",
      "The decoder of a diffusers AutoencoderKL (.safetensors in diffusers' names, e.g. "
      "stabilityai/sd-vae-ft-ema's): latents [B, C, h, w] -> images [B, 3, 8h, 8w].")
      .def(nb::init<const std::string&, nb::handle, nb::handle, std::int64_t, double, bool>(),
           nb::arg("path"), nb::arg("device"), nb::arg("dtype") = nb::none(),
           nb::arg("norm_groups") = 32, nb::arg("scaling_factor") = 0.18215,
           nb::arg("allow_unused") = false,
           "Loads the file (configuration from its tensors; the encoder's are skipped) onto "
           "`device` in `dtype` (default float32).")
      .def("decode", [](const PyVaeDecoder& v, const Tensor& latents) { return v.get().decode(latents); },
           nb::arg("latents"),
           "latents [B, C, h, w] as the sampler leaves them (divided by the scaling factor "
           "first) -> image [B, 3, H, W], about [-1, 1].")
      .def_prop_ro("device", &PyVaeDecoder::device)
      .def_prop_ro("latent_channels",
                   [](const PyVaeDecoder& v) { return v.get().config().latent_channels; })
      .def_prop_ro("block_out_channels",
                   [](const PyVaeDecoder& v) { return v.get().config().block_out_channels; })
      .def_prop_ro("layers_per_block",
                   [](const PyVaeDecoder& v) { return v.get().config().layers_per_block; })
      .def_prop_ro("upscale", [](const PyVaeDecoder& v) { return v.get().config().upscale(); })
      .def_prop_ro("scaling_factor",
                   [](const PyVaeDecoder& v) { return v.get().config().scaling_factor; });

  m.def(
      "vae_decode_bytes",
      [](const std::string& path, const std::vector<std::int64_t>& latents, nb::handle dtype,
         std::int64_t norm_groups) {
        RETRACE_CHECK(latents.size() == 4, invalid_argument,
                      "vae_decode_bytes: latents is [B, C, h, w], got {} dimensions",
                      latents.size());
        const auto weights = models::read_safetensors(path);
        const models::VaeDecoderConfig config = models::infer_vae_decoder_config(
            weights,
            models::VaeInference{.norm_groups = norm_groups,
                                 .dtype = dtype.is_none() ? DType::float32 : parse_dtype(dtype)});
        return models::VaeDecoder::decode_bytes(
            config, Shape{latents[0], latents[1], latents[2], latents[3]});
      },
      nb::arg("path"), nb::arg("latents"), nb::arg("dtype") = nb::none(),
      nb::arg("norm_groups") = 32,
      "Device memory a decode of latents of this shape needs at its peak with the VAE file "
      "`path` (its configuration from the tensors, nothing uploaded), for sizing a device "
      "before the decoder is loaded: open_device(memory=...) and, for a traced decode, "
      "trace_memory=... (a trace of the decode holds about as much again).");
  m.def(
      "vae_image",
      [](const Tensor& image, std::int64_t index) {
        const models::RgbImage rgb = models::vae_image(image, index);
        const auto* data = new std::vector<std::uint8_t>(rgb.pixels);
        nb::capsule owner(data, [](void* p) noexcept {
          delete static_cast<std::vector<std::uint8_t>*>(p);
        });
        return nb::ndarray<nb::numpy, std::uint8_t>(
            const_cast<std::uint8_t*>(data->data()),
            {static_cast<std::size_t>(rgb.height), static_cast<std::size_t>(rgb.width), 3}, owner);
      },
      nb::arg("image"), nb::arg("index") = 0,
      "Image `index` of a decoded batch as 8-bit RGB [H, W, 3] (numpy), mapped as torchvision's "
      "save_image with value_range (-1, 1).");
  m.def(
      "write_png",
      [](const std::string& path, nb::ndarray<std::uint8_t, nb::ndim<3>, nb::c_contig, nb::device::cpu> rgb) {
        RETRACE_CHECK(rgb.shape(2) == 3, invalid_argument,
                      "write_png: expected an RGB array [H, W, 3], got {} channels", rgb.shape(2));
        models::RgbImage image{.width = static_cast<std::int64_t>(rgb.shape(1)),
                               .height = static_cast<std::int64_t>(rgb.shape(0)),
                               .pixels = std::vector<std::uint8_t>(rgb.data(), rgb.data() + rgb.size())};
        models::write_png(path, image);
      },
      nb::arg("path"), nb::arg("rgb"), "An 8-bit RGB array [H, W, 3] as a PNG file.");
  m.def("read_npy", &models::read_npy, nb::arg("path"),
        "A .npy file (float32, float64 or float16, C order) as a host float32 tensor.");
  m.def("write_npy", &models::write_npy, nb::arg("path"), nb::arg("tensor"),
        "A tensor (any device) as a float32 .npy file.");
}

}  // namespace retrace::python
