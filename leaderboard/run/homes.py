"""What fit may read: the home dataset's training cells and the home GPU's measured points.

The home of a dataset is its family's default (``families``: ``h100_vidur19`` for every
``_vidur19`` GPU, new ones included) unless ``conf/dataset/<name>.yaml`` names another; a family
without a default fits on its A100 dataset (``h200_vidur`` -> ``a100_vidur``).
``dataset.home=[a,b]`` names several; ``dataset.home=logo`` every other GPU of the family
(leave one GPU out). The home's op points are, with
``split.home_points=full_grid`` (the default), every measured point of the home GPU its models
use (``leaderboard.run.home_grid``), as a profiler collects them; with ``behind_cells``, only the
points its *training* cells were composed from (their lineage), so a held-out cell is never a
sum of points the predictor was fitted on unless a training cell shares that point.

Several homes make one ``Home``: cells and op points concatenated (each row keeps its ``sku``),
``gpus`` holding every home's datasheet; ``sku``, ``gpu`` and ``dataset`` are the first home's.
"""

from __future__ import annotations

import polars as pl

from leaderboard.cells import families
from leaderboard.cells.families import suffix_of as family
from leaderboard.run import home_grid
from leaderboard_core import paths, yaml_io
from leaderboard_core.contract import Home
from leaderboard_core.naming import suggestion
from leaderboard_core.versioning import release


def with_family(runs: pl.DataFrame) -> pl.DataFrame:
    """``runs`` with each run's dataset ``family``: what report tables group by (and the sections
    a predictor offers read)."""
    return runs.with_columns(family=pl.col("dataset").map_elements(family, pl.String))


def conf_home(name: str) -> str | None:
    """The home ``conf/dataset/<name>.yaml`` names, overriding its family's, or None."""
    conf = paths.CONF_DIR / "dataset" / f"{name}.yaml"
    return yaml_io.safe_load(conf.read_text()).get("home") if conf.is_file() else None


def require_dataset(rows: dict[str, dict], name: str) -> dict:
    if name not in rows:
        raise ValueError(f"unknown dataset '{name}'; {suggestion(name, sorted(rows))}")
    return rows[name]


def home_of(name: str, named_home: str | None, rows: dict[str, dict]) -> str:
    """``named_home`` (a ``dataset.home=`` override), else the home the dataset's conf file
    names, else its family's default home (``families``), else the A100 dataset of its family."""
    fam = families.of(name)
    named_home = named_home or conf_home(name) or (fam.home if fam else None)
    if named_home:
        return require_dataset(rows, named_home)["name"]
    a100 = sorted(n for n in rows if family(n) == family(name) and n.startswith("a100"))
    if not a100:
        raise ValueError(f"the {family(name)} family has no default home and no A100 dataset to "
                         f"fit on; pass dataset.home=<dataset>, or give the family a home "
                         "(leaderboard/cells/families.py)")
    return a100[0]


LEAVE_ONE_OUT = "logo"  # dataset.home=logo: every other GPU of the target's family


def leave_one_gpu_out(name: str, rows: dict[str, dict]) -> list[str]:
    """The homes of the leave-one-GPU-out protocol: every dataset of ``name``'s family on
    another GPU (the protocol learned cross-GPU models are published under)."""
    require_dataset(rows, name)
    others = sorted(n for n, r in rows.items() if family(n) == family(name)
                    and r["kind"] == rows[name]["kind"] and r["sku"] != rows[name]["sku"])
    if not others:
        raise ValueError(f"dataset.home=logo needs another GPU of the {family(name)} family; "
                         f"the store holds only {name}")
    return others


def homes_of(name: str, named: str | list[str] | None, rows: dict[str, dict]) -> list[str]:
    """The home datasets of a run: ``named`` (one name or a list, from ``dataset.home=``;
    ``logo``: every other GPU of the family), else the one ``home_of`` picks."""
    if named == LEAVE_ONE_OUT:
        return leave_one_gpu_out(name, rows)
    if isinstance(named, str) or not named:
        return [home_of(name, named, rows)]
    names = [require_dataset(rows, n)["name"] for n in named]
    if len(set(names)) != len(names) or len({rows[n]["sku"] for n in names}) != len(names):
        raise ValueError(f"dataset.home={names} names a dataset or a GPU twice; list each home "
                         "GPU once")
    return names


def op_points(lineage: pl.DataFrame, cell_ids: list[str]) -> dict[str, pl.DataFrame]:
    """Per lineage op (``gemm_qkv``, ``attn_decode``, ``allreduce``...): one row per distinct
    measured point of the given cells, its key fields as columns plus ``latency_ms``."""
    used = lineage.filter(pl.col("cell_id").is_in(cell_ids))
    out = {}
    for (op,), group in used.group_by("op", maintain_order=True):
        points = group.unique("key", maintain_order=True)
        keys = points["key"].str.json_decode(infer_schema_length=None).struct.unnest()
        out[op] = pl.concat([keys, points.select("latency_ms")], how="horizontal")
    return dict(sorted(out.items()))


def points_of(home_points: str, home_rows: list[dict], rows: dict[str, dict]) -> str:
    """The op points the homes give: ``full_grid`` only where every home GPU has a measured op
    grid in the store (``<sku>_ops``) from the backend version its cells were built from; a
    family without one (vidurprof, splitwise, llmservingsim), or whose cells read ops the grid
    lacks (the MoE family's experts), has only the points behind its cells, and the run records
    ``behind_cells``. ``every_shape`` (the serving oracle's) reads the GPU's measured tables at
    the home's own version, whichever version its ``_ops`` set is of (``home_grid.full_grid``
    names a version the store lacks), an MoE family's (``expert_tables``) included, since it
    reads the fused-MoE tables too; for a family with ``profile_grid``, the GPU's vLLM profile,
    where the home was built from one (a release version; LLMServingSim's older PyTorch
    profiles record none)."""
    home_grid.require_choice(home_points)

    def has_grid(row: dict) -> bool:
        grid = rows.get(f"{row['sku']}{home_grid.OPS_SUFFIX}")
        fam = families.of(row["name"])
        if home_points == "every_shape":
            if fam is not None and fam.profile_grid:
                return all(release(v) is not None for v in row["backend_versions"])
            # every table of the GPU, the fused-MoE ones included
            return grid is not None and (fam is None or fam.op_grid or fam.expert_tables)
        same_version = grid is not None and grid["backend_versions"] == row["backend_versions"]
        return same_version and (fam is None or fam.op_grid)

    return home_points if all(has_grid(r) for r in home_rows) else "behind_cells"


def build_home(catalog, row: dict, train: pl.DataFrame, gpu, models,
               home_points: str = "behind_cells", heldout: pl.DataFrame | None = None) -> Home:
    """The home fit sees; ``heldout``: the cells it scores, whose shapes ``held_out_shapes``
    removes from the grid and from the training cells."""
    home_grid.require_choice(home_points)
    shapes = None
    if home_points == home_grid.HELD_OUT_SHAPES:
        if heldout is None:
            raise ValueError(f"{home_grid.HELD_OUT_SHAPES} needs the held-out cells of home "
                             f"{row['name']}")
        lineage = catalog.lineage(row["name"])
        shapes = home_grid.shapes_of(op_points(lineage, heldout["cell_id"].to_list()))
        reading = home_grid.cells_reading(
            lineage.filter(pl.col("cell_id").is_in(train["cell_id"].to_list())), shapes)
        train = train.filter(~pl.col("cell_id").is_in(sorted(reading)))
        if train.is_empty():
            raise ValueError(f"every training cell of home {row['name']} reads a shape of its "
                             "held-out configurations; change split.seed or split.test_fraction")
    if home_points == "every_shape" and not train.is_empty():
        ops = home_grid.full_grid(catalog, row, None, models)  # every shape and precision
    elif home_points != "behind_cells" and not train.is_empty():
        configs = sorted(set(train.select("model", "tp").iter_rows()))
        dtypes = train["gemm_dtype"].unique().to_list()
        if len(dtypes) != 1:
            raise ValueError(f"home {row['name']} mixes GEMM precisions {dtypes}; "
                             f"{home_points} reads one (pass split.home_points=behind_cells)")
        ops = home_grid.full_grid(catalog, row, configs, models, dtypes[0])
        if shapes is not None:
            ops = home_grid.without_shapes(ops, shapes)
    else:
        ops = op_points(catalog.lineage(row["name"]), train["cell_id"].to_list())
    return Home(sku=row["sku"], gpu=gpu, dataset=row["name"], cells=train, ops=ops,
                models=models, published=catalog.coefficients(), points=home_points)


def merge(parts: list[Home]) -> Home:
    """One home of several: rows concatenated, every home GPU's datasheet in ``gpus``. Every
    part must give the same op points (``points_of`` over all the homes)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if len({p.points for p in parts}) > 1:
        raise ValueError(f"homes {[p.dataset for p in parts]} give different op points "
                         f"{[p.points for p in parts]}; build each with the points of them all")
    ops = {op: pl.concat([p.ops[op] for p in parts if op in p.ops], how="diagonal_relaxed")
           for op in sorted({op for p in parts for op in p.ops})}
    return Home(sku=first.sku, gpu=first.gpu, dataset="+".join(p.dataset for p in parts),
                cells=pl.concat([p.cells for p in parts], how="diagonal_relaxed"), ops=ops,
                models=first.models, published=first.published,
                gpus={p.sku: p.gpu for p in parts}, points=first.points)
