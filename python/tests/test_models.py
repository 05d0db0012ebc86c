"""retrace.models from Python: the VAE decoder on a small diffusers-layout file written here,
traced == eager bit for bit, the 8-bit image, .npy files, errors naming the tensor, and the
Python demo's --vae."""
import json
import struct

import numpy as np
import pytest

import retrace
import retrace.demo
import retrace.models


def decoder_shapes(latent=4, blocks=(32, 64), layers=1, out=3):
    """The tensors of a diffusers AutoencoderKL decoder (and post_quant_conv), by name."""
    shapes = {}

    def conv(name, o, i, k):
        shapes[f"{name}.weight"] = (o, i, k, k)
        shapes[f"{name}.bias"] = (o,)

    def norm(name, c):
        shapes[f"{name}.weight"] = (c,)
        shapes[f"{name}.bias"] = (c,)

    def resnet(name, i, o):
        norm(f"{name}.norm1", i)
        conv(f"{name}.conv1", o, i, 3)
        norm(f"{name}.norm2", o)
        conv(f"{name}.conv2", o, o, 3)
        if i != o:
            conv(f"{name}.conv_shortcut", o, i, 1)

    top = blocks[-1]
    conv("post_quant_conv", latent, latent, 1)
    conv("decoder.conv_in", top, latent, 3)
    resnet("decoder.mid_block.resnets.0", top, top)
    norm("decoder.mid_block.attentions.0.group_norm", top)
    for p in ("to_q", "to_k", "to_v", "to_out.0"):
        shapes[f"decoder.mid_block.attentions.0.{p}.weight"] = (top, top)
        shapes[f"decoder.mid_block.attentions.0.{p}.bias"] = (top,)
    resnet("decoder.mid_block.resnets.1", top, top)
    prev = top
    for i, width in enumerate(reversed(blocks)):
        for j in range(layers + 1):
            resnet(f"decoder.up_blocks.{i}.resnets.{j}", prev if j == 0 else width, width)
        if i + 1 < len(blocks):
            conv(f"decoder.up_blocks.{i}.upsamplers.0.conv", width, width, 3)
        prev = width
    norm("decoder.conv_norm_out", blocks[0])
    conv("decoder.conv_out", out, blocks[0], 3)
    return shapes


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.fixture
def vae_file(tmp_path):
    rng = np.random.default_rng(7)
    tensors = {}
    for name, shape in decoder_shapes().items():
        if len(shape) == 1:
            base = 1.0 if name.endswith(".weight") else 0.0
            tensors[name] = base + 0.05 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            tensors[name] = rng.standard_normal(shape) / np.sqrt(fan_in)
    tensors["encoder.conv_in.weight"] = np.zeros((32, 3, 3, 3))  # an encoder's: skipped
    path = tmp_path / "vae.safetensors"
    write_safetensors(path, tensors)
    return str(path), tensors


def test_decode_traced_equals_eager_and_maps_to_8_bit(device, vae_file, rng, tmp_path):
    vae = retrace.models.VaeDecoder(vae_file[0], device)
    assert (vae.latent_channels, list(vae.block_out_channels), vae.layers_per_block,
            vae.upscale) == (4, [32, 64], 1, 2)
    latents = retrace.from_numpy(rng.standard_normal((2, 4, 5, 6)).astype(np.float32),
                                 device=device)
    eager = vae.decode(latents)
    assert eager.shape == (2, 3, 10, 12)
    assert np.isfinite(eager.numpy()).all()
    tracer = retrace.Tracer(vae.decode, device=device)
    tracer(latents)
    replay = tracer(latents)
    assert replay.numpy().tobytes() == eager.numpy().tobytes()

    rgb = retrace.models.vae_image(eager, 1)
    assert rgb.shape == (10, 12, 3) and rgb.dtype == np.uint8
    x = np.clip(eager.numpy()[1].transpose(1, 2, 0), -1, 1)
    expected = np.clip((x + np.float32(1)) / np.float32(2) * np.float32(255) + np.float32(0.5),
                       0, 255).astype(np.uint8)
    assert (rgb == expected).all()
    png = tmp_path / "image.png"
    retrace.models.write_png(str(png), rgb)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_npy_files_round_trip_with_numpy(device, rng, tmp_path):
    values = rng.standard_normal((1, 4, 3, 2)).astype(np.float32)
    np.save(tmp_path / "a.npy", values)
    read = retrace.models.read_npy(str(tmp_path / "a.npy"))
    assert read.shape == (1, 4, 3, 2)
    assert (read.numpy() == values).all()
    retrace.models.write_npy(str(tmp_path / "b.npy"), retrace.from_numpy(values, device=device))
    assert (np.load(tmp_path / "b.npy") == values).all()
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    with pytest.raises(retrace.InvalidArgument, match=r"is not a .npy file"):
        retrace.models.read_npy(str(tmp_path / "bad.npy"))


def test_a_missing_or_misshapen_tensor_is_named(device, vae_file, tmp_path):
    _, tensors = vae_file
    broken = dict(tensors)
    del broken["decoder.conv_out.bias"]
    write_safetensors(tmp_path / "missing.safetensors", broken)
    with pytest.raises(retrace.InvalidArgument,
                       match=r'no tensor "decoder.conv_out.bias" \(expected shape \[3\]\)'):
        retrace.models.VaeDecoder(str(tmp_path / "missing.safetensors"), device)
    broken = dict(tensors)
    broken["decoder.conv_in.bias"] = np.zeros((7,))
    write_safetensors(tmp_path / "shape.safetensors", broken)
    with pytest.raises(retrace.InvalidArgument,
                       match=r'weight "decoder.conv_in.bias" has shape \[7\], expected \[64\]'):
        retrace.models.VaeDecoder(str(tmp_path / "shape.safetensors"), device)


def test_demo_decodes_with_the_vae(vae_file, tmp_path, capsys):
    out = tmp_path / "demo.png"
    assert retrace.demo.main(["--steps", "2", "--depth", "1", "--hidden", "64", "--heads", "2",
                              "--input-size", "8", "--classes", "10", "--vae", vae_file[0],
                              "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("image [1, 3, 16, 16], traced == eager bit for bit") == 1
    assert text.count("traced == eager bit for bit") == 4
    assert f"wrote {out} (16x16 image decoded by the VAE)" in text
    assert "live traces: 2 (one per resolution), and 2 of the decoder" in text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_decode_bytes_sizes_a_device_before_the_decoder_loads(vae_file):
    path = vae_file[0]
    small = retrace.models.vae_decode_bytes(path, [1, 4, 4, 4])
    large = retrace.models.vae_decode_bytes(path, [1, 4, 16, 16])
    assert 0 < small < large
    assert retrace.models.vae_decode_bytes(path, [2, 4, 16, 16]) > large
    with pytest.raises(retrace.InvalidArgument, match=r"latents is \[B, C, h, w\], got 3"):
        retrace.models.vae_decode_bytes(path, [4, 16, 16])
    # A device sized by it, its traces given room: a traced decode fits.
    device = retrace.open_device("cpu:7", memory=(256 << 20) + 3 * large,
                                 trace_memory=(64 << 20) + large)
    vae = retrace.models.VaeDecoder(path, device)
    latents = retrace.from_numpy(np.zeros((1, 4, 16, 16), np.float32), device=device)
    tracer = retrace.Tracer(vae.decode, device=device)
    assert tracer(latents).shape == (1, 3, 32, 32)
    assert tracer(latents).shape == (1, 3, 32, 32)
