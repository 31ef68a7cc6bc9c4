#!/usr/bin/env python3
"""Keeps the Dockerfile in step with scripts/deps.sh, the Makefile and the binary.

  - the build stage installs exactly deps.sh's build_pkgs;
  - the runtime stage installs exactly the packages that own the shared
    libraries the binary needs (readelf NEEDED, resolved with ldconfig and
    dpkg), leaving out what every base image has (libc, libgcc, libstdc++)
    and the CUDA libraries the CUDA runtime image brings;
  - the build runs the Makefile's `make all`, overriding no compiler flag,
    with CUDA from the stage (1 in the CUDA devel image, 0 in the CPU one),
    and the image copies the Makefile's $(DAEMON) from it;
  - EXPOSE and the HEALTHCHECK's --probe use tstaged's default port, the user
    is numeric and not root, .dockerignore keeps the sources the Makefile
    compiles and drops .git and build/.

Usage: check_dockerfile.py [BINARY]   (default $TSTAGED, then build/tstaged)
       check_dockerfile.py --self-test BINARY   (each check catches a broken copy)
Exit 1 with one line per problem.
"""
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE_PKGS = {"libc6", "libgcc-s1", "libstdc++6"}
CUDA_LIBS = ("libcudart.so", "libcublas.so", "libcublasLt.so", "libnccl.so")
MAKE_VARS_ALLOWED = {"CUDA", "GIT_REV"}


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def instructions(text):
    """[(stage index, KEYWORD, argument text)] with continuations joined."""
    out, stage, cur = [], -1, ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        cur += line.rstrip("\\").strip() + " " if line.rstrip().endswith("\\") else line.strip()
        if line.rstrip().endswith("\\"):
            continue
        kw, _, arg = cur.partition(" ")
        kw = kw.upper()
        if kw == "FROM":
            stage += 1
        out.append((stage, kw, arg.strip()))
        cur = ""
    return out


def stages(ins):
    """{alias or index: (image, [(KW, arg)])}"""
    res, order = {}, []
    for st, kw, arg in ins:
        if kw == "FROM":
            words = arg.split()
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else str(st)
            order.append(name)
            res[name] = (words[0], [])
        elif order:
            res[order[-1]][1].append((kw, arg))
    return res, order


def apt_packages(run_arg):
    m = re.search(r"apt-get install ((?:-\S+ )*)(.*?)(?:&&|$)", run_arg)
    if not m:
        return None
    return [w for w in m.group(2).split() if not w.startswith("-")]


def stage_packages(st):
    pk = None
    for kw, arg in st[1]:
        if kw == "RUN" and "apt-get install" in arg:
            pk = apt_packages(arg)
    return pk


def deps_build_pkgs(text):
    m = re.search(r"^build_pkgs=\(([^)]*)\)", text, re.M)
    return m.group(1).split() if m else None


def needed_packages(binary):
    """(packages owning the binary's NEEDED libraries, problems)."""
    probs, pkgs = [], set()
    dyn = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True)
    if dyn.returncode != 0:
        return None, ["readelf -d %s failed: %s" % (binary, dyn.stderr.strip())]
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn.stdout)
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for lib in needed:
        if lib.startswith(CUDA_LIBS):
            continue
        m = re.search(r"^\s+%s \(([^)]*)\) => (\S+)" % re.escape(lib), cache, re.M)
        path = m.group(2) if m else None
        if not path:
            probs.append("the binary needs %s, which ldconfig does not know" % lib)
            continue
        own = subprocess.run(["dpkg", "-S", os.path.realpath(path)], capture_output=True,
                             text=True)
        if own.returncode != 0:
            own = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        if own.returncode != 0:
            probs.append("no package owns %s (%s)" % (lib, path))
            continue
        pkg = own.stdout.split(":")[0].strip()
        if pkg not in BASE_PKGS:
            pkgs.add(pkg)
    return pkgs, probs


def make_var(var, overrides):
    out = subprocess.run(["make", "-C", ROOT, "-pnq"] + overrides + ["all"],
                         capture_output=True, text=True).stdout
    m = re.search(r"^%s :?= ?(.*)$" % re.escape(var), out, re.M)
    return m.group(1).strip() if m else None


def check(docker, ignore, deps, runtime_pkgs):
    probs = []
    ins = instructions(docker)
    st, order = stages(ins)
    for need in ("build-cuda", "build-cpu", "build", "runtime-cuda", "runtime-cpu", "runtime"):
        if need not in st:
            probs.append("the Dockerfile has no stage '%s'" % need)
    if probs:
        return probs
    if not st["build-cuda"][0].startswith("nvidia/cuda:") or "-devel-" not in st["build-cuda"][0]:
        probs.append("stage build-cuda is not an nvidia/cuda devel image: %s" % st["build-cuda"][0])
    if st["runtime-cuda"][0] != st["build-cuda"][0].replace("-devel-", "-runtime-"):
        probs.append("the CUDA runtime image %s does not match the devel image %s"
                     % (st["runtime-cuda"][0], st["build-cuda"][0]))
    for s in ("build-cpu", "runtime-cpu"):
        if st[s][0] != "debian:bookworm-slim":
            probs.append("stage %s is %s, not debian:bookworm-slim" % (s, st[s][0]))
    for s, want in (("build-cuda", "1"), ("build-cpu", "0")):
        if ("ENV", "TS_CUDA=%s" % want) not in st[s][1]:
            probs.append("stage %s does not set TS_CUDA=%s" % (s, want))

    # the build stage: deps.sh's build packages and the Makefile's make all
    want = deps_build_pkgs(deps)
    got = stage_packages(st["build"])
    if want is None:
        probs.append("scripts/deps.sh has no build_pkgs=(...) list")
    elif got is None or sorted(got) != sorted(want):
        probs.append("the build stage installs %s; scripts/deps.sh's build_pkgs are %s"
                     % (got, want))
    makes = [a for k, a in st["build"][1] if k == "RUN" and re.search(r"(^|&& )make ", a)]
    workdir = [a for k, a in st["build"][1] if k == "WORKDIR"]
    if len(makes) != 1:
        probs.append("the build stage has %d make commands, want one" % len(makes))
    else:
        words = shlex.split(makes[0].split("&&")[0])
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        assigns = dict(w.split("=", 1) for w in words[1:] if "=" in w and not w.startswith("-"))
        if targets != ["all"]:
            probs.append("the build stage makes %s, not the Makefile's 'all'" % targets)
        bad = set(assigns) - MAKE_VARS_ALLOWED
        if bad:
            probs.append("the build stage overrides the Makefile's %s" % sorted(bad))
        if assigns.get("CUDA") != "${TS_CUDA}":
            probs.append("the build stage's CUDA=%s is not the stage's ${TS_CUDA}"
                         % assigns.get("CUDA"))
        daemon = make_var("DAEMON", ["CUDA=0", "GIT_REV=x"])
        copies = [a for k, a in st["runtime"][1] if k == "COPY" and "--from=build" in a]
        src = "%s/%s" % (workdir[-1].rstrip("/") if workdir else "", daemon)
        if not copies or copies[0].split()[1] != src:
            probs.append("the image copies %s, the Makefile builds %s"
                         % (copies[0].split()[1] if copies else None, src))
        cflags = make_var("TS_CFLAGS", ["CUDA=0", "GIT_REV=x"]) or ""
        if "-Werror" not in cflags:
            probs.append("the Makefile's TS_CFLAGS lost -Werror: %s" % cflags)

    # the runtime stage: the binary's libraries, nothing else
    got = stage_packages(st["runtime"])
    if runtime_pkgs is not None and (got is None or sorted(got) != sorted(runtime_pkgs)):
        probs.append("the runtime stage installs %s; the binary's libraries come from %s"
                     % (got, sorted(runtime_pkgs)))
    if any(p.endswith("-dev") or p in ("curl", "wget") for p in got or []):
        probs.append("the runtime stage installs a -dev package or curl/wget: %s" % got)

    # port, probe, user
    port = re.search(r'\{"port", OPT_INT, F\(port\), 0, 65535, "(\d+)"', read("server/config.c"))
    port = port.group(1) if port else "?"
    args = dict((k, a) for k, a in st["runtime"][1])
    if args.get("EXPOSE") != port:
        probs.append("EXPOSE %s, tstaged's default port is %s" % (args.get("EXPOSE"), port))
    hc = args.get("HEALTHCHECK", "")
    if not re.search(r'"--probe", "http://127\.0\.0\.1:%s/readyz"' % port, hc):
        probs.append("the HEALTHCHECK does not probe http://127.0.0.1:%s/readyz: %s" % (port, hc))
    user = args.get("USER", "")
    if not re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", user):
        probs.append("USER '%s' is not a numeric non-root user" % user)

    # .dockerignore
    pats = [l.strip() for l in ignore.splitlines() if l.strip() and not l.startswith("#")]
    for need in (".git", "build"):
        if need not in pats:
            probs.append(".dockerignore does not leave out %s" % need)
    for keep in ("Makefile", "VERSION", "common", "device", "storage", "handlers", "server",
                 "train", "scripts"):
        if keep in pats:
            probs.append(".dockerignore leaves out %s, which the build needs" % keep)
    return probs


def main():
    args = sys.argv[1:]
    selftest = args[:1] == ["--self-test"]
    if selftest:
        args = args[1:]
    binary = args[0] if args else os.environ.get("TSTAGED", os.path.join(ROOT, "build/tstaged"))
    if not os.path.exists(binary):
        print("check_dockerfile: no binary at %s (build it first)" % binary)
        return 1
    runtime_pkgs, probs = needed_packages(binary)
    docker, ignore, deps = read("Dockerfile"), read(".dockerignore"), read("scripts/deps.sh")
    probs += check(docker, ignore, deps, runtime_pkgs)
    if selftest and not probs:
        broken = [
            ("a build package dropped", docker.replace(" libjansson-dev", ""), ignore, deps),
            ("a package added to deps.sh", docker, ignore,
             deps.replace("build_pkgs=(", "build_pkgs=(libfoo-dev ")),
            ("a runtime library dropped", docker.replace(" libjansson4", ""), ignore, deps),
            ("a -dev package at run time",
             docker.replace(" libjansson4", " libjansson4 libjansson-dev"), ignore, deps),
            ("CFLAGS overridden", docker.replace("GIT_REV=", "OPT=-O0 GIT_REV="), ignore, deps),
            ("another target", docker.replace(" all \\", " build/tstaged \\"), ignore, deps),
            ("another port", docker.replace("EXPOSE 8470", "EXPOSE 8080"), ignore, deps),
            ("root user", docker.replace("USER 10001:10001", "USER root"), ignore, deps),
            ("runtime not matching", docker.replace("-runtime-ubuntu22.04",
                                                    "-runtime-ubuntu24.04"), ignore, deps),
            (".git kept", docker, ignore.replace(".git\n", ""), deps),
        ]
        for what, d, i, p in broken:
            if d == docker and i == ignore and p == deps:
                probs.append("self-test '%s': the mutation did not apply" % what)
            elif not check(d, i, p, runtime_pkgs):
                probs.append("self-test '%s': not caught" % what)
    for p in probs:
        print("check_dockerfile: " + p)
    if not probs:
        print("check_dockerfile: ok (runtime libraries %s)" % sorted(runtime_pkgs))
    return 1 if probs else 0


if __name__ == "__main__":
    sys.exit(main())
