"""The HTML report (issue 39): a run's and a sweep's report.html, opened in a real browser
(Debian's Chromium, headless, driven over the DevTools protocol), and the run's closing
table.

The browser tests are skipped where Chromium is absent, except under CI=true (.ci/run
installs it), where its absence fails them.

``python tests/test_report.py RUN_DIR SWEEP_DIR OUT_DIR`` writes full-page screenshots of
both reports (docs/report_run.png, docs/report_sweep.png)."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from secagg.cli import main

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"))
                 if p), None)


def _need_chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but no chromium: .ci/run installs Debian's chromium")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return CHROMIUM


# -- a small DevTools-protocol client (websockets is a dependency of the installed stack) --

class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, binary: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="secagg-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--metrics-recording-only", "--disable-default-apps",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             "--window-size=1280,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or len(port_file.read_text().splitlines()) < 2:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port = port_file.read_text().splitlines()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        self.ws_url = pages[0]["webSocketDebuggerUrl"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def open(self, path: Path, script: str, screenshot: Path | None = None) -> dict:
        """Load ``path`` (file://), wait for its load event, evaluate ``script`` (an
        expression giving a JSON-able value); return that value with the console errors,
        exceptions, log errors and every network request seen."""
        return asyncio.run(self._open(path.resolve().as_uri(), script, screenshot))

    async def _open(self, url: str, script: str, screenshot: Path | None) -> dict:
        import websockets

        events: list[dict] = []
        async with websockets.connect(self.ws_url, max_size=2 ** 28) as ws:
            ids = iter(range(1, 1 << 30))
            pending: dict[int, asyncio.Future] = {}
            loaded = asyncio.Event()

            async def reader() -> None:
                async for raw in ws:
                    msg = json.loads(raw)
                    if "id" in msg and msg["id"] in pending:
                        pending.pop(msg["id"]).set_result(msg)
                    else:
                        events.append(msg)
                        if msg.get("method") == "Page.loadEventFired":
                            loaded.set()

            task = asyncio.create_task(reader())

            async def call(method: str, **params) -> dict:
                i = next(ids)
                fut = asyncio.get_running_loop().create_future()
                pending[i] = fut
                await ws.send(json.dumps({"id": i, "method": method, "params": params}))
                msg = await asyncio.wait_for(fut, 60)
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

            for domain in ("Page", "Runtime", "Log", "Network"):
                await call(f"{domain}.enable")
            await call("Page.navigate", url=url)
            await asyncio.wait_for(loaded.wait(), 60)
            await asyncio.sleep(0.3)  # late console messages and requests
            value = await call("Runtime.evaluate", expression=script, returnByValue=True)
            if screenshot is not None:
                size = await call("Runtime.evaluate", returnByValue=True, expression=(
                    "[document.documentElement.scrollWidth,"
                    " document.documentElement.scrollHeight]"))
                w, h = size["result"]["value"]
                await call("Emulation.setDeviceMetricsOverride", width=w, height=h,
                           deviceScaleFactor=1, mobile=False)
                shot = await call("Page.captureScreenshot", format="png",
                                  captureBeyondViewport=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            task.cancel()
        out = value["result"].get("value")
        return {
            "value": out,
            "requests": [e["params"]["request"]["url"] for e in events
                         if e.get("method") == "Network.requestWillBeSent"],
            "console_errors": [e["params"] for e in events
                               if e.get("method") == "Runtime.consoleAPICalled"
                               and e["params"].get("type") in ("error", "assert")],
            "exceptions": [e["params"] for e in events
                           if e.get("method") == "Runtime.exceptionThrown"],
            "log_errors": [e["params"]["entry"] for e in events
                           if e.get("method") == "Log.entryAdded"
                           and e["params"]["entry"].get("level") == "error"],
        }


#: What the page shows, read in the browser: the size of every figure as rendered, every
#: number tagged with its result.json path, and whether any script is on the page.
PAGE_SCRIPT = """JSON.stringify({
  figures: [...document.querySelectorAll('figure')].map(f => {
    const s = f.querySelector('svg'); const r = s ? s.getBoundingClientRect() : null;
    return {id: f.id, width: r ? r.width : 0, height: r ? r.height : 0,
            shapes: s ? s.querySelectorAll('path, use').length : 0};
  }),
  numbers: [...document.querySelectorAll('[data-key]')].map(e => ({
    key: e.dataset.key, cell: e.dataset.cell || null, text: e.innerText})),
  banners: [...document.querySelectorAll('.banner.fail')].map(e => ({
    text: e.innerText, top: e.getBoundingClientRect().top})),
  firstHeading: document.querySelector('h2').getBoundingClientRect().top,
  scripts: document.querySelectorAll('script').length,
  title: document.title,
  text: document.body.innerText,
})"""


def _shown_value(text: str) -> tuple[float, float]:
    """A number as the page prints it (1,234 / 0.9269 / 1.641) and half its last digit."""
    t = text.strip().replace(",", "")
    decimals = len(t.split(".")[1]) if "." in t and "e" not in t.lower() else 0
    if "e" in t.lower():
        mant = t.lower().split("e")[0]
        decimals = len(mant.split(".")[1]) if "." in mant else 0
        return float(t), 0.5 * 10 ** (-decimals) * 10 ** math.floor(math.log10(abs(float(t))))
    return float(t), 0.5 * 10 ** (-decimals)


def _lookup(doc: dict, key: str):
    cur = doc
    for part in key.split("."):
        cur = cur[part]
    return cur


def _check_page(got: dict, n_figures: int) -> dict:
    assert not got["console_errors"], got["console_errors"]
    assert not got["exceptions"], got["exceptions"]
    assert not got["log_errors"], got["log_errors"]
    page = json.loads(got["value"])
    assert page["scripts"] == 0
    figures = page["figures"]
    assert len(figures) >= n_figures, figures
    for f in figures:  # rendered, at a size a person reads
        assert f["width"] >= 300 and f["height"] >= 150 and f["shapes"] > 10, f
    return page


# -- fixtures: a real run (two layers) and a real sweep, made once ---------------------------

@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser (skips, or fails under CI=true, before the runs are made)."""
    return _need_chromium()


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    """Two runs of the README's command, as `secagg run` writes them: plaintext and
    distributed DP (3 clients, 1 round, digits)."""
    base = tmp_path_factory.mktemp("runs")
    out = {}
    for layer, extra in (("plaintext", []), ("distributed-dp", ["--epsilon", "2"])):
        d = base / layer
        assert main(["run", "--layer", layer, *extra, "--clients", "3", "--rounds", "1",
                     "--quiet", "--out", str(d)]) == 0
        out[layer] = d
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """A small real sweep (one algorithm, plaintext and central DP at two epsilons), in
    process."""
    from secagg.sweep import sweep

    out = tmp_path_factory.mktemp("sweep")
    spec = {"sweep": {"rounds": 1, "workers": 0},
            "data": {"clients": 3, "train_limit": 300},
            "algorithm": {"fedlog": {"local_epochs": 1, "feature_norm": 8.0}},
            "grid": {"algorithms": ["fedlog"], "layers": ["plaintext", "central-dp"],
                     "epsilon": [1.0, 16.0], "seeds": [0]}}
    res = sweep(spec, out=out, progress=False)
    assert res.report == out / "report.html"
    return out


# -- the reports, in the browser --------------------------------------------------------------

def test_run_report_in_a_real_browser(chromium, run_dirs):
    """Loads without console error, makes no request but the file itself, renders its
    figures at a readable size, and every number tagged from result.json equals it."""
    browser = Browser(chromium)
    try:
        for layer, d in run_dirs.items():
            report = d / "report.html"
            assert report.exists()
            got = browser.open(report, PAGE_SCRIPT)
            assert got["requests"] == [report.resolve().as_uri()], got["requests"]
            page = _check_page(got, 1)
            result = json.loads((d / "result.json").read_text())
            keys = {n["key"] for n in page["numbers"]}
            assert {"accuracy", "best_accuracy", "n_clients", "rounds",
                    "costs.up.wire_bytes", "costs.down.wire_bytes",
                    "device.energy_j"} <= keys, keys
            for n in page["numbers"]:
                shown, tol = _shown_value(n["text"])
                want = float(_lookup(result, n["key"]))
                assert abs(shown - want) <= tol * 1.000001 + 1e-12, (n, want)
            text = page["text"]
            assert "digits, 3 clients, Dirichlet label-skew split (alpha 0.5)" in text
            assert "secagg run " in text
            assert f"--layer {layer}" in text or layer == "plaintext"
            assert "accuracy (mean local test)" in text.lower() or \
                "accuracy (global test)" in text.lower()
            assert "Attestation verified" in text and not page["banners"]
            if layer == "plaintext":
                assert "DP: none." in text
            else:
                assert "privacy.epsilon" in keys
                assert "every one of the 3 clients" in text  # equal epsilons: no histogram
                assert not any(f["id"] == "fig-client-eps" for f in page["figures"])
                assert "noise against signal per release" in text
                assert re.search(r"signal / noise", text)
    finally:
        browser.close()


def test_a_tampered_transcript_is_reported_at_the_top_in_words(run_dirs, tmp_path):
    """A server that rewrites one client's upload record after the run: the report opens
    with the audit's failure, above every section."""
    d = tmp_path / "tampered"
    src = run_dirs["distributed-dp"]
    shutil.copytree(src, d)
    shutil.copytree(src.parent / f"{src.name}.keys", tmp_path / "tampered.keys")  # its keys
    lines = (d / "transcript.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec.get("type") == "message" and rec.get("digest") and rec.get("direction") == "up":
            rec["digest"] = "00" * 32  # the server claims the client sent something else
            lines[i] = json.dumps(rec)
            break
    else:
        pytest.fail("no upload record to tamper with")
    (d / "transcript.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(d)]) == 0
    html = (d / "report.html").read_text()
    first_section = html.index('<h2 id="ran">')
    banner = html.index("The audit FAILED")
    assert banner < first_section
    assert "Attestation FAILED" in html
    # unchecked (as secagg run leaves a run of more than 1,000 clients): the page claims no
    # verification it did not do
    from secagg.report import write_report

    unchecked = write_report(d, out=tmp_path / "unchecked.html", verify=False).read_text()
    assert "Attestation NOT CHECKED" in unchecked and "Attestation verified" not in unchecked
    if CHROMIUM is None and os.environ.get("CI", "").lower() != "true":
        return
    browser = Browser(_need_chromium())
    try:
        page = _check_page(browser.open(d / "report.html", PAGE_SCRIPT), 1)
    finally:
        browser.close()
    assert page["banners"] and page["banners"][0]["top"] < page["firstHeading"]
    assert "The audit FAILED" in page["banners"][0]["text"]


def test_sweep_report_in_a_real_browser(chromium, sweep_dir):
    """The sweep report: both figures render, no request, and every accuracy in the
    table equals its row of results.jsonl."""
    browser = Browser(chromium)
    try:
        report = sweep_dir / "report.html"
        got = browser.open(report, PAGE_SCRIPT)
    finally:
        browser.close()
    assert got["requests"] == [report.resolve().as_uri()], got["requests"]
    page = _check_page(got, 2)
    assert {"fig-privacy-utility", "fig-cost-utility"} <= {f["id"] for f in page["figures"]}
    rows = {json.loads(x)["id"]: json.loads(x)
            for x in (sweep_dir / "results.jsonl").read_text().splitlines()}
    shown = [n for n in page["numbers"] if n["key"] == "accuracy"]
    assert len(shown) == len(rows) == 3  # plaintext + central DP at 2 epsilons
    for n in shown:
        value, tol = _shown_value(n["text"])
        assert abs(value - rows[n["cell"]]["accuracy"]) <= tol * 1.000001
    assert "secagg sweep" in page["title"]


# -- without a browser ------------------------------------------------------------------------

def test_report_is_self_contained(run_dirs, sweep_dir):
    """No script, no external reference of any kind, and a policy that forbids fetching."""
    for path in (run_dirs["plaintext"] / "report.html", sweep_dir / "report.html"):
        html = path.read_text()
        assert "<script" not in html.lower()
        assert "Content-Security-Policy" in html and "default-src 'none'" in html
        for ref in re.findall(r'(?:href|src)="([^"]*)"', html):
            assert ref.startswith("#") or ref.endswith("report.html") and "://" not in ref, ref
        assert "<svg" in html


def test_closing_table_says_what_ran_and_has_a_privacy_row(run_dirs, capsys):
    """The run's table names the algorithm, layer, data set, clients and split, says how
    the best round was picked, and has a DP row for a run without DP."""
    d = run_dirs["plaintext"]
    assert main(["run", "--layer", "plaintext", "--clients", "3", "--rounds", "1", "--quiet",
                 "--split", "iid", "--out", str(d / "again")]) == 0
    table = capsys.readouterr().out
    lines = {ln.split("  ")[0].strip(): ln for ln in table.splitlines() if ln.strip()}
    assert "fedlog under plaintext on digits, 3 clients, IID split, 1 round(s), seed 0" in \
        lines["ran"]
    assert "picked on test data" in table and "optimistic" in table
    assert lines["DP"].split("  ", 1)[1].strip().startswith("none")


def test_report_of_a_10000_client_run_takes_under_10_seconds(tmp_path):
    """A synthetic result of 10,000 clients with differing epsilons and a costs.csv of
    10,000 clients x 2 rounds (no transcript): the report is written in well under 10 s of
    CPU time."""
    import random

    rng = random.Random(0)
    n = 10_000
    clients = {str(i): {"epsilon": {"release": 1 + rng.random(), "server": 2 + rng.random()},
                        "participations": 1, "eligible_rounds": 2, "refusals": 0,
                        "status": "active"} for i in range(n)}
    result = {"algorithm": {"name": "fedavg"}, "layer": {"name": "central-dp"}, "rounds": 2,
              "planned_rounds": 2, "seed": 0, "n_clients": n, "accuracy": 0.8,
              "accuracy_kind": "global test", "best_accuracy": 0.81, "best_round": 0,
              "history": [0.81, 0.8], "failure": None, "wall_s": 1.0, "client_rounds": 2 * n,
              "costs": {"up": {"messages": 2 * n, "wire_bytes": 1e9, "plaintext_bytes": 1e9,
                               "client_cpu_s": 1.0, "server_cpu_s": 1.0}},
              "device": {"profile": "phone-wifi", "latency_s": 1.0, "energy_j": 2.0,
                         "compute_s": 0.5, "radio_s": 0.5, "flops": 1e9},
              "privacy": {"epsilon": 3.0, "delta": 1e-5, "private": True, "clients": clients}}
    (tmp_path / "result.json").write_text(json.dumps(result))
    head = ("round,phase,stage,sender,receiver,direction,fields,plaintext_bytes,wire_bytes,"
            "flops,step_flops,client_cpu_s,server_cpu_s,device_compute_s,device_radio_s,"
            "device_latency_s,device_energy_j\n")
    (tmp_path / "costs.csv").write_text(head + "".join(
        f"{r},train,upload,{c},server,up,{{}},50000,50000,0,0,0.001,0,0.1,0.1,0.2,0.01\n"
        for r in range(2) for c in range(n)))
    from secagg.report import write_report

    t0, c0 = time.perf_counter(), time.process_time()
    path = write_report(tmp_path)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"report of a {n:,}-client run: {took:.2f} s wall, {cpu:.2f} s CPU")
    assert cpu < 10  # CPU time: the wall clock of a shared CI machine measures the others
    html = path.read_text()
    assert 'id="fig-client-eps"' in html and "10,000 clients" in html


if __name__ == "__main__":  # screenshots for docs/
    run, swp, out = (Path(a) for a in sys.argv[1:4])
    b = Browser(CHROMIUM or "chromium")
    try:
        b.open(run / "report.html", "1", screenshot=out / "report_run.png")
        b.open(swp / "report.html", "1", screenshot=out / "report_sweep.png")
    finally:
        b.close()


def test_threat_section_follows_the_costs_with_the_threat_audits_verdict(run_dirs, tmp_path):
    """``secagg report RUN --threat COALITION``: the coalition's views and verdict, as
    ``secagg audit --threat`` gives them, after the costs."""
    from secagg.transcript import Transcript
    from threat_models.audit import threat_audit

    d = run_dirs["distributed-dp"]
    transcript = Transcript.read(d / "transcript.jsonl")
    verdicts = set()
    for coalition in ("server", "server+2"):
        out = tmp_path / f"{coalition}.html"
        assert main(["report", str(d), "--threat", coalition, "--out", str(out)]) == 0
        html = out.read_text()
        assert html.index('<h2 id="costs">') < html.index('<h2 id="threat">')
        text, leaks = threat_audit(transcript, coalition)
        import html as h

        assert h.escape(text, quote=True) in html
        assert ("can read some field beyond" in html) == leaks
        verdicts.add(leaks)
    assert verdicts == {False, True}  # 2 of 3 clients with the server read the third's upload
