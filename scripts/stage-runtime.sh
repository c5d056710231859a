#!/usr/bin/env bash
# Stages a runtime file tree for the container images: the given binaries under
# DEST/opt/krause/bin and every shared library they load (their `ldd` closure, symlinks
# resolved) under DEST/opt/krause/lib, with DEST/etc/ld.so.conf.d/krause.conf naming that folder
# (run `ldconfig` after copying DEST into the image). glibc's own libraries are left out: the
# runtime image's base provides them, the same Debian release as the build stage.
# Usage: scripts/stage-runtime.sh DEST BINARY... [-- LIBDIR...]
#   LIBDIR...: folders whose shared libraries are all copied as well (libraries a binary loads
#              with dlopen, which ldd cannot see: PyTorch's CUDA libraries for the GPU image)
# Fails when a binary has an unresolved library ("not found").
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: stage-runtime.sh DEST BINARY... [-- LIBDIR...]" >&2
  exit 2
fi
dest=$1
shift
bins=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do bins+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
libdirs=("$@")

mkdir -p "$dest/opt/krause/bin" "$dest/opt/krause/lib" "$dest/etc/ld.so.conf.d"
for b in "${bins[@]}"; do install -m 0755 "$b" "$dest/opt/krause/bin/"; done
for d in "${libdirs[@]}"; do
  find "$d" -maxdepth 1 -name '*.so*' \( -type f -o -type l \) -exec cp -aL -t "$dest/opt/krause/lib" {} +
done

# ldd prints "name => path (address)" per library; the binaries' libraries are resolved with the
# staged LIBDIRs on the path, as they will be at run time.
closure=$(LD_LIBRARY_PATH="$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  ldd "${bins[@]}")
if grep -q 'not found' <<< "$closure"; then
  echo "stage-runtime: unresolved libraries:" >&2
  grep 'not found' <<< "$closure" | sort -u >&2
  exit 1
fi
n=0
while read -r name path; do
  case "$name" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | \
      libutil.so.* | ld-linux*) continue ;;
  esac
  if [ ! -e "$dest/opt/krause/lib/$name" ]; then
    cp -L "$path" "$dest/opt/krause/lib/$name"
    n=$((n + 1))
  fi
done < <(awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' <<< "$closure" | sort -u)
echo /opt/krause/lib > "$dest/etc/ld.so.conf.d/krause.conf"
echo "stage-runtime: ${#bins[@]} binaries, $n libraries from their closure" \
  "($(du -sh "$dest/opt/krause/lib" | cut -f1) of libraries) in $dest"
