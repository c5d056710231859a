# Sourced by scripts that filter a running program's output with awk: sets LINE_AWK, an awk
# command that handles each line as it arrives. mawk (Debian's default awk) reads a pipe in
# blocks, so a filter would show nothing until kilobytes had come, unless run with
# -W interactive; gawk reads as lines come.
LINE_AWK=(awk)
if awk -W version 2> /dev/null | grep -q '^mawk'; then LINE_AWK+=(-W interactive); fi
