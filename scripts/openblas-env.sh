# Sourced by the scripts that run the host path. OpenBLAS before 0.3.25 (Debian 12 ships 0.3.21)
# runs its Prescott (SSE3) kernels on x86 CPUs newer than it knows (OpenBLAS issue #4267), this
# project's 2-core Xeon among them: SGEMM about 4x slower. It picks its kernels when it loads,
# so the choice goes in the environment: the kernels this CPU's vector units suit (the same rule
# as ddp::nn::blas::suited_core), unless the caller set OPENBLAS_CORETYPE already.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ "$(uname -m)" = x86_64 ] && [ -r /proc/cpuinfo ]; then
  ddp_cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  ddp_has() { for f in "$@"; do [[ "$ddp_cpu_flags" == *" $f "* ]] || return 1; done; }
  if ddp_has avx512f avx512bw avx512vl avx512dq; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif ddp_has avx2 fma; then
    export OPENBLAS_CORETYPE=Haswell
  fi
  unset ddp_cpu_flags
  unset -f ddp_has
fi
