#!/usr/bin/env bash
# Preflight of the GPU check (scripts/device-check.sh runs it first): in a few seconds, before any
# build time is spent, checks that this machine can build and run model/ against PyTorch's
# LibTorch, and stops with the reason when it cannot:
#  - PyTorch imports, has CUDA and sees a GPU (not in a CPU rehearsal);
#  - LibTorch uses the new C++ ABI (_GLIBCXX_USE_CXX11_ABI=1): an old-ABI LibTorch cannot link
#    Debian's Abseil and GoogleTest;
#  - nvcc exists and its CUDA major version is PyTorch's (two CUDA runtimes in one process);
#  - the C++ compiler is GCC >= 9 or Clang >= 10 with C++17, and cmake >= 3.18, ninja exist;
#  - the CUDA architectures: TORCH_CUDA_ARCH_LIST (PyTorch's CMake config adds -gencode flags
#    from it, or from its own detection when unset, whatever CMAKE_CUDA_ARCHITECTURES says).
#    When unset, it is pinned to the GPU's compute capability: printed as an `export` line that
#    device-check.sh applies. An architecture below 7.5 is refused (CUDA 13 has none).
# Prints one line per check and, last, `export TORCH_CUDA_ARCH_LIST=...`; exit 1 on a failure.
#   scripts/device-preflight.sh        (CPU_REHEARSAL=1: the GPU checks are skipped)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
fail=0
ok() { echo "preflight: ok    $*" >&2; }
bad() {
  echo "preflight: FAIL  $*" >&2
  fail=1
}
note() { echo "preflight: note  $*" >&2; }
rehearsal=${CPU_REHEARSAL:-0}

# version_ge A B: A >= B for dotted versions.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }

arch_list=${TORCH_CUDA_ARCH_LIST:-}
if [ "$rehearsal" = 1 ]; then
  note "CPU rehearsal: PyTorch, CUDA and nvcc checks skipped"
else
  info=$(python3 - 2>&1 <<'EOF'
import torch
print(torch.__version__)
print(torch.version.cuda or "none")
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
ok = torch.cuda.is_available()
print(int(ok))
if ok:
    major, minor = torch.cuda.get_device_capability(0)
    print(f"{major}.{minor}")
    print(torch.cuda.get_device_name(0))
else:
    print("none")
    print("none")
EOF
  )
  if [ $? -ne 0 ]; then
    bad "python3 cannot import torch: $(echo "$info" | tail -1)"
  else
    mapfile -t f <<< "$info"
    torch_version=${f[0]} torch_cuda=${f[1]} abi=${f[2]} has_gpu=${f[3]} cap=${f[4]} gpu=${f[5]}
    if version_ge "${torch_version%%+*}" 2.1; then
      ok "torch $torch_version"
    else
      bad "torch $torch_version: the GPU check needs PyTorch 2.1 or later (CUDA graphs, the allocator's pool calls)"
    fi
    [ "$abi" = 1 ] && ok "LibTorch C++ ABI: new (_GLIBCXX_USE_CXX11_ABI=1)" ||
      bad "LibTorch uses the old C++ ABI (_GLIBCXX_USE_CXX11_ABI=0): it cannot link Debian's Abseil and GoogleTest; use a cxx11-abi PyTorch build"
    if [ "$torch_cuda" = none ]; then
      bad "torch $torch_version has no CUDA"
    elif [ "$has_gpu" != 1 ]; then
      bad "PyTorch sees no CUDA device"
    else
      ok "GPU: $gpu, compute capability $cap"
    fi
    NVCC=${CUDACXX:-$(command -v nvcc || true)}
    [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
    if [ -z "$NVCC" ]; then
      bad "nvcc not found (PATH, CUDACXX, /usr/local/cuda/bin)"
    else
      nvcc_cuda=$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
      if [ "$torch_cuda" != none ] && [ "${nvcc_cuda%%.*}" != "${torch_cuda%%.*}" ]; then
        bad "nvcc is CUDA $nvcc_cuda but torch was built with CUDA $torch_cuda: the kernels would load a second CUDA runtime; use the matching toolkit"
      else
        ok "nvcc CUDA $nvcc_cuda, torch CUDA $torch_cuda"
      fi
    fi
    if [ -z "$arch_list" ] && [ "$cap" != none ]; then
      arch_list=$cap
      note "TORCH_CUDA_ARCH_LIST unset: pinned to this GPU's $cap"
    fi
  fi
fi

cxx=${CXX:-c++}
if ! command -v "$cxx" > /dev/null; then
  bad "no C++ compiler ($cxx)"
else
  cxx_id=$("$cxx" --version | head -1)
  cxx_major=$(echo | "$cxx" -dM -E -x c++ - | awk '/__clang_major__/ {c=$3} /__GNUC__ / {g=$3} END {print (c ? "clang " c : "gcc " g)}')
  case "$cxx_major" in
    gcc\ *) [ "${cxx_major#gcc }" -ge 9 ] && ok "c++: $cxx_id" || bad "c++: $cxx_id (GCC 9 or later needed)" ;;
    clang\ *) [ "${cxx_major#clang }" -ge 10 ] && ok "c++: $cxx_id" || bad "c++: $cxx_id (Clang 10 or later needed)" ;;
    *) bad "c++: cannot tell the compiler's version ($cxx_id)" ;;
  esac
fi
if command -v cmake > /dev/null; then
  cmake_version=$(cmake --version | sed -n 's/cmake version \([0-9.]*\).*/\1/p')
  version_ge "$cmake_version" 3.18 && ok "cmake $cmake_version" || bad "cmake $cmake_version (3.18 or later needed)"
else
  bad "cmake not found"
fi
command -v ninja > /dev/null && ok "ninja $(ninja --version)" || bad "ninja not found"

if [ -n "$arch_list" ]; then
  arch_ok=1
  for a in $(echo "$arch_list" | tr ';,' '  '); do
    n=${a%%+*}
    n=${n%%a}
    if ! [[ "$n" =~ ^[0-9]+\.[0-9]+$ ]]; then
      bad "TORCH_CUDA_ARCH_LIST=$arch_list: '$a' is not an architecture like 9.0"
      arch_ok=0
    elif ! version_ge "$n" 7.5; then
      bad "TORCH_CUDA_ARCH_LIST=$arch_list: $a is older than 7.5 (not in CUDA 13)"
      arch_ok=0
    fi
  done
  [ $arch_ok = 1 ] && ok "CUDA architectures: $arch_list"
  echo "export TORCH_CUDA_ARCH_LIST='$arch_list'"
fi
if [ $fail -ne 0 ]; then
  echo "preflight: failed: nothing built" >&2
  exit 1
fi
echo "preflight: passed" >&2
