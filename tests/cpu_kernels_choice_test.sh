#!/bin/bash
# KRAUSE_CPU_KERNELS and --weights_dtype from the command line: krause-check follows a variant the
# CPU runs and says so in its verdict line, with the weights it checked; a variant this build or
# CPU lacks, or a weights dtype that does not exist, stops krause-check and krause-server (exit
# code 2) with a message naming it.
#   tests/cpu_kernels_choice_test.sh KRAUSE_CHECK KRAUSE_SERVER MODELS_DIR
set -u
check=$1 server=$2 models=$3
fail=0
expect() {  # expect WHAT WANT_RC GOT_RC OUTPUT PATTERN
  if [[ $3 -ne $2 ]] || ! grep -q -- "$5" <<<"$4"; then
    echo "FAIL: $1: exit $3 (want $2), output lacks \"$5\":"
    echo "$4" | head -5
    fail=1
  else
    echo "ok: $1"
  fi
}

out=$(KRAUSE_CPU_KERNELS=base "$check" --weights_dtype bfloat16 "$models/krause_vit_fmnist.safetensors" 2>&1)
expect "base kernels, bf16 weights pass" 0 $? "$out" "krause-check on cpu (CPU kernels base, bfloat16 weights): every model passes"

out=$("$check" "$models/krause_vit_fmnist.safetensors" 2>&1)
expect "the default variant, fp32 weights" 0 $? "$out" "float32 weights): every model passes"

out=$(KRAUSE_CPU_KERNELS=avx9 "$check" "$models/krause_vit_fmnist.safetensors" 2>&1)
expect "krause-check refuses an unknown variant" 2 $? "$out" "KRAUSE_CPU_KERNELS=avx9 is not a variant this build and CPU run"

out=$("$check" --weights_dtype int8 "$models/krause_vit_fmnist.safetensors" 2>&1)
expect "krause-check refuses an unknown weights dtype" 2 $? "$out" "--weights_dtype must be float32 or bfloat16, got \"int8\""

out=$(KRAUSE_CPU_KERNELS=avx9 timeout 60 "$server" --models_dir "$models" --listen 127.0.0.1:0 \
        --http_listen "" --metrics_listen "" 2>&1)
expect "krause-server refuses an unknown variant before loading anything" 2 $? "$out" "krause-server: KRAUSE_CPU_KERNELS=avx9"

exit $fail
