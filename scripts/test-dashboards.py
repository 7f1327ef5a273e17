#!/usr/bin/env python3
"""Checks dashboards/*.json against promtool and the metrics omen exports.

Python standard library only, plus `promtool` (Debian package `prometheus`:
apt-get install -y prometheus). Run from anywhere:  python3 scripts/test-dashboards.py

For every dashboard:
  - JSON loads; uid set and unique; schemaVersion >= 36; a template variable
    `datasource` of type datasource/prometheus; every panel, target and
    annotation uses the `${datasource}` data source; unique panel ids; gridPos.
  - Every PromQL expression (panel targets, annotations, `label_values(...)`
    variable queries) gets its Grafana variables substituted ($__rate_interval,
    $__interval, $__range, dashboard variables, ...); an unknown variable is an
    error. All expressions are written as recording rules to a temporary file
    and parsed by `promtool check rules`.
  - Every metric name referenced is one omen exports (the list below; _bucket,
    _sum and _count for histograms), ALERTS / ALERTS_FOR_STATE, or a recording
    rule defined in alerting-rules/omen-rules.yml.
Also: dashboards/provisioning/dashboards.yml is a file provider, and every
panel named in docs/runbook.md (as *Panel title*) exists.

Before the real check a self-test feeds a deliberately broken dashboard
through the same checks and fails if any defect goes unnoticed.
Exit 0 when all checks pass, 1 otherwise; a summary line "N passed, M failed".
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASH_DIR = os.path.join(ROOT, "dashboards")
RULES = os.path.join(ROOT, "alerting-rules", "omen-rules.yml")
PROVIDER = os.path.join(DASH_DIR, "provisioning", "dashboards.yml")
RUNBOOK = os.path.join(ROOT, "docs", "runbook.md")
MIN_SCHEMA = 36

GAUGES = [
    "omen_tle_bits", "omen_rci", "omen_rci_bleu", "omen_rci_bertscore_f1", "omen_rci_repetition_ratio",
    "omen_kv_fragmentation", "omen_kvcache_usage_ratio", "omen_gpu_memory_used_bytes", "omen_gpu_memory_total_bytes",
    "omen_anomaly_score", "omen_anomaly_risk", "omen_lstm_ae_score", "omen_health_score", "omen_forecast_time_to_breach_seconds",
    "omen_forecast_time_to_breach_upper_seconds", "omen_source_up", "omen_build_info",
]
HISTOGRAMS = ["omen_ttft_seconds", "omen_tpot_seconds", "omen_e2e_seconds"]
BUILTIN_SERIES = ["ALERTS", "ALERTS_FOR_STATE"]

# Grafana's global variables, replaced by values valid where they appear.
GLOBAL_VARS = {
    "__rate_interval": "1m", "__interval": "30s", "__interval_ms": "30000", "__range": "1h",
    "__range_s": "3600", "__range_ms": "3600000", "__from": "1700000000000", "__to": "1700003600000",
    "__dashboard": "omen", "__org": "1", "__user": "admin",
}
PROMQL_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2",
}


def recording_rule_names(path):
    with open(path) as f:
        return set(re.findall(r"^\s*-\s*record:\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*$", f.read(), re.M))


def known_metric_names():
    names = set(GAUGES) | set(BUILTIN_SERIES)
    for h in HISTOGRAMS:
        names |= {h + "_bucket", h + "_sum", h + "_count"}
    names |= recording_rule_names(RULES)
    return names


VAR_RE = re.compile(r"\$\{([A-Za-z0-9_]+)(?::[A-Za-z0-9_]+)?\}|\$([A-Za-z0-9_]+)|\[\[([A-Za-z0-9_]+)(?::[A-Za-z0-9_]+)?\]\]")


def substitute(expr, variables):
    """Replace Grafana variables; returns (expr, [unknown variable names])."""
    unknown = []

    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in GLOBAL_VARS:
            return GLOBAL_VARS[name]
        if name in variables:
            return variables[name]
        unknown.append(name)
        return m.group(0)

    return VAR_RE.sub(repl, expr), unknown


def metric_names(expr):
    """Metric names referenced by a PromQL expression (a tokenizer, not a parser:
    strings, label matchers, ranges and grouping clauses are removed first;
    identifiers followed by '(' are functions or aggregations)."""
    s = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^{}]*\}", " {} ", s)
    s = re.sub(r"\[[^\[\]]*\]", " [] ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", s)
    out = []
    for m in re.finditer(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)", s):
        tok = m.group(1)
        if re.match(r"\s*\(", s[m.end():]) or tok.lower() in PROMQL_KEYWORDS:
            continue
        out.append(tok)
    return out


def variable_values(dash):
    """A valid value for each dashboard variable."""
    values = {}
    for v in dash.get("templating", {}).get("list", []):
        name, vtype = v.get("name"), v.get("type")
        if vtype == "datasource":
            values[name] = "prometheus"
        elif vtype in ("interval",):
            values[name] = (v.get("query") or "5m").split(",")[0].strip() or "5m"
        elif vtype in ("custom", "constant", "textbox"):
            values[name] = (str(v.get("query") or "x")).split(",")[0].strip() or "x"
        else:  # query: a label value; used in =~ matchers it must be a valid regex
            values[name] = "omen-value"
    return values


def is_ds_var(ds):
    return isinstance(ds, dict) and ds.get("uid") in ("${datasource}", "$datasource")


def panels_of(dash):
    for p in dash.get("panels", []):
        yield p
        for sub in p.get("panels", []) or []:
            yield sub


def check_dashboard(name, dash, known, seen_uids):
    """Returns (errors, [(where, raw_expr, substituted_expr)])."""
    errs = []
    exprs = []
    uid = dash.get("uid")
    if not uid:
        errs.append(f"{name}: uid not set")
    elif uid in seen_uids:
        errs.append(f"{name}: uid {uid!r} also used by {seen_uids[uid]}")
    else:
        seen_uids[uid] = name
    if not dash.get("title"):
        errs.append(f"{name}: no title")
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < MIN_SCHEMA:
        errs.append(f"{name}: schemaVersion {dash.get('schemaVersion')!r} < {MIN_SCHEMA}")
    if dash.get("id") is not None:
        errs.append(f"{name}: id must be null for provisioning")
    tvars = dash.get("templating", {}).get("list", [])
    dsvars = [v for v in tvars if v.get("name") == "datasource"]
    if not dsvars or dsvars[0].get("type") != "datasource" or dsvars[0].get("query") != "prometheus":
        errs.append(f"{name}: needs a template variable 'datasource' of type datasource with query 'prometheus'")
    values = variable_values(dash)

    def add_expr(where, raw):
        sub, unknown = substitute(raw, values)
        for u in unknown:
            errs.append(f"{where}: undefined variable ${u} in {raw!r}")
        exprs.append((where, raw, sub))
        for m in metric_names(sub):
            if m not in known:
                errs.append(f"{where}: metric {m!r} is not exported by omen nor a recording rule ({raw!r})")

    for v in tvars:
        if v.get("type") != "query":
            continue
        where = f"{name}: variable ${v.get('name')}"
        if not is_ds_var(v.get("datasource")):
            errs.append(f"{where}: datasource must be ${{datasource}}")
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", q or "")
        if not m:
            errs.append(f"{where}: query {q!r} is not label_values(<selector>, <label>)")
            continue
        add_expr(where, m.group(1))

    for a in dash.get("annotations", {}).get("list", []):
        if a.get("builtIn"):
            continue
        where = f"{name}: annotation {a.get('name')!r}"
        if not is_ds_var(a.get("datasource")):
            errs.append(f"{where}: datasource must be ${{datasource}}")
        if a.get("expr"):
            add_expr(where, a["expr"])
        else:
            errs.append(f"{where}: no expr")

    ids = set()
    npanels = 0
    for p in panels_of(dash):
        where = f"{name}: panel {p.get('id')} {p.get('title')!r}"
        if p.get("id") in ids:
            errs.append(f"{where}: duplicate panel id")
        ids.add(p.get("id"))
        gp = p.get("gridPos") or {}
        if not all(isinstance(gp.get(k), int) for k in ("h", "w", "x", "y")) or gp.get("x", 0) + gp.get("w", 0) > 24:
            errs.append(f"{where}: bad gridPos {gp}")
        if p.get("type") == "row":
            continue
        npanels += 1
        if not p.get("title"):
            errs.append(f"{where}: no title")
        if not is_ds_var(p.get("datasource")):
            errs.append(f"{where}: datasource must be {{type: prometheus, uid: ${{datasource}}}}, got {p.get('datasource')}")
        targets = p.get("targets") or []
        if not targets:
            errs.append(f"{where}: no targets")
        refs = set()
        for t in targets:
            tw = f"{where} target {t.get('refId')}"
            if t.get("refId") in refs:
                errs.append(f"{tw}: duplicate refId")
            refs.add(t.get("refId"))
            if "datasource" in t and not is_ds_var(t["datasource"]):
                errs.append(f"{tw}: datasource must be ${{datasource}}")
            if not (t.get("expr") or "").strip():
                errs.append(f"{tw}: empty expr")
                continue
            add_expr(tw, t["expr"])
    if npanels == 0:
        errs.append(f"{name}: no panels")
    return errs, exprs


def promtool_parse(exprs, tmpdir):
    """Parse expressions with `promtool check rules`; returns a list of errors."""
    if not exprs:
        return []

    def run(batch):
        doc = {"groups": [{"name": f"expr-{i}", "rules": [{"record": f"dashboard:expr_{i}", "expr": e}]}
                          for i, (_, _, e) in batch]}
        path = os.path.join(tmpdir, "dashboard-exprs.yml")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)  # JSON is YAML
        r = subprocess.run(["promtool", "check", "rules", path], capture_output=True, text=True)
        return r.returncode, (r.stdout + r.stderr).strip()

    indexed = list(enumerate(exprs))
    rc, out = run([(i, x) for i, x in indexed])
    if rc == 0:
        return []
    errs = []
    for i, x in indexed:  # find the culprits one by one
        rc1, out1 = run([(i, x)])
        if rc1 != 0:
            errs.append(f"promtool cannot parse {x[2]!r} ({x[0]}):\n    " + out1.replace("\n", "\n    "))
    return errs or [f"promtool check rules failed:\n{out}"]


def check_provider(path):
    if not os.path.exists(path):
        return [f"{path}: missing"]
    with open(path) as f:
        text = f.read()
    errs = []
    for pat, what in ((r"^apiVersion:\s*1\s*$", "apiVersion: 1"), (r"^providers:\s*$", "providers:"),
                      (r"^\s*-?\s*name:\s*\S+", "a provider name"), (r"^\s*type:\s*file\s*$", "type: file"),
                      (r"^\s*path:\s*/\S+", "options.path (absolute)")):
        if not re.search(pat, text, re.M):
            errs.append(f"{path}: no {what}")
    return errs


def check_runbook_panels(path, titles):
    if not os.path.exists(path):
        return [f"{path}: missing"]
    with open(path) as f:
        text = re.sub(r"\s*\n\s*", " ", f.read())
    text = re.sub(r"`[^`]*`", "", text)
    named = re.findall(r"(?<![*\w])\*(?!\*)([^*]+?)(?<!\*)\*(?![*\w])", text)
    return [f"{path}: panel *{n}* is not a panel title of any dashboard" for n in sorted(set(named)) if n not in titles]


def run_checks(dash_files, tmpdir):
    known = known_metric_names()
    errs, exprs, seen, titles = [], [], {}, set()
    for path in dash_files:
        name = os.path.relpath(path, ROOT)
        try:
            with open(path) as f:
                dash = json.load(f)
        except (OSError, ValueError) as e:
            errs.append(f"{name}: cannot load JSON: {e}")
            continue
        e, x = check_dashboard(name, dash, known, seen)
        errs += e
        exprs += x
        titles |= {p.get("title") for p in panels_of(dash)}
    errs += promtool_parse(exprs, tmpdir)
    return errs, exprs, titles


BROKEN = {
    "uid": "omen-selftest", "title": "broken", "schemaVersion": 39, "id": None,
    "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
    "panels": [
        {"id": 1, "type": "timeseries", "title": "syntax", "gridPos": {"h": 1, "w": 1, "x": 0, "y": 0},
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "targets": [{"refId": "A", "expr": "sum(rate(omen_ttft_seconds_bucket[$__rate_interval])"}]},
        {"id": 2, "type": "timeseries", "title": "unknown metric", "gridPos": {"h": 1, "w": 1, "x": 1, "y": 0},
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "targets": [{"refId": "A", "expr": "max by (layer) (omen_kv_fragments{job=\"omen\"})"}]},
        {"id": 3, "type": "timeseries", "title": "undefined var", "gridPos": {"h": 1, "w": 1, "x": 2, "y": 0},
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "targets": [{"refId": "A", "expr": "omen_health_score{instance=~\"$nosuchvar\"}"}]},
        {"id": 4, "type": "stat", "title": "fixed datasource", "gridPos": {"h": 1, "w": 1, "x": 3, "y": 0},
         "datasource": {"type": "prometheus", "uid": "P1234"},
         "targets": [{"refId": "A", "expr": "omen_health_score"}]},
    ],
}
BROKEN_EXPECT = ["promtool cannot parse", "'omen_kv_fragments' is not exported", "undefined variable $nosuchvar",
                 "panel 4 'fixed datasource': datasource must be"]


def main():
    if shutil.which("promtool") is None:
        print("promtool not found: apt-get install -y prometheus", file=sys.stderr)
        return 2
    passed, failed = 0, 0

    def report(ok, label, details=()):
        nonlocal passed, failed
        if ok:
            passed += 1
            print(f"ok   {label}")
        else:
            failed += 1
            print(f"FAIL {label}")
            for d in details:
                print("     " + d.replace("\n", "\n     "))

    with tempfile.TemporaryDirectory() as tmp:
        # Self-test: each planted defect must be reported.
        bad = os.path.join(tmp, "broken.json")
        with open(bad, "w") as f:
            json.dump(BROKEN, f)
        errs, _, _ = run_checks([bad], tmp)
        missing = [e for e in BROKEN_EXPECT if not any(e in x for x in errs)]
        report(not missing, "self-test: planted defects are detected",
               [f"not detected: {m}" for m in missing] + errs)
        toks = metric_names('sum by (le) (rate(a_b:c{x="y{z}"}[5m] offset 1d)) / on (i) group_left (j) b + 1e-9 * count(c) > bool 2')
        report(toks == ["a_b:c", "b", "c"], "self-test: metric-name tokenizer", [f"got {toks}"])

        files = sorted(os.path.join(DASH_DIR, f) for f in os.listdir(DASH_DIR) if f.endswith(".json"))
        for need in ("omen-overview.json", "omen-signals.json"):
            report(os.path.join(DASH_DIR, need) in files, f"dashboards/{need} exists")
        errs, exprs, titles = run_checks(files, tmp)
        report(len(exprs) > 0, f"{len(exprs)} expressions found in {len(files)} dashboards")
        for path in files:
            rel = os.path.relpath(path, ROOT)
            mine = [e for e in errs if e.startswith(rel + ":")]
            report(not mine, f"{rel}: structure, variables, metric names", mine)
        others = [e for e in errs if not any(e.startswith(os.path.relpath(p, ROOT) + ":") for p in files)]
        parse_errs = [e for e in errs if "promtool cannot parse" in e or "promtool check rules failed" in e]
        report(not parse_errs, "promtool check rules parses every expression", parse_errs)
        rest = [e for e in others if e not in parse_errs]
        report(not rest, "no other errors", rest)
        perr = check_provider(PROVIDER)
        report(not perr, "dashboards/provisioning/dashboards.yml is a file provider", perr)
        rerr = check_runbook_panels(RUNBOOK, titles)
        report(not rerr, "panels named in docs/runbook.md exist", rerr)
    print()
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
