"""The hand-picked GEMM tilings script (``bench/variants/gemm_tilings.py``): its tilings, the
summary and the CPU path (the timing itself needs a GPU)."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from _bench_scripts import REPO

import gemm_tilings  # bench/variants
from helion_kernels.spec import Shape


def test_every_tiling_is_a_valid_helion_config_with_tile_n_128():
    # helion.Config takes any key, so compare with the keys Helion's search wrote in the committed entries
    entries = json.loads((REPO / "configs" / "nvidia_h200_sm90" / "matmul.json").read_text())["entries"]
    known = set().union(*(e["config"] for e in entries))
    for name, config in gemm_tilings.TILINGS.items():
        assert set(config) <= known, (name, set(config) - known)
        assert config["block_sizes"][1] == 128, name
        assert ("_f" in name) == bool(config.get("range_flattens")), name
        assert name.endswith("_x2") == (config.get("num_sm_multiplier") == 2), name


def test_summary_ratios_are_per_repeat_and_failures_are_named():
    times = {"cublas_mm": [1.0, 2.0, 1.0], "registry": [1.1, 2.0, 1.2],
             "tma_128x128x64_w8_s3": [0.9, 1.9, 1.0]}
    errors = {"cublas_mm": None, "registry": None, "tma_128x128x64_w8_s3": 0.002,
              "tma_64x128x64_w4_s6_f": "OutOfResources: shared memory", "tma_256x128x64_w8_s3_f": float("nan")}
    df = gemm_tilings.summarise(Shape(8, 8, 8), times, errors, "exact 8x8x8").set_index("tiling")
    assert df.loc["registry", "vs_cublas"] == pytest.approx(1.1)
    assert df.loc["registry", "vs_cublas_spread"] == pytest.approx(0.2)
    assert df.loc["registry", "config"] == "exact 8x8x8"
    assert df.loc["tma_128x128x64_w8_s3", "ms"] == pytest.approx(1.0)
    assert df.loc["tma_64x128x64_w4_s6_f", "note"].startswith("OutOfResources")
    assert math.isnan(df.loc["tma_64x128x64_w4_s6_f", "ms"])
    assert df.loc["tma_256x128x64_w8_s3_f", "note"] == "wrong output"  # NaN output never passes


def test_shape_argument_is_checked():
    assert gemm_tilings.shape_argument("262144,512,128") == Shape(262144, 512, 128)
    assert gemm_tilings.shape_argument("4x5x6") == Shape(4, 5, 6)
    for bad in ("1,2", "a,b,c", "0,4,4"):
        with pytest.raises(argparse.ArgumentTypeError):
            gemm_tilings.shape_argument(bad)


@pytest.mark.ref_mode  # on a GPU it would time them
def test_without_a_gpu_it_names_the_tilings_and_exits(capsys):
    assert gemm_tilings.main(["--shape", "262144,512,128", "--tilings", "tma_128x128x64_w8_s3"]) == 0
    assert "would time at 262144x512x128: cublas_mm, registry, tma_128x128x64_w8_s3" in capsys.readouterr().err


def test_a_column_whose_timing_raises_gets_nan_and_a_note():
    cols = {"cublas_mm": ["c"], "registry": ["r"], "tma_128x128x64_w8_s3": ["t"]}
    errors = {"cublas_mm": None, "registry": None, "tma_128x128x64_w8_s3": 0.002}

    def fake(fns):
        if fns == ["t"]:
            raise RuntimeError("capture failed\nmore")
        return 1.0

    timer = gemm_tilings.timer_keeping_errors(cols, errors, timer=fake)
    assert timer(cols["registry"]) == 1.0 and math.isnan(timer(cols["tma_128x128x64_w8_s3"]))
    assert errors["tma_128x128x64_w8_s3"] == "timing failed: RuntimeError: capture failed"
    times = {"cublas_mm": [1.0], "registry": [1.0], "tma_128x128x64_w8_s3": [float("nan")]}
    row = gemm_tilings.summarise(Shape(8, 8, 8), times, errors, "exact").set_index("tiling").loc["tma_128x128x64_w8_s3"]
    assert math.isnan(row.ms) and row.note.startswith("timing failed")
