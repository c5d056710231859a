#!/usr/bin/env python3
"""Time from `scripts/serve.sh` on a fresh clone to the server's "serving" line, per revision.

  bench/first_serve.py [--revs OLD NEW ...] [--then-build] [--container IMAGE]
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
--container IMAGE: run each clone inside a fresh container of IMAGE (podman, as root; the clone
  is mounted at /src), so that `scripts/serve.sh` starts from nothing installed: the time then
  includes installing the dependencies (apt from the image's mirror). The container checks out
  the clone, not this working tree.

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
    """Runs argv in its own process group; returns (seconds to the stop_at line or to the end,
    the number of build steps seen, the exit code or None when stopped, the output's tail).
    At the stop_at line it calls stop(proc), by default SIGINT to the process group (Ctrl-C)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    steps, tail, at, last_shown = 0, [], None, 0.0
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail = (tail + [line])[-40:]
            # Today's progress line ("build ...: step 12 of 119 ...") or ninja's own ("[12/278]").
            m = (re.search(r"\bstep (\d+) of (\d+)\b", line) or
                 re.match(r"\[(\d+)/(\d+)\]", line))
            now = time.monotonic() - t0
            if m:
                done, total = int(m.group(1)), int(m.group(2))
                steps = max(steps, total)
                if done % 10 == 0 or done == total or now - last_shown > 30:
                    print(f"  [{label} {clock(now)}] {line[:110]}", file=sys.stderr, flush=True)
                    last_shown = now
            elif re.search(r"install-deps:|krause-server: (listening|serving)|FAILED|error:",
                           line):
                print(f"  [{label} {clock(now)}] {line[:110]}", file=sys.stderr, flush=True)
            if stop_at and re.search(stop_at, line):
                at = now
                if stop:
                    stop(proc)
                else:
                    os.killpg(proc.pid, signal.SIGINT)
                break
    finally:
        if at is not None:
            try:
                proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        else:
            proc.wait()
    seconds = at if at is not None else time.monotonic() - t0
    return seconds, steps, (None if at is not None else proc.returncode), tail


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--revs", nargs="+", default=["HEAD"])
    ap.add_argument("--then-build", action="store_true")
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
                # PID 1: the container is removed instead (its server has served).
                conf = os.path.join(work, "containers.conf")
                with open(conf, "w") as f:
                    # As scripts/container-check.sh: no default ulimits on these machines.
                    f.write("[containers]\ndefault_ulimits = []\n")
                env["CONTAINERS_CONF"] = conf

                def stop(proc, name=name):
                    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
                inner = ("cd /src && CCACHE_DIR=/src/.ccache-fresh scripts/serve.sh " +
                         " ".join(SERVE_ARGS))
                argv = ["podman", "--runtime", "runc", "run", "--rm", "--network", "host",
                        "--name", name, "-v", f"{clone}:/src", args.container, "bash", "-c", inner]
            else:
                argv = ["scripts/serve.sh"] + SERVE_ARGS
            serve_s, serve_steps, rc, tail = run_streamed(
                argv, clone, env, sha, stop_at=r" krause-server: serving$", stop=stop)
            if rc is not None:
                print("\n".join(tail), file=sys.stderr)
                sys.exit(f"first_serve: {rev}: serve.sh exited with {rc} before serving")
            row = {"rev": rev, "commit": sha, "serve_seconds": round(serve_s, 1),
                   "serve_build_steps": serve_steps,
                   "where": f"container {args.container}" if args.container else "host"}
            if args.then_build and not args.container:
                build_s, build_steps, rc, tail = run_streamed(
                    ["scripts/build.sh"], clone, env, sha + " build.sh")
                if rc != 0:
                    print("\n".join(tail), file=sys.stderr)
                    sys.exit(f"first_serve: {rev}: scripts/build.sh failed ({rc})")
                row["then_build_seconds"] = round(build_s, 1)
                row["then_build_steps"] = build_steps
            results.append(row)
            print(f"first_serve: {rev} ({sha}): serving after {serve_s:.0f} s "
                  f"({serve_steps} build steps)" +
                  (f"; then scripts/build.sh {row['then_build_seconds']:.0f} s "
                   f"({row['then_build_steps']} steps)" if "then_build_seconds" in row else ""),
                  file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"first_serve: kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    machine = {"nproc": os.cpu_count(),
               "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                            if l.startswith("model name")), "?")}
    print(f"{'revision':<12} {'commit':<9} {'where':<28} {'to serving':>11} {'steps':>6}"
          f" {'then build.sh':>14} {'steps':>6}")
    for r in results:
        then = (f"{r['then_build_seconds']:>12.0f} s {r['then_build_steps']:>6}"
                if "then_build_seconds" in r else f"{'':>14} {'':>6}")
        print(f"{r['rev']:<12} {r['commit']:<9} {r['where']:<28} {r['serve_seconds']:>9.0f} s"
              f" {r['serve_build_steps']:>6} {then}")
    if len(results) >= 2:
        print(f"ratio, last to first: {results[-1]['serve_seconds'] / results[0]['serve_seconds']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": machine,
                       "results": results}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
