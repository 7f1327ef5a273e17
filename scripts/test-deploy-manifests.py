#!/usr/bin/env python3
"""Render deploy/base and deploy/overlays/plain-sidecar and validate them; run through scripts/test-deploy.sh.

Needs the venv made by test-deploy.sh's install line (kubernetes-validate,
PyYAML, dockerfile) and, for rendering, `kubectl` (its built-in kustomize).

1. Render. `kubectl kustomize deploy/base` is the renderer. The kustomization
   is also rendered by a small Python renderer limited to what deploy/ uses
   (resources, namespace, labels, images; the overlay's JSON patches move and
   remove); with kubectl present the
   two renders must agree object for object, without kubectl the Python render
   is what gets validated (and the run says so).
2. Schema. Every core object is validated with kubernetes-validate (the
   Kubernetes OpenAPI schemas shipped in its package, strict: unknown fields
   are errors) for each version in K8S_VERSIONS. The PodMonitor (a
   prometheus-operator CRD, not in those schemas) is validated against
   PODMONITOR_SCHEMA below: the subset of monitoring.coreos.com/v1 PodMonitor
   that deploy/base uses, with unknown fields rejected; the PrometheusRule
   likewise (PROMETHEUSRULE_SCHEMA), and both generated files (PrometheusRule,
   Grafana dashboards ConfigMap) must equal what scripts/gen-deploy-monitoring.py
   makes of alerting-rules/ and dashboards/.
3. Sidecar contract: the omen container is non-root (65532), has a read-only
   root filesystem, drops all capabilities, has requests and limits, a liveness
   probe on /healthz of its `metrics` port 9465 and no readiness or startup probe
   (its health never takes vLLM out of its Service), is a native sidecar
   (init container, restartPolicy Always) in the base and a plain container in
   the overlay, mounts an emptyDir with a size limit at
   /var/lib/omen and the config at /etc/omen; omen.yaml listens on
   127.0.0.1:9464 and 0.0.0.0:9465 and backfills history from an http://
   Prometheus (history.prometheus_url), so that no pod needs a volume of its own; vLLM runs vllm/vllm-openai with a GPU
   limit; the PodMonitor and Service select the pod and name existing ports.
4. deploy/Dockerfile, parsed with the `dockerfile` package (Docker's own Go
   parser): multi-stage, rust:1-bookworm builder running
   `cargo build --release ... -p omen-cli`, slim/distroless runtime,
   non-root USER, omen entrypoint.
Prints one line per check and "N passed, M failed"; exit 1 on any failure.
"""
import copy
import os
import re
import shutil
import subprocess
import sys

import dockerfile
import jsonschema
import kubernetes_validate
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(ROOT, "deploy", "base")
PLAIN = os.path.join(ROOT, "deploy", "overlays", "plain-sidecar")
# Each rendered kustomization: (folder, whether omen is a native sidecar there).
TARGETS = [(BASE, True), (PLAIN, False)]
DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")
K8S_VERSIONS = ["1.29.0", "1.37.0"]
OMEN_UID = 65532

DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
PODMONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {
            "type": "object", "required": ["name"], "additionalProperties": False,
            "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
                           "namespace": {"type": "string"}, "labels": STRMAP, "annotations": STRMAP},
        },
        "spec": {
            "type": "object", "required": ["selector", "podMetricsEndpoints"], "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {"any": {"type": "boolean"},
                                                     "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": STRMAP, "matchExpressions": {"type": "array"}}},
                "podMetricsEndpoints": {
                    "type": "array", "minItems": 1,
                    "items": {"type": "object", "additionalProperties": False,
                              "properties": {"port": {"type": "string", "minLength": 1},
                                             "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535},
                                             "path": {"type": "string", "pattern": "^/"},
                                             "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                                             "interval": {"type": "string", "pattern": DURATION},
                                             "scrapeTimeout": {"type": "string", "pattern": DURATION},
                                             "honorLabels": {"type": "boolean"},
                                             "relabelings": {"type": "array"},
                                             "metricRelabelings": {"type": "array"}}}},
            },
        },
    },
}

RULE = {
    "type": "object", "additionalProperties": False, "required": ["expr"],
    "properties": {"record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
                   "alert": {"type": "string", "minLength": 1}, "expr": {"type": "string", "minLength": 1},
                   "for": {"type": "string", "pattern": DURATION}, "keep_firing_for": {"type": "string", "pattern": DURATION},
                   "labels": STRMAP, "annotations": STRMAP},
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
}
PROMETHEUSRULE_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": PODMONITOR_SCHEMA["properties"]["metadata"],
        "spec": {"type": "object", "required": ["groups"], "additionalProperties": False,
                 "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                     "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                     "properties": {"name": {"type": "string", "minLength": 1},
                                    "interval": {"type": "string", "pattern": DURATION},
                                    "rules": {"type": "array", "minItems": 1, "items": RULE}}}}}},
    },
}
CRD_SCHEMAS = {"PodMonitor": PODMONITOR_SCHEMA, "PrometheusRule": PROMETHEUSRULE_SCHEMA}

passed = 0
failed = 0


def report(ok, label, details=()):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {label}")
    else:
        failed += 1
        print(f"FAIL {label}")
        for d in details:
            print("     " + str(d).replace("\n", "\n     "))
    return ok


# ------------------------------------------------------------------ render
def render_kubectl(folder):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return None, "kubectl not found"
    r = subprocess.run([kubectl, "kustomize", folder], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"kubectl kustomize failed ({r.returncode}):\n{r.stderr}"
    return [d for d in yaml.safe_load_all(r.stdout) if d], None


SUPPORTED_KEYS = {"apiVersion", "kind", "namespace", "labels", "resources", "images", "patches"}


def image_name(image):
    """registry/repo[:tag][@digest] -> registry/repo"""
    name = image.split("@", 1)[0]
    head, sep, tail = name.rpartition(":")
    return head if sep and "/" not in tail else name


def json_pointer(doc, pointer):
    """(parent, last key) of an RFC 6901 pointer; list indices as ints, '-' kept."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.lstrip("/").split("/")]
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    last = parts[-1]
    return doc, (last if not isinstance(doc, list) or last == "-" else int(last))


def apply_json6902(doc, ops):
    """The JSON patch operations the overlay uses: move, remove, add (RFC 6902)."""
    for op in ops:
        if op["op"] == "remove" or op["op"] == "move":
            parent, k2 = json_pointer(doc, op["from"] if op["op"] == "move" else op["path"])
            value = parent.pop(k2)
            if op["op"] == "remove":
                continue
        elif op["op"] == "add":
            value = op["value"]
        else:
            raise ValueError(f"python renderer does not support JSON patch op {op['op']!r}")
        parent, k2 = json_pointer(doc, op["path"])
        if isinstance(parent, list):
            parent.append(value) if k2 == "-" else parent.insert(k2, value)
        else:
            parent[k2] = value


def render_python(folder=BASE):
    """Kustomize subset: resources (files or a base folder), namespace, labels with
    includeSelectors (metadata labels everywhere; with selectors: Deployment selector + pod
    template, Service selector, as kustomize's built-in field specs do for these kinds),
    images, and patches with a target kind/name and a JSON 6902 patch."""
    with open(os.path.join(folder, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    extra = set(k) - SUPPORTED_KEYS
    if extra:
        raise ValueError(f"python renderer does not support kustomization keys {sorted(extra)}")
    objs = []
    for res in k.get("resources", []):
        path = os.path.join(folder, res)
        if os.path.isdir(path):
            objs += render_python(path)
            continue
        with open(path) as f:
            objs += [d for d in yaml.safe_load_all(f) if d]
    images = {i["name"]: i for i in k.get("images", []) or []}
    for patch in k.get("patches", []) or []:
        t = patch["target"]
        for o in objs:
            if o["kind"] == t.get("kind") and o["metadata"]["name"] == t.get("name"):
                apply_json6902(o, yaml.safe_load(patch["patch"]))
    for o in objs:
        md = o.setdefault("metadata", {})
        if k.get("namespace"):
            md["namespace"] = k["namespace"]
        for group in k.get("labels", []) or []:
            labels = group.get("pairs") or {}
            md.setdefault("labels", {}).update(labels)
            if not group.get("includeSelectors"):
                continue
            if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
                o["spec"].setdefault("selector", {}).setdefault("matchLabels", {}).update(labels)
                o["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {}).update(labels)
            elif o["kind"] == "Service":
                o["spec"].setdefault("selector", {}).update(labels)
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            spec = o["spec"]["template"]["spec"]
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                name = image_name(c["image"])
                if name in images:
                    img = images[name]
                    new = img.get("newName", name)
                    if "digest" in img:
                        c["image"] = f"{new}@{img['digest']}"
                    elif "newTag" in img:
                        c["image"] = f"{new}:{img['newTag']}"
                    else:
                        c["image"] = new
    return objs


def key(o):
    return (o.get("kind"), o.get("metadata", {}).get("namespace"), o.get("metadata", {}).get("name"))


def diff(a, b, path=""):
    """First differences between two YAML values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k2 in sorted(set(a) | set(b), key=str):
            if k2 not in a or k2 not in b:
                out.append(f"{path}/{k2}: only in {'kubectl' if k2 in a else 'python'} render")
            else:
                out += diff(a[k2], b[k2], f"{path}/{k2}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: kubectl {a!r} != python {b!r}"]


# ------------------------------------------------------------------ checks
def by_kind(objs, kind):
    return [o for o in objs if o.get("kind") == kind]


def container(pod_spec, name):
    for c in pod_spec.get("containers", []) + pod_spec.get("initContainers", []):
        if c.get("name") == name:
            return c
    return None


def port_names(pod_spec):
    every = pod_spec.get("containers", []) + pod_spec.get("initContainers", [])
    return {p.get("name"): p.get("containerPort") for c in every for p in c.get("ports", [])}


def probe_problems(c, kind, path, port_name):
    p = c.get(kind) or {}
    g = p.get("httpGet") or {}
    if g.get("path") != path or g.get("port") != port_name:
        return [f"{kind} must be httpGet {path} on port {port_name!r}, got {p}"]
    return []


def check_omen_container(c, pod_spec, cms, native):
    errs = []
    if c is None:
        return ["no container named 'omen'"]
    in_init = any(x is c for x in pod_spec.get("initContainers", []))
    if native and not (in_init and c.get("restartPolicy") == "Always"):
        errs.append("omen must be a native sidecar: an initContainer with restartPolicy: Always")
    if not native and (in_init or "restartPolicy" in c):
        errs.append("omen must be a plain container (no initContainer, no restartPolicy) in the plain-sidecar overlay")
    for probe in ("readinessProbe", "startupProbe"):
        if probe in c:
            errs.append(f"omen must have no {probe}: its health must never take vLLM out of its Service or hold back its start")
    sc = c.get("securityContext") or {}
    want = {"runAsNonRoot": True, "runAsUser": OMEN_UID, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}
    for k2, v in want.items():
        if sc.get(k2) != v:
            errs.append(f"securityContext.{k2} must be {v!r}, got {sc.get(k2)!r}")
    if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
        errs.append(f"securityContext.capabilities.drop must be [ALL], got {sc.get('capabilities')}")
    if sc.get("privileged"):
        errs.append("privileged container")
    res = c.get("resources") or {}
    for part in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in (res.get(part) or {}):
                errs.append(f"resources.{part}.{r} missing")
    ports = {p.get("name"): p for p in c.get("ports", [])}
    if (ports.get("metrics") or {}).get("containerPort") != 9465:
        errs.append(f"port 'metrics' must be containerPort 9465, got {ports}")
    errs += probe_problems(c, "livenessProbe", "/healthz", "metrics")
    mounts = {m.get("mountPath"): m for m in c.get("volumeMounts", [])}
    vols = {v.get("name"): v for v in pod_spec.get("volumes", [])}
    store = mounts.get("/var/lib/omen")
    empty = (vols.get(store.get("name")) or {}).get("emptyDir") if store else None
    if not store or empty is None or not empty.get("sizeLimit"):
        errs.append(f"/var/lib/omen must be a mount of an emptyDir with a sizeLimit (got {vols.get(store.get('name')) if store else None})")
    cfg = mounts.get("/etc/omen")
    cm_name = ((vols.get(cfg.get("name")) or {}).get("configMap") or {}).get("name") if cfg else None
    if not cfg or cm_name not in cms:
        errs.append(f"/etc/omen must be a mount of a ConfigMap defined in the base (got {cm_name!r})")
    elif not cfg.get("readOnly"):
        errs.append("/etc/omen mount must be readOnly")
    else:
        data = cms[cm_name].get("data", {})
        try:
            conf = yaml.safe_load(data.get("omen.yaml", "")) or {}
        except yaml.YAMLError as e:
            conf = {}
            errs.append(f"omen.yaml does not parse: {e}")
        http = conf.get("http") or {}
        if http.get("listen") != "127.0.0.1:9464":
            errs.append(f"omen.yaml http.listen must be 127.0.0.1:9464, got {http.get('listen')!r}")
        if http.get("metrics_listen") != "0.0.0.0:9465":
            errs.append(f"omen.yaml http.metrics_listen must be 0.0.0.0:9465, got {http.get('metrics_listen')!r}")
        url = (conf.get("history") or {}).get("prometheus_url") or ""
        if not url.startswith("http://"):
            errs.append(f"omen.yaml history.prometheus_url must be an http:// Prometheus (the store is an emptyDir), got {url!r}")
        args = " ".join(c.get("args", []) + c.get("command", []))
        if "/etc/omen/omen.yaml" not in args:
            errs.append(f"omen args do not point at /etc/omen/omen.yaml: {args!r}")
    # writable paths under a read-only root: every mount except the config must be writable
    if "/tmp" not in mounts:
        errs.append("no writable /tmp mount (root filesystem is read-only)")
    return errs


def check_vllm_container(c):
    if c is None:
        return ["no container named 'vllm'"]
    errs = []
    if not c.get("image", "").startswith("vllm/vllm-openai"):
        errs.append(f"image must be vllm/vllm-openai, got {c.get('image')!r}")
    lim = (c.get("resources") or {}).get("limits") or {}
    if str(lim.get("nvidia.com/gpu", "0")) in ("0", ""):
        errs.append(f"resources.limits must request nvidia.com/gpu, got {lim}")
    if "http" not in {p.get("name") for p in c.get("ports", [])}:
        errs.append("no port named http")
    return errs


def selects(selector, labels):
    return bool(selector) and all(labels.get(k2) == v for k2, v in selector.items())


def check_manifests(objs, native=True):
    deps = by_kind(objs, "Deployment")
    report(len(deps) == 1, "one Deployment", [f"got {len(deps)}"])
    if not deps:
        return
    dep = deps[0]
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    pod_labels = pod.get("metadata", {}).get("labels", {})
    cms = {o["metadata"]["name"]: o for o in by_kind(objs, "ConfigMap")}
    e = check_omen_container(container(spec, "omen"), spec, cms, native)
    form = "native sidecar" if native else "plain container"
    report(not e, f"omen {form}: non-root, read-only, no capabilities, resources, liveness only, ports, mounts, config", e)
    e = check_vllm_container(container(spec, "vllm"))
    report(not e, "vllm container: vllm/vllm-openai image with a GPU limit", e)
    e = []
    if spec.get("hostNetwork"):
        e.append("hostNetwork must be off (sidecars share the pod network)")
    if not selects(dep["spec"]["selector"].get("matchLabels"), pod_labels):
        e.append("Deployment selector does not match its pod template")
    report(not e, "Deployment selector and pod network", e)
    ports = port_names(spec)
    e = []
    for pm in by_kind(objs, "PodMonitor"):
        if not selects(pm["spec"]["selector"].get("matchLabels"), pod_labels):
            e.append(f"PodMonitor {pm['metadata']['name']} does not select the pod")
        if pm["metadata"].get("namespace") != dep["metadata"].get("namespace") and not pm["spec"].get("namespaceSelector"):
            e.append("PodMonitor in another namespace without namespaceSelector")
        for ep in pm["spec"]["podMetricsEndpoints"]:
            if ep.get("port") not in ports:
                e.append(f"PodMonitor port {ep.get('port')!r} is not a container port name ({sorted(ports)})")
            if ep.get("port") == "metrics" and ports.get("metrics") != 9465:
                e.append("PodMonitor 'metrics' is not 9465")
    if not by_kind(objs, "PodMonitor"):
        e.append("no PodMonitor")
    report(not e, "PodMonitor scrapes port 'metrics' of the pod", e)
    e = []
    for svc in by_kind(objs, "Service"):
        if not selects(svc["spec"].get("selector"), pod_labels):
            e.append(f"Service {svc['metadata']['name']} does not select the pod")
        for p in svc["spec"].get("ports", []):
            tp = p.get("targetPort")
            if isinstance(tp, str) and tp not in ports:
                e.append(f"Service targetPort {tp!r} is not a container port name")
    if not by_kind(objs, "Service"):
        e.append("no Service")
    report(not e, "Service selects the pod and names existing ports", e)
    with open(os.path.join(BASE, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    e = []
    common = {lk: lv for group in k.get("labels") or [] for lk, lv in (group.get("pairs") or {}).items()}
    if not common:
        e.append("deploy/base sets no common labels (`labels`)")
    for o in objs:
        md = o.get("metadata", {})
        if md.get("namespace") != k.get("namespace"):
            e.append(f"{key(o)}: namespace {md.get('namespace')!r}")
        for lk, lv in common.items():
            if (md.get("labels") or {}).get(lk) != lv:
                e.append(f"{key(o)}: missing common label {lk}={lv}")
    kinds = sorted(o["kind"] for o in objs)
    want = ["ConfigMap", "ConfigMap", "Deployment", "PodMonitor", "PrometheusRule", "Service"]
    if kinds != sorted(want):
        e.append(f"unexpected set of kinds {kinds}")
    report(not e, "namespace and common labels on every object; expected kinds", e)
    e = []
    boards = [o for o in by_kind(objs, "ConfigMap") if (o["metadata"].get("labels") or {}).get("grafana_dashboard") == "1"]
    if len(boards) != 1 or not all(n.endswith(".json") for n in boards[0].get("data", {})) or not boards[0].get("data"):
        e.append(f"want one ConfigMap labelled grafana_dashboard: \"1\" holding *.json, got {[b['metadata']['name'] for b in boards]}")
    report(not e, "Grafana dashboards ConfigMap (label grafana_dashboard: \"1\")", e)


def validate_schemas(objs):
    for o in objs:
        name = f"{o['kind']}/{o['metadata']['name']}"
        if o.get("apiVersion") == "monitoring.coreos.com/v1":
            schema = CRD_SCHEMAS.get(o["kind"])
            if schema is None:
                report(False, f"schema {name}", [f"no schema for monitoring.coreos.com/v1 {o['kind']}"])
                continue
            errs = [f"{'/'.join(map(str, er.absolute_path))}: {er.message}"
                    for er in jsonschema.Draft7Validator(schema).iter_errors(o)]
            report(not errs, f"schema {name} ({o['kind']} subset of monitoring.coreos.com/v1)", errs)
            continue
        for v in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(o, v, strict=True)
                report(True, f"schema {name} (Kubernetes {v}, strict)")
            except kubernetes_validate.ValidationError as er:
                path = "/".join(str(p) for p in er.absolute_path)
                report(False, f"schema {name} (Kubernetes {v}, strict)", [f"{path}: {er.message}"])
            except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError,
                    kubernetes_validate.utils.VersionNotSupportedError) as er:
                report(False, f"schema {name} (Kubernetes {v})", [getattr(er, "message", repr(er))])


KNOWN_INSTRUCTIONS = {"from", "run", "copy", "add", "env", "arg", "workdir", "user", "entrypoint", "cmd",
                      "expose", "label", "healthcheck", "stopsignal", "shell", "volume", "onbuild"}


def check_dockerfile(path):
    with open(path) as f:
        text = f.read()
    try:
        cmds = dockerfile.parse_string(text)
    except dockerfile.GoParseError as e:
        report(False, "deploy/Dockerfile parses", [str(e)])
        return
    report(True, "deploy/Dockerfile parses")
    errs = [f"line {c.start_line}: unknown instruction {c.cmd}" for c in cmds if c.cmd.lower() not in KNOWN_INSTRUCTIONS]
    stages = []
    for c in cmds:
        if c.cmd.lower() == "from":
            stages.append({"from": c, "cmds": []})
        elif stages:
            stages[-1]["cmds"].append(c)
    if len(stages) < 2:
        errs.append(f"needs a builder and a runtime stage, found {len(stages)} FROM")
    else:
        b, r = stages[0], stages[-1]
        bv = [x.lower() for x in b["from"].value]
        if bv[0] != "rust:1-bookworm" or len(bv) < 3 or bv[1] != "as":
            errs.append(f"builder must be 'FROM rust:1-bookworm AS <name>', got {b['from'].original!r}")
        builder_name = bv[2] if len(bv) >= 3 else None
        runs = [" ".join(x.value) for x in b["cmds"] if x.cmd.lower() == "run"]
        if not any(re.search(r"\bcargo build\b.*--release\b", x) and re.search(r"(-p|--package)[ =]omen-cli\b", x) for x in runs):
            errs.append("builder does not run 'cargo build --release -p omen-cli'")
        if not any(re.search(r"\bcargo build\b.*--release\b.*(-p|--package)[ =]omen-worker\b", x) for x in runs):
            errs.append("builder does not build the model worker ('cargo build --release -p omen-worker')")
        rimg = r["from"].value[0]
        if not (rimg.startswith("debian:bookworm-slim") or rimg.startswith("gcr.io/distroless/")):
            errs.append(f"runtime must be debian:bookworm-slim or distroless, got {rimg!r}")
        users = [x.value[0] for x in r["cmds"] if x.cmd.lower() == "user"]
        uid = users[-1].split(":")[0] if users else None
        if uid is None or uid in ("0", "root") or not uid.isdigit() or int(uid) != OMEN_UID:
            errs.append(f"runtime must end as USER {OMEN_UID} (numeric, non-root), got {users}")
        copies = [x for x in r["cmds"] if x.cmd.lower() == "copy"]
        if not any(f"--from={builder_name}" in [fl.lower() for fl in x.flags] and any(v.endswith("/omen") for v in x.value) for x in copies):
            errs.append("runtime does not COPY --from=<builder> the omen binary")
        ep = [x for x in r["cmds"] if x.cmd.lower() == "entrypoint"]
        if not ep or not ep[-1].json or not ep[-1].value[0].endswith("/omen"):
            errs.append("runtime ENTRYPOINT must be the omen binary in exec (JSON) form")
    report(not errs, "deploy/Dockerfile: multi-stage rust:1-bookworm -> slim runtime, non-root, omen entrypoint", errs)
    ign = path + ".dockerignore"
    ok = os.path.exists(ign) and "target/" in open(ign).read().split()
    report(ok, "deploy/Dockerfile.dockerignore excludes target/")


def self_test(objs):
    """Planted defects must be caught by the contract and schema checks."""
    global passed, failed
    saved = (passed, failed)
    bad = copy.deepcopy(objs)
    dep = by_kind(bad, "Deployment")[0]
    omen = container(dep["spec"]["template"]["spec"], "omen")
    omen["securityContext"]["runAsUser"] = 0
    omen["livenessProbe"]["httpGet"]["path"] = "/health"
    omen["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": "metrics"}}
    omen.pop("restartPolicy")
    by_kind(bad, "PrometheusRule")[0]["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    omen["ports"][0]["containerPort"] = 9999
    container(dep["spec"]["template"]["spec"], "vllm")["resources"]["limits"].pop("nvidia.com/gpu")
    by_kind(bad, "Service")[0]["spec"]["ports"][0]["port"] = "eighty"
    dep["spec"]["replicass"] = 1
    by_kind(bad, "PodMonitor")[0]["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    import io
    import contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        check_manifests(bad)
        validate_schemas(bad)
    out = buf.getvalue()
    passed, failed = saved
    expect = ["runAsUser must be 65532", "livenessProbe must be httpGet /healthz", "port 'metrics' must be containerPort 9465",
              "must request nvidia.com/gpu", "'eighty'", "replicass", "interval", "must have no readinessProbe",
              "must be a native sidecar", "5 minutes"]
    missing = [x for x in expect if x not in out]
    report(not missing, "self-test: planted manifest defects are detected", [f"not detected: {m}" for m in missing])


def render(folder):
    """The objects of one kustomization: kubectl's render checked against the python one, or
    the python one alone without kubectl."""
    rel = os.path.relpath(folder, ROOT)
    objs, err = render_kubectl(folder)
    try:
        py = render_python(folder)
        py_err = None
    except (OSError, ValueError, KeyError, IndexError, yaml.YAMLError) as e:
        py, py_err = None, str(e)
    if objs is not None:
        report(True, f"kubectl kustomize {rel} renders {len(objs)} objects")
        if py is None:
            report(False, f"{rel}: python renderer agrees with kubectl kustomize", [py_err])
        else:
            a = {key(o): o for o in objs}
            b = {key(o): o for o in py}
            d = [f"{k2}: missing in python render" for k2 in a if k2 not in b]
            d += [f"{k2}: missing in kubectl render" for k2 in b if k2 not in a]
            for k2 in a:
                if k2 in b:
                    d += [f"{k2}{x}" for x in diff(a[k2], b[k2])]
            report(not d, f"{rel}: python renderer agrees with kubectl kustomize", d)
        return objs
    if err != "kubectl not found":
        report(False, f"kubectl kustomize {rel}", [err])
    else:
        print(f"note: kubectl not found (install: apt-get install -y kubernetes-client); validating the python render of {rel}")
    if py is None:
        report(False, f"{rel}: python renderer", [py_err])
        return []
    report(True, f"{rel}: python renderer renders {len(py)} objects")
    return py


def check_generated():
    """The PrometheusRule and the dashboards ConfigMap are what the generator makes of their sources."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen-deploy-monitoring.py"), "--check"],
                       capture_output=True, text=True)
    report(r.returncode == 0, "deploy/base prometheusrule.yaml and grafana-dashboards.yaml are generated from "
           "alerting-rules/omen-rules.yml and dashboards/*.json", [r.stdout + r.stderr] if r.returncode else ())


def main():
    check_generated()
    for folder, native in TARGETS:
        objs = render(folder)
        if objs:
            print(f"== {os.path.relpath(folder, ROOT)}")
            validate_schemas(objs)
            check_manifests(objs, native)
            if native:
                self_test(objs)
    check_dockerfile(DOCKERFILE)
    print()
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
