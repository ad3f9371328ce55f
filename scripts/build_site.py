"""Build the course site: every lesson notebook executed in fast mode, rendered to static HTML.

    python scripts/build_site.py                 # -> site/_build/html/index.html
    python scripts/build_site.py --jobs 2        # execute two notebooks at a time
    python scripts/build_site.py --reuse         # keep executed notebooks whose source is unchanged
    python scripts/build_site.py --only 01 05    # a subset (quick look at one lesson)

The lessons are read from ``site/site.json`` (title, intro, chapter order). Each notebook is
run top to bottom with ``nbclient`` (``CODEX_LAB_FAST=1``, cwd ``notebooks/``, widget state
stored), so figures, tables and verdicts are in the pages; a cell that raises fails the
build with the lesson and the error named (exit 1). Pages are written with ``nbconvert``
(JupyterLab template) plus a navigation bar; ``index.html`` lists the lessons. Open the
result with ``python -m http.server -d site/_build/html`` or the file directly.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "site"
NOTEBOOKS = ROOT / "notebooks"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def execute(nb_path: Path, out: Path, timeout: int, reuse: bool) -> tuple[str, float, bool]:
    """Run one notebook into ``out`` (.ipynb with outputs); (name, seconds, reused).

    Raises:
        RuntimeError: a cell raised; the message names the notebook and the error.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    stamp = out.with_suffix(".sha")
    digest = _digest(nb_path)
    if reuse and out.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return nb_path.name, 0.0, True
    nb = nbformat.read(nb_path, as_version=4)
    t0 = time.perf_counter()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()
    except CellExecutionError as exc:
        raise RuntimeError(f"{nb_path.name}: a cell failed; the site is not built\n{exc}") from None
    tmp = out.with_suffix(".tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, out)
    stamp.write_text(digest)
    return nb_path.name, time.perf_counter() - t0, False


def _title(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "untitled"


NAV_CSS = ("<style>.cl-nav{font-family:system-ui,sans-serif;display:flex;gap:1.5em;padding:.6em 1em;"
           "background:#f4f6f8;border-bottom:1px solid #d0d7de;position:sticky;top:0;z-index:100}"
           ".cl-nav a{text-decoration:none;color:#0969da}</style>")


def _nav(prev: tuple[str, str] | None, nxt: tuple[str, str] | None, book: str) -> str:
    parts = [f'<a href="index.html">&#8962; {html.escape(book)}</a>']
    if prev:
        parts.append(f'<a href="{prev[0]}">&larr; {html.escape(prev[1])}</a>')
    if nxt:
        parts.append(f'<a href="{nxt[0]}">{html.escape(nxt[1])} &rarr;</a>')
    return NAV_CSS + '<nav class="cl-nav">' + "".join(parts) + "</nav>"


def render(executed: list[Path], dest: Path, cfg: dict) -> None:
    """Write one HTML page per executed notebook plus ``index.html`` into ``dest``."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab")
    nbs = [nbformat.read(p, as_version=4) for p in executed]
    pages = [(p.stem + ".html", _title(nb)) for p, nb in zip(executed, nbs)]
    dest.mkdir(parents=True, exist_ok=True)
    for i, nb in enumerate(nbs):
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": pages[i][1]}})
        nav = _nav(pages[i - 1] if i else None, pages[i + 1] if i + 1 < len(pages) else None, cfg["title"])
        body = body.replace("<body", "<body", 1)
        at = body.find(">", body.find("<body")) + 1
        (dest / pages[i][0]).write_text(body[:at] + nav + body[at:], encoding="utf-8")
    items = "".join(f'<li><a href="{f}">{html.escape(t)}</a></li>' for f, t in pages)
    index = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(cfg['title'])}</title>"
             "<style>body{font-family:system-ui,sans-serif;max-width:52em;margin:2em auto;line-height:1.5}"
             "li{margin:.4em 0}</style></head><body>"
             f"<h1>{html.escape(cfg['title'])}</h1><p>{html.escape(cfg['intro'])}</p><ol start='0'>{items}</ol>"
             f"<p><small>Built {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in fast mode "
             "(CODEX_LAB_FAST=1): sizes and steps are shrunk, so figures are the fast-mode ones.</small></p>"
             "</body></html>")
    (dest / "index.html").write_text(index, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(SITE / "_build"), help="build folder (html/ and executed/ go in it)")
    ap.add_argument("--jobs", type=int, default=2, help="notebooks executed at once")
    ap.add_argument("--timeout", type=int, default=1800, help="per-cell timeout in seconds")
    ap.add_argument("--reuse", action="store_true", help="skip notebooks whose source has not changed since the last build")
    ap.add_argument("--only", nargs="*", default=None, metavar="NN", help="only these lessons (by number prefix)")
    args = ap.parse_args(argv)

    cfg = json.loads((SITE / "site.json").read_text())
    names = [n for n in cfg["chapters"] if args.only is None or any(n.startswith(o) for o in args.only)]
    missing = [n for n in names if not (NOTEBOOKS / n).is_file()]
    if missing:
        print(f"site/site.json names notebooks that do not exist: {missing}", file=sys.stderr)
        return 2
    out = Path(args.out)
    ex_dir = out / "executed"
    ex_dir.mkdir(parents=True, exist_ok=True)
    # the kernels inherit this environment: fast mode, inline figures (CI sets MPLBACKEND=Agg)
    os.environ["CODEX_LAB_FAST"] = "1"
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    os.environ.setdefault("CODEX_LAB_PROGRESS", "0")
    t0 = time.perf_counter()
    failed: list[str] = []

    def job(n: str):
        try:
            return execute(NOTEBOOKS / n, ex_dir / n, args.timeout, args.reuse)
        except RuntimeError as exc:
            failed.append(str(exc))
            return n, float("nan"), False

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, secs, reused in pool.map(job, names):
            print(f"{name}: {'reused' if reused else f'executed in {secs:.0f} s'}", flush=True)
    if failed:
        print("\n\n".join(failed), file=sys.stderr)
        print(f"site build FAILED: {len(failed)} lesson(s) raised", file=sys.stderr)
        return 1
    html_dir = out / "html"
    tmp = out / "html.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    render([ex_dir / n for n in names], tmp, cfg)
    shutil.rmtree(html_dir, ignore_errors=True)
    os.replace(tmp, html_dir)  # the previous site stays whole until the new one is complete
    print(f"site: {html_dir / 'index.html'} ({len(names)} lessons, {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
