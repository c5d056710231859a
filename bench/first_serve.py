#!/usr/bin/env python3
"""Time from `scripts/serve.sh` on a fresh clone to the server's "serving" line, per revision.

  bench/first_serve.py [--revs OLD NEW ...] [--then-build | --then-test] [--container IMAGE]
                       [--json bench/results/first-serve.json]

Each revision is cloned afresh from this repository into a temporary folder and its
`scripts/serve.sh` is run there as the README's quick start runs it, with an empty build folder
and an empty compiler cache (CCACHE_DIR in the temporary folder: a fresh machine has none), every
port chosen by the kernel. The time is taken from the command's start to the log line
"krause-server: serving"; the server is then stopped with SIGINT to its process group (Ctrl-C).
The revisions run one after the other in one run of this tool, so that they meet the same machine.

--then-build: after the server stops, run `scripts/build.sh` in the same clone (what
  `scripts/test.sh` builds before its tests) and time it: what the test command still has to
  build after serve.sh.
--then-test: after the server stops, run `scripts/test.sh` (the whole test command, as CI runs it)
  in the same clone and time it; the tool fails if it fails.
--container IMAGE: run each clone inside a fresh container of IMAGE (podman, as root; the clone
  is mounted at /src), so that `scripts/serve.sh` starts from nothing installed: the time then
  includes installing the dependencies (apt from the image's mirror). After the server stops, the
  same container installs the rest of the packages and configures as `scripts/test.sh` does, and
  reports what ninja would still do for the server and client (nothing, if test.sh reuses them)
  and for the rest.

Progress goes to stderr (the build's own progress line every 10 steps, with its estimate of the
time left); the result table to stdout, and the figures to --json.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SERVE_ARGS = ["--listen", "127.0.0.1:0", "--http_listen", "127.0.0.1:0",
              "--metrics_listen", "127.0.0.1:0"]


def clock(seconds):
    seconds = int(round(seconds))
    return "%d:%02d" % (seconds // 60, seconds % 60)


def run_streamed(argv, cwd, env, label, stop_at=None, stop=None):
    """Runs argv in its own process group to its end; returns (seconds to the stop_at line, or
    to the end without one; the number of build steps seen; the exit code; every line; the time
    install-deps finished, when it ran). At the
    stop_at line it calls stop(proc), by default SIGINT to the process group (Ctrl-C)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    steps, lines, at, last_shown = 0, [], None, 0.0
    marks = {}  # when install-deps finished

    for line in proc.stdout:
        line = line.rstrip("\n")
        lines.append(line)
        # Today's progress line ("build ...: step 12 of 119 ...") or ninja's own ("[12/278]").
        m = (re.search(r"\bstep (\d+) of (\d+)\b", line) or
             re.match(r"\[(\d+)/(\d+)\]", line))
        now = time.monotonic() - t0
        if m and at is None:
            done, total = int(m.group(1)), int(m.group(2))
            steps = max(steps, total)
            if done % 10 == 0 or done == total or now - last_shown > 30:
                print(f"  [{label} {clock(now)}] {line[:110]}", file=sys.stderr, flush=True)
                last_shown = now
        elif re.search(r"install-deps:|krause-server: (listening|serving)|FAILED|error:|"
                       r"^first_serve|tests passed|tests failed|^fuzz|^container-check|"
                       r"^sanitize|\*\*\*Failed|Total Test time", line):
            print(f"  [{label} {clock(now)}] {line[:110]}", file=sys.stderr, flush=True)
        if re.match(r"install-deps: (done|all \d+ packages present)", line):
            marks.setdefault("install_seconds", round(now, 1))
        if stop_at and at is None and re.search(stop_at, line):
            at = now
            if stop:
                stop(proc)
            else:
                os.killpg(proc.pid, signal.SIGINT)
    rc = proc.wait()
    seconds = at if at is not None else time.monotonic() - t0
    return seconds, steps, rc, lines, marks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--revs", nargs="+", default=["HEAD"])
    ap.add_argument("--then-build", action="store_true")
    ap.add_argument("--then-test", action="store_true")
    ap.add_argument("--container", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", action="store_true", help="keep the temporary clones")
    args = ap.parse_args()

    repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    results = []
    work = tempfile.mkdtemp(prefix="first-serve-", dir="/var/tmp")
    try:
        for i, rev in enumerate(args.revs):
            sha = subprocess.run(["git", "-C", repo, "rev-parse", "--short", rev],
                                 capture_output=True, text=True, check=True).stdout.strip()
            clone = os.path.join(work, f"{i}-{sha}")
            subprocess.run(["git", "clone", "-q", repo, clone], check=True)
            subprocess.run(["git", "-C", clone, "checkout", "-q", sha], check=True)
            print(f"first_serve: {rev} ({sha}) in {clone}", file=sys.stderr, flush=True)
            env = dict(os.environ, CCACHE_DIR=os.path.join(work, f"ccache-{i}"))
            name = f"first-serve-{os.getpid()}-{i}"
            stop = None
            if args.container:
                # The container's first process is bash, which ignores a forwarded SIGINT as
                # PID 1: Ctrl-C goes to the server inside.
                conf = os.path.join(work, "containers.conf")
                with open(conf, "w") as f:
                    # As scripts/container-check.sh: no default ulimits on these machines.
                    f.write("[containers]\ndefault_ulimits = []\n")
                env["CONTAINERS_CONF"] = conf

                def stop(proc, name=name):
                    subprocess.run(
                        ["podman", "exec", name, "bash", "-c",
                         "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2> /dev/null)\" = "
                         "krause-server ] && kill -INT ${p#/proc/}; done"], capture_output=True)
                # serve.sh; once its server is stopped, what the test command's build would do
                # in the same container: install the rest of the packages, configure, and ask
                # ninja (-n) whether the server and client are up to date, and how many steps the
                # rest takes.
                inner = ("cd /src && export CCACHE_DIR=/src/.ccache-fresh && scripts/serve.sh " +
                         " ".join(SERVE_ARGS) + " && scripts/install-deps.sh > /dev/null && "
                         "SKIP_INSTALL=1 CONFIGURE_ONLY=1 scripts/build.sh > /dev/null && "
                         "echo first_serve: serve targets: $(ninja -C build -n krause-server "
                         "krause-client | tail -1) && "
                         "echo first_serve: the rest: $(ninja -C build -n | tail -1)")
                argv = ["podman", "--runtime", "runc", "run", "--rm", "--network", "host",
                        "--name", name, "-v", f"{clone}:/src", args.container, "bash", "-c", inner]
            else:
                argv = ["scripts/serve.sh"] + SERVE_ARGS
            serve_s, serve_steps, rc, lines, marks = run_streamed(
                argv, clone, env, sha, stop_at=r" krause-server: serving$", stop=stop)
            if rc != 0 or not any(re.search(r" krause-server: serving$", l) for l in lines):
                print("\n".join(lines[-40:]), file=sys.stderr)
                sys.exit(f"first_serve: {rev}: exit code {rc}")
            row = {"rev": rev, "commit": sha, "serve_seconds": round(serve_s, 1),
                   "serve_build_steps": serve_steps, **marks,
                   "where": f"container {args.container}" if args.container else "host"}
            for l in lines:
                m = re.match(r"first_serve: (serve targets|the rest): (.*)", l)
                if m:
                    row["then_ninja_" + m.group(1).replace(" ", "_")] = m.group(2)
            if args.then_build and not args.container:
                build_s, build_steps, rc, lines, _ = run_streamed(
                    ["scripts/build.sh"], clone, env, sha + " build.sh")
                if rc != 0:
                    print("\n".join(lines[-40:]), file=sys.stderr)
                    sys.exit(f"first_serve: {rev}: scripts/build.sh failed ({rc})")
                row["then_build_seconds"] = round(build_s, 1)
                row["then_build_steps"] = build_steps
            elif args.then_test and not args.container:
                test_s, _, rc, lines, _ = run_streamed(["scripts/test.sh"], clone, env,
                                                       sha + " test.sh")
                row["then_test_seconds"] = round(test_s, 1)
                row["then_test_exit_code"] = rc
                row["then_test_summary"] = [l for l in lines if re.search(
                    r"tests passed|Total Test time|^fuzz: (built|all)|^container-check: passed|"
                    r"^sanitize: (built|threaded)", l)]
                if rc != 0:
                    print("\n".join(lines[-60:]), file=sys.stderr)
                    sys.exit(f"first_serve: {rev}: scripts/test.sh failed ({rc})")
            results.append(row)
            print(f"first_serve: {rev} ({sha}): serving after {serve_s:.0f} s "
                  f"({serve_steps} build steps)" +
                  (f"; then scripts/build.sh {row['then_build_seconds']:.0f} s "
                   f"({row['then_build_steps']} steps)" if "then_build_seconds" in row else "") +
                  (f"; then scripts/test.sh passed in {row['then_test_seconds']:.0f} s"
                   if "then_test_seconds" in row else ""),
                  file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"first_serve: kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    machine = {"nproc": os.cpu_count(),
               "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                            if l.startswith("model name")), "?")}
    where = max([len("where")] + [len(r["where"]) for r in results])
    print(f"{'revision':<12} {'commit':<9} {'where':<{where}} {'to serving':>11} {'steps':>6}"
          f" {'then build.sh':>14} {'steps':>6}")
    for r in results:
        then = (f"{r['then_build_seconds']:>12.0f} s {r['then_build_steps']:>6}"
                if "then_build_seconds" in r else "")
        print(f"{r['rev']:<12} {r['commit']:<9} {r['where']:<{where}} {r['serve_seconds']:>9.0f} s"
              f" {r['serve_build_steps']:>6} {then}".rstrip())
    for r in results:
        if "then_test_seconds" in r:
            print(f"{r['commit']}: then scripts/test.sh: exit code {r['then_test_exit_code']} "
                  f"after {r['then_test_seconds']:.0f} s")
            for l in r["then_test_summary"]:
                print("  " + l)
        for key in ("then_ninja_serve_targets", "then_ninja_the_rest"):
            if key in r:
                print(f"{r['commit']}: after serve.sh and the rest of the packages, ninja -n for "
                      f"{'the server and client' if 'serve' in key else 'everything'}: {r[key]}")
    if len(results) >= 2:
        print(f"ratio, last to first: {results[-1]['serve_seconds'] / results[0]['serve_seconds']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": machine,
                       "results": results}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
