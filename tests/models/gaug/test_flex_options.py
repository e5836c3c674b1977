"""The FlexAttention kernel-option lists, the shared-memory estimate and the limit read from the
device's properties (injected: no GPU here)."""

import logging
from types import SimpleNamespace

import pytest
import torch

import locatdino.models.gaug.flex_bias_attention as flex_module
from locatdino.models.gaug.flex_options import (
    FP32_CANDIDATES,
    HALF_CANDIDATES,
    FlexOptions,
    candidates,
    fitting,
    shared_memory_estimate,
    shared_memory_limit,
)
from locatdino.models.gaug.separable_bias_attention import separable_bias_attention
from tests.models.gaug.test_flex_bias_attention import _inputs

H200 = SimpleNamespace(
    name="NVIDIA H200", major=9, minor=0, shared_memory_per_block=49152, shared_memory_per_block_optin=232448
)


def test_the_estimate_reproduces_the_shared_memory_triton_asked_for_on_the_h200():
    """On an H200, torch's Hopper default for bf16, head size 64 (128 × 128 tiles, 3 stages) with fp32
    profiles failed with 'Required: 376832 Hardware limit: 232448'."""
    assert shared_memory_estimate(128, 128, 3, 64, 2, 4) == 376832
    # the same tiles without the gathered profiles would have fitted: they are what overflows
    assert shared_memory_estimate(128, 128, 3, 64, 2, 0) < 232448
    # a single stage holds one set of tiles: Q 64×64, K and V 32×64, P 64×32 (bf16), profiles 64×32 (fp32)
    assert shared_memory_estimate(64, 32, 1, 64, 2, 4) == 2 * (64 * 64 + 2 * 32 * 64 + 64 * 32) + 2 * 4 * 64 * 32


def test_every_option_measured_on_the_h200_fits_its_limit():
    assert fitting(HALF_CANDIDATES, 64, torch.bfloat16, H200.shared_memory_per_block_optin) == list(HALF_CANDIDATES)
    assert fitting(FP32_CANDIDATES, 64, torch.float32, H200.shared_memory_per_block_optin) == list(FP32_CANDIDATES)
    assert [o.shared_memory(64, torch.bfloat16) for o in HALF_CANDIDATES] == [36864, 65536, 22528, None]


def test_lists_per_dtype_and_what_each_options_passes():
    assert candidates(torch.bfloat16) == candidates(torch.float16) == HALF_CANDIDATES
    assert candidates(torch.float32) == FP32_CANDIDATES and candidates(torch.float64) == (FlexOptions(),)
    first, default_half = HALF_CANDIDATES[0], HALF_CANDIDATES[-1]
    assert first.kernel_options() == {"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 1}
    assert first.profile_dtype(torch.bfloat16) == torch.float32  # the bias stays fp32 ...
    assert default_half.kernel_options() is None and default_half.profile_dtype(torch.bfloat16) == torch.bfloat16
    assert all(o.profiles == "fp32" for o in HALF_CANDIDATES[:-1])  # ... in every option before the last
    assert first.name == "BLOCK_M=64 BLOCK_N=32 num_stages=1, fp32 profiles"


@pytest.mark.parametrize(
    ("props", "limit"),
    [
        (H200, 232448),
        (SimpleNamespace(major=8, minor=0, shared_memory_per_block=49152), 49152),  # no opt-in attribute
        (SimpleNamespace(major=8, minor=0), None),  # nothing reported: skip nothing
    ],
)
def test_limit_read_from_the_device_properties(props, limit):
    assert shared_memory_limit(props) == limit


def test_the_chooser_skips_options_that_exceed_the_devices_shared_memory(monkeypatch, caplog):
    """With 40 000 B per block the 64 × 64 two-stage tiles (~64 KiB) are skipped, not tried; the
    others are tried in order; the key names the capability read from the device."""
    small = SimpleNamespace(major=9, minor=0, shared_memory_per_block_optin=40000)
    monkeypatch.setattr(flex_module, "device_properties", lambda device: small)
    flex_module.reset_flex_state()
    tried, failing = [], {HALF_CANDIDATES[0].kernel}

    def kernel(q, k, v, rows, cols, num_prefix, scale, options):
        tried.append((options, rows.dtype))
        if options in failing:
            raise RuntimeError("simulated compile failure")
        return separable_bias_attention(q.float(), k.float(), v.float(), rows, cols, num_prefix, scale).to(q.dtype)

    monkeypatch.setattr(flex_module, "_kernel", lambda device: kernel)
    q, k, v, rows, cols = _inputs(1, 3, 4)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    try:
        with caplog.at_level(logging.INFO, logger="locatdino.models.gaug"):
            flex_module.flex_bias_attention(q, k, v, rows, cols, 1)
        assert tried == [(HALF_CANDIDATES[0].kernel, torch.float32), (HALF_CANDIDATES[2].kernel, torch.float32)]
        assert any(
            "skipping BLOCK_M=64 BLOCK_N=64 num_stages=2, fp32 profiles for torch.bfloat16, head size 16: needs ~"
            in r.getMessage()
            and "the device allows 40000 B" in r.getMessage()
            for r in caplog.records
        )
        assert flex_module.flex_report()["chosen"] == {"bfloat16, head size 16, sm 9.0": HALF_CANDIDATES[2].name}

        # nothing pinned fits 1 000 B: only torch's default tiles are left to try
        flex_module.reset_flex_state()
        tried.clear()
        small.shared_memory_per_block_optin = 1000
        flex_module.flex_bias_attention(q, k, v, rows, cols, 1)
        assert tried == [((), torch.bfloat16)]
    finally:
        flex_module.reset_flex_state()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("options", HALF_CANDIDATES + FP32_CANDIDATES, ids=lambda o: o.name)
def test_each_option_computes_the_same_attention(options):
    """Through the (eager) kernel: options change tiles, never the result; bf16 profiles round the bias."""
    q, k, v, rows, cols = _inputs(5, 3, 4)
    want = separable_bias_attention(q, k, v, rows, cols, 5)
    with torch.no_grad():
        got = flex_module._run(flex_module._attend, (q, k, v, rows, cols), 5, 16**-0.5, options)
        # bf16 queries cast the profiles of an "input" option: the same on fp32 queries, by hand
        cast = options.profile_dtype(torch.bfloat16)
        half = flex_module._attend(q, k, v, rows.to(cast), cols.to(cast), 5, 16**-0.5, options.kernel)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    tolerance = 1e-5 if options.profiles == "fp32" else 2e-2  # a bias up to 4, rounded to 8 bits
    torch.testing.assert_close(half, want, rtol=tolerance, atol=tolerance)
    if options.profiles == "input":
        assert (half - want).abs().max() > 1e-4  # the rounding is visible: a measured choice, not a free one
