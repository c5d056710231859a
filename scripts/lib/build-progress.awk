# Turns ninja's status lines into a progress line with an estimate of the time left.
# scripts/build.sh runs ninja with NINJA_STATUS="[%f/%t %e] " (steps finished, steps to run,
# seconds elapsed) and pipes its output through this filter; every other line (compiler
# messages, FAILED: lines, CMake's own) passes through unchanged.
#   -v tty=1   overwrite one line in place (a terminal); otherwise one line per step
#   -v what=   what is being built, e.g. "krause-server krause-client" (shown on the line)
# The estimate assumes the steps left take as long on average as the steps done so far; it is
# shown from the third step on.
function clock(s) {
  s = int(s + 0.5)
  return sprintf("%d:%02d", int(s / 60), s % 60)
}
BEGIN { open_line = 0 }
match($0, /^\[[0-9]+\/[0-9]+ [0-9.]+\] /) {
  n = split(substr($0, 2, RLENGTH - 3), f, /[\/ ]/)
  done = f[1] + 0; total = f[2] + 0; elapsed = f[3] + 0
  step = substr($0, RLENGTH + 1)
  left = ""
  if (done >= 3 && done < total) left = ", about " clock(elapsed / done * (total - done)) " left"
  pct = total > 0 ? int(100 * done / total) : 100
  line = sprintf("build%s: step %d of %d (%d%%), %s elapsed%s", what == "" ? "" : " " what, done,
                 total, pct, clock(elapsed), left)
  if (tty) {
    # The step's description is cut so that the line fits in 100 columns.
    detail = step
    room = 100 - length(line) - 2
    if (room < 10) detail = ""
    else if (length(detail) > room) detail = "..." substr(detail, length(detail) - room + 4)
    printf "\r%s%s\033[K", line, detail == "" ? "" : "  " detail
    open_line = 1
  } else {
    print line ": " step
  }
  fflush()
  next
}
{
  if (open_line) { printf "\n"; open_line = 0 }
  print
  fflush()
}
END { if (open_line) printf "\n" }
