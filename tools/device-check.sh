#!/usr/bin/env bash
# Device check: `bundle` packs the programs of a build, the shared libraries they need that
# a bare GPU machine lacks, Open MPI's runtime (relocated through OPAL_PREFIX) and the decks
# into one file; `run` (on the GPU machine) unpacks it, records the GPU and the libraries,
# and runs the kernel tests, the attention-vs-GEMM benchmark, layer steps at P = 1, 2, 4 and
# the NCCL test, each with its own timeout, into one directory with a summary.json.
# Exit status: 0 all passed, 1 a step failed (or bundle too large), 2 bad arguments,
# 3 no usable GPU driver (a program needs libcuda.so.1 and this node has none; the GPU steps
# skipped), 77 no GPU (the GPU steps skipped, the rest passed).
set -euo pipefail

PROG=device-check.sh
LIMIT_MIB=64
PROGRAMS_REQUIRED=(minicp minicp-test-kernels)
PROGRAMS_OPTIONAL=(minicp-kernels-bench minicp-cp-bench minicp-test-nccl)
# Not packed: the glibc family (the GPU machine's own must be used with its loader) and the
# driver and CUDA toolkit libraries, which the GPU machine brings (driver, Python wheels).
SYSTEM_LIBS='^(lib(c|m|pthread|dl|rt|resolv|util|anl|nsl)\.so|ld-linux|linux-vdso|lib(cuda|cudart|cublas|cublasLt|nccl)\.so)'
CUDA_LIBS='^lib(cuda|cudart|cublas|cublasLt|nccl)\.so'
# Open MPI plugins for networks a single GPU machine does not need (UCX, libfabric,
# InfiniBand verbs, PSM, netlink) and OpenSHMEM: left out with their libraries.
SKIP_PLUGIN_DEPS='^lib(ucp|ucs|uct|ucm|fabric|ibverbs|rdmacm|efa|psm2|psm_infinipath|infinipath|nl-3|nl-route-3|mca_common_ucx|mca_common_ofi|mca_common_verbs|oshmem)\.so'
TOP=minicp-device
# The first line of every bundle's MANIFEST.txt: how a bundle this script wrote is told apart.
MARKER='# minicp device bundle'
NO_DRIVER='no usable GPU driver on this node: libcuda.so.1 not found'

usage() {
  cat <<'EOF'
Usage: tools/device-check.sh bundle --build DIR --out FILE.tar.gz [--compress auto|gzip|xz]
                                    [--overwrite]
       tools/device-check.sh run --out DIR (--bundle FILE | --build DIR) [--timeout-s N]
                                 [--python EXE] [--seq-len N]

bundle (on the build machine): packs from DIR/bin the programs minicp and minicp-test-kernels
  (required) and minicp-kernels-bench, minicp-cp-bench, minicp-test-nccl (when present), the
  shared libraries they need except the glibc family and libcuda/libcudart/libcublas/
  libcublasLt/libnccl, Open MPI's mpirun/orted, plugins, help and configuration files, PMIx's
  plugins, inputs/, this script and MANIFEST.txt (what came from where, the git commit).
  --build DIR        build tree whose bin/ holds the programs (required; no default)
  --out FILE         bundle to write, .tar.gz or .tar.xz (required; no default)
  --compress MODE    auto | gzip | xz (default: auto: gzip, xz when gzip exceeds 64 MiB)
  --overwrite        replace an existing --out, only a bundle this script wrote (default: off,
                     an existing --out is refused; never a directory, device, FIFO, link or
                     other file, nor one under inputs/, which the bundle packs)
  The bundle is written to a temporary file beside --out, then renamed into place.
  A bundle over 64 MiB is refused (exit 1).

run (on the GPU machine): unpacks the bundle into DIR/bundle, finds the CUDA libraries
  (the Python environment's nvidia/*/lib, /usr/local/cuda/lib64), records nvidia-smi and
  ldd of every program, then runs each step with its own timeout, its output in
  DIR/<step>.log: kernels (minicp-test-kernels, DIR/kernels.json), kernels_bench
  (BM_Bf16Gemm at its largest size, 8192 in a device build, and bf16 attention fwd/bwd at S=4096 D=128 causal,
  DIR/kernels_bench.json), attention_ratio (attention useful FLOP/s / GEMM FLOP/s),
  layer_none_p1, layer_zigzag_p2, layer_zigzag_p4, layer_ulysses_p2, layer_ulysses_p4
  (inputs/tiny.toml, bf16, train, one HDF5 file each in DIR) and nccl_p1 (minicp-test-nccl).
  --out DIR          results directory, created (required; no default)
  --bundle FILE      bundle written by `bundle` (one of --bundle, --build is required);
                     checked to be one (readable, its MANIFEST.txt and bin/minicp) first
  --build DIR        a build tree instead of a bundle (its bin/; the system's mpirun)
  --timeout-s N      seconds for all steps together, 60 to 3600 (default: 600)
  --python EXE       Python whose site-packages hold nvidia/*/lib (default: python3)
  --seq-len N        tokens of the layer steps, 64 to 65536 (default: 2048)
  Before any program runs, the driver step checks that libcuda.so.1 (the GPU driver's
  library, which a CUDA build needs to start at all) is found; where it is not, it prints
  "no usable GPU driver on this node: libcuda.so.1 not found" and the GPU steps are skipped.
  Writes DIR/summary.json and prints
  MINICP_DEVICE_CHECK gpu=... steps=N passed=N failed=N skipped=N.
  Exit status: 0 all passed, 1 a step failed, 2 bad arguments, 3 no usable GPU driver
  (libcuda.so.1 not found), 77 no GPU (GPU steps skipped).
EOF
}

bad() {  # one line naming the flag, the value and what is allowed; nothing written
  echo "$PROG: $1" >&2
  exit 2
}

need_value() {  # flag, number of remaining args
  [[ $2 -ge 2 ]] || bad "$1: missing value"
}

is_int() { [[ $1 =~ ^[0-9]+$ ]]; }

# ---------------------------------------------------------------------------------------
# bundle

# Non-system libraries (absolute paths) that ldd resolves for the given ELF files.
needed_libs() {
  ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $SYSTEM_LIBS ]] || echo "$path"
  done | sort -u
}

# Whether FILE is a bundle this script wrote: a tar (gzip or xz) whose MANIFEST.txt starts
# with the marker line (MANIFEST.txt comes first, so this reads no further).
is_bundle() {
  local first
  first=$(tar -xOf "$1" --occurrence=1 "$TOP/MANIFEST.txt" 2>/dev/null | sed -n 1p) || return 1
  [[ $first == "$MARKER" ]]
}

# --out of bundle: a new file in an existing, writable directory outside inputs/ (which the
# bundle packs), or with --overwrite a regular file that is a bundle this script wrote.
check_bundle_out() {  # out, overwrite (0/1), repository
  local out=$1 overwrite=$2 repo=$3 dir
  if [[ $out == */ ]]; then
    if [[ -d $out ]]; then bad "--out '$out': is a directory (a file name is allowed, e.g. minicp-device.tar.gz)"; fi
    bad "--out '$out': directory ${out%/} does not exist (a file in an existing directory is allowed)"
  fi
  dir=$(dirname -- "$out")
  [[ -d $dir ]] || bad "--out '$out': directory $dir does not exist (a file in an existing directory is allowed)"
  [[ -w $dir ]] || bad "--out '$out': directory $dir is not writable (a writable directory is allowed)"
  [[ ! -d $out ]] || bad "--out '$out': is a directory (a file name is allowed, e.g. minicp-device.tar.gz)"
  local real_dir inputs
  real_dir=$(cd -- "$dir" && pwd -P)
  inputs=$(cd -- "$repo/inputs" && pwd -P)
  [[ $real_dir/ != "$inputs"/* ]] || bad "--out '$out': inside $inputs, which the bundle packs (a file outside it is allowed)"
  if [[ -e $out || -L $out ]]; then
    [[ $overwrite == 1 ]] || bad "--out '$out': exists (a new file is allowed; --overwrite replaces a bundle this script wrote)"
    [[ -f $out && ! -L $out ]] || bad "--out '$out': not a regular file (--overwrite replaces only a bundle this script wrote)"
    is_bundle "$out" || bad "--out '$out': not a bundle this script wrote (--overwrite replaces only such a file)"
  fi
}

# The staging directory as a tar stream on stdout, MANIFEST.txt first (see is_bundle).
pack_stage() {  # stage
  (cd -- "$1" && { printf '%s\0' "$TOP/MANIFEST.txt"; find "$TOP" ! -path "$TOP/MANIFEST.txt" -print0; } |
    tar --no-recursion --null -cf - -T -)
}

cmd_bundle() {
  local build="" out="" compress=auto overwrite=0
  while [[ $# -gt 0 ]]; do
    case $1 in
      --build) need_value "$1" $#; build=$2; shift 2 ;;
      --out) need_value "$1" $#; out=$2; shift 2 ;;
      --compress) need_value "$1" $#; compress=$2; shift 2 ;;
      --overwrite) overwrite=1; shift ;;
      -h|--help) usage; exit 0 ;;
      *) bad "bundle: unknown argument '$1' (allowed: --build, --out, --compress, --overwrite; see --help)" ;;
    esac
  done
  [[ -n $build ]] || bad "--build: missing (a build tree whose bin/ holds minicp)"
  [[ -n $out ]] || bad "--out: missing (the bundle file to write, e.g. minicp-device.tar.gz)"
  case $compress in auto|gzip|xz) ;; *) bad "--compress '$compress': allowed auto, gzip, xz" ;; esac
  local p
  for p in "${PROGRAMS_REQUIRED[@]}"; do
    [[ -x $build/bin/$p ]] || bad "--build '$build': no program $build/bin/$p (required: ${PROGRAMS_REQUIRED[*]})"
  done
  local repo; repo=$(cd "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
  check_bundle_out "$out" "$overwrite" "$repo"
  # An existing --out (a bundle, as checked) must not also be a file the bundle packs.
  local out_real=""
  if [[ -e $out ]]; then out_real=$(readlink -f -- "$out"); fi

  STAGE=$(mktemp -d)
  TMP_OUT=""
  trap 'rm -rf -- "$STAGE"; if [[ -n $TMP_OUT ]]; then rm -f -- "$TMP_OUT"; fi' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local stage=$STAGE
  local root=$stage/$TOP
  mkdir -p "$root/bin" "$root/lib" "$root/tools" "$root/etc"
  local manifest=$root/MANIFEST.txt
  {
    echo "$MARKER"
    echo "commit $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
    echo "created $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}') (the GPU machine's must be this or newer)"
    echo "# kind bundle-path source"
  } >"$manifest"
  add() {  # kind, source, bundle-relative destination
    if [[ -n $out_real && $(readlink -f -- "$2") == "$out_real" ]]; then
      bad "--out '$out': is the $1 file $2, which the bundle packs (a file it does not pack is allowed)"
    fi
    mkdir -p "$(dirname -- "$root/$3")"
    cp -L "$2" "$root/$3"
    echo "$1 $3 $2" >>"$manifest"
  }

  local progs=()
  for p in "${PROGRAMS_REQUIRED[@]}" "${PROGRAMS_OPTIONAL[@]}"; do
    if [[ -x $build/bin/$p ]]; then
      add program "$build/bin/$p" "bin/$p"
      progs+=("$build/bin/$p")
    else
      echo "absent bin/$p (not in $build/bin)" >>"$manifest"
    fi
  done

  # Open MPI: where this install keeps its plugins and help files (ompi_info, else Debian's layout).
  local mpirun; mpirun=$(readlink -f "$(command -v mpirun || command -v orterun)")
  local ompi_prefix=/usr pkglibdir="" pkgdatadir="" sysconfdir=""
  if command -v ompi_info >/dev/null; then
    local info; info=$(ompi_info --path all --parsable 2>/dev/null || true)
    ompi_prefix=$(awk -F: '$2 == "prefix" {print $3}' <<<"$info")
    pkglibdir=$(awk -F: '$2 == "pkglibdir" {print $3}' <<<"$info" | head -1)
    pkgdatadir=$(awk -F: '$2 == "pkgdatadir" {print $3}' <<<"$info")
    sysconfdir=$(awk -F: '$2 == "sysconfdir" {print $3}' <<<"$info")
  fi
  [[ -n $pkglibdir ]] || pkglibdir=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
  [[ -n $pkgdatadir ]] || pkgdatadir=/usr/share/openmpi
  [[ -n $sysconfdir ]] || sysconfdir=/etc/openmpi
  [[ -d $pkglibdir ]] || { echo "$PROG: Open MPI plugin directory $pkglibdir not found" >&2; exit 1; }
  # OPAL_PREFIX replaces the prefix of every configured path, so the bundle mirrors the paths
  # below the prefix (Debian: lib/x86_64-linux-gnu/openmpi/lib/openmpi3, share/openmpi).
  [[ -n $ompi_prefix ]] || ompi_prefix=/usr
  if [[ $pkglibdir != "$ompi_prefix"/* || $pkgdatadir != "$ompi_prefix"/* ]]; then
    echo "$PROG: Open MPI's plugins ($pkglibdir) or help files ($pkgdatadir) lie outside its prefix $ompi_prefix: OPAL_PREFIX cannot relocate them" >&2
    exit 1
  fi
  local rel_lib=${pkglibdir#"$ompi_prefix"/} rel_data=${pkgdatadir#"$ompi_prefix"/}
  add ompi "$mpirun" ompi/bin/orterun
  ln -s orterun "$root/ompi/bin/mpirun"
  local orted; orted=$(command -v orted || echo "$(dirname -- "$mpirun")/orted")
  add ompi "$orted" ompi/bin/orted
  local plugins=() f name skip
  # One ldd over every plugin: "<plugin>:" lines, then its libraries.
  declare -A needs
  while read -r f dep; do needs[$f]=$dep; done < <(ldd "$pkglibdir"/*.so 2>/dev/null | awk -v re="$SKIP_PLUGIN_DEPS" '
    /^[^ \t].*:$/ {f = substr($0, 1, length($0) - 1); next}
    $1 ~ re && !(f in seen) {seen[f] = 1; print f, $1}')
  for f in "$pkglibdir"/*.so; do
    name=$(basename -- "$f")
    skip=${needs[$f]:-}
    if [[ -n $skip ]]; then
      echo "left-out $name (needs $skip)" >>"$manifest"
    else
      add ompi-plugin "$f" "ompi/$rel_lib/$name"
      plugins+=("$f")
    fi
  done
  mkdir -p "$root/ompi/$rel_data"
  cp -rL "$pkgdatadir"/. "$root/ompi/$rel_data/"
  echo "ompi-data ompi/$rel_data $pkgdatadir" >>"$manifest"
  for f in "$sysconfdir"/openmpi-mca-params.conf "$sysconfdir"/openmpi-default-hostfile; do
    if [[ -f $f ]]; then add ompi-etc "$f" "etc/$(basename -- "$f")"; fi
  done
  # PMIx (external to Open MPI 4.1 on Debian): its few plugins and its parameter file.
  local pmix_lib; pmix_lib=$(ldd "$pkglibdir"/mca_pmix_*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ {print $3; exit}')
  if [[ -n $pmix_lib ]]; then
    local pmix_home; pmix_home=$(dirname -- "$(readlink -f "$pmix_lib")")
    if [[ -d $pmix_home/pmix2/lib/pmix ]]; then pmix_home=$pmix_home/pmix2/lib; fi
    if [[ -d $pmix_home/pmix ]]; then
      for f in "$pmix_home"/pmix/*.so; do
        add pmix-plugin "$f" "pmix/lib/pmix/$(basename -- "$f")"
        plugins+=("$f")
      done
      if [[ -f $pmix_home/../share/pmix-mca-params.conf ]]; then
        add pmix-etc "$pmix_home/../share/pmix-mca-params.conf" pmix/share/pmix-mca-params.conf
      fi
    fi
  fi

  local lib
  while read -r lib; do
    if [[ -n $lib ]]; then add lib "$lib" "lib/$(basename -- "$lib")"; fi
  done < <(needed_libs "${progs[@]}" "$mpirun" "$orted" "${plugins[@]}")

  cp -r "$repo/inputs" "$root/inputs"
  echo "inputs inputs $repo/inputs" >>"$manifest"
  add script "${BASH_SOURCE[0]}" tools/device-check.sh
  cat >"$root/env.sh" <<'EOF'
# Source this to use the bundle's programs and its Open MPI from where it was unpacked.
_b=$(cd "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
export PATH="$_b/ompi/bin:$_b/bin:$PATH"
export LD_LIBRARY_PATH="$_b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$_b/ompi" OPAL_SYSCONFDIR="$_b/etc"
export PMIX_MCA_mca_base_component_path="$_b/pmix/lib/pmix"
export PMIX_MCA_mca_base_param_files="$_b/pmix/share/pmix-mca-params.conf"
unset _b
EOF
  echo "env env.sh (OPAL_PREFIX, OPAL_SYSCONFDIR, PMIX_MCA_*, LD_LIBRARY_PATH, PATH)" >>"$manifest"

  # A temporary beside --out (same file system), renamed into place once complete; the
  # EXIT trap removes it on any failure.
  TMP_OUT=$(mktemp -- "$(dirname -- "$out")/.$(basename -- "$out").XXXXXX") ||
    { echo "$PROG: --out '$out': cannot create a temporary file in $(dirname -- "$out")" >&2; exit 1; }
  chmod "$(printf '%o' $((0666 & ~8#$(umask))))" "$TMP_OUT"
  local mode=$compress size
  if [[ $mode == auto ]]; then mode=gzip; fi
  while :; do
    if [[ $mode == gzip ]]; then
      pack_stage "$stage" | gzip -6 >"$TMP_OUT"
    else
      pack_stage "$stage" | xz -T2 -6 >"$TMP_OUT"
    fi
    size=$(stat -c %s "$TMP_OUT")
    if [[ $size -gt $((LIMIT_MIB * 1048576)) && $compress == auto && $mode == gzip ]]; then
      mode=xz
      continue
    fi
    break
  done
  if [[ $size -gt $((LIMIT_MIB * 1048576)) ]]; then
    echo "$PROG: bundle is $size bytes ($((size / 1048576)) MiB, $mode), over the $LIMIT_MIB MiB limit; nothing written" >&2
    exit 1
  fi
  # -T: never into a directory that took --out's name since it was checked.
  mv -f -T -- "$TMP_OUT" "$out"
  TMP_OUT=""
  echo "MINICP_DEVICE_BUNDLE file=$out bytes=$size compress=$mode programs=${#progs[@]} libs=$(grep -c '^lib ' "$manifest")"
}

# ---------------------------------------------------------------------------------------
# run

STEPS=()  # names in order
declare -A ST_STATUS ST_SECONDS ST_REASON

record() {  # step status seconds reason
  STEPS+=("$1")
  ST_STATUS[$1]=$2
  ST_SECONDS[$1]=$3
  ST_REASON[$1]=$4
  printf '%-18s %-7s %6ss  %s\n' "$1" "$2" "$3" "$4"
}

DEADLINE=0
# run_step name timeout_s command...: output in $OUTDIR/<name>.log; the timeout is cut to
# what is left of --timeout-s.
run_step() {
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - $(date +%s)))
  if [[ $left -lt 5 ]]; then
    record "$name" skipped 0 "--timeout-s spent before this step"
    return 0
  fi
  if [[ $limit -gt $left ]]; then limit=$left; fi
  local t0 rc=0; t0=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1 || rc=$?
  local secs; secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  if [[ $rc -eq 0 ]]; then
    record "$name" passed "$secs" ""
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
    record "$name" failed "$secs" "timed out after ${limit} s (see $name.log)"
  elif grep -q 'libcuda\.so\.1: cannot open shared object file' "$OUTDIR/$name.log"; then
    record "$name" failed "$secs" "$NO_DRIVER (exit status $rc, see $name.log)"
  else
    record "$name" failed "$secs" "exit status $rc (see $name.log: $(tail -n 1 "$OUTDIR/$name.log" | tr -d '"\\' | cut -c1-160))"
  fi
}

# ldd of every program into $OUTDIR/ldd: nothing may be missing but, without a GPU, the
# CUDA libraries; libcuda.so.1 is left to record_driver.
record_ldd() {  # root, no_gpu (empty where there is a GPU)
  local root=$1 no_gpu=$2 p name missing="" missing_cuda="" lib versions=""
  mkdir -p "$OUTDIR/ldd"
  ldd --version 2>&1 | head -1 >"$OUTDIR/glibc.txt" || true
  for p in "$root"/bin/minicp*; do
    name=$(basename -- "$p")
    ldd "$p" >"$OUTDIR/ldd/$name.txt" 2>&1 || true
    while read -r lib; do
      if [[ $lib == libcuda.so.1 ]]; then continue; fi
      if [[ $lib =~ $CUDA_LIBS ]]; then missing_cuda+=" $name:$lib"; else missing+=" $name:$lib"; fi
    done < <(awk '$2 == "=>" && /not found/ {print $1}' "$OUTDIR/ldd/$name.txt")
    # "version `GLIBC_2.34' not found": this machine's glibc (or libstdc++) is older than the build's.
    versions+=$(grep -o "version \`[^']*' not found" "$OUTDIR/ldd/$name.txt" | sort -u | sed "s/^/ $name: /" | tr '\n' ' ' || true)
  done
  if [[ -n $versions ]]; then
    record ldd failed 0 "symbol versions missing (this machine's $(cat "$OUTDIR/glibc.txt"); the bundle's: see MANIFEST.txt):$versions$missing"
  elif [[ -n $missing || (-n $missing_cuda && -z $no_gpu) ]]; then
    record ldd failed 0 "not found:$missing$missing_cuda"
  elif [[ -n $missing_cuda ]]; then
    record ldd passed 0 "every library found but the CUDA ones, which a GPU machine brings:$missing_cuda"
  else
    record ldd passed 0 ""
  fi
}

# The GPU driver's libcuda.so.1, from the ldd records: a CUDA build cannot start without it
# (the loader ends it with exit 127 before main, where nothing in the program can catch
# it), so its absence is said once, here, before any program runs. Returns 1 where a
# program needs it and it is not found.
record_driver() {
  local f users="" where=""
  for f in "$OUTDIR"/ldd/*.txt; do
    [[ -f $f ]] || continue
    if grep -q '^[[:space:]]*libcuda\.so\.1 => not found' "$f"; then users+=" $(basename -- "$f" .txt)"; fi
    where=${where:-$(awk '$1 == "libcuda.so.1" && $3 ~ /^\// {print $3; exit}' "$f")}
  done
  if [[ -n $users ]]; then
    record driver failed 0 "$NO_DRIVER (needed by$users)"
    echo "$PROG: $NO_DRIVER" >&2
    return 1
  fi
  if [[ -n $where ]]; then
    record driver passed 0 "libcuda.so.1 => $where"
  else
    record driver skipped 0 "no program needs libcuda.so.1 (a build without CUDA)"
  fi
}

cmd_run() {
  local out="" bundle="" build="" timeout_s=600 python=python3 seq_len=2048
  while [[ $# -gt 0 ]]; do
    case $1 in
      --out) need_value "$1" $#; out=$2; shift 2 ;;
      --bundle) need_value "$1" $#; bundle=$2; shift 2 ;;
      --build) need_value "$1" $#; build=$2; shift 2 ;;
      --timeout-s) need_value "$1" $#; timeout_s=$2; shift 2 ;;
      --python) need_value "$1" $#; python=$2; shift 2 ;;
      --seq-len) need_value "$1" $#; seq_len=$2; shift 2 ;;
      -h|--help) usage; exit 0 ;;
      *) bad "run: unknown argument '$1' (allowed: --out, --bundle, --build, --timeout-s, --python, --seq-len; see --help)" ;;
    esac
  done
  [[ -n $out ]] || bad "--out: missing (the results directory to create)"
  [[ ! -e $out || -d $out ]] || bad "--out '$out': exists and is not a directory (a directory is allowed)"
  if [[ -d $out && -n $(ls -A "$out") ]]; then bad "--out '$out': directory not empty (an empty or new directory is allowed)"; fi
  if [[ -n $bundle && -n $build ]]; then bad "--bundle '$bundle' and --build '$build': give one of them, not both"; fi
  if [[ -z $bundle && -z $build ]]; then bad "--bundle/--build: missing (one of them is required)"; fi
  [[ -z $bundle || -f $bundle ]] || bad "--bundle '$bundle': no such file (a file written by 'device-check.sh bundle' is allowed)"
  [[ -z $build || -x $build/bin/minicp ]] || bad "--build '$build': no program $build/bin/minicp (a build tree is allowed)"
  is_int "$timeout_s" && ((timeout_s >= 60 && timeout_s <= 3600)) ||
    bad "--timeout-s '$timeout_s': allowed an integer 60 to 3600"
  is_int "$seq_len" && ((seq_len >= 64 && seq_len <= 65536)) || bad "--seq-len '$seq_len': allowed an integer 64 to 65536"
  command -v "$python" >/dev/null || bad "--python '$python': not found (a Python 3 executable is allowed)"
  # Read through before --out is made: a file that is not a bundle is bad input, not a failed step.
  if [[ -n $bundle ]] && ! { is_bundle "$bundle" && tar -tf "$bundle" "$TOP/bin/minicp" >/dev/null 2>&1; }; then
    bad "--bundle '$bundle': not a bundle written by 'device-check.sh bundle' (allowed: a readable .tar.gz or .tar.xz holding $TOP/MANIFEST.txt and $TOP/bin/minicp)"
  fi

  mkdir -p "$out"
  OUTDIR=$(cd "$out" && pwd)
  # Each step is cut to what is left; 10 s kept back for the kill grace of the last one.
  DEADLINE=$(($(date +%s) + timeout_s - 10))
  local root mpirun
  local t0; t0=$(date +%s)
  if [[ -n $bundle ]]; then
    mkdir -p "$OUTDIR/bundle"
    if tar -C "$OUTDIR/bundle" -xf "$bundle" >"$OUTDIR/unpack.log" 2>&1 && [[ -x $OUTDIR/bundle/$TOP/bin/minicp ]]; then
      record unpack passed "$(($(date +%s) - t0))" ""
    else
      record unpack failed "$(($(date +%s) - t0))" "tar -xf $bundle failed (see unpack.log)"
      finish none 0
    fi
    root=$OUTDIR/bundle/$TOP
    # shellcheck source=/dev/null
    source "$root/env.sh"
    mpirun=$root/ompi/bin/mpirun
    cp "$root/MANIFEST.txt" "$OUTDIR/MANIFEST.txt"
    record manifest passed 0 "$(grep -m1 '^commit' "$root/MANIFEST.txt")"
  else
    root=$(cd "$build" && pwd)
    mpirun=$(command -v mpirun || echo mpirun-not-on-PATH)
    record unpack skipped 0 "a build tree, no bundle"
    record manifest skipped 0 "a build tree, no bundle"
  fi

  # CUDA libraries: the Python environment's wheels (nvidia/<pkg>/lib), then the toolkit.
  local cuda_dirs
  cuda_dirs=$("$python" - <<'EOF' 2>/dev/null || true
import glob, os, site, sys
roots = list(sys.path)
try:
    roots += site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    pass
seen = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
print(":".join(seen))
EOF
)
  if [[ -d /usr/local/cuda/lib64 ]]; then cuda_dirs=${cuda_dirs:+$cuda_dirs:}/usr/local/cuda/lib64; fi
  if [[ -n $cuda_dirs ]]; then export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cuda_dirs"; fi
  echo "$cuda_dirs" | tr ':' '\n' >"$OUTDIR/cuda_lib_dirs.txt"

  # The GPU.
  local gpus=0 gpu_name=none no_gpu=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L >"$OUTDIR/nvidia-smi.txt" 2>&1 || true
    nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,clocks.max.sm,power.limit \
      --format=csv >>"$OUTDIR/nvidia-smi.txt" 2>&1 || true
    gpus=$(grep -c '^GPU [0-9]' "$OUTDIR/nvidia-smi.txt" || true)
    if [[ $gpus -gt 0 ]]; then
      gpu_name=$(grep -m1 '^GPU 0' "$OUTDIR/nvidia-smi.txt" | sed 's/^GPU 0: //; s/ (UUID.*//; s/ /_/g')
    else
      no_gpu="no GPU (nvidia-smi -L lists none)"
    fi
  else
    echo "nvidia-smi: not found" >"$OUTDIR/nvidia-smi.txt"
    no_gpu="no GPU (no nvidia-smi)"
  fi

  record_ldd "$root" "$no_gpu"
  local driver_ok=1
  record_driver || driver_ok=0

  local gpu_steps=(kernels kernels_bench attention_ratio layer_none_p1 layer_zigzag_p2 layer_zigzag_p4
    layer_ulysses_p2 layer_ulysses_p4 nccl_p1)
  local p
  if [[ $driver_ok == 0 ]]; then
    for p in "${gpu_steps[@]}"; do record "$p" skipped 0 "$NO_DRIVER"; done
    finish "$gpu_name" "$gpus" 3
  fi
  if [[ -n $no_gpu ]]; then
    for p in "${gpu_steps[@]}"; do record "$p" skipped 0 "$no_gpu"; done
    finish none 0
  fi

  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_PROC_BIND=false
  local mpi=("$mpirun" --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x OMP_PROC_BIND)
  run_step kernels 240 "${mpi[@]}" -np 1 "$root/bin/minicp-test-kernels" --gtest_output="json:$OUTDIR/kernels.json"

  # BM_Bf16Gemm registers 8192 in a device build (2048 and below in a host one): its largest.
  if [[ -x $root/bin/minicp-kernels-bench ]]; then
    run_step kernels_bench 240 "$root/bin/minicp-kernels-bench" --seq 4096 --head-dim 128 --causal 1 \
      '--benchmark_filter=^BM_(Bf16Gemm/(2048|8192)|Attention(Fwd|Bwd)Bf16/4096/128/1/)' \
      --benchmark_format=json --benchmark_out="$OUTDIR/kernels_bench.json"
    if [[ ${ST_STATUS[kernels_bench]} == passed ]]; then
      local ratio rc=0
      ratio=$("$python" - "$OUTDIR/kernels_bench.json" <<'EOF' 2>"$OUTDIR/attention_ratio.log"
import json, sys
rows = [x for x in json.load(open(sys.argv[1]))["benchmarks"] if x.get("run_type", "iteration") == "iteration"]
b = {x["name"].split("/")[0]: x for x in rows if not x["name"].startswith("BM_Bf16Gemm")}
gemm = max((x for x in rows if x["name"].startswith("BM_Bf16Gemm/")), key=lambda x: int(x["name"].split("/")[1]))
n = int(gemm["name"].split("/")[1])
g = gemm["FLOPS"]
f = b["BM_AttentionFwdBf16"]["FLOPS"]
d = b["BM_AttentionBwdBf16"]["FLOPS"]
print("gemm_n=%d gemm_tflops=%.2f fwd_tflops=%.2f bwd_tflops=%.2f fwd_over_gemm=%.3f bwd_over_gemm=%.3f"
      % (n, g / 1e12, f / 1e12, d / 1e12, f / g, d / g))
EOF
) || rc=$?
      echo "$ratio" >>"$OUTDIR/attention_ratio.log"
      if [[ $rc -eq 0 ]]; then record attention_ratio passed 0 "$ratio"
      else record attention_ratio failed 0 "kernels_bench.json unreadable (see attention_ratio.log)"; fi
    else
      record attention_ratio skipped 0 "kernels_bench did not pass"
    fi
  else
    record kernels_bench skipped 0 "minicp-kernels-bench not bundled"
    record attention_ratio skipped 0 "minicp-kernels-bench not bundled"
  fi

  local deck="$root/inputs/tiny.toml" s np
  [[ -f $deck ]] || deck=$(cd "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)/inputs/tiny.toml
  local common=(--deck "$deck" --set 'run.pass=["train"]' --set 'run.dtype="bf16"'
    --set "sweep.seq_len=[$seq_len]" --set run.stall_timeout_s=90 --quiet)
  run_step layer_none_p1 90 "${mpi[@]}" -np 1 "$root/bin/minicp" "${common[@]}" \
    --set 'sweep.schemes=["none"]' --set 'sweep.ranks=[1]' --out "$OUTDIR/layer_none_p1.h5"
  for s in zigzag ulysses; do
    for np in 2 4; do
      run_step "layer_${s}_p$np" 90 "${mpi[@]}" -np "$np" "$root/bin/minicp" "${common[@]}" \
        --set "sweep.schemes=[\"$s\"]" --set "sweep.ranks=[$np]" --out "$OUTDIR/layer_${s}_p$np.h5"
    done
  done

  if [[ -x $root/bin/minicp-test-nccl ]]; then
    run_step nccl_p1 90 "${mpi[@]}" -np 1 "$root/bin/minicp-test-nccl" --gtest_output="json:$OUTDIR/nccl.json"
  else
    record nccl_p1 skipped 0 "minicp-test-nccl not bundled (a build without CUDA)"
  fi
  finish "$gpu_name" "$gpus"
}

json_str() { local s=$1; s=${s//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }

finish() {  # gpu-name gpu-count [exit-status]; writes summary.json, prints the line, exits
  local gpu=$1 count=$2 passed=0 failed=0 skipped=0 s first=1
  {
    printf '{\n  "gpu": %s,\n  "gpus": %s,\n  "steps": [\n' "$(json_str "$gpu")" "$count"
    for s in "${STEPS[@]}"; do
      [[ $first -eq 1 ]] || printf ',\n'
      first=0
      printf '    {"step": %s, "status": %s, "seconds": %s, "reason": %s}' "$(json_str "$s")" \
        "$(json_str "${ST_STATUS[$s]}")" "${ST_SECONDS[$s]}" "$(json_str "${ST_REASON[$s]}")"
    done
    printf '\n  ]\n}\n'
  } >"$OUTDIR/summary.json"
  for s in "${STEPS[@]}"; do
    case ${ST_STATUS[$s]} in passed) passed=$((passed + 1)) ;; failed) failed=$((failed + 1)) ;; *) skipped=$((skipped + 1)) ;; esac
  done
  echo "MINICP_DEVICE_CHECK gpu=$gpu steps=${#STEPS[@]} passed=$passed failed=$failed skipped=$skipped out=$OUTDIR"
  if [[ -n ${3:-} ]]; then exit "$3"; fi
  if [[ $failed -gt 0 ]]; then exit 1; fi
  if [[ $count -eq 0 ]]; then exit 77; fi
  exit 0
}

case ${1:-} in
  bundle) shift; cmd_bundle "$@" ;;
  run) shift; cmd_run "$@" ;;
  -h|--help) usage ;;
  "") bad "missing subcommand (allowed: bundle, run; see --help)" ;;
  *) bad "subcommand '$1': allowed bundle, run (see --help)" ;;
esac
