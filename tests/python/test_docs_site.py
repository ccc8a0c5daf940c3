"""The documentation site (tools/docs_site.py, `make docs`): built strictly, every public name in
both references, and read in a real browser (headless Chromium), whose screenshot of the home page
is kept in .check/ by `make test`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kerasdist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import docs_site  # noqa: E402

CHECK_DIR = ROOT / ".check"  # make test's artifacts


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = CHECK_DIR / "site" if CHECK_DIR.is_dir() else tmp_path_factory.mktemp("site")
    shutil.rmtree(out, ignore_errors=True)
    docs_site.build(out, articles="show")  # R CMD build runs the vignettes in make test
    return out


def rendered_text(page: Path, screenshot: Path | None = None) -> str:
    """The page's text as Chromium renders it (its DOM after scripts ran, tags removed)."""
    browser = shutil.which("chromium")
    assert browser, "chromium is not installed (tools/setup.sh installs it)"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000"]
    if screenshot:
        subprocess.run([browser, *flags, f"--screenshot={screenshot}", page.as_uri()], capture_output=True,
                       timeout=120, check=True)
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)))


def test_every_public_python_name_has_a_reference_entry(site):
    page = (site / "reference" / "python.html").read_text()
    missing = [name for name in kerasdist.__all__ if f'id="kerasdist.{name}"' not in page]
    assert missing == []


def test_every_exported_r_function_has_a_reference_page(site):
    exported = re.findall(r"^export\((\S+)\)$", (ROOT / "NAMESPACE").read_text(), re.M)
    aliases = {m for rd in (ROOT / "man").glob("*.Rd") for m in re.findall(r"\\alias\{([^}]+)\}", rd.read_text())}
    assert set(exported) <= aliases
    pages = {p.stem for p in (site / "reference" / "r").glob("*.html")}
    assert {rd.stem for rd in (ROOT / "man").glob("*.Rd")} <= pages


def test_a_broken_link_fails_the_build(tmp_path, capfd):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    docs_site.build(tmp_path / "guides", docs, references=False, articles=None)  # the guides alone build
    (docs / "training.md").write_text((docs / "training.md").read_text() + "\nSee [nowhere](no-such-page.md).\n")
    with pytest.raises(subprocess.CalledProcessError):
        docs_site.build(tmp_path / "site", docs, references=False, articles=None)
    assert "'training.md' contains a link 'no-such-page.md', but the target is not found" in capfd.readouterr().err


def test_the_home_page_and_a_reference_page_of_each_language_render_in_chromium(site):
    home = rendered_text(site / "index.html", screenshot=site.parent / "docs-home.png"
                         if site.parent == CHECK_DIR else None)
    assert "Distributed, fault-tolerant Keras 3 training on TensorFlow" in home
    assert "Choosing a strategy" in home and "Python reference" not in home.split("Guides")[0]
    python = rendered_text(site / "reference" / "python.html")
    assert "kerasdist.distributed_fit" in python and "checkpoint_dir" in python
    assert "Strategy selection" in python and "kerasdist.checkpoint_table" in python
    r = rendered_text(site / "reference" / "r" / "distributed_fit.html")
    assert "Train a model under a distribution strategy, surviving restarts, in one call" in r
    assert "distributed_fit( build_fn, x, y = NULL" in r and "Usage" in r and "Arguments" in r


def test_the_vignettes_are_articles_on_the_site(site):
    vignettes = sorted(path.stem for path in (ROOT / "vignettes").glob("*.Rmd"))
    assert sorted(path.stem for path in (site / "articles").glob("*.html")) == vignettes
    article = rendered_text(site / "articles" / "fault-tolerance.html")
    assert "Fault tolerance: checkpoints, a kill and a resume" in article
    assert "make_or_restore_model" in article and "shows the vignette's code without running it" in article
    assert "R articles" in rendered_text(site / "index.html")


def test_the_latest_benchmark_run_and_its_plot_are_on_the_site(site):
    page = (site / "bench-latest.html").read_text()
    assert '<img alt="figures" src="summary.png"' in page and (site / "summary.png").stat().st_size > 10_000
    assert "Benchmark results" in page and "| benchmark |" not in page  # the table rendered


def test_the_python_reference_is_rendered_whether_or_not_articles_are_built():
    for articles in ([], ["articles/fault-tolerance.md"]):
        plugins = docs_site.mkdocs_config(["select_strategy"], articles)["plugins"]
        assert any(isinstance(p, dict) and "mkdocstrings" in p for p in plugins), articles
    assert docs_site.mkdocs_config(None, [])["plugins"] == ["search"]  # the guides alone
