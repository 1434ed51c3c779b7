"""The config registry: round trip, atomic writes, corrupt files, the user and shipped layers,
lookup rules (exact / nearest / same architecture / default)."""

from __future__ import annotations

import json
import re

import helion
import pandas as pd
import pytest
import torch

from helion_kernels import registry
from helion_kernels import results
from helion_kernels.spec import AttentionShape, Shape
from helion_kernels.registry import ConfigFallbackWarning, Entry, RegistryError

CFG_A = helion.Config(block_sizes=[64, 128, 64], num_warps=8, num_stages=3)
CFG_B = helion.Config(block_sizes=[128, 64, 32], num_warps=4, num_stages=4, indexing="tensor_descriptor")


def _entry(m, k, n, cfg=CFG_A, dtype="bfloat16", **meta):
    return Entry(Shape(m, k, n), dtype, cfg, meta)


def test_round_trip_keeps_config_and_meta(registry_dir):
    e = _entry(65536, 1024, 512, CFG_B, latency_ms=0.25, versions={"helion": "1.5.0"})
    path = registry.save_entry("k", "gpu_x", e, gpu_name="GPU X")
    assert path == registry_dir / "gpu_x" / "k.json"
    loaded = registry.load_entries(path)[(65536, 1024, 512, "bfloat16")]
    assert helion.Config(**loaded.config) == CFG_B
    assert loaded.meta == {"latency_ms": 0.25, "versions": {"helion": "1.5.0"}}
    assert json.loads(path.read_text())["gpu"] == "GPU X"


def test_save_adds_and_replaces_without_losing_entries(registry_dir):
    registry.save_entry("k", "g", _entry(1, 2, 3))
    registry.save_entry("k", "g", _entry(4, 5, 6))
    registry.save_entry("k", "g", _entry(1, 2, 3, CFG_B))
    entries = registry.entries_for("k", "g")
    assert set(entries) == {(1, 2, 3, "bfloat16"), (4, 5, 6, "bfloat16")}
    assert helion.Config(**entries[(1, 2, 3, "bfloat16")].config) == CFG_B
    assert not list((registry_dir / "g").glob("*.tmp")), "temporary files left behind"


_ENTRY = '{"M": 1, "K": 2, "N": 3, "dtype": "bfloat16", "config": {"block_sizes": [16]}}'


@pytest.mark.parametrize("content,reason", [
    ("", ""), ('{"format": 1, "entries": [{"M": 1', ""), ("[]", ""), ('{"format": 99, "entries": []}', ""),
    ('{"format": 1, "entries": [{"M": 1, "K": 2}]}', ""),
    # entries that only look valid: what Helion would refuse only at the first call
    ('{"format": 1, "kernel": "other", "entries": []}', "holds 'other'"),
    ('{"format": 1, "entries": [%s, %s]}' % (_ENTRY, _ENTRY), "appears more than once"),
    ('{"format": 1, "entries": [%s]}' % _ENTRY.replace("bfloat16", "float128"), "dtype 'float128'"),
    ('{"format": 1, "entries": [%s]}' % _ENTRY.replace("[16]", '"x"'), "'block_sizes'"),
    ('{"format": 1, "entries": [%s]}' % _ENTRY.replace("[16]", '[16], "num_warps": -3'), "'num_warps'"),
    ('{"format": 1, "entries": [%s]}' % _ENTRY.replace("[16]", '[16], "num_stages": 2.5'), "'num_stages'"),
    ('{"format": 1, "entries": {}}', "'entries' must be a list, got dict"),
], ids=["empty", "truncated", "not_object", "other_format", "entry_missing_fields", "other_kernel", "duplicate_key",
        "unknown_dtype", "block_sizes_text", "negative_warps", "fractional_stages", "entries_empty_dict"])
def test_corrupt_file_raises_naming_it_and_is_never_overwritten(registry_dir, content, reason):
    registry.save_entry("k", "g", _entry(1, 2, 3))
    path = registry_dir / "g" / "k.json"
    path.write_text(content)
    with pytest.raises(RegistryError, match=f"registry file {path} is corrupt.*{re.escape(reason)}"):
        registry.entries_for("k", "g")
    with pytest.raises(RegistryError):
        registry.save_entry("k", "g", _entry(7, 8, 9))
    assert path.read_text() == content


def test_corrupt_file_of_one_kernel_leaves_others_usable(registry_dir):
    registry.save_entry("good", "g", _entry(1, 2, 3))
    (registry_dir / "g" / "bad.json").write_text("{")
    assert (1, 2, 3, "bfloat16") in registry.entries_for("good", "g")


def test_failed_write_keeps_previous_file(registry_dir, monkeypatch):
    registry.save_entry("k", "g", _entry(1, 2, 3))
    before = (registry_dir / "g" / "k.json").read_text()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(registry.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        registry.save_entry("k", "g", _entry(4, 5, 6))
    assert (registry_dir / "g" / "k.json").read_text() == before
    assert not list((registry_dir / "g").glob("*.tmp"))


def test_nearest_rule(registry_dir):
    for shape in [(65536, 1024, 1024), (65536, 256, 256), (524288, 1024, 1024)]:
        registry.save_entry("k", "g", _entry(*shape))
    registry.save_entry("k", "g", _entry(65536, 512, 512, CFG_B, dtype="float16"))
    entries = registry.entries_for("k", "g")
    # Same dtype wins over an exact shape of another dtype; 256^2 and 1024^2 tie at
    # distance 2, and the tie goes to the larger.
    assert registry.nearest_entry(entries, Shape(65536, 512, 512), "bfloat16").shape == Shape(65536, 1024, 1024)
    assert registry.nearest_entry(entries, Shape(262144, 1024, 1024), "bfloat16").shape == Shape(524288, 1024, 1024)
    # No entry of the dtype: one of the same element size, never another size (a bf16
    # tiling can need more shared memory than the GPU has when its elements are fp32).
    assert registry.nearest_entry({e.key: e for e in entries.values() if e.dtype == "float16"},
                                  Shape(65536, 512, 512), "bfloat16").dtype == "float16"
    assert registry.nearest_entry(entries, Shape(65536, 512, 512), "float32") is None
    assert registry.nearest_entry({}, Shape(1, 1, 1), "bfloat16") is None


def test_neighbours_are_near_and_nearest_first():
    """The entries whose configs may seed a search: within distance 1 (N x2, M x4, K x16) by
    default, the row's own entry left out, nearest first, of the dtype's pool."""
    at = {e.key: e for e in (_entry(131072, 256, 512), _entry(131072, 256, 1024), _entry(131072, 512, 512),
                             _entry(65536, 256, 256), _entry(131072, 256, 256), _entry(131072, 256, 2048),
                             _entry(131072, 256, 256, dtype="float32"))}
    got = registry.neighbour_entries(at, Shape(131072, 256, 256), "bfloat16")
    assert [tuple(e.shape) for e in got] == [(65536, 256, 256), (131072, 256, 512)]
    assert all(e.dtype == "bfloat16" for e in got)
    wider = registry.neighbour_entries(at, Shape(131072, 256, 256), "bfloat16", max_distance=2.0)
    assert [tuple(e.shape) for e in wider] == [(65536, 256, 256), (131072, 256, 512), (131072, 512, 512),
                                               (131072, 256, 1024)]  # distances 0.5, 1, 1.25, 2
    # A key with no entry: its nearest entry is among its neighbours.
    assert [tuple(e.shape) for e in registry.neighbour_entries(at, Shape(98304, 256, 256), "bfloat16")][:1] == [
        (131072, 256, 256)]
    assert registry.neighbour_entries({}, Shape(1, 1, 1), "bfloat16") == []


def test_nearest_weighs_n_over_m_over_k():
    """A factor of 2 in N costs more than one in M, which costs more than one in K (the
    measured losses in registry.GEMM_DISTANCE_WEIGHTS)."""
    at = {e.key: e for e in (_entry(65536, 1024, 512), _entry(131072, 1024, 1024), _entry(65536, 2048, 1024))}
    assert registry.nearest_entry(at, Shape(65536, 1024, 1024), "bfloat16").shape == Shape(65536, 2048, 1024)
    del at[(65536, 2048, 1024, "bfloat16")]
    assert registry.nearest_entry(at, Shape(65536, 1024, 1024), "bfloat16").shape == Shape(131072, 1024, 1024)
    assert registry.shape_distance(Shape(1, 1, 1), Shape(4, 2, 8)) == 2 * 0.5 + 0.25 + 3
    from helion_kernels.spec import AttentionShape
    assert registry.shape_distance(AttentionShape(2, 64), AttentionShape(8, 128)) == 3


def test_tie_goes_to_larger_shape():
    entries = {e.key: e for e in (_entry(65536, 1024, 1024), _entry(262144, 1024, 1024))}
    assert registry.nearest_entry(entries, Shape(131072, 1024, 1024), "bfloat16").shape.M == 262144


def test_lookup_exact_nearest_default(registry_dir):
    registry.save_entry("k", "g_sm90", _entry(64, 64, 64, CFG_B))
    exact = registry.lookup("k", Shape(64, 64, 64), torch.bfloat16, "g_sm90")
    assert (exact.source, helion.Config(**exact.entry.config)) == ("exact", CFG_B)
    with pytest.warns(ConfigFallbackWarning, match="using the one tuned for 64x64x64 bfloat16"):
        near = registry.lookup("k", Shape(128, 64, 64), torch.bfloat16, "g_sm90")
    assert (near.source, near.entry.shape) == ("nearest", Shape(64, 64, 64))
    with pytest.warns(ConfigFallbackWarning, match="no config for other_gpu_sm80.*helion-kernels autotune"):
        default = registry.lookup("k", Shape(128, 64, 64), torch.bfloat16, "other_gpu_sm80")
    assert (default.source, default.entry) == ("default", None)
    # fp32 elements: the bf16 entry's tiling is not used; the default is, and the warning says why.
    with pytest.warns(ConfigFallbackWarning, match="no config for float32 or a dtype of its size for g_sm90;"):
        default = registry.lookup("k", Shape(64, 64, 64), torch.float32, "g_sm90")
    assert default.source == "default"


def test_same_architecture_entries_are_nearest_never_exact(registry_dir):
    """An H100 next to the H200's sm_90 entries: those, as *nearest* (so the runtime still fits
    them to the device), with a warning naming the GPU they were tuned on; another
    architecture gets the default."""
    registry.save_entry("k", "nvidia_h200_sm90", _entry(64, 64, 64, CFG_B))
    registry.save_entry("k", "nvidia_h200_sm90", _entry(64, 64, 128, CFG_A))
    registry.save_entry("k", "tiny_gpu_sm90", _entry(64, 64, 64, CFG_A))
    with pytest.warns(ConfigFallbackWarning, match=r"64x64x64 bfloat16 on nvidia_h200_sm90 \(same architecture\)"):
        found = registry.lookup("k", Shape(64, 64, 64), torch.bfloat16, "nvidia_h100_80gb_hbm3_sm90")
    assert (found.source, found.gpu) == ("nearest", "nvidia_h200_sm90")  # the GPU with more entries
    assert helion.Config(**found.entry.config) == CFG_B
    with pytest.warns(ConfigFallbackWarning, match="default config"):
        assert registry.lookup("k", Shape(64, 64, 64), torch.bfloat16, "nvidia_a100_sm80").source == "default"
    # A GPU with entries of its own for the kernel uses only those.
    registry.save_entry("k", "nvidia_h100_80gb_hbm3_sm90", _entry(1, 1, 1))
    with pytest.warns(ConfigFallbackWarning, match="using the one tuned for 1x1x1 bfloat16. Tune"):
        assert registry.lookup("k", Shape(64, 64, 64), torch.bfloat16, "nvidia_h100_80gb_hbm3_sm90").entry.shape == Shape(1, 1, 1)


def test_user_registry_layers_over_the_shipped_one(tmp_path, monkeypatch):
    """Lookups see both layers (the user's entry wins per key); writes go to the user
    registry only, never into the shipped one."""
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    monkeypatch.setattr(registry, "shipped_dir", lambda: shipped)
    monkeypatch.setenv("HELION_KERNELS_CONFIG_DIR", str(user))
    (shipped / "g_sm90").mkdir(parents=True)
    doc = {"format": 1, "kernel": "k", "gpu": "G", "entries": [
        _entry(1, 2, 3, CFG_A, latency_ms=1.0).to_json(), _entry(4, 5, 6, CFG_A).to_json()]}
    (shipped / "g_sm90" / "k.json").write_text(json.dumps(doc))
    before = (shipped / "g_sm90" / "k.json").read_text()
    path = registry.save_entry("k", "g_sm90", _entry(1, 2, 3, CFG_B, latency_ms=0.5))
    assert path == user / "g_sm90" / "k.json" == registry.registry_path("k", "g_sm90")
    assert (shipped / "g_sm90" / "k.json").read_text() == before
    entries = registry.entries_for("k", "g_sm90")
    assert set(entries) == {(1, 2, 3, "bfloat16"), (4, 5, 6, "bfloat16")}
    assert entries[(1, 2, 3, "bfloat16")].meta == {"latency_ms": 0.5}
    assert registry.lookup("k", Shape(4, 5, 6), torch.bfloat16, "g_sm90").source == "exact"  # shipped
    assert registry.known_gpus() == ["g_sm90"]


def test_default_user_registry_is_outside_the_package(monkeypatch, tmp_path):
    monkeypatch.delenv("HELION_KERNELS_CONFIG_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert registry.user_dir() == tmp_path / "helion-kernels" / "configs"
    assert registry.shipped_dir().name in ("configs", "_configs")


def test_shipped_registry_resolves_h200_shapes_exactly(monkeypatch):
    """With an empty user registry, a tuned H200 shape resolves exact from the shipped one."""
    found = registry.lookup("rmsnorm_matmul", Shape(65536, 1024, 1024), "bfloat16", "nvidia_h200_sm90")
    assert found.source == "exact" and found.entry.meta["latency_ms"] > 0


def test_gpu_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    registry._gpu_key.cache_clear()  # cached per device: the queries run on every call
    try:
        assert registry.gpu_key("cuda") == registry.gpu_key("cuda:0") == "nvidia_h200_sm90"
        assert registry.gpu_key("cpu") == "cpu"
    finally:
        registry._gpu_key.cache_clear()


def test_committed_registry_files_are_valid():
    """Every committed registry file loads, is named for a known op, and its configs are
    Helion configs that measured correct (the derived producer tilings of
    matmul_rmsnorm_matmul keep their source entry's record)."""
    from helion_kernels.techniques import CATALOG

    paths = sorted(registry.shipped_dir().glob("*/*.json"))
    assert paths
    for path in paths:
        assert path.stem in CATALOG, f"{path}: not an op name"
        assert json.loads(path.read_text())["kernel"] == path.stem
        for entry in registry.load_entries(path).values():
            assert helion.Config(**entry.config).block_sizes, f"{path}: {entry.key} has no block sizes"
            record = entry.meta.get("source_entry", entry.meta)
            assert record["latency_ms"] > 0 and record["rel_error"] < 3e-2


def test_remove_entry_keeps_the_rest_and_the_gpu_name(registry_dir):
    registry.save_entry("k", "g", _entry(1, 2, 3), gpu_name="GPU G")
    registry.save_entry("k", "g", _entry(4, 5, 6))
    registry.remove_entry("k", "g", (1, 2, 3, "bfloat16"))
    assert set(registry.entries_for("k", "g")) == {(4, 5, 6, "bfloat16")}
    assert json.loads((registry_dir / "g" / "k.json").read_text())["gpu"] == "GPU G"
    with pytest.raises(KeyError):
        registry.remove_entry("k", "g", (1, 2, 3, "bfloat16"))


@pytest.mark.parametrize("content", [b"\xff\xfe garbage", b'{"format": 1, "entries": [{"M": 0, "K": 2, "N": 3, '
                                     b'"dtype": "bfloat16", "config": {"block_sizes": [16]}}]}'],
                         ids=["not_utf8", "zero_M"])
def test_more_corrupt_files(registry_dir, content):
    path = registry_dir / "g" / "k.json"
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.raises(RegistryError, match=f"registry file {path} is corrupt"):
        registry.entries_for("k", "g")


def test_a_registry_path_that_is_a_folder_or_a_config_dir_that_is_a_file(registry_dir, monkeypatch, tmp_path):
    (registry_dir / "g" / "k.json").mkdir(parents=True)
    with pytest.raises(RegistryError, match="cannot be read"):
        registry.entries_for("k", "g")
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv(registry.ENV_CONFIG_DIR, str(not_a_folder))
    with pytest.raises(RegistryError, match=f"{registry.ENV_CONFIG_DIR} = {not_a_folder} is not a folder"):
        registry.known_gpus()


def test_saved_files_are_readable_by_others_and_keep_their_mode(registry_dir):
    path = registry.save_entry("k", "g", _entry(1, 2, 3))
    assert path.stat().st_mode & 0o777 == 0o644
    path.chmod(0o600)
    registry.save_entry("k", "g", _entry(4, 5, 6))
    assert path.stat().st_mode & 0o777 == 0o600


def test_attention_entries_round_trip_and_resolve(registry_dir):
    """Attention kernels are keyed by (H, D, dtype); lookup never crosses key kinds."""
    registry.save_entry("fna", "g_sm90", Entry(AttentionShape(2, 128), "bfloat16", CFG_A, {"latency_ms": 1.0}))
    registry.save_entry("fna", "g_sm90", Entry(AttentionShape(8, 128), "bfloat16", CFG_B))
    entries = registry.entries_for("fna", "g_sm90")
    assert set(entries) == {(2, 128, "bfloat16"), (8, 128, "bfloat16")}
    assert entries[(2, 128, "bfloat16")].shape == AttentionShape(2, 128)
    assert entries[(2, 128, "bfloat16")].meta == {"latency_ms": 1.0}
    assert registry.lookup("fna", AttentionShape(8, 128), torch.bfloat16, "g_sm90").source == "exact"
    with pytest.warns(ConfigFallbackWarning, match=r"H4xD128 .* --kernel fna --workload flash_norm_attention --where 'H == 4 and D == 128'"):
        near = registry.lookup("fna", AttentionShape(4, 128), torch.bfloat16, "g_sm90")
    assert near.source == "nearest" and near.entry.shape == AttentionShape(8, 128)  # tie: larger
    assert registry.nearest_entry(entries, Shape(1, 2, 3), "bfloat16") is None


def test_entry_without_a_key_is_a_corrupt_file(registry_dir):
    path = registry_dir / "g" / "k.json"
    path.parent.mkdir()
    path.write_text('{"format": 1, "entries": [{"H": 2, "dtype": "bfloat16", "config": {"block_sizes": [16]}}]}')
    with pytest.raises(RegistryError, match="entry without a key"):
        registry.entries_for("k", "g")


def test_no_tuning_advice_for_the_cpu(registry_dir):
    """Configs are tuned per GPU: on the CPU (an interpreter run) the warning says so instead
    of printing an autotune command that cannot run there."""
    with pytest.warns(ConfigFallbackWarning, match="default config, as configs are tuned per GPU, and on cpu only"):
        registry.lookup("k", Shape(8, 8, 8), torch.float32, "cpu")


def test_tune_advice_is_a_command_on_a_gpu_and_a_reason_on_the_cpu(registry_dir):
    """Every fallback warning ends with the same advice: the autotune command on a GPU, on the
    CPU the reason there is none (an entry saved for the CPU is followed as nearest with it too)."""
    gpu = registry.tune_advice("k", Shape(8, 8, 8), "float32", "nvidia_h200_sm90")
    assert gpu == "Tune this shape with: helion-kernels autotune --kernel k --shape 8,8,8 --dtype float32"
    assert registry.tune_advice("k", Shape(8, 8, 8), "float32", "cpu") == (
        "Configs are tuned per GPU, and on cpu only Helion's or Triton's interpreter runs.")
    registry.save_entry("k", "cpu", registry.Entry(Shape(16, 8, 8), "float32", helion.Config(block_sizes=[16])))
    with pytest.warns(ConfigFallbackWarning, match=r"tuned for 16x8x8 float32\. Configs are tuned per GPU, and on cpu"):
        registry.lookup("k", Shape(8, 8, 8), torch.float32, "cpu")


def test_committed_configs_fit_their_kernels():
    """Every committed config can seed Helion's search for its kernel: each per-access list
    (``indexing``, ...) has the length the kernel's config spec has. A longer one runs, but
    Helion 1.5's search asserts when it encodes it as a seed, which failed every search of
    ``matmul_rmsnorm_matmul`` (its entries, derived from the split-N kernel, held 10 indexing
    entries for a kernel with 4). One binding per kernel: the lists do not depend on the shape."""
    from helion.autotuner.config_generation import ConfigGeneration  # Helion 1.5 internals
    from helion.runtime.settings import RefMode

    from helion_kernels.techniques import get_spec
    from helion_kernels.spec import AttentionRow
    from helion_kernels.tuning import fit_seed

    for path in sorted(registry.shipped_dir().glob("*/*.json")):
        spec = get_spec(path.stem)
        entries = list(registry.load_entries(path).values())
        first = entries[0].shape
        problem = (AttentionRow(2, first.H, first.D, 16, 16, 0.5, 0) if isinstance(first, AttentionShape)
                   else Shape(64, first.K, first.N))
        kernel = helion.kernel(spec.kernel.fn, static_shapes=spec.kernel.settings.static_shapes, ref_mode=RefMode.OFF)
        config_spec = kernel.bind(spec.make_args(problem.for_codegen(), torch.bfloat16, "cpu", None)).config_spec
        generation = ConfigGeneration(config_spec)
        for entry in entries:
            config = helion.Config(**entry.config)
            assert fit_seed(config_spec, config) is config, f"{path.name}: {entry.key}"
            generation.encode_config(generation.flatten(config))  # what failed the search


def test_committed_dispatch_records_follow_the_margin_rule():
    """Every committed entry that records more than one unfused pipeline's time names the one
    :func:`~helion_kernels.tuning.dispatch_decision` picks from those times (the split-N
    entries' Liger pipeline was derived from their benchmark CSV), and says so in the tuning
    report's words; at least one entry of the H200 runs Liger's pipeline."""
    from helion_kernels.tuning import dispatch_decision

    liger = 0
    for path in sorted(registry.shipped_dir().glob("*/*.json")):
        for entry in registry.load_entries(path).values():
            record = entry.meta.get("dispatch", {})
            if "unfused_timed_ms" not in record:
                continue
            times = dict(record["unfused_timed_ms"])
            default = "cublas+inductor_norm"
            again = dispatch_decision(record["fused_ms"], times.pop(default), default, times)
            assert (again["choice"], again["unfused"]) == (record["choice"], record["unfused"]), (path.name, entry.key)
            liger += record["unfused"] == "cublas+liger_norm"
            liger_path = record["choice"] == "unfused" and record["unfused"] == "cublas+liger_norm"
            assert registry.dispatch_text(record) == ("unfused (Liger norm)" if liger_path else record["choice"])
    assert liger >= 1


def test_timestamp_reads_both_iso_forms_and_nothing_else():
    """Entries write ``+00:00``, some result files ``Z``; both are the same instant. A missing
    or malformed date is None, never an exception (the reports then say the date is unknown)."""
    assert results.timestamp("2026-12-02T12:23:00Z") == results.timestamp("2026-12-02T12:23:00+00:00")
    assert results.timestamp("2026-12-02T12:23:00+00:00").tzinfo is not None
    assert results.timestamp(None) is None and results.timestamp("") is None and results.timestamp("soon") is None


def test_result_rows_and_newest_rows(tmp_path, capsys):
    """The reports' one reader of benchmark tables: each row with its kernel, date (its own
    ``measured_at``) and file; per key the newest row, an undated row counting as oldest and the
    later row winning a tie; an unreadable table raises, or is named and left out when asked."""
    def table(name, rows, **columns):
        csv = tmp_path / f"{name}.csv"
        pd.DataFrame(rows).assign(**columns).to_csv(csv, index=False)
        return csv

    row = {"M": 64, "K": 32, "N": 16}
    undated = table("undated", [{**row, "ms": 1.0}])
    old = table("old", [{**row, "ms": 2.0}, {**row, "N": 8, "ms": 2.5}], kernel="matmul",
                measured_at="2026-01-01T00:00:00Z")
    new = table("new", [{**row, "ms": 3.0}], kernel="matmul", measured_at="2026-02-01T00:00:00+00:00")
    tie = table("tie", [{**row, "ms": 4.0}], kernel="matmul", measured_at="2026-02-01T00:00:00Z")
    rows = results.result_rows([undated, new, old])
    assert list(rows.file) == ["undated.csv", "new.csv", "old.csv", "old.csv"]
    assert rows.kernel.isna().tolist() == [True, False, False, False] and rows.measured_at.isna().tolist()[0]
    assert str(rows.measured_at.dtype).endswith("UTC]")
    newest = results.newest_rows(rows, ["M", "K", "N"]).set_index("N").ms.to_dict()
    assert newest == {16: 3.0, 8: 2.5}  # the dated newest beats the undated one listed first
    assert results.newest_rows(results.result_rows([new, tie]), ["M", "K", "N"]).ms.tolist() == [4.0]
    assert results.newest_rows(results.result_rows([undated]), ["M"]).ms.tolist() == [1.0]

    # unreadable: empty, a folder, a column the reader would add
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    clash = table("clash", [{**row, "file": "mine", "ms": 6.0}])
    for path in (empty, folder, clash):
        with pytest.raises(results.ResultTableError, match=path.name):
            results.result_rows([path, new])
        kept = results.result_rows([path, new], skip_unreadable=True)
        assert kept.file.tolist() == ["new.csv"] and f"left out {path.name}" in capsys.readouterr().err
    assert results.result_rows([]).empty
    assert results.result_rows(str(new)).file.tolist() == results.result_rows(new).file.tolist() == ["new.csv"]


def test_the_tune_command_of_an_attention_kernel_names_the_attention_workload():
    """Every attention kernel tunes on the attention table (not a table named after itself)."""
    from helion_kernels.spec import ATTENTION_WORKLOAD, AttentionShape
    from helion_kernels.techniques import CATALOG
    from helion_kernels.workloads import list_workloads

    assert ATTENTION_WORKLOAD in list_workloads("attention")
    for name, entry in CATALOG.items():
        if entry.workload == "attention":
            command = registry.tune_command(name, AttentionShape(4, 128), "bfloat16")
            assert f"--kernel {name} --workload {ATTENTION_WORKLOAD} " in command, command
