"""The documentation site (`make docs`; `make test` builds it too): the guides in docs/, the R
vignettes as articles (knitted to Markdown by knitr), the reliability, benchmark and architecture
records with the latest benchmark plot, the Python reference (mkdocstrings, from the docstrings)
and the R reference (the package's Rd help pages, rendered by R's own Rd2HTML). Built with
`mkdocs build --strict`: a broken link, or a public name without a reference entry, fails the
build.

Usage: python tools/docs_site.py OUT_DIR [--articles run|show]
  run (the default, `make docs`): the vignettes' code runs, its output and plots are on the page
  (it trains; it needs the kerasdist R package installed and its Python, as R CMD build does);
  show (`make test`, whose R CMD build runs the vignettes already): the code without its output.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Files outside docs/ that the guides link to, and their pages on the site.
ROOT_PAGES = {"RELIABILITY.md": "reliability.md", "RELIABILITY-history.md": "reliability-history.md",
              "bench/README.md": "benchmarks.md", "bench/results/summary.md": "bench-latest.md",
              "ARCHITECTURE.md": "architecture.md"}
ROOT_LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?P<anchor>#[^)\s]*)?\)")
GUIDES = ["install", "strategies", "training", "checkpoints", "data", "your-data", "custom-loops", "evaluation",
          "multi-worker", "upstream", "clusters", "ray", "parameter-servers", "cli"]
LINK = re.compile(r"\]\(\.\./(?P<target>[^)#\s]+)(?P<anchor>#[^)\s]*)?\)")
BODY = re.compile(r"<body>(?P<body>.*)</body>", re.S)
R_HELP_LINK = re.compile(r'href="\.\./\.\./(?P<package>[\w.]+)/help/(?P<topic>[^"]+)\.html"')


def python_groups() -> list[tuple[str, list[str]]]:
    """`kerasdist.__all__` in its groups, each under the comment that heads it in __init__.py."""
    source = (ROOT / "python" / "kerasdist" / "__init__.py").read_text()
    module = ast.parse(source)
    assigned = next(node for node in module.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
    lines = source.splitlines()[assigned.lineno:assigned.end_lineno]
    groups: list[tuple[str, list[str]]] = []
    for line in lines:
        text = line.strip()
        if text.startswith("#"):
            groups.append((text.lstrip("# ").capitalize(), []))
        elif text.startswith('"'):
            groups[-1][1].append(text.strip('",'))
    return groups


def python_reference() -> str:
    parts = ["# Python reference\n", "Everything `import kerasdist` offers (`kerasdist.__all__`), from the "
             "docstrings. The R twins have the same names: see the [R reference](r/index.md).\n"]
    for title, names in python_groups():
        parts.append(f"## {title}\n")
        parts.extend(f"::: kerasdist.{name}\n" for name in names)
    return "\n".join(parts)


R_RENDER = r"""
args <- commandArgs(TRUE)
out <- args[[2]]
topics <- list()
for (rd_file in list.files(args[[1]], pattern = "[.]Rd$", full.names = TRUE)) {
  rd <- tools::parse_Rd(rd_file)
  tags <- vapply(rd, function(x) attr(x, "Rd_tag"), "")
  text <- function(tag) paste(unlist(rd[tags == tag]), collapse = "")
  name <- sub("[.]Rd$", "", basename(rd_file))
  html <- file.path(out, paste0(name, ".html"))
  tools::Rd2HTML(rd, out = html, package = "kerasdist", stylesheet = "")
  topics[[name]] <- list(title = trimws(gsub("\\s+", " ", text("\\title"))),
                         aliases = unname(unlist(lapply(rd[tags == "\\alias"], unlist))))
}
writeLines(jsonlite::toJSON(topics, auto_unbox = TRUE), file.path(out, "topics.json"))
"""


def r_reference(staging: Path) -> list[str]:
    """One page per Rd help page under reference/r/, and an index; the pages' names."""
    rendered = Path(tempfile.mkdtemp(prefix="rd-"))
    subprocess.run(["Rscript", "-e", R_RENDER, str(ROOT / "man"), str(rendered)], check=True)
    topics = json.loads((rendered / "topics.json").read_text())
    page_of = {alias: name for name, topic in topics.items()
               for alias in ([topic["aliases"]] if isinstance(topic["aliases"], str) else topic["aliases"])}
    exported = re.findall(r"^export\((\S+)\)$", (ROOT / "NAMESPACE").read_text(), re.M)
    missing = [name for name in exported if name not in page_of]
    if missing:
        raise SystemExit(f"docs: exported R functions without a help page: {', '.join(missing)}")
    folder = staging / "reference" / "r"
    folder.mkdir(parents=True)
    for name in topics:
        html = BODY.search((rendered / f"{name}.html").read_text())["body"]
        html = R_HELP_LINK.sub(lambda m: _r_link(m, page_of), html)
        page = f"---\ntitle: {name}\n---\n<div class=\"rd\" markdown=\"0\">\n{html}\n</div>\n"
        (folder / f"{name}.md").write_text(page)
    rows = "\n".join(f"| [`{name}`]({name}.md) | {topics[name]['title']} |" for name in sorted(topics))
    (folder / "index.md").write_text(
        "# R reference\n\nThe help pages of the R package (`?distributed_fit` in R), one per topic. "
        "The Python twins have the same names: see the [Python reference](../python.md).\n\n"
        f"| topic | title |\n|---|---|\n{rows}\n")
    shutil.rmtree(rendered)
    return sorted(topics)


def _r_link(match: re.Match[str], page_of: dict[str, str]) -> str:
    page = page_of.get(match["topic"]) if match["package"] == "kerasdist" else None
    return f'href="{page}.html"' if page else 'href="https://rdrr.io/r/"'  # another package's help


def stage_guides(staging: Path, docs: Path) -> None:
    for page in sorted(docs.glob("*.md")):
        (staging / page.name).write_text(rewrite_links(page.read_text(), staging))
    shutil.copytree(docs / "images", staging / "images")
    for source, page in ROOT_PAGES.items():
        (staging / page).write_text(rewrite_root_links((ROOT / source).read_text()))
    (staging / "history").mkdir()  # bench/README.md's earlier runs, linked as history/NAME.md
    for page in sorted((ROOT / "bench" / "history").glob("*.md")):
        shutil.copy(page, staging / "history" / page.name)
    shutil.copy(ROOT / "bench" / "results" / "summary.png", staging / "summary.png")


R_KNIT = r"""
args <- commandArgs(TRUE)
if (args[[3]] == "show") {
  # every chunk shown, none run (a hook on eval runs for every chunk, whatever the vignette sets)
  knitr::opts_hooks$set(eval = function(options) { options$eval <- FALSE; options })
}
setwd(args[[2]])
for (rmd in list.files(args[[1]], pattern = "[.]Rmd$", full.names = TRUE)) {
  name <- sub("[.]Rmd$", "", basename(rmd))
  knitr::opts_chunk$set(fig.path = paste0("figures/", name, "-"))
  knitr::knit(rmd, output = paste0(name, ".md"), quiet = TRUE, envir = new.env())
}
"""
SHOWN_ONLY = ("!!! note\n    This copy shows the vignette's code without running it; `make docs` builds the "
              "site with its output, and in R `vignette(\"{name}\")` shows it.\n\n")


def stage_articles(staging: Path, mode: str) -> list[str]:
    """The R vignettes knitted into articles/ (`mode` "run" or "show", see the usage); their pages."""
    folder = staging / "articles"
    folder.mkdir()
    subprocess.run(["Rscript", "-e", R_KNIT, str(ROOT / "vignettes"), str(folder), mode], check=True)
    pages = sorted(path.name for path in folder.glob("*.md"))
    for page in pages:
        text = (folder / page).read_text()
        if mode == "show":
            end = text.index("\n---\n", 4) + 5  # after the front matter
            text = text[:end] + "\n" + SHOWN_ONLY.format(name=page[:-3]) + text[end:]
        (folder / page).write_text(text)
    return [f"articles/{page}" for page in pages]


def rewrite_root_links(text: str) -> str:
    """Links between the records beside docs/ (RELIABILITY.md and its history): to their site pages."""
    def rewrite(match: re.Match[str]) -> str:
        page = ROOT_PAGES.get(match["target"])
        return f"]({page}{match['anchor'] or ''})" if page else match[0]
    return ROOT_LINK.sub(rewrite, text)


def rewrite_links(text: str, staging: Path) -> str:
    """Links out of docs/ (`../X`): to the site's page for X, or to a copy of the repository file."""
    def rewrite(match: re.Match[str]) -> str:
        target, anchor = match["target"], match["anchor"] or ""
        if target in ROOT_PAGES:
            return f"]({ROOT_PAGES[target]}{anchor})"
        source = ROOT / target
        if source.is_file():
            copy = staging / target
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, copy)
            return f"]({target}{anchor})"
        return match[0]  # left for mkdocs --strict to refuse
    return LINK.sub(rewrite, text)


def mkdocs_config(r_pages: list[str] | None, articles: list[str]) -> dict:
    """The site's mkdocs configuration; `r_pages` None for a site of the guides alone."""
    config = {
        "site_name": "kerasdist",
        "site_description": "Distributed, fault-tolerant Keras 3 training on TensorFlow, from Python and R",
        "docs_dir": "pages",
        "use_directory_urls": False,  # pages open from the disk (file://) as well as from a server
        "strict": True,
        "theme": {"name": "material", "font": False,  # no fonts fetched from Google: the site works offline
                  "features": ["navigation.sections", "content.code.copy"]},
        "markdown_extensions": ["tables", "admonition", "md_in_html", "pymdownx.superfences",
                                {"toc": {"permalink": True}}],
        "plugins": ["search", {"mkdocstrings": {"handlers": {"python": {
            "paths": [str(ROOT / "python")],
            "options": {"show_root_heading": True, "show_source": False, "heading_level": 3,
                        "docstring_style": "google", "show_signature_annotations": True,
                        "separate_signature": True, "merge_init_into_class": True}}}}}],
        "validation": {"links": {"not_found": "warn", "anchors": "warn", "unrecognized_links": "warn"}},
        "nav": [
            {"Home": "index.md"},
            {"Guides": [f"{name}.md" for name in GUIDES]},
            {"R articles": articles},
            {"Reference": [{"Python": "reference/python.md"}, {"R": "reference/r/index.md"}]},
            {"Records": [{"Reliability": "reliability.md"}, {"Benchmarks": "benchmarks.md"},
                         {"Latest benchmark run": "bench-latest.md"}, {"Architecture": "architecture.md"}]},
        ],
        "not_in_nav": "\n".join(f"/reference/r/{name}.md" for name in r_pages or []),
    }
    if r_pages is None:
        config["nav"] = [entry for entry in config["nav"] if "Reference" not in entry]
        config["plugins"] = ["search"]
    if not articles:
        config["nav"] = [entry for entry in config["nav"] if "R articles" not in entry]
    return config


def build(out: Path, docs: Path = ROOT / "docs", references: bool = True, articles: str | None = "run") -> None:
    """The site into `out`, from the guides in `docs` (the repository's docs/ by default); without
    the Python and R references when `references` is False; the vignettes as articles, run or only
    shown (`articles` "run" or "show"), or none (None)."""
    work = Path(tempfile.mkdtemp(prefix="kerasdist-site-"))
    try:
        staging = work / "pages"
        staging.mkdir()
        stage_guides(staging, docs)
        r_pages = None
        article_pages = stage_articles(staging, articles) if articles else []
        if references:
            (staging / "reference").mkdir()
            (staging / "reference" / "python.md").write_text(python_reference())
            r_pages = r_reference(staging)
        (work / "mkdocs.yml").write_text(json.dumps(mkdocs_config(r_pages, article_pages), indent=1))  # JSON is YAML
        # not --quiet: with it, mkdocs 1.6.1 no longer counts warnings in strict mode
        command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(work / "mkdocs.yml"),
                   "-d", str(out.resolve())]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        if done.returncode != 0:
            print("\n".join(line for line in done.stderr.splitlines() if not line.startswith("INFO")), file=sys.stderr)
            raise subprocess.CalledProcessError(done.returncode, command)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and (sys.argv[2] != "--articles"
                                                               or sys.argv[3] not in ("run", "show"))):
        raise SystemExit(__doc__)
    build(Path(sys.argv[1]), articles=sys.argv[3] if len(sys.argv) == 4 else "run")
    print(f"docs: the site is in {sys.argv[1]} (open {sys.argv[1]}/index.html)")
