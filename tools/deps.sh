#!/usr/bin/env bash
# Installs everything miniCP needs on Debian 12 (bookworm); idempotent, quick when done.
# Debian packages first, then an OpenMP-enabled Kokkos 3.4.01 under $MINICP_KOKKOS_PREFIX
# built from bookworm's trilinos source package (Debian's own Kokkos is Serial-only).
#   tools/deps.sh          what miniCP needs (make deps)
#   tools/deps.sh --peer   only the peer study's PyTorch (python3-torch 1.13.1, about 1 GB
#                          with its libraries; make peer-deps): not part of make deps
set -euo pipefail

KOKKOS_PREFIX=${MINICP_KOKKOS_PREFIX:-/opt/minicp/kokkos-openmp}
TRILINOS_VERSION=13.2.0-4
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

PKGS=(
  build-essential cmake make pkg-config git dpkg-dev xz-utils clang-format
  openmpi-bin libopenmpi-dev libucx-dev ucx-utils
  libhdf5-openmpi-dev hdf5-tools
  libopenblas-dev libopenblas-openmp-dev libdnnl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libtrilinos-kokkos-dev
  python3-h5py python3-numpy python3-pandas python3-matplotlib
  slurm-wlm munge iproute2
)

PEER_PKGS=(python3-torch)

# install_missing NAME PKG...: apt-get installs those of PKG not installed yet.
install_missing() {
  local what=$1 p
  shift
  local missing=()
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "deps: $what present"
  fi
}

case "${1:-}" in
  "") ;;
  --peer)
    install_missing "the peer study's packages (${PEER_PKGS[*]})" "${PEER_PKGS[@]}"
    exit 0 ;;
  *)
    echo "deps.sh: unknown option '$1' (allowed: none, or --peer)" >&2
    exit 2 ;;
esac

install_missing "Debian packages" "${PKGS[@]}"

if [ -f "$KOKKOS_PREFIX/lib/cmake/Kokkos/KokkosConfig.cmake" ] || \
   [ -f "$KOKKOS_PREFIX/lib64/cmake/Kokkos/KokkosConfig.cmake" ]; then
  echo "deps: OpenMP Kokkos present in $KOKKOS_PREFIX"
  exit 0
fi

echo "deps: building Kokkos 3.4.01 (OpenMP + Serial) into $KOKKOS_PREFIX"
work=$(mktemp -d /tmp/minicp-kokkos.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/src"
# A temporary deb-src list passed through apt options: the system's apt setup is not touched.
cat > "$work/sources.list" <<SRC
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
SRC
APT_OPTS=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$work/lists" -o "APT::Sandbox::User=root")
apt-get "${APT_OPTS[@]}" -q update
(cd "$work/src" && apt-get "${APT_OPTS[@]}" -q source --download-only "trilinos=$TRILINOS_VERSION")
orig=$(ls "$work"/src/trilinos_*.orig.tar.* | head -n1)
echo "deps: extracting packages/kokkos from $(basename "$orig")"
tar -xf "$orig" -C "$work/src" --wildcards '*/packages/kokkos/*'
ksrc=$(dirname "$(find "$work/src" -path '*/packages/kokkos/CMakeLists.txt' | head -n1)")
cmake -S "$ksrc" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$KOKKOS_PREFIX" -DCMAKE_CXX_STANDARD=17 \
  -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON -DBUILD_SHARED_LIBS=ON \
  -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF > "$work/cmake.log" || { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/build" -j "$(nproc)" > "$work/build.log" || { tail -50 "$work/build.log"; exit 1; }
$SUDO cmake --install "$work/build" > /dev/null
echo "deps: Kokkos installed in $KOKKOS_PREFIX"
