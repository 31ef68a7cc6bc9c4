#!/usr/bin/env python3
"""routes_vs_spec.py ROUTES_C OPENAPI_YAML - checks that the route table and
the OpenAPI description list the same routes (method and path), and for each
the same query parameters. Fault-build routes (FAULT_ROUTES) are not part of
the API and are left out. Exits 1 naming every difference."""
import re
import sys

import yaml

METHODS = ("get", "put", "post", "delete", "patch")


def c_strings(expr, macros):
    """The value of a C expression of adjacent string literals and macro
    names, such as  PLACE ",prefix"."""
    out = []
    for lit, name in re.findall(r'"((?:[^"\\]|\\.)*)"|([A-Za-z_]\w*)', expr):
        if name:
            if name not in macros:
                raise ValueError(f"unknown macro {name} in {expr!r}")
            out.append(macros[name])
        else:
            out.append(lit)
    return "".join(out)


def split_args(s):
    args, depth, cur, in_str = [], 0, [], False
    i = 0
    while i < len(s):
        c = s[i]
        if in_str:
            cur.append(c)
            if c == "\\":
                cur.append(s[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            cur.append(c)
        elif c in "([{":
            depth += 1
            cur.append(c)
        elif c in ")]}":
            depth -= 1
            cur.append(c)
        elif c == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    args.append("".join(cur).strip())
    return args


def table_routes(path):
    src = open(path).read()
    macros = {m: v for m, v in re.findall(r'#define\s+(\w+)\s+"([^"]*)"', src)}
    m = re.search(r"#define ROUTES\(X\)(.*?)\n(?=\S)", src.replace("\\\n", " "), re.S)
    if not m:
        raise SystemExit(f"{path}: no '#define ROUTES(X)' table found")
    body = m.group(1)
    routes = {}
    pos = 0
    while True:
        k = body.find("X(", pos)
        if k < 0:
            break
        depth, j = 0, k + 1
        while True:
            if body[j] == "(":
                depth += 1
            elif body[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        args = split_args(body[k + 2:j])
        method, pattern = c_strings(args[0], macros), c_strings(args[1], macros)
        query = c_strings(args[-1], macros)
        names = {q.split(":")[0] for q in query.split(",") if q}
        routes[(method, pattern)] = names
        pos = j + 1
    return routes


def spec_routes(path):
    spec = yaml.safe_load(open(path))
    comps = spec.get("components", {}).get("parameters", {})

    def resolve(p):
        ref = p.get("$ref")
        if ref:
            name = ref.rsplit("/", 1)[-1]
            if name not in comps:
                raise SystemExit(f"{path}: unresolved parameter {ref}")
            return comps[name]
        return p

    routes = {}
    for pattern, item in (spec.get("paths") or {}).items():
        shared = [resolve(p) for p in item.get("parameters", [])]
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            params = shared + [resolve(p) for p in op.get("parameters", [])]
            routes[(method.upper(), pattern)] = {p["name"] for p in params
                                                 if p.get("in") == "query"}
    return routes


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    table, spec = table_routes(sys.argv[1]), spec_routes(sys.argv[2])
    problems = []
    for (method, pattern), q in sorted(table.items()):
        if (method, pattern) not in spec:
            problems.append(f"route {method} {pattern} is missing from {sys.argv[2]} "
                            f"(declared in {sys.argv[1]}; query: {','.join(sorted(q)) or 'none'})")
            continue
        sq = spec[(method, pattern)]
        for name in sorted(q - sq):
            problems.append(f"{method} {pattern}: query parameter '{name}' is declared in "
                            f"{sys.argv[1]} but missing from {sys.argv[2]}")
        for name in sorted(sq - q):
            problems.append(f"{method} {pattern}: query parameter '{name}' is in "
                            f"{sys.argv[2]} but the route does not take it ({sys.argv[1]})")
    for (method, pattern) in sorted(set(spec) - set(table)):
        problems.append(f"route {method} {pattern} is in {sys.argv[2]} but not served "
                        f"(no such row in {sys.argv[1]})")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(f"routes: {len(table)} routes, methods and query parameters agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
