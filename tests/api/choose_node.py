#!/usr/bin/env python3
"""choose_node.py CHROMIUM URL NODE OUT - opens URL (the dashboard) in headless Chromium,
waits for its first poll, chooses NODE in the node selector as a user does (the select's
value set and a change event), waits for the next poll after it, and writes the DOM to OUT.
Chromium is driven over the DevTools protocol (its remote-debugging port, on loopback)."""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket


def main():
    chromium, url, node, out = sys.argv[1:5]
    profile = tempfile.mkdtemp(prefix="tstage-chrome-")
    proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--no-first-run",
                             "--disable-extensions", "--disable-background-networking",
                             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                             f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file) or not open(port_file).read().strip():
            if time.monotonic() > deadline:
                sys.exit("choose_node: Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        ws = websocket.create_connection(next(p for p in pages if p["type"] == "page")
                                         ["webSocketDebuggerUrl"], timeout=30)
        seq = [0]

        def call(method, **params):
            seq[0] += 1
            ws.send(json.dumps({"id": seq[0], "method": method, "params": params}))
            while True:
                msg = json.loads(ws.recv())
                if msg.get("id") == seq[0]:
                    if "error" in msg:
                        sys.exit(f"choose_node: {method}: {msg['error']}")
                    return msg["result"]

        def js(expr):
            return call("Runtime.evaluate", expression=expr,
                        returnByValue=True)["result"].get("value")

        def updated_after(t, what):
            deadline = time.monotonic() + 20
            while True:
                v = js("Number(document.body && document.body.getAttribute('data-updated'))")
                if v and v > t:
                    return
                if time.monotonic() > deadline:
                    sys.exit(f"choose_node: the page did not poll {what}")
                time.sleep(0.1)

        call("Page.navigate", url=url)
        updated_after(0, "at all")
        if not js(f"[...document.getElementById('node').options].some(o => o.value === "
                  f"{json.dumps(node)})"):
            sys.exit(f"choose_node: the selector offers no {node!r}")
        chosen = js(f"(function () {{ var s = document.getElementById('node');"
                    f" s.value = {json.dumps(node)};"
                    f" s.dispatchEvent(new Event('change')); return Date.now(); }})()")
        # a poll that began before the choice may end after it: wait for two
        updated_after(chosen, "after the choice")
        second = js("Number(document.body.getAttribute('data-updated'))")
        updated_after(second, "twice after the choice")
        with open(out, "w") as f:
            f.write(js("document.documentElement.outerHTML"))
        print(f"choose_node: chose {node}; the page is at {js('location.hash')}")
        ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["rm", "-rf", profile], check=False)


if __name__ == "__main__":
    main()
