#!/usr/bin/env python3
"""scripts/serve.sh and its two filters, for real.

1. scripts/lib/build-progress.awk on ninja status lines: the step count, the time left estimated
   from the steps done, every other line passed through unchanged and in order.
2. scripts/serve.sh (SKIP_INSTALL=1 SKIP_BUILD=1: what is built) on the bundled models, every port
   chosen by the kernel, in its own process group:
   - the log passes through the hint filter unchanged (the "serving" line, each model's line);
   - the hints name the ports the server listens on, and every hinted command works as printed:
     the client's list, generate (4 PNG files) and classify, the REST and /metrics URLs;
   - Ctrl-C (SIGINT to the whole process group, the filter included) drains the server: its last
     lines ("stopped") still come through and the script exits 0; the same for SIGTERM to the
     group (a service manager's stop).

Usage: serve_script_test.py BIN_DIR SOURCE_DIR (ctest passes both).
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def progress_filter(src, text, tty="0"):
    return subprocess.run(
        ["awk", "-v", "tty=" + tty, "-v", "what=krause-server",
         "-f", os.path.join(src, "scripts/lib/build-progress.awk")],
        input=text.encode(), capture_output=True, check=True).stdout.decode()


def test_progress(src):
    text = ("[1/10 2.000] Building CXX object a.o\n"
            "a.cc:1: warning: unused\n"
            "[2/10 4.000] Building CXX object b.o\n"
            "[4/10 8.000] Building CXX object c.o\n"
            "FAILED: d.o\n"
            "[10/10 30.000] Linking CXX executable bin/krause-server\n"
            "ninja: build stopped\n")
    out = progress_filter(src, text).splitlines()
    check(out == [
        "build krause-server: step 1 of 10 (10%), 0:02 elapsed: Building CXX object a.o",
        "a.cc:1: warning: unused",
        "build krause-server: step 2 of 10 (20%), 0:04 elapsed: Building CXX object b.o",
        # 8 s for 4 steps: 2 s a step, 6 steps left.
        "build krause-server: step 4 of 10 (40%), 0:08 elapsed, about 0:12 left: "
        "Building CXX object c.o",
        "FAILED: d.o",
        "build krause-server: step 10 of 10 (100%), 0:30 elapsed: "
        "Linking CXX executable bin/krause-server",
        "ninja: build stopped"], "progress lines:\n" + "\n".join(out))
    # On a terminal: one line rewritten in place, ended before any other line.
    tty = progress_filter(src, "[1/2 1.000] a\n[2/2 2.000] b\nninja: done\n", tty="1")
    check(tty.startswith("\rbuild krause-server: step 1 of 2 (50%), 0:01 elapsed  a\x1b[K\r"),
          repr(tty))
    check(tty.endswith("\x1b[K\nninja: done\n"), repr(tty))
    print("progress filter: ok")


class Lines:
    """Reads a stream on a thread; wait_for() a line matching a pattern."""

    def __init__(self, stream):
        self.lines, self.cv = [], threading.Condition()
        self.done = False
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.done = True
            self.cv.notify_all()

    def wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for i, line in enumerate(self.lines):
                    if re.search(pattern, line):
                        return i
                left = deadline - time.monotonic()
                check(left > 0 and not self.done,
                      "no line matching %r; output:\n%s" % (pattern, "\n".join(self.lines)))
                self.cv.wait(left)


def test_serve(bin_dir, src, stop, try_hints):
    build_dir = os.path.dirname(os.path.abspath(bin_dir))
    env = dict(os.environ, SKIP_INSTALL="1", SKIP_BUILD="1", BUILD_DIR=build_dir)
    proc = subprocess.Popen(
        [os.path.join(src, "scripts/serve.sh"), "--listen", "127.0.0.1:0", "--http_listen",
         "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0"],
        cwd=src, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    out = Lines(proc.stderr)
    try:
        out.wait_for(r"Ctrl-C drains and stops it", 120)
        # The hint block ends with an empty line.
        start = out.wait_for(r"krause-server is serving;", 5)
        deadline = time.monotonic() + 5
        while True:
            with out.cv:
                block = out.lines[start + 1:]
            if "" in block or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        lines = out.lines
        serving = out.wait_for(r" krause-server: serving$", 1)
        check(serving < start, "the hints come after the server's 'serving' line")
        listen = next(l for l in lines if " krause-server: listening on port " in l)
        ports = re.search(r"listening on port (\d+), REST \(v2\) on port (\d+)[^,]*, "
                          r"/metrics on port (\d+)", listen)
        check(ports is not None, "listening line: " + listen)
        grpc, rest, metrics = ports.groups()
        for name in ("arm-fmnist", "karm-fmnist", "krause-vit-fmnist", "vit-fmnist"):
            check(any(re.search(r" krause-server: model %s version 1: " % name, l)
                      for l in lines), "the log line of model " + name)
        commands = [l.split("   # ")[0].strip() for l in block if "   # " in l]
        check(len(commands) == 7, "7 hints:\n" + "\n".join(block))
        if not try_hints:
            commands = []
        client = os.path.join(bin_dir, "krause-client")
        with tempfile.TemporaryDirectory() as cwd:
            ran = 0
            for c in commands:
                argv = shlex.split(c)
                if argv[0].startswith("http://"):  # the web page
                    port = re.match(r"http://localhost:(\d+)/$", argv[0]).group(1)
                    check(port == rest, "the page's address is the REST port: " + c)
                    with urllib.request.urlopen(argv[0], timeout=10) as r:
                        check(r.status == 200 and b"<title>krause-serve</title>" in r.read(),
                              "the hinted address serves the web page: " + c)
                elif argv[0] == "curl":
                    url = "http://" + argv[1]
                    port = re.match(r"localhost:(\d+)/", argv[1]).group(1)
                    check(port in (rest, metrics), "a hinted URL on a port the server has: " + c)
                    with urllib.request.urlopen(url, timeout=10) as r:
                        body = r.read().decode()
                    check(r.status == 200, c)
                    if port == rest:
                        check('"name":"krause-vit-fmnist"' in body.replace(" ", ""), body)
                    else:
                        check("krause_" in body, "metrics: " + body[:200])
                else:
                    check(os.path.realpath(argv[0]) == os.path.realpath(client),
                          "the hints name the built client: " + c)
                    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)
                    if "--help" in argv:
                        # Abseil's --help exits 1 (Debian 12's Abseil); the usage is the check.
                        check("krause-client list" in r.stdout + r.stderr, c)
                        ran += 1
                        continue
                    check(argv[1:3] == ["--server", "localhost:" + grpc], "the gRPC port: " + c)
                    check(r.returncode == 0, "%s: exit %d\n%s%s" % (c, r.returncode, r.stdout,
                                                                   r.stderr))
                    if "generate" in argv:
                        check(sorted(os.listdir(os.path.join(cwd, "samples"))) ==
                              ["sample-%d.png" % i for i in range(4)], "generate wrote 4 PNGs")
                    if "classify" in argv:
                        check(r.stdout.startswith("samples/sample-0.png:"), r.stdout)
                    if "list" in argv:
                        check("karm-fmnist" in r.stdout, r.stdout)
                ran += 1
        # Ctrl-C (SIGINT) or a service manager's stop (SIGTERM): to the whole process group, the
        # filter and the server alike.
        os.killpg(proc.pid, stop)
        check(proc.wait(timeout=60) == 0, "serve.sh exits 0 after %s" % stop.name)
        out.wait_for(r" krause-server: stopped$", 10)
        print("serve.sh: %d hinted commands worked; %s to the process group drained the server" %
              (ran, stop.name))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main():
    bin_dir, src = sys.argv[1], sys.argv[2]
    test_progress(src)
    test_serve(bin_dir, src, signal.SIGINT, try_hints=True)
    test_serve(bin_dir, src, signal.SIGTERM, try_hints=False)


if __name__ == "__main__":
    main()
