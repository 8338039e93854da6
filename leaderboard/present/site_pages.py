"""The static site's pages (``leaderboard.site``): HTML from the current runs, and from the
report's own markdown tables and topic pages where the report already tables a thing, so the site
and RESULTS.md never disagree.

``markdown`` converts the report's markdown (headings, paragraphs, lists, tables, images, code
blocks) and nothing more; every table becomes sortable and filterable (``site.js``).
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import polars as pl

from leaderboard.present import headline as report_headline
from leaderboard.present import leaderboard_table, pages, site_pictures
from leaderboard.score import results
from leaderboard_core import paths
from leaderboard_core.report_tables import GPU_MEAN, fmt, phase_stat

NAV = [("index.html", "Leaderboard"), ("methodology.html", "Methodology"),
       ("results.csv", "Download CSV"), ("results.parquet", "Download parquet")]
# A link or image target the site writes as one: a relative path or an http(s) address. Any
# other (a javascript: URL, a quote that would leave the attribute) stays text.
SAFE_URL = re.compile(r"^(https?://[^\s\"'<>]+|[\w./#-]+)$")
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")
INLINE = [(re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
          (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>")]
NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d+( ?%| –.*)?$|^—$")


def _target(match: re.Match, image: bool) -> str:
    label, url = match.group(1), html.unescape(match.group(2))
    if not SAFE_URL.match(url):
        return match.group(0)
    url = html.escape(url, quote=True)
    return f'<img alt="{label}" src="{url}">' if image else f'<a href="{url}">{label}</a>'


def inline(text: str) -> str:
    """One line of the report's markdown as HTML: escaped first (quotes too), then its images,
    links, code and bold; a link whose target is not a plain path or http(s) address stays
    text."""
    text = html.escape(text, quote=True)
    text = IMAGE.sub(lambda m: _target(m, True), text)
    text = LINK.sub(lambda m: _target(m, False), text)
    for pattern, replacement in INLINE:
        text = pattern.sub(replacement, text)
    text = re.sub(r'href="(?:\.\./)?results/', 'href="', text)
    text = text.replace('href="../RESULTS.md"', 'href="index.html"')
    return re.sub(r'href="([^":]+)\.md"', r'href="\1.html"', text)


def _table(rows: list[str]) -> str:
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    head, body = cells[0], cells[2:]
    cls = lambda c: ' class="num"' if NUMBER.match(c) else ""  # noqa: E731
    return ('<table class="sortable" data-filter><thead><tr>'
            + "".join(f"<th>{inline(h)}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td{cls(c)}>{inline(c)}</td>" for c in r) + "</tr>"
                      for r in body) + "</tbody></table>")


def markdown(text: str) -> str:
    """The report's markdown as HTML."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")),
                       len(lines))
            out.append("<pre>" + html.escape("\n".join(lines[i + 1:end])) + "</pre>")
            i = end + 1
            continue
        if line.startswith("|"):
            end = next((j for j in range(i, len(lines)) if not lines[j].startswith("|")),
                       len(lines))
            out.append(_table(lines[i:end]))
            i = end
            continue
        if heading := re.match(r"^(#{1,4}) (.*)", line):
            level = len(heading.group(1))
            anchor = re.sub(r"[^a-z0-9]+", "-", heading.group(2).lower()).strip("-")
            out.append(f'<h{level} id="{anchor}">{inline(heading.group(2))}</h{level}>')
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith(("- ", "  ")):
                items.append(lines[i][2:] if lines[i].startswith("- ") else lines[i])
                i += 1
            out.append("<ul>" + "".join(f"<li>{inline(t)}</li>" for t in items) + "</ul>")
            continue
        elif line.strip() and not line.startswith("<!--"):
            out.append(f"<p>{inline(line)}</p>")
        i += 1
    return "\n".join(out)


def page(title: str, body: str) -> str:
    nav = " ".join(f'<a href="{href}">{label}</a>' for href, label in NAV)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}'
            '</title><link rel="stylesheet" href="style.css"><script src="site.js"></script>'
            f"</head><body><nav>{nav}</nav>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def _best_by_gpu(runs: pl.DataFrame, fam: str) -> str:
    """Per unseen GPU and phase: the best predictor, and its margin over the best profiled
    one (a predictor whose card says it fits measured rows)."""
    unseen = runs.filter((pl.col("family") == fam) & (pl.col("split") == "unseen")
                         & pl.col("valid"))
    rows = ["| GPU | phase | best predictor | MAPE % | best profiled | MAPE % | margin (points) |",
            "|---|---|---|---|---|---|---|"]
    for dataset in sorted(set(unseen["dataset"])):
        mine = unseen.filter(pl.col("dataset") == dataset)
        phases = sorted({p for r in mine["phases"] for p in json.loads(r or "{}")})
        for phase in phases:
            scored = [(phase_stat(r, phase), r["predictor"],
                       json.loads(r["card"] or "{}").get("kind") == "profiled")
                      for r in mine.iter_rows(named=True) if phase_stat(r, phase) is not None]
            if not scored:
                continue
            best = min(scored)
            profiled = min((s for s in scored if s[2]), default=None)
            margin = fmt(profiled[0] - best[0]) if profiled else "—"
            rows.append(f"| {dataset} | {phase} | {best[1]} | {fmt(best[0])} | "
                        f"{profiled[1] if profiled else '—'} | "
                        f"{fmt(profiled[0]) if profiled else '—'} | {margin} |")
    return "\n".join(rows)


def _matrix_links(lines: list[str]) -> list[str]:
    """The matrix's predictor names linked to their pages and family headers to theirs."""
    out = []
    for line in lines:
        line = line.replace("[the leaderboard](results/leaderboard.md)", "[its family's page](#families)")
        if line.startswith("| predictor |"):
            cells = line.strip("|").split("|")
            line = "| " + " | ".join([cells[0].strip()] + [f"[{c.strip()}](family-{c.strip()}.md)"
                                                            for c in cells[1:]]) + " |"
        elif line.startswith("| ") and not line.startswith("| ---"):
            name = line.split("|")[1].strip()
            line = line.replace(f"| {name} |", f"| [{name}](predictor-{name}.md) |", 1)
        out.append(line)
    return out


def landing(runs: pl.DataFrame, predictions: pl.DataFrame, versions: dict) -> str:
    headline = report_headline.headline(runs, predictions)
    matrix = _matrix_links(pages.matrix(runs))
    harness = sorted(set(runs["harness_hash"].drop_nulls())) if "harness_hash" in runs.columns else []
    text = "\n".join([
        "How long will the next forward step of an LLM take on this GPU? This site scores "
        "predictors of that number against real GPU measurements published by other projects. "
        "Each predictor is fitted on a home GPU and predicts GPUs it never saw, sealed from their "
        "measurements; only the default run of each predictor and dataset is ranked.", "",
        *headline, "", *matrix, "",
        "## Families", "", *(f"- [{fam}](family-{fam}.md)" for fam in sorted(set(runs["family"]))),
        "", "## Versions", "",
        f"- Harness hash: {', '.join(f'`{h}`' for h in harness) or '—'}; dataset versions: "
        f"{len(versions)} datasets (each dataset page states its own).",
        f"- Code versions of the runs: "
        f"{', '.join(f'`{v}`' for v in sorted(set(runs['code_version'])))}.", "",
        "## Submit a predictor", "",
        "Write it from `docs/predictors.md`, check it with `python -m leaderboard.check`, score "
        "it with `python -m leaderboard.submit predictor=NAME predictors_path=DIR`, and send the "
        "results bundle it writes; `python -m leaderboard.report report.bundles=[FILE]` merges it.",
        "", "## More", "", *(f"- [{title}]({page})" for page, title, _ in pages.TOPICS
                             if (paths.REPO_ROOT / "results" / page).is_file()),
        "- [Datasets](datasets.md)", "- [Methodology](methodology.md)"])
    return page("LLM step-latency leaderboard", markdown(text))


def family_page(fam: str, runs: pl.DataFrame) -> str:
    mine = runs.filter(pl.col("family") == fam)
    tables = leaderboard_table.main_leaderboard(mine)
    keep = [line for line in tables if not line.startswith("## ")]
    text = "\n".join(["Per unseen GPU and phase: the best predictor and its margin over the best "
                      "profiled baseline (in MAPE points).", "", _best_by_gpu(runs, fam), "",
                      *keep])
    return page(f"{fam}: MAPE % per phase and GPU", markdown(text))


def predictor_page(name: str, runs: pl.DataFrame, images: list[str]) -> str:
    mine = runs.filter(pl.col("predictor") == name).sort("family", "dataset")
    card = json.loads(mine["card"][0] or "{}") if len(mine) else {}
    rows = ["| family | dataset | GPU | split | phase | n | MAPE % | median APE % | bias % | run |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in mine.iter_rows(named=True):
        for phase, stats in json.loads(r["phases"] or "{}").items():
            rows.append(f"| {r['family']} | [{r['dataset']}](dataset-{r['dataset']}.md) | "
                        f"{r['sku']} | {r['split']} | {phase} | {stats.get('n', '—')} | "
                        f"{fmt(stats.get('mape'))} | {fmt(stats.get('median_ape'))} | "
                        f"{fmt(stats.get('bias'))} | [metrics](runs/{r['run_id']}.json) |")
    text = "\n".join([
        f"Kind: **{card.get('kind', '—')}**; reference: {card.get('reference', '—')}; fits "
        f"measured rows: {card.get('needs_profiled_rows', '—')}; precisions: "
        f"{', '.join(card.get('precisions', [])) or '—'}; layers: "
        f"{', '.join(card.get('layers', [])) or '—'}.", "", "## Its numbers", "", *rows, "",
        *(["## Pictures", "", *(f"![{img}]({img})" for img in images)] if images else [])])
    return page(f"Predictor: {name}", markdown(text))


def dataset_page(name: str, runs: pl.DataFrame, card: str, version: str | None) -> str:
    mine = runs.filter(pl.col("dataset") == name)
    counts = {}
    for r in mine.iter_rows(named=True):
        for phase, stats in json.loads(r["phases"] or "{}").items():
            counts[phase] = max(counts.get(phase, 0), stats.get("n") or 0)
    best = sorted((phase_stat(r, "all"), r["predictor"]) for r in mine.iter_rows(named=True)
                  if phase_stat(r, "all") is not None)
    text = "\n".join([f"Version `{version or '—'}`; cells scored per phase: "
                      + (", ".join(f"{p} {n:,}" for p, n in counts.items()) or "—") + ".", "",
                      "| predictor | all MAPE % |", "|---|---|",
                      *(f"| [{p}](predictor-{p}.md) | {fmt(m)} |" for m, p in best), "",
                      "## Card", "", "```", card or "(no card in the store)", "```"])
    return page(f"Dataset: {name}", markdown(text))


METHODOLOGY = f"""## What is measured

A cell is one forward step (per request: new tokens and cached context) on one GPU, model and TP
degree, with measured ground truth from public projects, pinned by commit and sha256. A serving
target is one measured deployment under a load (mean TTFT and TPOT).

## The seal

Fit and predict run in a child process in namespaces of its own, confined by Landlock, with no
network and no read of any measurement but the home's training rows and, at most, a capped deploy
reading of the target (16 rows, 1 %). A predictor that tries to read more is INVALID. Only the
default run of a (predictor, dataset) is ranked: default reading caps, split, home and home
points, default parameters, sealed, on the store's own data (docs/design.md, "The seal" and
"Rankable runs").

## Metrics

- **MAPE**: the mean of |predicted − measured| / measured over a phase's cells, in %.
- **{GPU_MEAN}**: the mean over a family's unseen GPUs of each GPU's MAPE (each GPU weighs
  alike); **pooled MAPE**: one MAPE over all the unseen cells together (the places).
- **TTFT / TPOT**: time to first token and time per output token of a replayed load (TPOT is the
  mean over a request's decode steps; ITL, the gap between tokens, is not scored).
- **Tie-aware accuracy**: for GPU pairs measured more than 1 % apart, the share the predictor
  orders right; a predicted tie gets no credit.
- **Decisions**: capacity at a step-time SLO (violation %, throughput regret %) and GPU choice
  (regret %), scored by measured outcomes.

## What the cells can and cannot test

Composed `_vidur` mixed steps may stand in for one varlen kernel and are scored apart; light
kernels, embedding, LM head and sampler are outside the `gpu_block` ground truth; wall-clock sets
(splitwise) include the host.
"""


def write_all(out: Path, runs: pl.DataFrame, table: pl.DataFrame, atlas_dir: Path | None
              ) -> list[Path]:
    """Every page of the site into ``out``."""
    versions = results.store_versions()
    step = runs.filter(pl.col("level") == "step") if "level" in runs.columns else runs
    predictions = results.load_predictions(step.filter(pl.col("family").is_in(
        list({f for f in step["family"]}))))
    written = {"index.html": landing(runs, predictions, versions)}
    for fam in sorted(set(runs["family"])):
        written[f"family-{fam}.html"] = family_page(fam, runs)
    (out / "runs").mkdir(exist_ok=True)
    for folder, run_id in runs.select("folder", "run_id").iter_rows():
        shutil.copy(Path(folder) / "metrics.json", out / "runs" / f"{run_id}.json")
    for name in sorted(set(runs["predictor"])):
        images = []
        if atlas_dir and (atlas_dir / f"{name}.png").is_file():
            shutil.copy(atlas_dir / f"{name}.png", out / f"atlas-{name}.png")
            images.append(f"atlas-{name}.png")
        images += site_pictures.scatter(out, name, predictions)
        images += site_pictures.error_profile(out, name, predictions)
        images += site_pictures.run_atlases(out, name, runs)
        written[f"predictor-{name}.html"] = predictor_page(name, runs, images)
    cards = _cards()
    for name in sorted(set(runs["dataset"])):
        written[f"dataset-{name}.html"] = dataset_page(name, runs, cards.get(name, ""),
                                                       versions.get(name))
    written["datasets.html"] = page("Datasets", markdown("\n".join(
        f"- [{n}](dataset-{n}.md)" for n in sorted(set(runs["dataset"])))))
    written["methodology.html"] = page("Methodology", markdown(METHODOLOGY))
    for topic, title, _ in pages.TOPICS:
        source = paths.REPO_ROOT / "results" / topic
        if source.is_file():
            body = source.read_text().replace("](atlas/", "](topic-atlas/")
            written[topic.replace(".md", ".html")] = page(title, markdown(body))
    if (paths.REPO_ROOT / "results" / "atlas").is_dir():
        shutil.copytree(paths.REPO_ROOT / "results" / "atlas", out / "topic-atlas",
                        dirs_exist_ok=True)
    for name, text in written.items():
        (out / name).write_text(text)
    return [out / n for n in written]


def _cards() -> dict[str, str]:
    from leaderboard.store import database

    with database.connect() as con:
        return dict(con.execute("SELECT name, card FROM datasets").fetchall())


# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
