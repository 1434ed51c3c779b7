"""What tuning cost and bought, per registry entry, from the committed registry (no GPU needed).

Per entry of every kernel of one GPU (``configs/<gpu>/*.json``): the search budget and the
seconds Helion's search took (the verification and the seed and unfused timings after it add
6-20 s per GEMM shape on the H200), how many configs Helion's search timed, the best
seed's time (the nearest entry's config, other tuned neighbours' for entries tuned from
2026-12-02 on, and the hand-picked tilings) beside the final config's (``search_gain`` = seed / final: what the
search added over the seeds; two separate timings, so near 1.0, 0.98-1.0, when a seed was
kept), the tiling picked, and the dispatch decision. A second table sums
the search seconds per kernel and date: what a whole table's search took.

    python bench/tuning_report.py [--gpu nvidia_h200_sm90] [--since 2026-12-01]

Writes ``bench/results/<gpu>/tuning_report.{csv,md}`` (the committed report); with ``--since``
it prints the filtered tables instead, and writes them only to an ``--out`` folder. Entries tuned before the registry
recorded the seed times or the search counts show those columns empty.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from helion_kernels import registry
from helion_kernels.cli import date_arg

ROOT = Path(__file__).resolve().parent.parent
# The seed and the final config are timed in separate runs (CUDA-graph medians): a gain inside
# this ratio is not told from noise (a kept seed shows 0.98-1.0).
NOISE = 1.02


def _tiling(config: dict) -> str:
    """block sizes, warps/stages, indexing of the first load, pid type, and ``flattened`` where
    a loop is flattened into the one inside it (``range_flattens``): e.g.
    ``128x256x64 w8 s3 tensor_descriptor persistent_interleaved flattened``."""
    indexing = config.get("indexing", "pointer")
    first = indexing[0] if isinstance(indexing, list) and indexing else indexing
    flattened = " flattened" if any(config.get("range_flattens") or []) else ""
    return (f"{'x'.join(map(str, config.get('block_sizes', [])))} w{config.get('num_warps')} "
            f"s{config.get('num_stages')} {first} {config.get('pid_type', 'flat')}{flattened}")


def report(folder: Path) -> pd.DataFrame:
    """One row per entry of every registry file in ``folder`` (a ``configs/<gpu>/``)."""
    rows = []
    for path in sorted(folder.glob("*.json")):
        for entry in registry.load_entries(path).values():
            tune = entry.meta.get("autotune", {})
            seed_ms, final_ms = tune.get("best_seed_ms"), entry.meta.get("latency_ms")
            rows.append({
                "kernel": path.stem, "shape": "x".join(map(str, entry.shape)), "dtype": entry.dtype,
                "tuned_at": entry.tuned_on,
                "budget_s": tune.get("budget_seconds"), "tuning_s": tune.get("seconds"),
                "configs_timed": tune.get("configs_tested"), "generations": tune.get("generations"),
                # entries from before the option was added were all tuned with Helion's seeds
                "compiler_seeds": tune.get("compiler_seeds", True) if tune else None,
                "best_seed_ms": seed_ms, "final_ms": final_ms,
                "search_gain": round(seed_ms / final_ms, 3) if seed_ms and final_ms else None,
                "kept_seed": tune.get("kept_seed"),
                "tiling": _tiling(entry.config),
                "dispatch": registry.dispatch_text(entry.meta["dispatch"]) if "dispatch" in entry.meta else "",
            })
    return pd.DataFrame(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="nvidia_h200_sm90", help="registry GPU key (default %(default)s)")
    p.add_argument("--since", default=None, type=date_arg, help="only entries tuned on or after this date (YYYY-MM-DD)")
    p.add_argument("--configs", type=Path, default=ROOT / "configs", help="registry root (default: the checkout's)")
    p.add_argument("--out", type=Path, default=None, help=(
        "folder (default bench/results/<gpu>/; with --since, nothing is written unless --out is given)"))
    args = p.parse_args()
    df = report(args.configs / args.gpu)
    if df.empty:
        print(f"tuning_report: no registry entries under {args.configs / args.gpu}", file=sys.stderr)
        return 2
    if args.since:
        df = df[df.tuned_at >= args.since.isoformat()]
        if df.empty:
            print(f"tuning_report: no {args.gpu} entries tuned on or after {args.since} (UTC)")
            return 0
    totals = (df.groupby(["kernel", "tuned_at"])
              .agg(entries=("shape", "size"), tuning_s=("tuning_s", lambda g: g.sum(min_count=1)),
                   budget_s=("budget_s", "median"),
                   search_beat_seeds=("search_gain", lambda g: int((g.dropna() > NOISE).sum())),
                   with_seed_time=("search_gain", lambda g: int(g.notna().sum())))
              .reset_index())
    if args.since and args.out is None:  # a filtered look: the committed report stays whole
        print(totals.to_string(index=False), "", df.to_string(index=False), sep="\n")
        return 0
    out = args.out or ROOT / "bench" / "results" / args.gpu
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "tuning_report.csv", index=False)
    since = f" --since {args.since}" if args.since else ""
    (out / "tuning_report.md").write_text("\n".join([
        f"# Tuning cost and gain per registry entry ({args.gpu})", "",
        f"- command: `python bench/tuning_report.py --gpu {args.gpu}{since}` (from the committed registry)",
        "- tuning_s: seconds of Helion's search (verification, seed and unfused timings add 6-20 s per GEMM shape);"
        " budget_s: Helion's autotune_budget_seconds; configs_timed: configs Helion's search timed;"
        " generations: search rounds Helion started past its first population (generations, polish and finishing"
        " rounds; one the budget cut off counts, so configs_timed says what was timed; 0: only the first population;"
        " empty where the entry predates this record); compiler_seeds: False where `autotune --no-compiler-seeds` left"
        " Helion's own seeds out of the first population",
        "- search_gain: best seed's time (the nearest entry's config, the hand-picked tilings and, in entries that record"
        " `seeds`, other tuned neighbours') / final config's time, two separate timings (CUDA-graph medians),"
        f" so within {NOISE} of 1 it is noise (a kept seed shows 0.98-1.0); kept_seed: the best seed replaced the search's"
        " pick, which timed slower (by 2% or more since that margin was added; the entry's search_ms); empty where the entry predates these records",
        "- tiling: block sizes, warps, stages, the first load's indexing, pid type, flattened where the persistent tile loop is flattened into the k-loop; dispatch: the path the op runs"
        " there (fused kernel or unfused pipeline), where the kernel has a dispatcher",
        f"- totals: search_beat_seeds = entries whose search_gain exceeds {NOISE}; with_seed_time = entries that recorded"
        " a seed time; budget_s = the median budget; tuning_s empty where the entries record no tuning",
        "", "## Whole tables: search seconds per kernel and tuning date", "",
        totals.to_markdown(index=False), "", "## Per entry", "",
        df.to_markdown(index=False, floatfmt=".4g"), ""]))
    print(totals.to_string(index=False))
    print(f"wrote {out / 'tuning_report.csv'} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
