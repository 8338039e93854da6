"""The static site: built from stored runs, every link and image resolves, the landing page's
numbers are the runs', and in a real browser (headless Chromium through Selenium and the Debian
``chromium-driver``) every page loads with no console error and a header click sorts its table."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from leaderboard import site
from leaderboard.run.evaluate import RunSpec, run
from leaderboard_core.report_tables import fmt

RUNS = [("ours", "a100_vidur"), ("ours", "h200_vidur"), ("llm_viewer", "h200_vidur")]


@pytest.fixture(scope="module")
def built(real_store, tmp_path_factory):
    import os

    saved = os.environ.get("LEADERBOARD_HOME")
    os.environ["LEADERBOARD_HOME"] = str(real_store.home)
    root = tmp_path_factory.mktemp("site")
    try:
        metrics = [run(RunSpec(p, d, {}, runs_dir=root / "runs")).metrics for p, d in RUNS]
        pages = site.build(root / "runs", root / "site")
    finally:
        os.environ["LEADERBOARD_HOME"] = saved or ""
    return root / "site", pages, metrics


def _targets(page: Path) -> list[str]:
    text = page.read_text()
    return re.findall(r'(?:href|src)="([^"#:]+)(?:#[^"]*)?"', text)


@pytest.mark.slow
def test_every_link_and_image_of_every_page_resolves(built):
    out, pages, _ = built
    assert {"index.html", "methodology.html", "family-vidur.html", "predictor-ours.html",
            "dataset-h200_vidur.html", "results.csv", "results.parquet"} <= {
        p.name for p in out.iterdir()}
    missing = {(page.name, t) for page in pages for t in _targets(page) if not (out / t).exists()}
    assert not missing, sorted(missing)[:5]


@pytest.mark.slow
def test_a_predictor_page_shows_each_gpu_atlas_and_where_its_error_grows(built):
    out, _, _ = built
    page = out.joinpath("predictor-ours.html").read_text()
    for image in ("atlas-ours-a100_vidur.png", "atlas-ours-h200_vidur.png", "profile-ours.png",
                  "scatter-ours.png"):
        assert f'src="{image}"' in page and (out / image).stat().st_size > 10_000
    # the home's own atlas first: the page reads home, then the GPUs it never saw
    assert page.index("atlas-ours-a100_vidur.png") < page.index("atlas-ours-h200_vidur.png")


@pytest.mark.slow
def test_the_landing_numbers_are_the_stored_runs(built):
    out, _, metrics = built
    ours = next(m for m in metrics if m["predictor"] == "ours" and m["dataset"] == "h200_vidur")
    landing = out.joinpath("index.html").read_text()
    n = ours["phases"]["all"]["n"]
    assert f"{fmt(ours['phases']['all']['mape'])} (n={n:,})" in landing  # its matrix cell
    tidy = pl.read_parquet(out / "results.parquet")
    mape = tidy.filter((pl.col("predictor") == "ours") & (pl.col("dataset") == "h200_vidur")
                       & (pl.col("phase") == "all") & (pl.col("metric") == "mape"))["value"]
    assert mape.to_list() == [ours["phases"]["all"]["mape"]]
    stored = json.loads((out / "runs" / f"{ours['run_id']}.json").read_text())
    assert stored["phases"] == ours["phases"]


@pytest.mark.slow
def test_the_site_in_a_real_browser(built):
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (the dev "
                                                                 "extra) for the browser tests")
    driver_path = shutil.which("chromedriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not (driver_path and browser):
        pytest.skip("no chromium and chromium-driver here (apt-get install chromium "
                    "chromium-driver; make test-long installs them where apt can)")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    out, pages, _ = built
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        for page in [p for p in pages if p.suffix == ".html"]:
            driver.get(page.as_uri())
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, (page.name, errors[:2])
            broken = driver.execute_script(
                "return Array.from(document.images).filter(i => !i.complete || "
                "i.naturalWidth === 0).map(i => i.src)")
            assert not broken, (page.name, broken)
        driver.get((out / "family-vidur.html").as_uri())
        table = driver.find_elements(By.CSS_SELECTOR, "table.sortable")[-1]
        header = table.find_elements(By.TAG_NAME, "th")[0]
        first = lambda: [r.find_elements(By.TAG_NAME, "td")[0].text  # noqa: E731
                         for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
        header.click()
        ascending = first()
        header.click()
        assert ascending == sorted(ascending, key=str.lower) and first() == ascending[::-1]
    finally:
        driver.quit()


@pytest.mark.slow
def test_the_hub_export_carries_the_results_table_with_its_columns(built, store_home, tmp_path):
    from leaderboard.present import hub_export

    out, _, metrics = built
    export = tmp_path / "export"
    hub_export.export(export, only=["h200_vidur"], quiet=True, runs_dir=out.parent / "runs")
    table = pl.read_parquet(export / "results" / "results.parquet")
    assert table.equals(pl.read_parquet(out / "results.parquet"))
    card = (export / "README.md").read_text()
    assert "config_name: results" in card and "| ? |" not in card
    assert "| `metric` | string | - |" in card


def test_markdown_from_runs_cannot_inject_script():
    """The second hostile review's payload (an INVALID reason carrying an image whose URL
    closes the attribute) and a javascript: link stay text."""
    from leaderboard.present.site_pages import inline, markdown

    forged = inline('see ![x](nope.png" onerror="throw onerror=alert,document.domain)')
    assert "<img" not in forged and "onerror=&quot;" in forged
    assert "<a " not in inline("[a](javascript:alert(1))")
    assert inline("<script>x</script>") == "&lt;script&gt;x&lt;/script&gt;"
    assert '<img alt="c" src="atlas/a.png">' in markdown("![c](atlas/a.png)")
