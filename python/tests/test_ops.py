"""retrace.ops from Python: results against numpy, keywords, out=, errors."""
import math

import numpy as np
import pytest

import retrace
from retrace import ops


def dev(device, a, dtype=None):
    return retrace.from_numpy(np.ascontiguousarray(a), device=device, dtype=dtype)


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum,
}
UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "sqrt": np.sqrt, "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0), "sin": np.sin, "cos": np.cos, "square": np.square,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "silu": lambda x: x / (1 + np.exp(-x)),
    "erf": np.vectorize(math.erf),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shapes", [((2, 3), (2, 3)), ((4, 1, 3), (5, 1)), ((0, 3), (1, 3)), ((1,), ())])
def test_binary_broadcasting(device, rng, name, shapes):
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32) + 3.0
    op = getattr(ops, name)
    got = op(dev(device, a), dev(device, b)).numpy()
    np.testing.assert_allclose(got, BINARY[name](a, b).astype(np.float32), rtol=1e-6)
    scalar = op(dev(device, a), 2.5).numpy()
    np.testing.assert_allclose(scalar, BINARY[name](a, np.float32(2.5)), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(device, rng, name):
    a = np.abs(rng.standard_normal((3, 7))).astype(np.float32) + 0.1
    got = getattr(ops, name)(dev(device, a)).numpy()
    expected = UNARY[name](a.astype(np.float64))
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)


def test_out_forms_and_in_place(device, rng):
    a = rng.standard_normal((4, 8)).astype(np.float32)
    x = dev(device, a)
    out = retrace.empty((4, 8), device=device)
    assert ops.add(x, 1.0, out=out) is out
    np.testing.assert_allclose(out.numpy(), a + 1, rtol=1e-6)
    ops.mul(x, 2.0, out=x)  # in place
    np.testing.assert_allclose(x.numpy(), a * 2, rtol=1e-6)
    ops.exp(x, out=out)
    np.testing.assert_allclose(out.numpy(), np.exp(a * 2), rtol=2e-6)
    ops.softmax(x, out=x)
    np.testing.assert_allclose(x.numpy().sum(-1), np.ones(4), rtol=1e-5)
    w = dev(device, rng.standard_normal((3, 8)).astype(np.float32))
    lin = retrace.empty((4, 3), device=device)
    ops.linear(x, w, out=lin)
    np.testing.assert_allclose(lin.numpy(), x.numpy() @ w.numpy().T, rtol=1e-5, atol=1e-6)
    with pytest.raises(retrace.InvalidArgument, match="matmul"):
        ops.matmul(x, w, transpose_b=True, out=x)  # wrong shape
    with pytest.raises(retrace.InvalidArgument, match="out must be a retrace.Tensor"):
        ops.add(x, 1.0, out=np.zeros((4, 8), np.float32))


def test_reductions_and_norms(device, rng):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    x = dev(device, a)
    for dim in (0, 1, -1):
        np.testing.assert_allclose(ops.sum(x, dim).numpy(), a.sum(dim), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ops.mean(x, dim=dim, keepdim=True).numpy(),
                                   a.mean(dim, keepdims=True), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(ops.max(x, dim).numpy(), a.max(dim))
        np.testing.assert_array_equal(ops.min(x, dim).numpy(), a.min(dim))
        np.testing.assert_allclose(ops.var(x, dim).numpy(), a.var(dim, ddof=1), rtol=1e-5)
        np.testing.assert_allclose(ops.std(x, dim, correction=0).numpy(), a.std(dim), rtol=1e-5)
        sm = np.exp(a - a.max(dim, keepdims=True))
        sm /= sm.sum(dim, keepdims=True)
        np.testing.assert_allclose(ops.softmax(x, dim).numpy(), sm, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(ops.log_softmax(x, dim).numpy(), np.log(sm), rtol=1e-5, atol=1e-6)
    mu = a.mean(-1, keepdims=True)
    ln = (a - mu) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ops.layer_norm(x).numpy(), ln, rtol=1e-4, atol=1e-5)
    w = rng.standard_normal(5).astype(np.float32)
    rms = a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(ops.rms_norm(x, dev(device, w)).numpy(), rms, rtol=1e-4, atol=1e-5)
    g = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    grouped = g.reshape(2, 2, -1)
    gn = ((grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-5)).reshape(g.shape)
    np.testing.assert_allclose(ops.group_norm(dev(device, g), 2).numpy(), gn, rtol=1e-4, atol=1e-5)
    empty = dev(device, np.zeros((2, 0), np.float32))
    np.testing.assert_array_equal(ops.sum(empty).numpy(), [0, 0])
    assert np.isnan(ops.mean(empty).numpy()).all()


def test_matmul_attention_shapes(device, rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(ops.matmul(dev(device, a), dev(device, b)).numpy(), a @ b, rtol=1e-5, atol=1e-6)
    v = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(ops.matmul(dev(device, v), dev(device, b)).numpy(), v @ b, rtol=1e-5, atol=1e-6)
    q, k, vv = (rng.standard_normal((1, 2, 6, 8)).astype(np.float32) for _ in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(8)
    causal = np.triu(np.full((6, 6), -np.inf, np.float32), 1)
    for mask, is_causal in ((None, False), (None, True)):
        scores = s + (causal if is_causal else 0)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        got = ops.scaled_dot_product_attention(dev(device, q), dev(device, k), dev(device, vv),
                                               mask, is_causal=is_causal).numpy()
        np.testing.assert_allclose(got, p @ vv, rtol=1e-4, atol=1e-5)
    out = retrace.empty((1, 2, 6, 8), device=device)
    ops.scaled_dot_product_attention(dev(device, q), dev(device, k), dev(device, vv), is_causal=True, out=out)
    np.testing.assert_allclose(out.numpy(), got, rtol=0, atol=0)


def test_shape_ops(device, rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x = dev(device, a)
    np.testing.assert_array_equal(ops.reshape(x, (6, -1)).numpy(), a.reshape(6, -1))
    np.testing.assert_array_equal(ops.permute(x, (2, 0, 1)).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(ops.transpose(x, 0, 2).numpy(), a.swapaxes(0, 2))
    np.testing.assert_array_equal(ops.slice(x, 2, 1, 4, 2).numpy(), a[:, :, 1:4:2])
    parts = ops.split(x, [1, 3], dim=2)
    np.testing.assert_array_equal(parts[1].numpy(), a[:, :, 1:])
    chunks = ops.chunk(x, 3, dim=1)
    assert len(chunks) == 3
    np.testing.assert_array_equal(ops.concat(chunks, 1).numpy(), a)
    np.testing.assert_array_equal(ops.cat([x, x], dim=0).numpy(), np.concatenate([a, a]))
    i = ops.typecast(x, retrace.int32)
    assert i.dtype == retrace.int32
    t = ops.to_layout(x, retrace.TILE_LAYOUT)
    np.testing.assert_array_equal(ops.to_layout(t, retrace.ROW_MAJOR_LAYOUT).numpy(), a)
    f = ops.full((2, 2), 1.5, device)
    np.testing.assert_array_equal(f.numpy(), np.full((2, 2), 1.5, np.float32))
    ops.fill(f, -3)
    np.testing.assert_array_equal(ops.zeros([3], device, dtype="int32").numpy(), [0, 0, 0])
    np.testing.assert_array_equal(f.numpy(), np.full((2, 2), -3, np.float32))
    c = ops.clamp(x, min=-0.5, max=0.5)
    np.testing.assert_array_equal(c.numpy(), np.clip(a, -0.5, 0.5))
    np.testing.assert_array_equal(ops.clamp(x, max=0.0).numpy(), np.minimum(a, 0))


def test_integer_ops(device):
    a = dev(device, np.array([7, -7, np.iinfo(np.int32).min, 5], np.int32))
    b = dev(device, np.array([2, 2, -1, 0], np.int32))
    np.testing.assert_array_equal(ops.div(a, b).numpy(), [3, -3, np.iinfo(np.int32).min, 0])
    with pytest.raises(retrace.InvalidArgument, match="whole number"):
        ops.mul(a, 0.5)


def test_errors_name_the_op(device):
    x = dev(device, np.zeros((2, 3), np.float32))
    with pytest.raises(retrace.InvalidArgument, match="reshape") as info:
        ops.reshape(x, (4, 4))
    assert isinstance(info.value, ValueError) and info.value.category == "invalid argument"
    with pytest.raises(retrace.InvalidArgument, match="add"):
        ops.add(x, dev(device, np.zeros((4,), np.float32)))
    with pytest.raises(retrace.InvalidArgument, match="b must be a retrace.Tensor or a number"):
        ops.add(x, "one")
    with pytest.raises(retrace.InvalidArgument, match="permute: dims must be a sequence"):
        ops.permute(x, "01")
    with pytest.raises(TypeError):
        ops.add(np.zeros(3), 1.0)  # numpy arrays are not tensors: from_numpy first
    with pytest.raises(retrace.InvalidArgument, match="host"):
        ops.add(retrace.from_numpy(np.zeros(3, np.float32)), 1.0)
    with pytest.raises(retrace.InvalidArgument, match="queue 99 is out of range"):
        ops.add(x, 1.0, queue=99)


def test_assert_finite_becomes_device_error(device):
    x = dev(device, np.array([1.0, np.nan], np.float32))
    ops.assert_finite(x)
    with pytest.raises(retrace.DeviceError, match="assert_finite"):
        device.synchronize()


def test_arange(device):
    np.testing.assert_array_equal(ops.arange(5, device=device).numpy(), np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(ops.arange(-1, 1, 0.25, device=device).numpy(),
                                  np.arange(-1, 1, 0.25).astype(np.float32))
    np.testing.assert_array_equal(ops.arange(10, 0, -3, device=device, dtype="int32").numpy(), [10, 7, 4, 1])
    assert ops.arange(3, 1, device=device).shape == (0,)
    with pytest.raises(retrace.InvalidArgument, match="step must not be 0"):
        ops.arange(0, 1, 0, device=device)


def test_random_draws(device):
    gen = retrace.Generator(device, seed=7)
    z = ops.randn((2, 3, 5), generator=gen)
    assert z.shape == (2, 3, 5) and gen.offset == 1 and gen.seed == 7
    u = ops.rand((1000,), generator=gen, dtype="bfloat16").numpy()
    assert u.min() >= 0 and u.max() < 1
    # The same seed and offset give the same numbers; a prefix does not depend on the shape.
    again = retrace.Generator(device, seed=7)
    np.testing.assert_array_equal(ops.randn((7,), generator=again).numpy(), z.numpy().ravel()[:7])
    gen.offset = 0
    out = retrace.empty((2, 3, 5), device=device)
    assert ops.randn(generator=gen, out=out) is out
    np.testing.assert_array_equal(out.numpy(), z.numpy())
    gen.manual_seed(8)
    assert gen.offset == 0 and gen.seed == 8
    with pytest.raises(retrace.InvalidArgument, match="randn: dtype must be float32, bfloat16 or float16"):
        ops.randn((3,), generator=gen, dtype="int32")


def test_random_draws_in_a_trace_advance_on_every_replay(device):
    traced_gen = retrace.Generator(device, seed=3)
    eager_gen = retrace.Generator(device, seed=3)
    tracer = retrace.Tracer(lambda x: ops.add(x, ops.randn((4, 4), generator=traced_gen)), device=device)
    x = np.ones((4, 4), np.float32)
    seen = []
    for _ in range(3):
        traced = tracer(x).numpy().copy()
        eager = ops.add(retrace.from_numpy(x).to_device(device), ops.randn((4, 4), generator=eager_gen))
        np.testing.assert_array_equal(traced, eager.numpy())
        assert all((traced != earlier).any() for earlier in seen)
        seen.append(traced)
    assert traced_gen.offset == 3


def test_comparisons_where_and_masked_fill(device):
    a = np.array([[1.0, np.nan, -3.0], [0.5, 2.0, 0.0]], np.float32)
    b = np.array([0.5, 0.0, 0.0], np.float32)
    ta, tb = retrace.from_numpy(a).to_device(device), retrace.from_numpy(b).to_device(device)
    for name, ref in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                      ("gt", np.greater), ("ge", np.greater_equal)]:
        got = getattr(ops, name)(ta, tb)
        assert got.dtype == retrace.bool_
        np.testing.assert_array_equal(got.numpy(), ref(a, b))
        np.testing.assert_array_equal(getattr(ops, name)(ta, 0.5).numpy(), ref(a, np.float32(0.5)))
    cond = ops.gt(ta, tb)
    np.testing.assert_array_equal(ops.where(cond, ta, ops.neg(ta)).numpy(), np.where(a > b, a, -a))
    mask = retrace.from_numpy(np.array([True, False, True])).to_device(device)
    assert mask.dtype == retrace.bool_
    np.testing.assert_array_equal(ops.masked_fill(ta, mask, -np.inf).numpy(),
                                  np.where(np.array([True, False, True]), -np.inf, a).astype(np.float32))
    with pytest.raises(retrace.InvalidArgument, match="where: cond must be a bool tensor"):
        ops.where(ta, ta, ta)


def _conv2d_reference(x, w, b, stride, padding, dilation, groups):
    """Direct convolution in float64 (numpy), torch's conv2d semantics."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho = (h - dilation * (kh - 1) - 1) // stride + 1
    wo = (wd - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, ho, wo))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for a in range(kh):
            for bb in range(kw):
                patch = x[:, g * cg:(g + 1) * cg,
                          a * dilation:a * dilation + stride * (ho - 1) + 1:stride,
                          bb * dilation:bb * dilation + stride * (wo - 1) + 1:stride]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, a, bb].astype(np.float64))
        if b is not None:
            out[:, oc] += b[oc]
    return out


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1),
                                                           (1, 2, 2, 2), (1, 1, 1, 4)])
def test_conv2d_pad_and_interpolate_match_numpy(device, stride, padding, dilation, groups):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4 // groups, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    xt = retrace.from_numpy(x, device=device)
    y = ops.conv2d(xt, retrace.from_numpy(w, device=device), retrace.from_numpy(b, device=device),
                   stride=stride, padding=padding, dilation=dilation, groups=groups)
    np.testing.assert_allclose(y.numpy(), _conv2d_reference(x, w, b, stride, padding, dilation,
                                                            groups), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ops.pad(xt, (1, 2, 0, 1), 0.5).numpy(),
                                  np.pad(x, ((0, 0), (0, 0), (0, 1), (1, 2)), constant_values=0.5))
    np.testing.assert_array_equal(ops.interpolate_nearest(xt, (18, 16)).numpy(),
                                  x.repeat(2, axis=2).repeat(2, axis=3))
    with pytest.raises(retrace.InvalidArgument, match="conv2d: stride is one integer or two"):
        ops.conv2d(xt, retrace.from_numpy(w, device=device), stride=(1, 2, 3), groups=groups)


def _torch_axis(n_in, n_out, align_corners):
    """torch's bilinear taps along one axis (float32 coordinates)."""
    i = np.arange(n_out, dtype=np.float32)
    if n_in == n_out:
        idx = np.arange(n_out)
        return idx, idx, np.ones(n_out, np.float32), np.zeros(n_out, np.float32)
    if align_corners:
        scale = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0)
        src = scale * i
    else:
        scale = np.float32(n_in) / np.float32(n_out)
        # one rounding (torch's kernels compute this as a fused multiply-add)
        src = (np.float64(scale) * (np.arange(n_out) + 0.5) - 0.5).astype(np.float32)
        src = np.maximum(src, np.float32(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    l1 = np.clip(src - i0.astype(np.float32), 0, 1).astype(np.float32)
    return i0, np.minimum(i0 + 1, n_in - 1), (np.float32(1) - l1), l1


@pytest.mark.parametrize("size,align_corners", [((7, 5), False), ((3, 11), True), ((1, 1), False)])
def test_interpolate_bilinear_and_nearest_match_numpy(device, size, align_corners):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    xt = retrace.from_numpy(x, device=device)
    oh, ow = size
    h0, h1, hl0, hl1 = _torch_axis(4, oh, align_corners)
    w0, w1, wl0, wl1 = _torch_axis(6, ow, align_corners)
    xd = x.astype(np.float64)
    rows = xd[:, :, :, w0] * wl0 + xd[:, :, :, w1] * wl1
    want = rows[:, :, h0, :] * hl0[:, None] + rows[:, :, h1, :] * hl1[:, None]
    got = ops.interpolate(xt, size, mode="bilinear", align_corners=align_corners).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    hi = np.minimum(np.floor(np.arange(oh, dtype=np.float32) * (np.float32(4) / np.float32(oh))),
                    3).astype(np.int64)
    wi = np.minimum(np.floor(np.arange(ow, dtype=np.float32) * (np.float32(6) / np.float32(ow))),
                    5).astype(np.int64)
    np.testing.assert_array_equal(ops.interpolate(xt, size).numpy(), x[:, :, hi][:, :, :, wi])
    cubic = ops.interpolate(xt, size, mode="bicubic", align_corners=align_corners).numpy()
    assert cubic.shape == (2, 3, oh, ow) and np.isfinite(cubic).all()
    flat = retrace.from_numpy(np.full((1, 1, 4, 6), 1.5, np.float32), device=device)
    np.testing.assert_allclose(ops.interpolate(flat, size, mode="bicubic").numpy(), 1.5, atol=4e-6)
    area = ops.interpolate(xt, size, mode="area").numpy()
    h0 = (np.arange(oh) * 4) // oh
    h1 = ((np.arange(oh) + 1) * 4 + oh - 1) // oh
    w0 = (np.arange(ow) * 6) // ow
    w1 = ((np.arange(ow) + 1) * 6 + ow - 1) // ow
    want_area = np.array([[xd[:, :, h0[i]:h1[i], w0[j]:w1[j]].mean(axis=(2, 3)) for j in range(ow)]
                          for i in range(oh)]).transpose(2, 3, 0, 1)
    np.testing.assert_allclose(area, want_area, rtol=1e-6, atol=1e-6)
    with pytest.raises(retrace.InvalidArgument, match="interpolate: mode 'lanczos'"):
        ops.interpolate(xt, size, mode="lanczos")


def test_interpolate_by_scale_factor_reads_through_one_over_the_factor(device):
    # torch's F.interpolate(scale_factor=...): floor(in * factor) outputs, positions through
    # 1 / factor rounded to float32 (not in / out: 5 by 1.5 gives 7 outputs at steps of 0.6667).
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    xt = retrace.from_numpy(x, device=device)
    got = ops.interpolate(xt, scale_factor=(1.5, 0.75), mode="nearest-exact").numpy()
    assert got.shape == (1, 2, 7, 3)

    def exact(n_in, n_out, factor):
        at = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * np.float32(1.0 / factor)
        return np.minimum(np.floor(at).astype(np.int64), n_in - 1)

    np.testing.assert_array_equal(got, x[:, :, exact(5, 7, 1.5)][:, :, :, exact(4, 3, 0.75)])
    # A whole factor: the same as the size it gives; one number for both dimensions.
    np.testing.assert_array_equal(ops.interpolate(xt, scale_factor=2, mode="bilinear").numpy(),
                                  ops.interpolate(xt, (10, 8), mode="bilinear").numpy())
    np.testing.assert_array_equal(ops.interpolate(xt, scale_factor=2.0).numpy(),
                                  x.repeat(2, axis=2).repeat(2, axis=3))
    # recompute_scale_factor=True: the sizes decide, as torch's.
    np.testing.assert_array_equal(
        ops.interpolate(xt, scale_factor=1.5, mode="bilinear", recompute_scale_factor=True).numpy(),
        ops.interpolate(xt, (7, 6), mode="bilinear").numpy())
    assert ops.interpolate(xt, 3).shape == (1, 2, 3, 3)  # one size for both, as torch's
    with pytest.raises(retrace.InvalidArgument, match="exactly one of size and scale_factor"):
        ops.interpolate(xt)
    with pytest.raises(retrace.InvalidArgument, match="exactly one of size and scale_factor"):
        ops.interpolate(xt, (2, 2), scale_factor=2.0)
    with pytest.raises(retrace.InvalidArgument, match="scale_factor for the width is -1"):
        ops.interpolate(xt, scale_factor=(2.0, -1.0))


def test_torch_forms_of_split_where_and_reductions(device, rng):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    xt = retrace.from_numpy(x, device=device)
    # split by one size (the last piece smaller), as torch.split(t, 2, dim).
    assert [p.shape for p in ops.split(xt, 2, 3)] == [(2, 3, 4, 2), (2, 3, 4, 2), (2, 3, 4, 1)]
    assert [p.shape for p in ops.split(xt, [1, 2], 1)] == [(2, 1, 4, 5), (2, 2, 4, 5)]
    # where with a number for either side: a 0-d tensor of the other's dtype.
    cond = retrace.from_numpy(x > 0, device=device)
    np.testing.assert_array_equal(ops.where(cond, xt, 0.0).numpy(), np.where(x > 0, x, 0))
    np.testing.assert_array_equal(ops.where(cond, -1, xt).numpy(), np.where(x > 0, -1, x))
    both = ops.where(cond, 1.0, 2.0)
    assert both.dtype == retrace.float32 and both.shape == x.shape
    with pytest.raises(retrace.InvalidArgument, match="where: a must be a tensor or a number"):
        ops.where(cond, "1", xt)
    # Reductions over several dimensions, as torch's dim=(2, 3).
    for name, ref in (("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min)):
        for dims, keep in (((2, 3), False), ((-1, 0), True), ([0, 1, 2, 3], False)):
            got = getattr(ops, name)(xt, dims, keepdim=keep).numpy()
            want = ref(x.astype(np.float64), axis=tuple(dims), keepdims=keep)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} {dims}")
    with pytest.raises(retrace.InvalidArgument, match="sum: a dimension appears twice"):
        ops.sum(xt, (1, -3))
    with pytest.raises(retrace.InvalidArgument, match="argmax: dim must be one integer"):
        ops.argmax(xt, (1, 2))


def test_argmax_and_boolean_attention_masks(device):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 7)).astype(np.float32)
    x[1, 4] = np.nan
    xt = retrace.from_numpy(x, device=device)
    np.testing.assert_array_equal(ops.argmax(xt).numpy(), [np.argmax(x[0]), 4, np.argmax(x[2])])
    np.testing.assert_array_equal(ops.argmax(xt, 0, keepdim=True).numpy(),
                                  np.argmax(x, 0, keepdims=True))
    assert ops.argmax(xt).dtype == retrace.int32
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    keep = np.array([[[[True, True, False]]]])
    additive = np.where(keep, 0.0, -np.inf).astype(np.float32)
    args = [retrace.from_numpy(a, device=device) for a in (q, k, v)]
    with_bool = ops.scaled_dot_product_attention(*args, retrace.from_numpy(keep, device=device))
    with_add = ops.scaled_dot_product_attention(*args, retrace.from_numpy(additive, device=device))
    np.testing.assert_array_equal(with_bool.numpy(), with_add.numpy())


def test_embedding_index_select_and_gather_match_numpy(device):
    rng = np.random.default_rng(12)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    idx = np.array([[3, 0, 9], [9, 1, 2]])  # int64 from numpy: converted to int32
    wt = dev(device, table)
    np.testing.assert_array_equal(ops.embedding(wt, dev(device, idx)).numpy(), table[idx])
    np.testing.assert_array_equal(
        ops.index_select(wt, 1, dev(device, np.array([3, 3, 0]))).numpy(), table[:, [3, 3, 0]])
    g = rng.integers(0, 10, size=(6, 4))
    np.testing.assert_array_equal(ops.gather(wt, 0, dev(device, g)).numpy(),
                                  np.take_along_axis(table, g, 0))
    halves = table.astype(np.float16)
    out = ops.embedding(dev(device, halves), dev(device, idx))
    assert out.dtype == retrace.float16
    np.testing.assert_array_equal(out.numpy(), halves[idx])
    with pytest.raises(retrace.InvalidArgument, match="embedding: index must be int32"):
        ops.embedding(wt, dev(device, idx.astype(np.float32)))
    ops.embedding(wt, dev(device, np.array([1, 10])))
    with pytest.raises(retrace.DeviceError, match=r"index element 1 is 10, outside \[0, 10\)"):
        device.synchronize()


def test_float16_round_trips_numpy_and_computes_in_float(device):
    x = np.array([1.0, 65504.0, 6e-8, -0.0, np.inf, 0.1], dtype=np.float16)
    t = dev(device, x)
    assert t.dtype == retrace.float16
    back = t.numpy()
    assert back.dtype == np.float16
    np.testing.assert_array_equal(back.view(np.uint16), x.view(np.uint16))
    y = ops.add(t, t).numpy()
    with np.errstate(over="ignore"):  # 65504 * 2 is inf in float16, as retrace gives
        want = (x.astype(np.float32) * 2).astype(np.float16)
    np.testing.assert_array_equal(y, want)
    assert retrace.from_numpy(np.ones(3), device=device, dtype="float16").dtype == retrace.float16


def test_logical_ops_match_numpy(device):
    a = np.array([[0.0, 1.0, np.nan], [-2.0, 0.0, 0.5]], np.float32)
    b = np.array([True, False, True])
    at, bt = dev(device, a), dev(device, b)
    np.testing.assert_array_equal(ops.logical_and(at, bt).numpy(), np.logical_and(a, b))
    np.testing.assert_array_equal(ops.logical_or(at, bt).numpy(), np.logical_or(a, b))
    np.testing.assert_array_equal(ops.logical_xor(at, bt).numpy(), np.logical_xor(a, b))
    np.testing.assert_array_equal(ops.logical_not(at).numpy(), np.logical_not(a))
    assert ops.logical_not(at).dtype == retrace.bool_


def test_slash_is_true_division(device):
    a = np.array([7, -7, 5, 1], dtype=np.int32)
    b = np.array([2, 2, 4, 3], dtype=np.int32)
    at = retrace.from_numpy(a, device=device)
    bt = retrace.from_numpy(b, device=device)
    got = (at / bt).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (a / b).astype(np.float32))
    np.testing.assert_array_equal((at / 0.5).numpy(), (a / 0.5).astype(np.float32))
    np.testing.assert_array_equal(ops.true_divide(at, 4).numpy(), (a / 4).astype(np.float32))
    # div keeps the dtype and truncates, as documented
    np.testing.assert_array_equal(ops.div(at, bt).numpy(), np.array([3, -3, 1, 0], np.int32))
    np.testing.assert_array_equal((1 / at).numpy(), (1 / a).astype(np.float32))
    x = retrace.from_numpy(np.array([2.0, 4.0], np.float32), device=device)
    np.testing.assert_array_equal((1 / x).numpy(), np.array([0.5, 0.25], np.float32))


def test_floor_division_and_remainders_match_numpy(device):
    rng = np.random.default_rng(21)
    a = (rng.standard_normal(500) * 50).astype(np.float32)
    b = (rng.standard_normal(500) * 3).astype(np.float32)
    b[b == 0] = 1.0
    at, bt = retrace.from_numpy(a, device=device), retrace.from_numpy(b, device=device)
    np.testing.assert_array_equal((at // bt).numpy(), np.floor_divide(a, b))
    np.testing.assert_array_equal((at % bt).numpy(), np.remainder(a, b))
    np.testing.assert_array_equal(ops.fmod(at, bt).numpy(), np.fmod(a, b))
    np.testing.assert_array_equal((at // 2.5).numpy(), np.floor_divide(a, np.float32(2.5)))
    np.testing.assert_array_equal((7.0 // bt).numpy(), np.floor_divide(np.float32(7), b))
    np.testing.assert_array_equal((7.0 % bt).numpy(), np.remainder(np.float32(7), b))
    i = np.array([7, -7, 7, -7, 0, 5], np.int32)
    j = np.array([2, 2, -2, -2, 3, 0], np.int32)
    it, jt = retrace.from_numpy(i, device=device), retrace.from_numpy(j, device=device)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal((it // jt).numpy(), np.floor_divide(i, j))  # x // 0 is 0
        np.testing.assert_array_equal((it % jt).numpy(), np.remainder(i, j))
    np.testing.assert_array_equal(ops.fmod(it, jt).numpy(), np.array([1, -1, 1, -1, 0, 0]))
    with pytest.raises(retrace.InvalidArgument, match="remainder: the scalar"):
        it % 2.5


def test_stack_expand_repeat_flip_match_numpy(device):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 1, 3)).astype(np.float32)
    xt = retrace.from_numpy(x, device=device)
    np.testing.assert_array_equal(ops.expand(xt, (4, 2, 5, -1)).numpy(),
                                  np.broadcast_to(x, (4, 2, 5, 3)))
    np.testing.assert_array_equal(ops.repeat(xt, (2, 1, 3, 2)).numpy(), np.tile(x, (2, 1, 3, 2)))
    np.testing.assert_array_equal(ops.flip(xt, (0, 2)).numpy(), np.flip(x, (0, 2)))
    np.testing.assert_array_equal(ops.stack([xt, xt], dim=1).numpy(), np.stack([x, x], axis=1))
    assert ops.contiguous(xt) is not None
    with pytest.raises(retrace.InvalidArgument, match="expand: dimension 0"):
        ops.expand(xt, (3, 1, 3))


def test_rounding_ops_match_numpy(device):
    a = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.7, -2.7], np.float32)
    t = retrace.from_numpy(a, device=device)
    np.testing.assert_array_equal(ops.round(t).numpy(), np.round(a))  # halves to even
    np.testing.assert_array_equal(ops.floor(t).numpy(), np.floor(a))
    np.testing.assert_array_equal(ops.ceil(t).numpy(), np.ceil(a))
    np.testing.assert_array_equal(ops.trunc(t).numpy(), np.trunc(a))


def test_shape_ops_return_views_that_match_numpy(device, rng):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    x = dev(device, a)
    t = ops.permute(x, [2, 0, 1])
    assert t.address == x.address and not t.is_contiguous()
    assert t.stride() == (1, 20, 5)
    np.testing.assert_array_equal(t.numpy(), a.transpose(2, 0, 1))
    s = ops.slice(x, 2, 1, 5, 2)
    assert s.storage_offset() == 1 and s.stride() == (20, 5, 2)
    np.testing.assert_array_equal(s.numpy(), a[:, :, 1:5:2])
    # Ops on views give what they give on dense copies (bit for bit), and views see writes.
    np.testing.assert_array_equal(ops.exp(s).numpy(), ops.exp(s.contiguous()).numpy())
    np.testing.assert_array_equal(ops.matmul(x, ops.transpose(x, 1, 2)).numpy(),
                                  ops.matmul(x, ops.transpose(x, 1, 2).contiguous()).numpy())
    ops.copy(dev(device, np.zeros((3, 4, 2), np.float32)), s)
    assert (x.numpy()[:, :, 1:5:2] == 0).all()
    with pytest.raises(retrace.InvalidArgument, match="add: out is a strided view"):
        ops.add(t, t, out=t)
