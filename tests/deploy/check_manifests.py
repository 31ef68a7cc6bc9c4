#!/usr/bin/env python3
"""What the schema validators cannot see in deploy/kubernetes: that the pieces fit
each other and tstaged.

  - every object has the app.kubernetes.io name/part-of labels and lives in
    the tstage namespace; no Secret is committed (the token is created apart);
  - the ConfigMap's keys are TSTAGE_* variables that `tstaged --help` lists;
  - the DaemonSet: GPU node selector and the nvidia.com/gpu toleration; the
    startup/liveness probes on /livez and readiness on /readyz of the named
    port; the container port, the Prometheus annotation and TSTAGE_PORT agree;
    TSTAGE_HOST_NAME comes from spec.nodeName; the token Secret is mounted
    where TSTAGE_TOKEN_FILE points; the grace period outlasts the drain; the
    memory limit holds both host budgets; the security context is
    runAsNonRoot, seccomp RuntimeDefault, all capabilities dropped, read-only
    root;
  - the ServiceMonitor selects exactly one Service, the headless one, by a
    port it has.

Usage: check_manifests.py TSTAGED [--self-test]   (needs PyYAML)
"""
import copy
import glob
import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
         "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def size(s):
    m = re.fullmatch(r"(\d+)([KMGT]i(?:B)?)?", str(s))
    return int(m.group(1)) * UNITS.get(m.group(2) or "", 1) if m else None


def load():
    docs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "deploy/kubernetes/**/*.yaml"),
                                 recursive=True)):
        with open(path) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def one(docs, kind):
    found = [d for d in docs if d.get("kind") == kind]
    return found[0] if len(found) == 1 else None


def check(docs, env_vars):
    probs = []
    for d in docs:
        md = d.get("metadata", {})
        what = "%s/%s" % (d.get("kind"), md.get("name"))
        labels = md.get("labels") or {}
        for l in ("app.kubernetes.io/name", "app.kubernetes.io/part-of"):
            if l not in labels:
                probs.append("%s has no label %s" % (what, l))
        ns = md.get("name") if d.get("kind") == "Namespace" else md.get("namespace")
        if ns != "tstage":
            probs.append("%s is not in the namespace tstage" % what)
        if d.get("kind") == "Secret":
            probs.append("%s: a Secret is committed; the README creates the token" % what)

    cm, ds = one(docs, "ConfigMap"), one(docs, "DaemonSet")
    if not cm or not ds:
        return probs + ["want one ConfigMap and one DaemonSet"]
    data = cm.get("data", {})
    for k in data:
        if k not in env_vars:
            probs.append("ConfigMap key %s is no variable tstaged reads" % k)

    spec = ds["spec"]["template"]["spec"]
    if not spec.get("nodeSelector"):
        probs.append("the DaemonSet has no GPU node selector")
    if not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])):
        probs.append("the DaemonSet does not tolerate the nvidia.com/gpu taint")
    c = spec["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if str(ports.get("http")) != data.get("TSTAGE_PORT"):
        probs.append("containerPort http %s, TSTAGE_PORT %s" % (ports.get("http"),
                                                               data.get("TSTAGE_PORT")))
    ann = ds["spec"]["template"]["metadata"].get("annotations", {})
    if ann.get("prometheus.io/port") != data.get("TSTAGE_PORT") or \
            ann.get("prometheus.io/path") != "/metrics" or ann.get("prometheus.io/scrape") != "true":
        probs.append("the Prometheus annotations do not name /metrics on TSTAGE_PORT: %s" % ann)
    for probe, path in (("startupProbe", "/livez"), ("livenessProbe", "/livez"),
                        ("readinessProbe", "/readyz")):
        get = (c.get(probe) or {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") != "http":
            probs.append("%s is not GET %s on port http: %s" % (probe, path, get))
    env = {e["name"]: e for e in c.get("env", [])}
    ref = env.get("TSTAGE_HOST_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
    if ref.get("fieldPath") != "spec.nodeName":
        probs.append("TSTAGE_HOST_NAME is not the node's name (downward API spec.nodeName)")
    if not any(e.get("configMapRef", {}).get("name") == cm["metadata"]["name"]
               for e in c.get("envFrom", [])):
        probs.append("the container does not load the ConfigMap")
    token_dir = os.path.dirname(data.get("TSTAGE_TOKEN_FILE", ""))
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    mounted = [m for m in c.get("volumeMounts", []) if m["mountPath"] == token_dir and
               vols.get(m["name"], {}).get("secret", {}).get("secretName") == "tstage-token"]
    if not mounted:
        probs.append("the Secret tstage-token is not mounted at %s (TSTAGE_TOKEN_FILE)"
                     % token_dir)
    if int(spec.get("terminationGracePeriodSeconds", 30)) <= int(data.get("TSTAGE_DRAIN_SECONDS", 30)):
        probs.append("terminationGracePeriodSeconds does not outlast TSTAGE_DRAIN_SECONDS")
    limit = size(c.get("resources", {}).get("limits", {}).get("memory", ""))
    budgets = sum(size(data.get(k, "0")) or 0 for k in ("TSTAGE_PINNED_HOST_LIMIT",
                                                        "TSTAGE_UNPINNED_HOST_LIMIT"))
    if not limit or budgets >= limit:
        probs.append("the memory limit %s does not hold the host budgets (%d bytes)"
                     % (limit, budgets))
    psc, csc = spec.get("securityContext", {}), c.get("securityContext", {})
    if not (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")):
        probs.append("runAsNonRoot is not set")
    if (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        probs.append("seccomp is not RuntimeDefault")
    if csc.get("capabilities", {}).get("drop") != ["ALL"] or csc.get("capabilities", {}).get("add"):
        probs.append("capabilities are not all dropped")
    if csc.get("readOnlyRootFilesystem") is not True:
        probs.append("the root file system is not read-only")

    sm = one(docs, "ServiceMonitor")
    if not sm:
        probs.append("want one ServiceMonitor")
    else:
        sel = sm["spec"]["selector"]["matchLabels"]
        hits = [s for s in docs if s.get("kind") == "Service" and
                all((s["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())]
        if len(hits) != 1 or hits[0]["spec"].get("clusterIP") != "None":
            probs.append("the ServiceMonitor selects %s, want the headless Service alone"
                         % [h["metadata"]["name"] for h in hits])
        else:
            names = {p.get("name") for p in hits[0]["spec"]["ports"]}
            for ep in sm["spec"]["endpoints"]:
                if ep.get("port") not in names or ep.get("path") != "/metrics":
                    probs.append("the ServiceMonitor scrapes %s%s, not a port of %s"
                                 % (ep.get("port"), ep.get("path"), hits[0]["metadata"]["name"]))
    return probs


def mutations(docs):
    def find(ds, kind):
        return [d for d in ds if d.get("kind") == kind][0]

    def container(ds):
        return find(ds, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]

    out = []

    def mut(what, f):
        d = copy.deepcopy(docs)
        f(d)
        out.append((what, d))

    mut("no toleration", lambda d: find(d, "DaemonSet")["spec"]["template"]["spec"].pop("tolerations"))
    mut("unknown ConfigMap key", lambda d: find(d, "ConfigMap")["data"].update(TSTAGE_NO_SUCH="1"))
    mut("pod name as host", lambda d: container(d)["env"][0]["valueFrom"]["fieldRef"]
        .update(fieldPath="metadata.name"))
    mut("readiness on /livez", lambda d: container(d)["readinessProbe"]["httpGet"]
        .update(path="/livez"))
    mut("port mismatch", lambda d: find(d, "ConfigMap")["data"].update(TSTAGE_PORT="9000"))
    mut("a capability added", lambda d: container(d)["securityContext"]["capabilities"]
        .update(add=["IPC_LOCK"]))
    mut("a Secret committed", lambda d: d.append({"kind": "Secret", "metadata": {
        "name": "tstage-token", "namespace": "tstage", "labels": {
            "app.kubernetes.io/name": "x", "app.kubernetes.io/part-of": "tstage"}}}))
    mut("monitor selects both Services", lambda d: find(d, "ServiceMonitor")["spec"]["selector"]
        ["matchLabels"].pop("app.kubernetes.io/component"))
    mut("budgets over the limit", lambda d: find(d, "ConfigMap")["data"]
        .update(TSTAGE_PINNED_HOST_LIMIT="64GiB"))
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    helptext = subprocess.run([sys.argv[1], "--help"], capture_output=True, text=True).stdout
    env_vars = set(re.findall(r"\((TSTAGE_[A-Z_]+)\)", helptext))
    if not env_vars:
        print("check_manifests: %s --help lists no TSTAGE_ variable" % sys.argv[1])
        return 1
    docs = load()
    probs = check(docs, env_vars)
    if "--self-test" in sys.argv[2:] and not probs:
        for what, d in mutations(docs):
            if not check(d, env_vars):
                probs.append("self-test '%s': not caught" % what)
    for p in probs:
        print("check_manifests: " + p)
    if not probs:
        print("check_manifests: ok (%d objects)" % len(docs))
    return 1 if probs else 0


if __name__ == "__main__":
    sys.exit(main())
