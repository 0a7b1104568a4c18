#!/usr/bin/env bash
# The GPU check, one script for a single-GPU Linux box with CUDA 13, cmake and a compiler (and
# PyTorch for the reference figures), in a few minutes:
#   1. dependencies: the box's own when CMake finds them, else the Debian packages that
#      scripts/gpu_debs downloaded beforehand (.gpu-debs/), unpacked with dpkg -x into a prefix;
#   2. build (BERTH_GPU_CHECK: the backend, its tests and bench_gpu_ops; sm_90 unless
#      BERTH_CUDA_ARCHS says otherwise), or reuse BUILD_DIR if it already holds a GPU-check build;
#   3. GPU tests: ctest -L gpu (gpu.BackendOps.*, gpu.ModelOnBackend.*, and gpu.single.Nccl.*: the
#      NCCL communicator on one rank, NCCL from the toolkit or PyTorch's wheel), and the measured
#      CUDA-vs-CPU errors of every op (BERTH_TOL_REPORT=1);
#   4. benchmark: bench_gpu_ops and bench/gpu/torch_reference.py, one after the other on this GPU,
#      then bench/gpu/compare.py's berth/PyTorch ratios (printed, so a caller that sees only the
#      output's end sees them);
#   5. with BERTH_GPU_CHECK_HOST_TESTS=1 only, the host runs of the same test binaries (ctest -L
#      cpu), last: CI runs them, and a lent GPU's minutes are better kept for a second run.
# Everything lands in OUTDIR (up to eight files); the exit status is the GPU tests' (3 when a GPU
# is visible and a GPU test skipped anyway: it checked nothing; also written
# to OUTDIR/gpu_tests_rc as soon as they end, should the box's own limit stop the script later).
# Every phase is capped by one deadline, BERTH_GPU_CHECK_BUDGET_S (default 300 s) from the start;
# give the command a limit of the budget + 60 s. A test that hangs (the tiled kernels' barriers
# have never run on a GPU before) is stopped after 45 s, and the others still run.
#
#   scripts/gpu_check.sh OUTDIR
set -uo pipefail
out="${1:?usage: scripts/gpu_check.sh OUTDIR}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
start=$SECONDS
log() { echo "[gpu_check $((SECONDS - start))s] $*" | tee -a "$out/gpu_check.log"; }
deadline=$((start + ${BERTH_GPU_CHECK_BUDGET_S:-300}))
# cap SECONDS [RESERVE]: a phase's time limit, at most SECONDS, leaving RESERVE for what follows.
cap() {
  local left=$((deadline - SECONDS - ${2:-0}))
  [ "$left" -lt "$1" ] && echo $((left > 5 ? left : 5)) || echo "$1"
}
build="${BUILD_DIR:-build-gpu}"
debs="${BERTH_DEBS_DIR:-.gpu-debs}"
prefix=/tmp/berth-deps
jobs="$(nproc)"

# The toolkit where CUDA installs it, when nvcc is not on PATH (CMake looks only there and in
# $CUDA_PATH): a missing nvcc is a configure error that would end the run before anything ran.
if ! command -v nvcc >/dev/null; then
  for d in "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13*; do
    [ -n "$d" ] && [ -x "$d/bin/nvcc" ] && { export PATH="$d/bin:$PATH"; break; }
  done
fi
command -v nvcc >/dev/null && export CUDACXX="$(command -v nvcc)"
{ date -u '+%Y-%m-%d %H:%M:%S UTC'; nvidia-smi; nvcc --version; cmake --version; g++ --version
  command -v ninja && ninja --version
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
} > "$out/nvidia-smi.txt" 2>&1
log "$(date -u '+%Y-%m-%d %H:%M UTC'), sources $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
log "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
for tool in nvcc cmake g++; do
  if ! command -v "$tool" >/dev/null; then
    log "no $tool on this machine (PATH=$PATH): nothing can be built"
    exit 2
  fi
done
log "tools: $(nvcc --version | tail -1); $(cmake --version | head -1); $(g++ --version | head -1)"

cmake_args=(-DBERTH_GPU_CHECK=ON -DBERTH_CUDA=ON "-DBERTH_CUDA_ARCHS=${BERTH_CUDA_ARCHS:-90}"
            -DCMAKE_BUILD_TYPE=Release)
if compgen -G "$debs/*.deb" >/dev/null; then
  mkdir -p "$prefix"
  for f in "$debs"/*.deb; do
    dpkg -x "$f" "$prefix" 2>/dev/null && continue
    # no dpkg: a .deb is an ar archive whose data.tar.* holds the files
    member=$(ar t "$f" 2>/dev/null | grep '^data\.tar' | head -1)
    case "$member" in
      *.xz) unpack=(xz -dc) ;; *.zst) unpack=(zstd -dc) ;; *.gz) unpack=(gzip -dc) ;; *) unpack=(cat) ;;
    esac
    { [ -n "$member" ] && ar p "$f" "$member" | "${unpack[@]}" | tar -x -C "$prefix"; } ||
      log "could not unpack $f (no dpkg, and ar/tar failed)"
  done
  cmake_args+=("-DBERTH_DEPS_PREFIX=$prefix")
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:$prefix/usr/lib/x86_64-linux-gnu/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  log "unpacked $(ls "$debs"/*.deb | wc -l) packages from $debs into $prefix"
fi
command -v ninja >/dev/null && [ ! -f "$build/CMakeCache.txt" ] && cmake_args+=(-G Ninja)
# NCCL: the CUDA toolkit's when it has one, else PyTorch's nvidia-nccl wheel (header and
# libnccl.so.2), so the one-rank NCCL tests (gpu.single.Nccl.*) run on a box without MPI.
if [ -z "${NCCL_ROOT:-}" ] && [ ! -f "$(dirname "$(command -v nvcc)")/../include/nccl.h" ]; then
  NCCL_ROOT=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
fi
[ -n "${NCCL_ROOT:-}" ] && cmake_args+=("-DNCCL_ROOT=$NCCL_ROOT")

# A build made elsewhere (carried to the GPU box) is used only when it was built from these very
# sources: their hash is stored next to it. Anything else is (re)built.
src_hash=$(find CMakeLists.txt kernels runtime tests bench packing parallel launcher -type f \
             \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cmake' \
                -o -name 'CMakeLists.txt' \) 2>/dev/null | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-16)
# A build directory configured at another path (carried from a checkout elsewhere) has that path
# in its CMakeCache.txt and test files: cmake refuses it and ctest cannot find the binaries.
if [ -f "$build/CMakeCache.txt" ] &&
   ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$PWD" "$build/CMakeCache.txt"; then
  log "$build was configured for another source directory: building afresh"
  rm -rf "$build"
fi
# A carried build linked against an NCCL this box lacks (the toolkit's, on the machine it was made
# on) would not even start its tests: it is rebuilt against this box's.
nccl_lib=$(grep -o 'NCCL_LIBRARY:FILEPATH=.*' "$build/CMakeCache.txt" 2>/dev/null | cut -d= -f2)
if [ -n "$nccl_lib" ] && [ "${nccl_lib%NOTFOUND}" = "$nccl_lib" ] && [ ! -e "$nccl_lib" ]; then
  log "$build links $nccl_lib, which this box lacks: building afresh"
  rm -rf "$build"
fi
if [ -x "$build/bench/gpu/bench_gpu_ops" ] && [ -x "$build/tests/test_backend_gpu" ] &&
   [ "$(cat "$build/.berth-src-hash" 2>/dev/null)" = "$src_hash" ]; then
  log "using the build in $build (built from these sources, $src_hash)"
else
  log "configuring and building into $build ($jobs jobs)"
  if ! cmake -S . -B "$build" "${cmake_args[@]}" > "$out/build.log" 2>&1; then
    log "configure failed; the end of build.log:"
    tail -40 "$out/build.log"
    exit 2
  fi
  # Keep going past a target that fails (a test against this box's NCCL, say): the others still
  # build, and whatever built is run.
  keep_going=(-k); grep -q "CMAKE_GENERATOR:INTERNAL=Ninja" "$build/CMakeCache.txt" && keep_going=(-k 0)
  if timeout "$(cap 240 100)" cmake --build "$build" -j "$jobs" -- "${keep_going[@]}" \
       >> "$out/build.log" 2>&1; then
    echo "$src_hash" > "$build/.berth-src-hash"
    log "built"
  else
    log "the build did not finish (some targets failed or it ran out of time); the end of build.log:"
    grep -E "error|Error|FAILED" "$out/build.log" | tail -20
    if [ ! -x "$build/tests/test_backend_gpu" ] && [ ! -x "$build/bench/gpu/bench_gpu_ops" ]; then
      exit 2
    fi
    log "going on with what built"
  fi
fi
nccl_lib=$(grep -o 'NCCL_LIBRARY:FILEPATH=.*' "$build/CMakeCache.txt" | cut -d= -f2)
nccl_found=1
if [ -z "$nccl_lib" ] || [ "${nccl_lib%NOTFOUND}" != "$nccl_lib" ]; then
  log "NCCL: not found (set NCCL_ROOT): the gpu.single.Nccl tests skip"
  nccl_found=0
else
  log "NCCL: $nccl_lib"
fi

# The GPU tests alone first: the host runs of the same binaries (label cpu; the tiled kernels
# emulated thread by thread take minutes) must not use up their time. Those run last, in parallel.
log "GPU tests"
timeout "$(cap 150 100)" ctest --test-dir "$build" -L gpu --timeout 45 --output-on-failure \
  > "$out/tests.txt" 2>&1
tests_rc=$?
grep -E "tests passed|tests failed|Skipped|\*\*\*Failed|Timeout|Not Run" "$out/tests.txt" |
  tee -a "$out/gpu_check.log"
echo "$tests_rc" > "$out/gpu_tests_rc"
# A GPU test that skipped on a box with a GPU checked nothing (a CUDA backend that cannot start, a
# driver too old for the toolkit): ctest counts it as passed, the check fails (status 3) and names
# each with gtest's reason, from ctest's log. Skips that are not the GPU's are allowed: the NCCL
# tests when the build found no NCCL (said above), a test that lacks the license corpus.
gpus=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -gt 0 ]; then
  # "NAME<TAB>REASON" for each skipped test: the line after gtest's "FILE:LINE: Skipped"
  reasons=$(awk '/^[0-9]+\/[0-9]+ Testing: /{name=$3} after{print name "\t" $0; after=0}
                 /: Skipped$/{after=1}' "$build/Testing/Temporary/LastTest.log" 2>/dev/null)
  unexplained=0
  while read -r name; do
    [ -n "$name" ] || continue
    reason=$(printf '%s\n' "$reasons" | awk -F'\t' -v n="$name" '$1 == n {print $2; exit}')
    case "$name" in *.Nccl.*) [ "$nccl_found" = 0 ] && continue ;; esac
    case "$reason" in *"common-licenses corpus"*) continue ;; esac
    log "a GPU is visible, yet $name skipped: ${reason:-(no reason in the ctest log)}"
    unexplained=$((unexplained + 1))
  done <<< "$(grep -E '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$out/tests.txt" |
              sed -E 's/^[[:space:]]*[0-9]+ - (.*) \(Skipped\)$/\1/')"
  if [ "$unexplained" -gt 0 ] && [ "$tests_rc" -eq 0 ]; then
    tests_rc=3
    echo "$tests_rc" > "$out/gpu_tests_rc"
  fi
fi
# The measured CUDA-vs-CPU error of every op, unless the tests hung (it runs the same kernels).
if [ "$tests_rc" -ne 124 ] && ! grep -q "Timeout" "$out/tests.txt"; then
  BERTH_TOL_REPORT=1 timeout "$(cap 40 90)" "$build/tests/test_backend_gpu" \
    > "$out/tolerances.txt" 2>&1
fi

log "benchmark"
{
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)"
  # Line-buffered, so that a program stopped at its limit keeps the lines it printed. The bf16
  # half, then PyTorch's figures (what the comparison needs), then the slower fp32 half.
  timeout "$(cap 60 90)" stdbuf -oL "$build/bench/gpu/bench_gpu_ops" --precision bf16
  # PyTorch loads its own libraries (RPATH $ORIGIN); the unpacked prefix is not for it.
  LD_LIBRARY_PATH= timeout "$(cap 90 30)" python3 -u bench/gpu/torch_reference.py
  timeout "$(cap 60)" stdbuf -oL "$build/bench/gpu/bench_gpu_ops" --precision fp32
} > "$out/bench.txt" 2>&1
python3 bench/gpu/compare.py "$out/bench.txt" > "$out/compare.txt" 2>&1
cat "$out/compare.txt" >> "$out/bench.txt" && rm -f "$out/compare.txt"
cat "$out/bench.txt" >> "$out/gpu_check.log"
grep -E "^(attention|training|compare)" "$out/bench.txt"  # the ratios, in the command's output

if [ "${BERTH_GPU_CHECK_HOST_TESTS:-0}" = 1 ] && [ $((deadline - SECONDS)) -ge 60 ]; then
  log "host tests (label cpu, $jobs at a time, $(cap 150) s at most)"
  timeout "$(cap 150)" ctest --test-dir "$build" -L cpu -j "$jobs" --output-on-failure \
    > "$out/tests_host.txt" 2>&1
  grep -E "tests passed|tests failed|\*\*\*Failed|Timeout" "$out/tests_host.txt" | tee -a "$out/gpu_check.log"
else
  log "host tests not run (BERTH_GPU_CHECK_HOST_TESTS=1 runs them, time permitting; CI runs them)"
fi
log "done (GPU tests exit status $tests_rc)"
exit $tests_rc
