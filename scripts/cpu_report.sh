#!/usr/bin/env bash
# Prints what decides this machine's host speed and rounding: the CPU model, its AVX-512, BF16
# and AMX flags, the core OpenBLAS picks for it (Debian's OpenBLAS 0.3.21 takes some Sapphire
# Rapids for "Prescott"), and the instruction set oneDNN dispatches to (KAT's float GEMMs and
# convolutions on the host). Needs scripts/setup.sh's packages; prints "unknown" without them.
set -uo pipefail
model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
flags=$(grep -m 1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_bf16|amx_tile)$' | tr '\n' ' ')
echo "cpu: ${model:-unknown}, $(nproc) logical CPUs; flags: ${flags:-none of avx2/avx512f/avx512_bf16/amx}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/report.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
char *openblas_get_corename(void);
#ifdef KAT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
static const char *isa(dnnl_cpu_isa_t i) {
  switch (i) {
  case dnnl_cpu_isa_sse41: return "SSE4.1";
  case dnnl_cpu_isa_avx: return "AVX";
  case dnnl_cpu_isa_avx2: return "AVX2";
  case dnnl_cpu_isa_avx512_core: return "AVX-512";
  case dnnl_cpu_isa_avx512_core_vnni: return "AVX-512 VNNI";
  case dnnl_cpu_isa_avx512_core_bf16: return "AVX-512 BF16";
  case dnnl_cpu_isa_avx512_core_amx: return "AVX-512 with AMX";
  default: return "other";
  }
}
#endif
int main(void) {
  printf("OpenBLAS core (OPENBLAS_CORETYPE %s): %s\n", getenv("OPENBLAS_CORETYPE") ? "set" : "unset",
         openblas_get_corename());
#ifdef KAT_HAVE_DNNL
  printf("oneDNN ISA: %s\n", isa(dnnl_get_effective_cpu_isa()));
#endif
  return 0;
}
C
if gcc -DKAT_HAVE_DNNL "$work/report.c" -o "$work/report" -lopenblas -ldnnl 2>/dev/null ||
  gcc "$work/report.c" -o "$work/report" -lopenblas 2>/dev/null; then
  "$work/report"
else
  echo "OpenBLAS core: unknown (libopenblas-dev missing)"
fi
