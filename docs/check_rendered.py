"""Rendered check of the built docs (``make docs-check``, run by ``.ci/run`` after ``make docs``).

Opens the built tutorial page in headless Chromium and checks what a reader sees there:

* the gallery's figure: an ``<img>`` of ``sphx_glr_<tutorial>_NNN.png`` that the browser loaded;
* the demo's summary, line by line, matched by label (values may be anything well-formed)::

    policy answers readable : 97%
    task reward (GRPO)      : 0.21 -> 0.64
    RM held-out accuracy    : 0.50 -> 0.83
    RM pairs by wide margin : 0.10 -> 0.95
    figure                  : /path/to/figure.png

* the gallery's timing ("Total running time of the script").

It also writes a screenshot of the page from the figure on (the text before it hidden), for a
person to look at.

Usage::

    python docs/check_rendered.py [PAGE] [--screenshot PNG]

``PAGE`` defaults to ``docs/_build/html/auto_examples/trl_interop.html``. Chromium is found as
``$CHROMIUM``, ``chromium`` or ``chromium-browser``; this script never installs it (``.ci/run``
does, in CI). The browser gets no network: every host name resolves to nothing, so the check is
the same offline and online. Exit status: 0 all present, 1 something missing (listed), 2 the check
could not run (no page, no browser).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PAGE = ROOT / "docs" / "_build" / "html" / "auto_examples" / "trl_interop.html"
DEFAULT_SCREENSHOT = ROOT / "docs" / "_build" / "docs-check" / "trl_interop.png"

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?%?"
# "A -> B", where a word may qualify A ("0.50 untrained -> 0.83 trained").
_FROM_TO = rf"{_NUM}(?:[ \t]+[A-Za-z][\w-]*)?[ \t]*(?:->|→)[ \t]*{_NUM}"
# Label -> (what the value looks like, in words; regex of the value, which may be followed by
# more words after a space).
SUMMARY_LINES: dict[str, tuple[str, str]] = {
    "policy answers readable": ("P%", rf"{_NUM}[ \t]*%?"),
    "task reward (GRPO)": ("A -> B", _FROM_TO),
    "RM held-out accuracy": ("X -> Y", _FROM_TO),
    "RM pairs by wide margin": ("W -> V", _FROM_TO),
    "figure": ("PATH", r"\S+"),
}
TIMING = "Total running time of the script"

# Runs in the page once everything (images included) has loaded, and writes what it saw into
# the DOM that Chromium's --dump-dom prints.
_PROBE = """
<script>
window.addEventListener("load", function () {
  var images = Array.prototype.map.call(document.images, function (img) {
    var box = img.getBoundingClientRect();
    return {src: img.getAttribute("src") || "", complete: img.complete,
            width: img.naturalWidth, height: img.naturalHeight,
            shown: box.width > 0 && box.height > 0};
  });
  var out = document.createElement("script");
  out.type = "application/json";
  out.id = "docs-check-result";
  out.textContent = JSON.stringify({images: images, text: document.body.innerText})
    .replace(/</g, "\\\\u003c");
  document.body.appendChild(out);
});
</script>
"""
# For the screenshot: headless Chromium only captures the top of a page (a scrolled page comes
# out blank), so everything before the figure is hidden but the headings leading to it.
_FOCUS = """
<script>
(function () {
  var node = document.querySelector("img.sphx-glr-single-img, img.sphx-glr-multi-img");
  while (node && !node.classList.contains("bd-article") && node !== document.body) {
    for (var sib = node.previousElementSibling; sib; sib = sib.previousElementSibling) {
      if (!/^H[1-6]$/.test(sib.tagName)) { sib.style.display = "none"; }
    }
    node = node.parentElement;
  }
})();
</script>
"""
_RESULT = re.compile(
    r'<script type="application/json" id="docs-check-result">(.*?)</script>', re.DOTALL
)


def find_chromium() -> str | None:
    """The Chromium binary to use: ``$CHROMIUM``, else ``chromium`` or ``chromium-browser``."""
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def missing_summary_lines(text: str) -> list[str]:
    """Says, for each summary label, why no line of ``text`` shows it with a well-formed value.

    Returns an empty list when every label is there.
    """
    problems = []
    for label, (shape, value) in SUMMARY_LINES.items():
        line_start = rf"^[ \t]*{re.escape(label)}[ \t]*:"
        if re.search(line_start + rf"[ \t]*{value}(?:[ \t].*)?$", text, re.MULTILINE):
            continue
        found = re.search(line_start + r".*$", text, re.MULTILINE)
        if found:
            problems.append(
                f"summary line {label!r} is there but its value does not read as {shape!r}: "
                f"{found.group(0).strip()!r}"
            )
        else:
            problems.append(f"no summary line {label!r} (expected '{label} : {shape}')")
    return problems


def summary_lines(text: str) -> list[str]:
    """The lines of ``text`` that carry one of the summary labels, as shown on the page."""
    labels = "|".join(re.escape(label) for label in [*SUMMARY_LINES, "time"])
    return [m.group(0).strip() for m in re.finditer(rf"^[ \t]*(?:{labels})[ \t]*:.*$", text, re.M)]


def missing_figure(images: list[dict], stem: str) -> list[str]:
    """Says why none of the page's ``images`` is a loaded, visible gallery figure of ``stem``."""
    pattern = re.compile(rf"(^|/)sphx_glr_{re.escape(stem)}_\d+\.png$")
    figures = [img for img in images if pattern.search(img["src"])]
    if not figures:
        seen = ", ".join(sorted({img["src"] for img in images})) or "none"
        return [
            f"no <img> of the gallery's figure (sphx_glr_{stem}_NNN.png) on the page; images "
            f"seen: {seen}. Was the tutorial executed (a build with -D plot_gallery=0 has none)?"
        ]
    if any(img["complete"] and img["width"] > 0 and img["shown"] for img in figures):
        return []
    return [
        f"figure <img src={img['src']!r}> did not load or is not shown "
        f"(complete={img['complete']}, natural size {img['width']}x{img['height']})"
        for img in figures
    ]


def _chromium(browser: str, url: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="docs-check-") as profile:
        command = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            # No network: CDN scripts and fonts fail at once instead of waiting on a time-out.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={profile}",
            "--window-size=1280,1600",
            "--virtual-time-budget=10000",
            *args,
            url,
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=180)


def render(page: Path, browser: str, screenshot: Path | None) -> dict:
    """Loads ``page`` in headless Chromium; returns its images and its rendered text."""
    # The probe goes into a copy beside the page, so that relative links (images, CSS) resolve.
    probe = page.with_name(f".docs-check-{page.name}")
    html = page.read_text(encoding="utf-8")
    try:
        probe.write_text(html.replace("</body>", _PROBE + "</body>", 1), encoding="utf-8")
        done = _chromium(browser, probe.as_uri(), "--dump-dom")
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            probe.write_text(html.replace("</body>", _FOCUS + "</body>", 1), encoding="utf-8")
            _chromium(browser, probe.as_uri(), f"--screenshot={screenshot}")
    finally:
        probe.unlink(missing_ok=True)
    found = _RESULT.search(done.stdout)
    if found is None:
        raise RuntimeError(
            f"Chromium did not report on {page} (exit {done.returncode}); its stderr ends with:\n"
            + "\n".join(done.stderr.strip().splitlines()[-10:])
        )
    return json.loads(found.group(1))


def check(page: Path, screenshot: Path | None = DEFAULT_SCREENSHOT) -> int:
    """Runs the check on ``page`` and prints the outcome; returns the exit status."""
    if not page.is_file():
        print(f"docs-check: {page} does not exist; build the docs first (make docs).")
        return 2
    browser = find_chromium()
    if browser is None:
        print(
            "docs-check: no Chromium found (tried $CHROMIUM, chromium, chromium-browser). "
            "Install it (Debian: apt-get install chromium) or set CHROMIUM=/path/to/chrome."
        )
        return 2
    try:
        seen = render(page, browser, screenshot)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        print(f"docs-check: {err}")
        return 2
    text = seen["text"]
    stem = page.stem
    problems = missing_figure(seen["images"], stem) + missing_summary_lines(text)
    if TIMING not in text:
        problems.append(f"no gallery timing ({TIMING!r}) on the page")

    print(f"docs-check: {page}")
    for line in summary_lines(text):
        print(f"  on the page: {line}")
    if screenshot is not None and screenshot.is_file():
        print(f"  screenshot : {screenshot}")
    if problems:
        print(f"docs-check FAILED, {len(problems)} missing:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print("docs-check passed: figure loaded, summary lines and timing on the page.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", nargs="?", type=Path, default=DEFAULT_PAGE)
    parser.add_argument("--screenshot", type=Path, default=DEFAULT_SCREENSHOT)
    args = parser.parse_args(argv)
    return check(args.page.resolve(), args.screenshot.resolve())


if __name__ == "__main__":
    sys.exit(main())
